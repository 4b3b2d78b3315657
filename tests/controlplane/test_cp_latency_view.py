"""What the Control Plane shows of an edge's latency: each provider's p50/p95 within
the sketch's error, models and the edge merged exactly, null figures without
requests, and a peer's bad sketch left out with one warning, never a crash."""

from __future__ import annotations

import json
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogLevel, globalLogPublisher

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.http.latency_views import latency_json, merged_figures, snapshot_latency
from twisted_iop.controlplane.requests.fleet_rounds import FleetRound, StatusRow
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.edge.inference.latency import OK, LatencyRecorder
from twisted_iop.latency.sketch import RELATIVE_ERROR
from twisted_iop.testing import json_reference as reference
from twisted_iop.testing.harness import contract_validator
from twisted_iop.testing.provider_views import edge_status_body, shown_provider
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status, snapshot
from twisted_iop.wire import control_pb2 as pb

NOW = 1_000.0


def recorded(ttfts: list[float], tokens: int = 11, tpot: float = 0.02) -> pb.ProviderLatency:
    """The ProviderLatency an Edge sends after streamed requests with these TTFTs (each then
    ``tokens`` tokens ``tpot`` apart)."""
    recorder = LatencyRecorder(0.0)
    for ttft in ttfts:
        first = NOW - (tokens - 1) * tpot
        recorder.request_ended("m", "n", "p", OK, first - ttft, first, NOW, tokens)
    latency = recorder.provider_latency("n", "p", NOW)
    assert latency is not None
    return latency


def within(shown: float, exact: float) -> bool:
    """Whether a figure shown is within the sketch's stated error of the exact one."""
    return abs(shown - exact) <= exact * RELATIVE_ERROR + 1e-6


def test_a_provider_shows_its_quantiles_within_the_stated_error() -> None:
    """100 TTFTs of 10..1000 ms: p50 and p95 within 2 % of the exact ranks; TPOT, rate and window."""
    ttfts = [0.01 * i for i in range(1, 101)]
    provider = pb.ProviderSnapshot(provider_id="p1", kind="mock")
    provider.latency.CopyFrom(recorded(ttfts))
    shown = shown_provider(provider)["latency"]
    assert within(shown["ttft_p50_seconds"], sorted(ttfts)[49]) or within(shown["ttft_p50_seconds"], 0.5)
    assert within(shown["ttft_p95_seconds"], 0.95) or within(shown["ttft_p95_seconds"], 0.96)
    assert within(shown["tpot_p50_seconds"], 0.02) and within(shown["tpot_p95_seconds"], 0.02)
    assert shown["requests"] == 100 and shown["errors"] == 0
    assert shown["window_seconds"] == 60.0 and shown["requests_per_second"] == round(100 / 60, 3)


def test_no_request_means_null_figures() -> None:
    """A provider that never served shows null figures and zero counts."""
    shown = shown_provider(pb.ProviderSnapshot(provider_id="p1"))["latency"]
    assert shown == latency_json(None)
    assert shown["ttft_p95_seconds"] is None and shown["requests"] == 0


def test_models_and_the_edge_merge_their_providers_exactly() -> None:
    """Two providers of one model: the model's p95 is that of every request, not an average of p95s."""
    response = snapshot("edge-1", nodes=2)
    fast = [0.01] * 95 + [0.02] * 5
    slow = [1.0] * 100
    response.nodes[0].providers[0].latency.CopyFrom(recorded(fast))
    response.nodes[1].providers[0].latency.CopyFrom(recorded(slow))
    body = json.loads(edge_status_body(response, {}))
    assert not [e.message for e in contract_validator("EdgeStatus").iter_errors(body)]
    model = body["models"]["llama-3-8b"]["latency"]
    # All 200 requests: rank 0.95 * 199 falls among the slow ones; the mean of the p95s would be 0.51.
    assert within(model["ttft_p95_seconds"], 1.0) and model["requests"] == 200
    figures = snapshot_latency(response)
    merged = merged_figures(f for f in figures.providers if f is not None)
    assert merged is not None and merged.ttft.buckets == figures.edge.ttft.buckets  # type: ignore[union-attr]  # merged is checked first; the figures have TTFT


