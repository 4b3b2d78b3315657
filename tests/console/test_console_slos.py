"""The SLOs panel against a real Control Plane: empty, it says "No SLOs."; with two SLOs put over
the API and a scripted edge whose engine answers at 1 s against a 0.5 s objective, the missed
SLO's row shows its objective, its spent budget and its page alert firing, highlighted, and the
untouched one shows its whole budget and no alert; a failing ``GET /slos`` shows the error."""

from __future__ import annotations

import json
from typing import Any

import pytest
import pytest_twisted
import treq
from iop_console_browser import Browser, page_errors

from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.latency import LatencyEngine
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge

pytestmark = pytest.mark.browser

PANEL = "iop-slos"
#: Evaluated ten times a second; a one-hour window scales the page alert's windows to 5 s and 0.42 s.
CONFIG = """
slos:
  interval_seconds: 0.1
status:
  fleet_max_age_seconds: 0.05
"""
MISSED = {
    "metric": "ttft",
    "percentile": 95,
    "objective_seconds": 0.5,
    "model": "llama-3-8b",
    "edge_selector": "region=eu",
    "window": "1h",
}
UNTOUCHED = {"metric": "error_ratio", "objective_ratio": 0.01, "model": "other-model", "window": "1h"}


async def _put_slo(cp: ControlPlaneHarness, name: str, body: dict[str, Any]) -> None:
    response = await treq.put(cp.http_url + f"/slos/{name}", json=body)
    assert response.code == 201, await response.text()


async def _page_state(cp: ControlPlaneHarness) -> str:
    code, slo = await cp.get_json("/slos/chat-ttft")
    assert code == 200, slo
    return str(next(a["state"] for a in slo["alerts"] if a["name"] == "page"))


@pytest_twisted.ensureDeferred
async def test_slos_show_objective_budget_and_the_firing_alert(browser: Browser) -> None:
    """No SLO: the empty state. Then chat-ttft (missed) is highlighted with "page firing" and a
    spent budget, chat-errors shows 100% and no alert; a 503 from GET /slos shows its code."""
    cp = await start_control_plane(config_text=CONFIG)
    edge: ScriptedEdge | None = None
    try:
        page = browser.page

        def empty() -> str:
            page.goto(cp.http_url + "/console/")
            return str(page.inner_text(f"{PANEL} [data-empty]"))

        assert await browser.call(empty) == "No SLOs."

        await _put_slo(cp, "chat-ttft", MISSED)
        await _put_slo(cp, "chat-errors", UNTOUCHED)
        engine = LatencyEngine(ttft=1.0)
        edge, answer = await connect_edge(cp.edge_wire_port, "edge-eu-1", labels={"region": "eu"})
        assert answer is not None and answer.accepted
        edge.status = lambda: engine.status("edge-eu-1")

        async def firing() -> bool:
            return await _page_state(cp) == "firing"

        await eventually(firing, timeout=15, interval=0.05, message="the page fires")

        def rows() -> dict[str, dict[str, str]]:
            page.reload()
            page.wait_for_selector(f'{PANEL} tr[data-slo="chat-ttft"][data-firing]')
            shown = {}
            for name in ("chat-ttft", "chat-errors"):
                row = f'{PANEL} tr[data-slo="{name}"]'
                shown[name] = {
                    "name": page.inner_text(f"{row} td:first-child"),
                    "metric": page.inner_text(f"{row} [data-metric]"),
                    "objective": page.inner_text(f"{row} [data-objective]"),
                    "budget": page.inner_text(f"{row} [data-budget]"),
                    "alerts": " ".join(page.inner_text(f"{row} [data-alerts]").split()),
                    "firing": page.get_attribute(row, "data-firing") or "",
                    "background": page.eval_on_selector(f"{row} td", "td => getComputedStyle(td).backgroundColor"),
                }
            return shown

        shown = await browser.call(rows)
        missed, untouched = shown["chat-ttft"], shown["chat-errors"]
        assert missed["name"] == "chat-ttft" and missed["metric"] == "ttft p95" and missed["objective"] == "<= 500 ms"
        assert "page firing" in missed["alerts"] and "page" in missed["firing"].split()
        assert missed["budget"].endswith("%") and missed["budget"] != "100%"
        untouched_background = untouched.pop("background")
        assert untouched == {
            "name": "chat-errors",
            "metric": "error_ratio",
            "objective": "<= 1% errors",
            "budget": "100%",
            "alerts": "none",
            "firing": "",
        }
        assert missed["background"] != untouched_background  # the firing row is highlighted
        code, slo = await cp.get_json("/slos/chat-ttft")
        assert code == 200 and slo["error_budget_remaining"] < 1

        def failing() -> str:
            page.route(
                "**/slos",
                lambda route: route.fulfill(
                    status=503,
                    content_type="application/json",
                    body=json.dumps({"error": {"code": "unavailable", "message": "down for a test"}}),
                ),
            )
            page.reload()
            page.wait_for_selector(f"{PANEL} [data-error]:not([hidden])")
            return str(page.inner_text(f"{PANEL} [data-error]"))

        assert await browser.call(failing) == "unavailable: down for a test"
        assert all("503" in e for e in page_errors(browser))
    finally:
        if edge is not None:
            edge.tcp.loseConnection()
        await cp.stop()
