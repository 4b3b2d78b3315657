"""``iopctl status`` and ``iopctl fleet`` show latency: the client models read the
views' ``latency`` objects, and the tables show TTFT and TPOT p95 per provider, per
model and per edge."""

from __future__ import annotations

import json

from twisted.internet.task import Clock

from twisted_iop.client.iopctl.render import render_fleet, render_status, seconds_text
from twisted_iop.client.model_json import read
from twisted_iop.client.models import EdgeStatus, FleetStatus
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.requests.fleet_rounds import FleetRound, StatusRow
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.edge.inference.latency import OK, LatencyRecorder
from twisted_iop.latency.sketch import RELATIVE_ERROR
from twisted_iop.testing.provider_views import edge_status_body
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status, snapshot


def test_seconds_text_is_milliseconds_below_ten_seconds() -> None:
    """412 ms, 0.25 ms, 12.4 s and none."""
    assert [seconds_text(v) for v in (0.412, 0.00025, 12.4, None)] == ["412ms", "0.25ms", "12.4s", "-"]


def test_status_shows_ttft_and_tpot_p95_per_provider_and_a_model_table() -> None:
    """A provider with figures (the Control Plane's real view of them) shows them in its row;
    a model table follows."""
    recorder = LatencyRecorder(0.0)
    for _ in range(30):
        # Admitted at 100 s, first token at 100.412 s, 11 tokens by 100.642 s: TTFT 412 ms, TPOT 23 ms.
        recorder.request_ended("llama-3-8b", "n", "p", OK, 100.0, 100.412, 100.642, 11)
    response = snapshot("edge-a", nodes=1)
    wire = recorder.provider_latency("n", "p", 101.0)
    assert wire is not None
    response.nodes[0].providers[0].latency.CopyFrom(wire)
    status = read(EdgeStatus, json.loads(edge_status_body(response, {})))
    latency = status.nodes[0].providers[0].latency
    assert latency.requests == 30 and latency.ttft_p95_seconds is not None
    providers, models = render_status(status).split("\n\n")[-2:]
    header, row = providers.splitlines()
    at = header.split().index("TTFT-P95")
    ttft_shown = seconds_text(latency.ttft_p95_seconds)
    assert abs(latency.ttft_p95_seconds - 0.412) <= 0.412 * RELATIVE_ERROR  # within the sketch's 2 %
    tpot_shown = seconds_text(latency.tpot_p95_seconds)
    assert row.split()[at : at + 2] == [ttft_shown, tpot_shown] and tpot_shown.endswith("ms")
    duration_shown = seconds_text(status.models["llama-3-8b"].latency.duration_p95_seconds)
    model_row = ["llama-3-8b", ttft_shown, ttft_shown, tpot_shown, tpot_shown, duration_shown, "0.50", "0"]
    assert models.splitlines()[1].split() == model_row


def test_fleet_rows_show_their_edge_figures() -> None:
    """A fleet row's TTFT and TPOT p95 columns, from the Control Plane's real page."""
    recorder = LatencyRecorder(0.0)
    recorder.request_ended("llama-3-8b", "n", "p", OK, 100.0, 100.2, 100.5, 4)  # TTFT 200 ms, TPOT 100 ms
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels={}, software_version="1", protocol_version="1.0", commands=())
    token = registry.connect("edge-a", HeldEdgePeer(), hello)
    response = snapshot("edge-a", nodes=1)
    wire = recorder.provider_latency("n", "p", 101.0)
    assert wire is not None
    response.nodes[0].providers[0].latency.CopyFrom(wire)
    kept = keep_status(registry, "edge-a", token, response)
    assert kept is not None
    round_ = FleetRound(1.0, 1.0, [StatusRow(registry.get("edge-a"), "ok", kept, True)], ["edge-a"])
    fleet = read(FleetStatus, json.loads(JsonBytesRenderer().fleet_page(round_, "", 10, 2.0)))
    lines = render_fleet(fleet).split("\n\n")[-1].splitlines()
    at = lines[0].split().index("TTFT-P95")
    shown = lines[1].split()[at : at + 2]
    assert shown == [
        seconds_text(fleet.items[0].latency.ttft_p95_seconds),
        seconds_text(fleet.items[0].latency.tpot_p95_seconds),
    ]
    assert shown[0] in ("196ms", "200ms", "204ms") or abs(int(shown[0][:-2]) - 200) <= 4