def test_a_bad_sketch_is_left_out_with_one_warning() -> None:
    """An index out of range and more buckets than allowed: that provider's figures are null, one warning, a view."""
    response = snapshot("edge-1", nodes=2)
    good = recorded([0.1] * 10)
    response.nodes[0].providers[0].latency.CopyFrom(good)
    bad = pb.ProviderLatency(window_seconds=60.0, requests_recent=1)
    bad.ttft_recent.index.extend([10**6])
    bad.ttft_recent.count.extend([1])
    response.nodes[1].providers[0].latency.CopyFrom(bad)
    warnings: list[dict[str, Any]] = []

    def observe(event: dict[str, Any]) -> None:
        if event.get("log_level") == LogLevel.warn and "latency" in event.get("log_format", ""):
            warnings.append(event)

    body = json.loads(edge_status_body(response, {}))  # the reference's bytes, valid
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels={}, software_version="1", protocol_version="1.0", commands=())
    token = registry.connect("edge-1", HeldEdgePeer(), hello)
    kept = keep_status(registry, "edge-1", token, response)
    assert kept is not None
    globalLogPublisher.addObserver(cast(ILogObserver, observe))
    try:
        renderer = JsonBytesRenderer()
        renderer.edge_status(registry.get("edge-1"), kept, False)
        renderer.edge_status(registry.get("edge-1"), kept, False)  # a kept rendering: no new warning
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, observe))
    providers = [node["providers"][0]["latency"] for node in body["nodes"]]
    assert providers[0]["requests"] == 10 and providers[1] == latency_json(None)
    assert body["models"]["llama-3-8b"]["latency"]["requests"] == 10
    assert len(warnings) == 1 and "node-2/mock-2" in warnings[0]["problem"]


def test_a_fleet_row_shows_its_edge_merged_once_per_snapshot() -> None:
    """A fleet row's latency is its providers merged; it is written once per snapshot and kept."""
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels={}, software_version="1", protocol_version="1.0", commands=())
    token = registry.connect("edge-1", HeldEdgePeer(), hello)
    response = snapshot("edge-1", nodes=2)
    response.nodes[0].providers[0].latency.CopyFrom(recorded([0.2] * 1))
    response.nodes[1].providers[0].latency.CopyFrom(recorded([0.4] * 3))
    kept = keep_status(registry, "edge-1", token, response)
    assert kept is not None
    record = registry.get("edge-1")
    round_ = FleetRound(1.0, 1.0, [StatusRow(record, "ok", kept, True)], ["edge-1"])
    renderer = JsonBytesRenderer()
    page = renderer.fleet_page(round_, "", 10, 2.0)
    assert page == reference.compact(reference.fleet_status_json(round_, "", 10, 2.0))
    row = json.loads(page)["items"][0]
    assert not [e.message for e in contract_validator("FleetRow").iter_errors(row)]
    assert row["latency"]["requests"] == 4 and within(row["latency"]["ttft_p95_seconds"], 0.4)
    renderer.fleet_page(round_, "", 10, 3.0)
    assert renderer.kept()["row_latencies"].entries == 1
    # The next round's snapshot carries the same figures (generated later): the same key, no new entry.
    response.generated_at_ms += 5000
    again = keep_status(registry, "edge-1", token, response)
    assert again is not None and again.latency_key == kept.latency_key != b""
    next_round = FleetRound(2.0, 2.0, [StatusRow(record, "ok", again, True)], ["edge-1"])
    assert json.loads(renderer.fleet_page(next_round, "", 10, 4.0))["items"][0]["latency"] == row["latency"]
    assert renderer.kept()["row_latencies"].entries == 1
    idle = keep_status(registry, "edge-1", token, snapshot("edge-1", nodes=2))
    assert idle is not None and idle.latency_key == b""


@settings(max_examples=40, deadline=None)
@given(
    index=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
    count=st.lists(st.integers(0, 2**64 - 1), max_size=8),
    window=st.floats(allow_nan=True, allow_infinity=True),
    requests=st.integers(0, 2**32 - 1),
    errors=st.integers(0, 2**32 - 1),
)
def test_any_latency_from_a_peer_gives_a_valid_view(
    index: list[int], count: list[int], window: float, requests: int, errors: int
) -> None:
    """Whatever a peer's ProviderLatency says, the status view is the reference's bytes and valid."""
    response = snapshot("edge-1", nodes=1)
    latency = response.nodes[0].providers[0].latency
    latency.window_seconds = window
    latency.requests_recent = requests
    latency.errors_recent = errors
    latency.ttft_recent.index.extend(index)
    latency.ttft_recent.count.extend(count)
    body = json.loads(edge_status_body(response, {}))
    assert not [e.message for e in contract_validator("EdgeStatus").iter_errors(body)]
