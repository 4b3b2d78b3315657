"""The console shows every fleet state truly, fits the screen and spares the Control Plane.

Headless Chromium against a real Control Plane with scripted edges: a
frozen edge (status timeout), an edge that goes away (503, then 409 with the
stale snapshot), the page width at common screen sizes, the node choice and
the readable result of the command form, and how often the fleet view is
re-fetched while an edge emits a burst of events.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser
from twisted.internet import reactor, task

from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.wires.peers import CATALOG, connect_edge, set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.browser

#: A short status deadline, so a frozen edge shows as timed out quickly.
FAST_TIMEOUT = "http:\n  status_timeout_seconds: 1\n"
#: Page widths that must not scroll sideways.
WIDTHS = (1280, 1400, 1920)
#: Node ids are often host names: long, and without a place to break.
LONG_NODE = "gpu-node-17.rack-4.eu-west-2.inference-cluster.example.internal"


def long_named_nodes() -> pb.EdgeStatusResponse:
    """The scripted snapshot with node-2 named like a fully qualified host."""
    response = snapshot("edge-a")
    response.nodes[1].node_id = LONG_NODE
    response.nodes[1].providers[0].health_reason = "probe-failed:" + "x" * 60
    # With every engine column and badge filled: the widest row there is.
    set_engine(response.nodes[1].providers[0], saturated=True, cooling_down=True, tokens_per_second=12345.6)
    return response


def unexpected_errors(browser: Browser) -> list[str]:
    """Console errors other than Chromium's note on each HTTP error answer (which these tests cause on purpose)."""
    return [e for e in browser.console_errors if not e.startswith("Failed to load resource")]


#: Records every iop-edge-loaded event with what the panel showed at that moment.
RECORD_EDGE_LOADS = """() => {
  window.__edgeLoads = [];
  document.addEventListener('iop-edge-loaded', (e) => window.__edgeLoads.push({
    code: e.detail.error ? e.detail.error.code : null,
    stale: e.detail.stale,
    nodes: (e.detail.status && e.detail.status.nodes || []).map((n) => n.node_id),
    text: e.target.shadowRoot.querySelector('[data-body]').innerText,
  }));
}"""


