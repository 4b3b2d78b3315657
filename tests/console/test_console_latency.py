"""The console shows latency: TTFT and TPOT p95 columns in the edge table, and the figures
beside the capacity bars of the fleet list; at 1440 px the edge table needs no sideways
scroll and every figure of the fleet list shows whole.

A real Control Plane with one scripted edge whose snapshot has wide figures: two nodes of
providers with 24 of 64 leases in flight, engine readings, a launched engine, and latency
sketches as an Edge records them.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors
from labelled_edges import MANY_EDGES_CONFIG, connect_fleet

from twisted_iop.edge.inference.latency import OK, LatencyRecorder
from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.wires.peers import set_engine, set_launch, snapshot
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.browser

#: Every figure of the fleet list and the edge table that must show whole, and the edge table's fit.
MEASURE = """() => {
  const fleet = document.querySelector('iop-fleet-overview').shadowRoot;
  const cut = [];
  const whole = (el) => {
    // Clipped by its own box, or reaching past an ancestor that hides overflow.
    if (el.scrollWidth > el.clientWidth + 1) return false;
    const right = el.getBoundingClientRect().right;
    for (let p = el.parentElement; p; p = p.parentElement) {
      const style = getComputedStyle(p);
      if (style.overflowX !== 'visible' && right > p.getBoundingClientRect().right + 1) return false;
    }
    return true;
  };
  for (const el of fleet.querySelectorAll('.stat b, .sub > span, .name')) {
    if (!whole(el)) cut.push(el.textContent.trim());
  }
  const detail = document.querySelector('iop-edge-detail').shadowRoot;
  const scroll = detail.querySelector('.scroll');
  const row = detail.querySelector('tr[data-provider="p-1"]');
  return {
    cut,
    table: {scroll: scroll.scrollWidth, client: scroll.clientWidth},
    page: {scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth},
    ttft: row.querySelector('[data-ttft-p95]').textContent.trim(),
    tpot: row.querySelector('[data-tpot-p95]').textContent.trim(),
    headers: detail.querySelector('thead').innerText,
    widths: [...row.children].map((td) => [td.getBoundingClientRect().width, td.textContent.trim().slice(0, 30)]),
    card: fleet.querySelector('button[data-edge="edge-a"] [data-latency]').textContent.trim(),
  };
}"""


def wide_snapshot(edge_id: str) -> pb.EdgeStatusResponse:
    """Two nodes of two providers each, every figure wide: 24/64 in flight, engines, a launch, latency."""
    response = snapshot(edge_id, nodes=2, capacity=64)
    recorder = LatencyRecorder(0.0)
    for _ in range(40):
        recorder.request_ended("llama-3-8b", "n", "p", OK, 100.0, 100.412, 102.9, 101)  # TTFT 412 ms, TPOT 24.9 ms
    latency = recorder.provider_latency("n", "p", 103.0)
    assert latency is not None
    for number, node in enumerate(response.nodes):
        first = node.providers[0]
        first.provider_id = f"p-{2 * number + 1}"
        node.providers.add().CopyFrom(first)
        node.providers[1].provider_id = f"p-{2 * number + 2}"
        for provider in node.providers:
            provider.in_flight, provider.queued = 24, 12
            provider.long_context_capacity, provider.long_context_in_flight, provider.long_context_queued = 16, 8, 4
            provider.models[:] = ["llama-3-8b", "qwen-2-7b"]
            set_engine(provider, running=24, waiting=12, tokens_per_second=1234.5)
            provider.latency.CopyFrom(latency)
        set_launch(node.providers[1], state=pb.ENGINE_STATE_READY, reason="", restarts=2, next_try_at_ms=0, pid=4242)
    return response


@pytest_twisted.ensureDeferred
async def test_latency_shows_and_the_views_fit_1440_px(browser: Browser) -> None:
    """TTFT and TPOT p95 in the edge table and the fleet card; no sideways scroll at 1440 px; no figure cut."""
    cp = await start_control_plane(config_text=MANY_EDGES_CONFIG)
    try:
        edges = await connect_fleet(cp.edge_wire_port, {"edge-a": {"region": "eu-west-1", "site": "lab"}})
        edges["edge-a"].status = lambda: wide_snapshot("edge-a")
        await eventually(lambda: cp.registry.get("edge-a").connected, message="the edge connected")
        page = browser.page

        def measured() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-edge-detail tr[data-provider="p-1"] [data-ttft-p95]')
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-a"] [data-latency]')
            shown: dict[str, Any] = page.evaluate(MEASURE)
            return shown

        shown = await browser.call(measured)
        assert shown["ttft"].endswith(" ms") and abs(float(shown["ttft"][:-3]) - 412) <= 412 * 0.02 + 1, shown
        assert shown["tpot"].endswith(" ms") and 24 <= float(shown["tpot"][:-3]) <= 26, shown
        assert "TTFT p95" in shown["headers"] and "TPOT p95" in shown["headers"], shown
        assert shown["card"].startswith("TTFT p95 "), shown
        assert shown["table"]["scroll"] <= shown["table"]["client"], " | ".join(
            f"{w:.0f}" for w, _ in shown["widths"]
        )  # no sideways scroll
        assert shown["page"]["scroll"] <= shown["page"]["client"], shown
        assert shown["cut"] == [], shown
        assert page_errors(browser) == []
    finally:
        await cp.stop()
