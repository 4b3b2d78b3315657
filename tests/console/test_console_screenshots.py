"""The console on a busy fleet: what docs/console.md's pictures show.

A real Control Plane whose store holds an hour of capacity history, sampled
on a fake clock from the same fleet (tests/console/busy_fleet.py), and
three scripted edges in two regions on the real edge wire: ten GPU nodes
serving vLLM, SGLang and llama.cpp engines, busy, one provider degraded.
A node is drained from the HTTP API and a rollout runs on every edge, so
the operations and rollouts panels have something to say. Headless
Chromium must show it all: the totals, every edge connected, the drained
and degraded rows, both capacity charts with the hour's points, events.
With IOP_UPDATE_SCREENSHOT=1 it writes docs/console.png and
docs/console-history.png; otherwise its shots go to the test's temporary
directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from busy_fleet import (
    HISTORY_SPAN_SECONDS,
    SHAPES,
    busy_edges,
    connect_busy_fleet,
    relay_recent_events,
    seed_history,
)
from iop_console_browser import DOCS, Browser, page_errors
from twisted.internet import reactor

from twisted_iop.testing.harness import start_control_plane

pytestmark = pytest.mark.browser

SELECTED = "edge-eu-west-1"
DRAINED = "ams-gpu-03"
NODES = sum(len(shape.nodes) for shape in SHAPES)
#: Two SLOs, evaluated often enough to have a value within the test.
SLOS = """slos:
  interval_seconds: 0.5
  objectives:
    chat-ttft: {metric: ttft, percentile: 95, objective_seconds: 0.6, model: llama-3.1-8b-instruct}
    reasoning-ttft: {metric: ttft, percentile: 95, objective_seconds: 1.5, model: llama-3.1-70b-instruct}
    chat-errors: {metric: error_ratio, objective_ratio: 0.01, model: llama-3.1-8b-instruct, edge_selector: region=eu-west}
"""

#: Each chart's drawn values, by field, and the page's totals.
DRAWN = """() => {
  const chart = (selector) => {
    const lines = {};
    for (const path of document.querySelector(selector).shadowRoot.querySelectorAll('path[data-field]')) {
      lines[path.dataset.field] = path.dataset.values ? path.dataset.values.split(',').map(Number) : [];
    }
    return lines;
  };
  const totals = {};
  const overview = document.querySelector('iop-fleet-overview').shadowRoot;
  for (const stat of overview.querySelectorAll('[data-total]')) totals[stat.dataset.total] = stat.querySelector('b').textContent;
  return {fleet: chart('iop-history-chart[scope="fleet"]'), edge: chart('#edge-area iop-history-chart'), totals};
}"""


@pytest_twisted.ensureDeferred
async def test_console_on_a_busy_fleet(browser: Browser, tmp_path: Path) -> None:
    """Three busy edges with an hour of history: totals, rows, charts, operations, rollouts and events all show."""
    shots = DOCS if os.environ.get("IOP_UPDATE_SCREENSHOT") else tmp_path
    cp = await start_control_plane(config_text=SLOS)
    try:
        now = reactor.seconds()
        edges = busy_edges(started_at=now - 3 * 3600)
        history = cp.service.history
        samples = seed_history(cp.service.store, history.settings, edges, now)
        assert samples >= HISTORY_SPAN_SECONDS / history.settings.interval_seconds - 2
        scripted = await connect_busy_fleet(cp.edge_wire_port, edges, reactor.seconds)
        relay_recent_events(scripted[0], now)
        code, drained = await cp.post_json(
            f"/edges/{SELECTED}/commands",
            {"name": "node.drain", "target": DRAINED, "arguments": {"reason": "driver update"}},
        )
        assert code == 200 and drained["state"] == "succeeded", drained
        edges[SELECTED].drain(DRAINED)
        scripted[0].event("node.drained", node_id=DRAINED, message="node ams-gpu-03 drained")
        code, rollout = await cp.post_json(
            "/rollouts",
            {"command": {"name": "edge.diagnostics", "target": "", "arguments": {}}, "selector": "tier=prod"},
        )
        assert code in (200, 201, 202), rollout
        page = browser.page

        def shows_the_fleet() -> dict[str, Any]:
            page.goto(cp.http_url + f"/console/#edge={SELECTED}")
            for shape in SHAPES:
                page.wait_for_selector(f'iop-fleet-overview button[data-edge="{shape.edge_id}"][data-connected="true"]')
            for gpu in SHAPES[0].nodes:
                page.wait_for_selector(f'iop-edge-detail tr[data-node="{gpu.node_id}"][data-connected="true"]')
            page.wait_for_selector(f'iop-edge-detail tr[data-node="{DRAINED}"] ~ tr[data-status="drained"]')
            page.wait_for_selector('iop-operations tr[data-state="succeeded"]')
            page.click('iop-rollouts tr[data-rollout][data-state="succeeded"]')
            page.wait_for_selector('iop-rollouts [data-rollout-detail][data-state="succeeded"] [data-progress="100"]')
            page.wait_for_selector('iop-event-stream li[data-kind="node.drained"]')
            page.wait_for_selector('iop-event-stream [data-state="live"]')
            for slo in ("chat-ttft", "reasoning-ttft"):
                page.wait_for_function(
                    "(slo) => /[0-9]/.test(document.querySelector('iop-slos').shadowRoot"
                    ".querySelector(`tr[data-slo=${slo}] [data-value]`)?.textContent.trim() || '')",
                    arg=slo,
                )
            page.wait_for_selector('iop-history-chart[scope="fleet"] path[data-field="in_flight"][data-values]')
            page.wait_for_selector('#edge-area iop-history-chart path[data-field="in_flight"][data-values]')
            page.evaluate("window.scrollTo(0, 0)")
            page.mouse.move(1, 1)
            page.screenshot(path=str(shots / "console.png"), full_page=True, animations="disabled")
            page.screenshot(path=str(shots / "console-history.png"), full_page=False, animations="disabled")
            return dict(page.evaluate(DRAWN))

        shown = await browser.call(shows_the_fleet)
        assert shown["totals"] == {"edges": "3/3", "nodes": f"{NODES}/{NODES}"}
        # An hour of points: the fleet's every 15 s, the edge's every 30 s; in flight moves.
        for chart, least in (("fleet", 200), ("edge", 100)):
            for field in ("capacity", "in_flight", "queued", "ttft_p95", "requests_per_second"):
                assert len(shown[chart][field]) >= least, (chart, field)
            assert max(shown[chart]["in_flight"]) > min(shown[chart]["in_flight"]) > 0, chart
        for name in ("console.png", "console-history.png"):
            assert (shots / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert page_errors(browser) == []
    finally:
        await cp.stop()