@pytest_twisted.ensureDeferred
async def test_frozen_edge_shows_timed_out_with_reason_and_stale_snapshot(browser: Browser) -> None:
    """An edge that stops answering shows as timed out with the reason; its panel keeps the last snapshot, stale."""
    cp = await start_control_plane(config_text=FAST_TIMEOUT)
    frozen = {"on": False}
    try:
        edge, _ = await connect_edge(
            cp.edge_wire_port, "edge-a", status=lambda: None if frozen["on"] else snapshot("edge-a")
        )
        page = browser.page

        def loaded() -> None:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-a"][data-state="ok"]')
            page.wait_for_selector('iop-edge-detail tr[data-node="node-2"][data-connected="true"]')
            page.wait_for_selector('iop-event-stream [data-state="live"]')

        await browser.call(loaded)
        frozen["on"] = True
        edge.event("node.ready", node_id="node-1", message="a state change makes every panel re-fetch")

        def timed_out() -> tuple[str, str]:
            row = 'iop-fleet-overview button[data-edge="edge-a"][data-state="timeout"]'
            page.wait_for_selector(row)
            page.wait_for_selector('iop-edge-detail [data-notice="edge_timeout"]')
            page.wait_for_selector('iop-edge-detail table[data-stale="true"] tr[data-node="node-1"]')
            return page.inner_text(row), page.inner_text("iop-edge-detail section")

        row_text, panel_text = await browser.call(timed_out)
        code, fleet = await cp.get_json("/fleet/status")
        assert code == 200
        (item,) = fleet["items"]
        assert item["state"] == "timeout" and item["error"]["code"] == "edge_timeout"
        assert "timed out" in row_text and item["error"]["message"] in row_text
        assert "[object Object]" not in row_text
        assert "did not answer in time" in panel_text and "stale" in panel_text
        assert "node-1" in panel_text and "node-2" in panel_text
        assert "No nodes are configured" not in panel_text
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_edge_gone_shows_reason_and_last_snapshot(browser: Browser) -> None:
    """A status request cut by the edge leaving (503), then the edge not connected (409): reason and stale nodes."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        page = browser.page

        def hosted() -> None:
            page.goto(cp.http_url + "/console/")
            page.evaluate(RECORD_EDGE_LOADS)
            page.evaluate(
                """() => { document.body.innerHTML =
                  '<iop-edge-detail edge-id="edge-a" refresh-interval="0"></iop-edge-detail>'; }"""
            )
            page.wait_for_selector('iop-edge-detail table[data-stale="false"] tr[data-node="node-2"]')
            page.wait_for_function("() => window.__edgeLoads.length > 0")

        await browser.call(hosted)
        edge.hold_status = True
        before = edge.status_requests
        await browser.call(lambda: page.evaluate("() => { document.querySelector('iop-edge-detail').refresh(); }"))
        await eventually(lambda: edge.held, message="the status request reached the edge")
        assert edge.status_requests == before + 1
        assert edge.transport is not None
        edge.tcp.loseConnection()

        def gone() -> list[dict[str, Any]]:
            page.wait_for_function("() => window.__edgeLoads.some((l) => l.code === 'edge_disconnected')")
            page.wait_for_function("() => window.__edgeLoads.some((l) => l.code === 'edge_not_connected')")
            page.wait_for_selector('iop-edge-detail [data-notice="edge_not_connected"]')
            loads: list[dict[str, Any]] = page.evaluate("() => window.__edgeLoads")
            return loads

        loads = await browser.call(gone)
        failed = [load for load in loads if load["code"]]
        assert {load["code"] for load in failed} == {"edge_disconnected", "edge_not_connected"}
        for load in failed:
            assert load["stale"] is True and load["nodes"] == ["node-1", "node-2"], load
            assert "No nodes are configured" not in load["text"]
            assert "stale" in load["text"] and "node-2" in load["text"]
        went_away = next(load for load in failed if load["code"] == "edge_disconnected")
        assert "went away" in went_away["text"]
        not_connected = next(load for load in failed if load["code"] == "edge_not_connected")
        assert "Not connected" in not_connected["text"]
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_layout_fits_common_widths(browser: Browser, tmp_path: Path) -> None:
    """With a fleet, an edge, operations and a command result, the page never scrolls sideways."""
    cp = await start_control_plane(config_text=FAST_TIMEOUT)
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", status=long_named_nodes)
        await connect_edge(cp.edge_wire_port, "edge-frozen-with-a-rather-long-identifier", status=lambda: None)
        edge.event("node.ready", node_id=LONG_NODE, message="ready:" + "y" * 120)
        page = browser.page

        def filled() -> None:
            page.set_viewport_size({"width": WIDTHS[0], "height": 900})
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-fleet-overview button[data-state="timeout"]')
            page.wait_for_selector(f'iop-edge-detail tr[data-node="{LONG_NODE}"][data-connected="true"]')
            page.select_option("iop-command-form select#cmd-name", "node.drain")
            page.wait_for_selector(f'iop-command-form select#cmd-target option[value="{LONG_NODE}"]', state="attached")
            page.select_option("iop-command-form select#cmd-target", LONG_NODE)
            page.fill("iop-command-form input#cmd-key", "a-long-idempotency-key-" + "x" * 60)
            page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="succeeded"]')
            page.wait_for_selector('iop-operations tr[data-state="succeeded"]')

        await browser.call(filled)

        def width_at(width: int) -> dict[str, int]:
            page.set_viewport_size({"width": width, "height": 900})
            sizes: dict[str, int] = page.evaluate(
                "() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
            )
            page.screenshot(path=str(tmp_path / f"console-{width}.png"), full_page=True, animations="disabled")
            return sizes

        for width in WIDTHS:
            sizes = await browser.call(width_at, width)
            assert sizes["inner"] == width
            assert sizes["scroll"] <= sizes["inner"], (width, sizes)
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()


#: A catalog with an argument spec, next to the scripted edge's node and edge commands.
CATALOG_WITH_ARGUMENTS = [
    *CATALOG,
    pb.CommandSpec(
        name="node.disconnect",
        description="Close a node's connection",
        target_kind="node",
        arguments=[pb.CommandArgumentSpec(name="reason", description="why, for the audit", required=True)],
    ),
]

#: What the command form shows of its last operation.
OUTCOME = """() => {
  const box = document.querySelector('iop-command-form').shadowRoot.querySelector('.outcome');
  const pairs = (sel) => Array.from(box.querySelectorAll(sel + ' dt')).map((dt) => [dt.innerText, dt.nextElementSibling.innerText]);
  return {state: box.dataset.state, text: box.innerText, operation: pairs('dl[aria-label="Operation"]'),
          result: pairs('dl[data-result]'), late: !!box.querySelector('[data-late-outcome]'),
          replayed: !!box.querySelector('[data-replayed-note]')};
}"""


@pytest_twisted.ensureDeferred
async def test_command_form_node_choice_and_readable_result(browser: Browser) -> None:
    """Node targets are a choice of the edge's nodes; arguments stay; the result is a key/value list as the server sent it."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", catalog=CATALOG_WITH_ARGUMENTS)
        page = browser.page

        def node_choice() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.select_option("iop-command-form select#cmd-name", "node.drain")
            page.wait_for_selector('iop-command-form select#cmd-target option[value="node-2"]', state="attached")
            options: list[str] = page.eval_on_selector_all(
                "iop-command-form select#cmd-target option", "(os) => os.map((o) => o.value)"
            )
            page.select_option("iop-command-form select#cmd-name", "edge.diagnostics")
            page.wait_for_selector("iop-command-form #cmd-target", state="detached")
            page.select_option("iop-command-form select#cmd-name", "node.disconnect")
            page.wait_for_selector('iop-command-form select#cmd-target option[value="node-1"]', state="attached")
            argument = page.inner_text("iop-command-form [data-params]")
            page.select_option("iop-command-form select#cmd-target", "node-1")
            page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="bad_request"]')
            missing = page.inner_text("iop-command-form .outcome")
            page.fill('iop-command-form input[data-arg="reason"]', "maintenance")
            with page.expect_response(
                lambda r: r.url.endswith("/edges/edge-a/commands") and r.request.method == "POST"
            ) as answer:
                page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="succeeded"]')
            shown: dict[str, Any] = page.evaluate(OUTCOME)
            return {
                "options": options,
                "argument": argument,
                "missing": missing,
                "sent": answer.value.json(),
                "shown": shown,
            }

        seen = await browser.call(node_choice)
        assert seen["options"] == ["node-1", "node-2"]
        assert "reason" in seen["argument"] and "why, for the audit" in seen["argument"]
        assert "argument reason is required" in seen["missing"]
        (sent,) = edge.commands_seen
        assert (sent.name, sent.target, dict(sent.arguments)) == (
            "node.disconnect",
            "node-1",
            {"reason": "maintenance"},
        )
        operation, shown = seen["sent"], seen["shown"]
        assert shown["state"] == operation["state"] == "succeeded"
        assert dict(shown["operation"])["Target"] == "node-1"
        assert dict(shown["operation"])["Operation"] == operation["operation_id"]
        assert shown["result"] == [[k, v] for k, v in operation["result"].items()] == [["target", "node-1"]]
        assert "target=node-1" not in shown["text"]
        assert shown["late"] == (operation.get("late_outcome") is not None)
        assert shown["replayed"] == (operation.get("replayed") is True)

        # The same idempotency key twice: the second answer is the first operation.
        def twice() -> list[tuple[dict[str, Any], dict[str, Any]]]:
            page.select_option("iop-command-form select#cmd-name", "edge.diagnostics")
            page.fill("iop-command-form input#cmd-key", "once-only")
            answers = []
            for _ in range(2):
                with page.expect_response(
                    lambda r: r.url.endswith("/edges/edge-a/commands") and r.request.method == "POST"
                ) as answer:
                    page.click("iop-command-form button[type=submit]")
                body = answer.value.json()
                page.wait_for_function(
                    "(id) => document.querySelector('iop-command-form').shadowRoot.querySelector('.outcome')?.innerText.includes(id)",
                    arg=body["operation_id"],
                )
                answers.append((body, page.evaluate(OUTCOME)))
            return answers

        (first, first_shown), (second, second_shown) = await browser.call(twice)
        assert first["operation_id"] == second["operation_id"]
        assert [c.name for c in edge.commands_seen].count("edge.diagnostics") == 1
        for body, shown in ((first, first_shown), (second, second_shown)):
            assert shown["replayed"] == (body.get("replayed") is True)
            assert shown["late"] == (body.get("late_outcome") is not None)
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_late_answer_shown_as_the_server_reports_it(browser: Browser) -> None:
    """A command that timed out and was answered later shows the late outcome the server reports."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", command_behaviour="hold")
        page = browser.page

        def timed_out() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.select_option("iop-command-form select#cmd-name", "edge.diagnostics")
            page.fill("iop-command-form input#cmd-timeout", "1")
            page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="timed_out"]')
            shown: dict[str, Any] = page.evaluate(OUTCOME)
            return shown

        shown = await browser.call(timed_out)
        assert "edge_timeout" in shown["text"] and dict(shown["operation"])["State"] == "timed_out"
        edge.answer_held(late="yes")
        # Frames of one connection are read in order: once this event is recorded, so is the late answer.
        edge.event("test.marker", message="after the late answer")

        async def marker_recorded() -> bool:
            _, events = await cp.get_json("/edges/edge-a/events?since=0&limit=1000")
            return any(e["kind"] == "test.marker" for e in events["items"])

        await eventually(marker_recorded, message="the marker event")
        code, page_json = await cp.get_json("/edges/edge-a/operations")
        assert code == 200
        (operation,) = page_json["items"]
        assert operation["state"] == "timed_out"
        assert operation["late_outcome"]["result"] == {"late": "yes"}

        def listed() -> bool:
            page.evaluate("() => document.querySelector('iop-operations').refresh()")
            row = page.wait_for_selector('iop-operations tr[data-state="timed_out"]')
            return row.query_selector("[data-late-outcome]") is not None

        assert await browser.call(listed) is True
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_event_burst_does_not_flood_fleet_status(browser: Browser) -> None:
    """50 events in ten groups over about three seconds cause a handful of /fleet/status fetches, and the final state shows."""
    cp = await start_control_plane()
    nodes_up = {"node-2": True}

    def status() -> pb.EdgeStatusResponse:
        response = snapshot("edge-a")
        for node in response.nodes:
            node.connected = nodes_up.get(node.node_id, True)
        return response

    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", status=status)
        page = browser.page
        fleet_requests: list[str] = []

        def loaded() -> None:
            page.on("request", lambda r: fleet_requests.append(r.url) if "/fleet/status" in r.url else None)
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-a"][data-state="ok"]')
            page.wait_for_selector("iop-fleet-overview [data-live] .dot.ok")
            page.evaluate("() => 0")  # deliver pending request events before counting
            fleet_requests.clear()

        await browser.call(loaded)
        for group in range(10):
            if group == 9:
                nodes_up["node-2"] = False
            for i in range(5):
                edge.event(
                    "node.ready" if group < 9 or i < 4 else "node.disconnected", node_id="node-2", message=str(i)
                )
            # Groups are spaced wider than a short debounce, so only throttling keeps the fetches few.
            await task.deferLater(reactor, 0.3, lambda: None)

        def final() -> int:
            page.wait_for_selector(
                'iop-fleet-overview button[data-edge="edge-a"]:has-text("nodes 1/2")', timeout=10_000
            )
            return len(fleet_requests)

        count = await browser.call(final)
        code, fleet = await cp.get_json("/fleet/status")
        assert code == 200 and fleet["items"][0]["nodes_connected"] == 1
        assert 1 <= count <= 5, count
        assert unexpected_errors(browser) == []
    finally:
        await cp.stop()
