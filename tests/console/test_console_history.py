"""The console's capacity charts draw the real history, live.

Headless Chromium against a real Control Plane sampling every 0.5 s and
three scripted edges whose in-flight and queued counts, and whose
providers' latency (TTFT and TPOT sketches of the last answers), move with
every status answer. The fleet chart (left) and the selected edge's chart
must draw exactly the values the Control Plane sampled (each SVG path
carries the values it draws; the latency lane in ms), new points must
appear without a reload, and the range picker, model picker and tooltip
must work. Its screenshot stays in the test's temporary directory
(docs/console.md's pictures are test_console_screenshots.py's).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors

from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.latency import LatencyFeed
from twisted_iop.testing.wires.peers import connect_edge, set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.browser

#: Samples every 0.5 s; 5 s and 50 s tiers.
HISTORY = (
    "history:\n  interval_seconds: 0.5\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 5, keep_hours: 2}\n  - {step_seconds: 50, keep_hours: 24}\n"
)
#: What the fleet chart's general lane draws, by field.
GENERAL = ("capacity", "in_flight", "queued")
#: What its latency lane (in ms) and its requests lane draw.
LATENCY = ("ttft_p95", "tpot_p95")
REQUESTS = ("requests_per_second",)


def busy_edge(edge_id: str, phase: float) -> Any:
    """A status function: two nodes of capacity 8 whose work rises and falls with each answer."""
    answers = {"n": 0}
    feed = LatencyFeed()

    def status() -> pb.EdgeStatusResponse:
        answers["n"] += 1
        wave = math.sin(answers["n"] / 4 + phase)
        feed.new_window()
        feed.requests(ttft=[0.2 + 0.1 * wave + 0.01 * i for i in range(12)], tpot=[0.03 + 0.01 * wave] * 12)
        response = snapshot(edge_id, capacity=8)
        for node in response.nodes:
            provider = node.providers[0]
            provider.in_flight = max(0, round(5 + 3 * wave))
            provider.queued = max(0, round(2 * wave + 1))
            provider.long_context_in_flight = 1 if wave > 0 else 0
            provider.long_context_queued = 1 if wave > 0.6 else 0
            set_engine(provider, running=provider.in_flight, waiting=provider.queued, tokens_per_second=40 + 10 * wave)
            provider.latency.CopyFrom(feed.message())
        response.nodes[1].providers[0].models.append("qwen-2-7b")
        return response

    return status


CHART_STATE = """(selector) => {
  const chart = document.querySelector(selector);
  const view = chart && chart.view;
  if (!view) return null;
  const lines = {};
  for (const path of chart.shadowRoot.querySelectorAll('path[data-field]')) {
    lines[path.dataset.field] = {
      values: path.dataset.values ? path.dataset.values.split(',').map(Number) : [],
      commands: (path.getAttribute('d').match(/[ML]/g) || []).length,
    };
  }
  const legend = {};
  for (const b of chart.shadowRoot.querySelectorAll('[data-last]')) legend[b.dataset.last] = b.textContent;
  return {view, lines, legend, title: chart.shadowRoot.querySelector('#history-title').textContent};
}"""


def drawn_matches_view(state: dict[str, Any]) -> None:
    """Each path of the general, latency and requests lanes carries, and draws, the view's values
    of its field: the latency in ms (on a rolled-up tier its max: p95s do not average), the others as they are."""
    view = state["view"]
    for field in (*GENERAL, *LATENCY, *REQUESTS):
        part = "max" if field in LATENCY else "mean"
        at = view["columns"].index(f"{field}.{part}" if view["rolled_up"] else field)
        expected = [p[at] * (1000 if field in LATENCY else 1) for p in view["points"] if p[at] is not None]
        assert state["lines"][field]["values"] == pytest.approx(expected, abs=1e-3), field
        assert state["lines"][field]["commands"] == len(expected), field


@pytest_twisted.ensureDeferred
async def test_history_charts_draw_the_sampled_values_live(browser: Browser, tmp_path: Path) -> None:
    """The fleet and edge charts draw what the Control Plane sampled; new points appear; pickers and tooltip work."""
    cp = await start_control_plane(config_text=HISTORY)
    try:
        for index, edge_id in enumerate(("edge-a", "edge-b", "edge-c")):
            await connect_edge(cp.edge_wire_port, edge_id, status=busy_edge(edge_id, index * 1.3))
        history = cp.service.history
        await eventually(lambda: history.samples >= 16, timeout=20, message="16 samples")
        page = browser.page

        def opened() -> Any:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-history-chart[scope="fleet"] path[data-field="in_flight"]')
            page.wait_for_selector('#edge-area iop-history-chart path[data-field="in_flight"]')
            return page.evaluate(CHART_STATE, 'iop-history-chart[scope="fleet"]')

        fleet = await browser.call(opened)
        drawn_matches_view(fleet)
        assert not fleet["view"]["rolled_up"] and len(fleet["view"]["points"]) >= 10
        assert fleet["title"] == "Fleet capacity"
        # The values are the ones the Control Plane sampled: the same points as its own view's.
        code, api = await cp.get_json("/fleet/history?from=-1h&step=0.5&series=capacity,in_flight,queued")
        assert code == 200
        sampled = {p[0]: p[1:] for p in api["points"]}
        view = fleet["view"]
        places = [view["columns"].index(f) for f in GENERAL]
        for point in view["points"]:
            assert [point[i] for i in places] == sampled[point[0]]
        assert max(fleet["lines"]["in_flight"]["values"]) > min(fleet["lines"]["in_flight"]["values"])
        assert set(fleet["lines"]["capacity"]["values"]) == {48}
        # The latency lane: the fleet's p95s (every edge's sketches merged), moving, in ms.
        code, api = await cp.get_json(f"/fleet/history?from=-1h&step=0.5&series={','.join(LATENCY)}")
        assert code == 200
        sampled = {p[0]: p[1:] for p in api["points"]}
        drawn = [point[view["columns"].index("ttft_p95")] for point in view["points"]]
        assert drawn == [sampled[point[0]][0] for point in view["points"]]
        ttfts = fleet["lines"]["ttft_p95"]["values"]
        assert ttfts and 100 < min(ttfts) < max(ttfts) < 450  # 0.1 .. 0.41 s
        assert fleet["legend"]["ttft_p95"].endswith(" ms") and fleet["legend"]["requests_per_second"].endswith("/s")

        edge = await browser.call(page.evaluate, CHART_STATE, "#edge-area iop-history-chart")
        drawn_matches_view(edge)
        assert edge["title"] == "Edge edge-a capacity" and edge["view"]["series"] == "edge:edge-a"

        # Live: later points appear without a reload.
        seen = len(fleet["lines"]["in_flight"]["values"])

        def grew() -> Any:
            page.wait_for_function(
                """([selector, seen]) => {
                  const path = document.querySelector(selector).shadowRoot.querySelector('path[data-field="in_flight"]');
                  return path.dataset.values.split(',').length > seen;
                }""",
                arg=['iop-history-chart[scope="fleet"]', seen],
            )
            return page.evaluate(CHART_STATE, 'iop-history-chart[scope="fleet"]')

        later = await browser.call(grew)
        drawn_matches_view(later)

        def pickers() -> tuple[Any, Any, str]:
            chart = page.locator("#edge-area iop-history-chart")
            chart.locator('button[data-range="6h"]').click()
            page.wait_for_selector('#edge-area iop-history-chart button[data-range="6h"][aria-pressed="true"]')
            page.wait_for_function("() => document.querySelector('#edge-area iop-history-chart').range === '6h'")
            chart.locator("select[data-model]").select_option("qwen-2-7b")
            page.wait_for_function(
                "() => document.querySelector('#edge-area iop-history-chart').view.series === 'edge:edge-a/model:qwen-2-7b'"
            )
            state = page.evaluate(CHART_STATE, "#edge-area iop-history-chart")
            fleet_chart = page.locator('iop-history-chart[scope="fleet"] [data-lane="general"] svg')
            fleet_chart.scroll_into_view_if_needed()
            box = fleet_chart.bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.8, box["y"] + box["height"] / 2)
            tip = page.locator('iop-history-chart[scope="fleet"] .tip').inner_text()
            return state, box, tip

        model, _, tip = await browser.call(pickers)
        drawn_matches_view(model)
        assert model["title"] == "Edge edge-a capacity · qwen-2-7b"
        assert set(model["lines"]["capacity"]["values"]) == {8}  # one provider of the edge serves qwen-2-7b
        assert "in flight" in tip and "capacity" in tip

        def latency_tip() -> str:
            lane = page.locator('iop-history-chart[scope="fleet"] [data-lane="latency"] svg')
            lane.scroll_into_view_if_needed()
            box = lane.bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.9, box["y"] + box["height"] / 2)
            return str(page.locator('iop-history-chart[scope="fleet"] [data-lane="latency"] .tip').inner_text())

        tip = await browser.call(latency_tip)
        assert "TTFT" in tip and "TPOT" in tip and " ms" in tip

        screenshot = tmp_path / "console-history.png"

        def shoot() -> None:
            page.locator("#edge-area iop-history-chart select[data-model]").select_option("")
            page.locator('#edge-area iop-history-chart button[data-range="1h"]').click()
            page.wait_for_function(
                "() => document.querySelector('#edge-area iop-history-chart').view.series === 'edge:edge-a'"
            )
            page.mouse.move(1, 1)
            page.screenshot(path=str(screenshot), full_page=False)

        await browser.call(shoot)
        assert screenshot.stat().st_size > 10_000
        assert page_errors(browser) == []
    finally:
        await cp.stop()
