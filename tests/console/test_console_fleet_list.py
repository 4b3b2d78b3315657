"""The fleet list at scale, and its filters, against a real Control Plane with scripted edges.

2,000 labelled edges over real sockets: the list follows every page of
``/fleet/status``, keeps only the rows in view in the DOM while scrolling
reaches the last edge, and puts the edge in trouble first. The filters are
sent to the server as ``q``, ``selector`` and ``state``; the selector tests
need the Control Plane's filtered views (they assert what the page shows
and what it asked).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors
from labelled_edges import MANY_EDGES_CONFIG, connect_fleet

from twisted_iop.testing.harness import eventually, start_control_plane

pytestmark = pytest.mark.browser

#: Edges of the large fleet: as many as stay quick to connect and to page through in a test.
FLEET_SIZE = 2000
#: Most rows the list may hold in the DOM at once (the window plus its overscan).
MAX_DOM_ROWS = 100

DOM_ROWS = "() => document.querySelector('iop-fleet-overview').shadowRoot.querySelectorAll('li[data-index]').length"
SHOWN_IDS = """() => [...document.querySelector('iop-fleet-overview').shadowRoot
    .querySelectorAll('button[data-edge]')].map((b) => b.dataset.edge)"""
SCROLL_TO_END = """() => { const v = document.querySelector('iop-fleet-overview').shadowRoot.querySelector('[data-viewport]');
    v.scrollTop = v.scrollHeight; }"""


def region(i: int) -> str:
    """Even edges are in eu, odd ones in us."""
    return "eu" if i % 2 == 0 else "us"


def fleet_labels(size: int) -> dict[str, dict[str, str]]:
    """edge-0000 ... with a region label each."""
    return {f"edge-{i:04d}": {"region": region(i), "site": "test"} for i in range(size)}


def queries(urls: list[str]) -> list[dict[str, list[str]]]:
    """The query parameters of each requested URL."""
    return [parse_qs(urlsplit(url).query) for url in urls]


@pytest_twisted.ensureDeferred
async def test_two_thousand_edges_scroll_to_the_last_with_few_dom_rows(browser: Browser) -> None:
    """Every page is followed; the DOM holds a window of rows while scrolling reaches the last edge; trouble comes first."""
    cp = await start_control_plane(config_text=MANY_EDGES_CONFIG)
    try:
        edges = await connect_fleet(cp.edge_wire_port, fleet_labels(FLEET_SIZE))
        edges["edge-1500"].tcp.loseConnection()

        async def gone() -> bool:
            code, body = await cp.get_json("/edges/edge-1500")
            return code == 200 and body.get("connected") is False

        await eventually(gone, message="edge-1500 is known as disconnected")
        page = browser.page
        fleet_requests: list[str] = []

        def loaded() -> dict[str, Any]:
            page.on("request", lambda r: fleet_requests.append(r.url) if "/fleet/status" in r.url else None)
            page.goto(cp.http_url + "/console/")
            page.wait_for_selector(f'iop-fleet-overview [data-count]:has-text("{FLEET_SIZE} edges")', timeout=90_000)
            first = page.evaluate(SHOWN_IDS)[0]
            at_top = page.evaluate(DOM_ROWS)
            page.evaluate(SCROLL_TO_END)
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-1999"]')
            at_end = page.evaluate(DOM_ROWS)
            page.select_option("iop-fleet-overview select[data-sort]", "id")
            page.evaluate(
                "() => document.querySelector('iop-fleet-overview').shadowRoot.querySelector('[data-viewport]').scrollTop = 0"
            )
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-0000"]')
            by_id_first = page.evaluate(SHOWN_IDS)[0]
            return {"first": first, "at_top": at_top, "at_end": at_end, "by_id_first": by_id_first}

        seen = await browser.call(loaded)
        assert seen["first"] == "edge-1500", seen  # the disconnected edge sorts first
        assert seen["by_id_first"] == "edge-0000", seen
        assert 0 < seen["at_top"] <= MAX_DOM_ROWS and 0 < seen["at_end"] <= MAX_DOM_ROWS, seen
        asked = queries(fleet_requests)
        assert all(q["limit"] == ["1000"] for q in asked), asked
        assert any("cursor" in q for q in asked), "the list followed next_cursor"
        assert page_errors(browser) == []
    finally:
        await cp.stop()


async def small_fleet(browser: Browser, size: int = 30) -> tuple[Any, list[str]]:
    """A Control Plane with ``size`` labelled edges and the console open on it; answers it and the fleet URLs asked."""
    cp = await start_control_plane(config_text=MANY_EDGES_CONFIG)
    await connect_fleet(cp.edge_wire_port, fleet_labels(size))
    page = browser.page
    fleet_requests: list[str] = []

    def loaded() -> None:
        page.on("request", lambda r: fleet_requests.append(r.url) if "/fleet/status" in r.url else None)
        page.goto(cp.http_url + "/console/")
        page.wait_for_selector(f'iop-fleet-overview [data-count]:has-text("{size} edges")')

    await browser.call(loaded)
    return cp, fleet_requests


@pytest_twisted.ensureDeferred
async def test_search_box_sends_q_and_shows_matching_edges(browser: Browser) -> None:
    """Typing in the search box asks the server with q= and shows only the edges whose id contains it."""
    cp, fleet_requests = await small_fleet(browser)
    try:
        page = browser.page

        def searched() -> list[str]:
            page.fill('iop-fleet-overview input[data-filter="q"]', "EDGE-001")
            page.wait_for_selector('iop-fleet-overview [data-count]:has-text("10 edges match")')
            ids: list[str] = page.evaluate(SHOWN_IDS)
            return ids

        ids = await browser.call(searched)
        assert sorted(ids) == [f"edge-{i:04d}" for i in range(10, 20)]
        assert any(q.get("q") == ["EDGE-001"] for q in queries(fleet_requests)), fleet_requests
        assert page_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_selector_is_sent_to_the_server_and_only_matching_edges_show(browser: Browser) -> None:
    """A selector typed and entered is sent as selector=; the list shows the matching edges only (server-filtered)."""
    cp, fleet_requests = await small_fleet(browser)
    try:
        page = browser.page

        def filtered() -> list[str]:
            page.fill('iop-fleet-overview input[data-filter="selector"]', "region=eu")
            page.press('iop-fleet-overview input[data-filter="selector"]', "Enter")
            page.wait_for_function(
                "() => [...performance.getEntriesByType('resource')].some((e) => e.name.includes('selector=region%3Deu'))"
            )
            page.wait_for_selector('iop-fleet-overview [data-count]:has-text("15 edges match")')
            ids: list[str] = page.evaluate(SHOWN_IDS)
            return ids

        ids = await browser.call(filtered)
        assert any(q.get("selector") == ["region=eu"] for q in queries(fleet_requests)), fleet_requests
        assert ids and all(int(i.split("-")[1]) % 2 == 0 for i in ids), ids
        assert page_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_bad_selector_shows_the_servers_message_under_the_field(browser: Browser) -> None:
    """A selector the server rejects (400 invalid_selector) shows its message under the field, and no rows."""
    cp, _ = await small_fleet(browser, size=4)
    try:
        page = browser.page

        def rejected() -> dict[str, Any]:
            field = 'iop-fleet-overview input[data-filter="selector"]'
            page.fill(field, "region in (eu")
            page.press(field, "Enter")
            page.wait_for_selector("iop-fleet-overview [data-selector-error]:not([hidden])")
            return {
                "message": page.inner_text("iop-fleet-overview [data-selector-error]"),
                "invalid": page.get_attribute(field, "aria-invalid"),
                "rows": page.evaluate(DOM_ROWS),
            }

        seen = await browser.call(rejected)
        code, body = await cp.get_json("/fleet/status?selector=region+in+%28eu")
        assert code == 400 and body["error"]["code"] == "invalid_selector"
        assert seen["message"] == body["error"]["message"], seen
        assert seen["invalid"] == "true" and seen["rows"] == 0, seen
    finally:
        await cp.stop()
