"""The Edge's latency figures: the recorder's arithmetic on plain calls, and the
gateway feeding it on a fake clock (exact TTFT, TPOT and durations), through to
/metrics' GenAI histograms and the snapshot's ``ProviderLatency``."""

from __future__ import annotations

from typing import Any, cast

import pytest
from twisted.internet.task import Clock

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.latency import (
    CANCELLED,
    CLIENT_ERROR,
    DURATION_BUCKETS,
    ERROR,
    MAX_SERIES,
    OK,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    LatencyRecorder,
    time_per_output_token,
)
from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.edge.metrics import _latency_metrics
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.latency.sketch import MAX_BUCKETS, RELATIVE_ERROR
from twisted_iop.latency.wire import sketch_from_wire
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.http import chat
from twisted_iop.testing.wires.peers import RecordingNodePeer
from twisted_iop.wire import control_pb2 as pb

EDGE = {
    "control_plane": {"edge_id": "edge-a"},
    "nodes": [
        {
            "node_id": "node-1",
            "credential": "k1",
            "providers": [{"provider_id": "p1", "kind": "mock", "models": [MODEL], "capacity": 4}],
        }
    ],
}


class Sink:
    """A response sink that keeps nothing."""

    def chunks(self, events: list[bytes]) -> None:
        """Ignore events."""

    def complete(self, done: pb.InferenceDone) -> None:
        """Ignore the end."""

    def fail(self, error: InferenceError) -> None:
        """Ignore an error."""


def gateway_with_node() -> tuple[InferenceGateway, NodeRegistry, RecordingNodePeer, Clock]:
    """A gateway whose only Node is ready, on a fake clock started at 1000 s."""
    clock = Clock()
    clock.advance(1000)
    config = parse_edge_config(EDGE)
    registry = NodeRegistry(config, clock)
    node = RecordingNodePeer()
    hello = pb.NodeHelloRequest(node_id="node-1", providers=[pb.NodeProviderSpec(provider_id="p1", models=[MODEL])])
    token = registry.node_accepted(hello, cast(Any, node))  # only send() is used
    registry.node_ready(
        token, [pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])]
    )
    return InferenceGateway(registry, config.inference, clock), registry, node, clock


def submit(gateway: InferenceGateway, stream: bool) -> int:
    """Submit one chat request; its inference id."""
    body = chat(stream=stream)
    return gateway.submit(pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, MODEL, False, body, stream, Sink())


def chunk(gateway: InferenceGateway, node: RecordingNodePeer, inference_id: int) -> None:
    """One streamed event from the Node."""
    envelope = pb.Envelope(inference_chunk=pb.InferenceChunk(inference_id=inference_id, data=b"{}"))
    gateway.node_message(node, envelope, "inference_chunk")


def finish(
    gateway: InferenceGateway, node: RecordingNodePeer, inference_id: int, completion_tokens: int, **fields: Any
) -> None:
    """The request's ``inference_done`` (OK unless ``fields`` say otherwise), with its usage."""
    done = pb.InferenceDone(inference_id=inference_id, **{"status": pb.INFERENCE_STATUS_OK, **fields})
    done.usage.completion_tokens = completion_tokens
    gateway.node_message(node, pb.Envelope(inference_done=done), "inference_done")


def series(registry: NodeRegistry) -> dict[tuple[str, ...], Any]:
    """The recorder's histograms by (model, node, provider, outcome)."""
    return {tuple(key): figures for key, figures in registry.latency.series()}


def test_time_per_output_token_is_the_time_after_the_first_over_the_tokens_after_it() -> None:
    """TPOT = (end - first token) / (tokens - 1); none for one token or fewer."""
    assert time_per_output_token(10.0, 12.0, 5) == 0.5
    assert time_per_output_token(10.0, 12.0, 1) is None
    assert time_per_output_token(10.0, 12.0, 0) is None


def test_a_streamed_request_gives_its_exact_ttft_tpot_and_duration() -> None:
    """Admitted at t, first token at t+0.25, done at t+1.25 with 11 tokens: TTFT 0.25, TPOT 0.1, duration 1.25."""
    gateway, registry, node, clock = gateway_with_node()
    inference_id = submit(gateway, stream=True)
    clock.advance(0.25)
    chunk(gateway, node, inference_id)
    clock.advance(0.5)
    chunk(gateway, node, inference_id)  # later events do not move the first token
    clock.advance(0.5)
    finish(gateway, node, inference_id, completion_tokens=11)
    figures = series(registry)[(MODEL, "node-1", "p1", OK)]
    assert (figures.ttft.count, figures.ttft.total) == (1, pytest.approx(0.25))
    assert (figures.tpot.count, figures.tpot.total) == (1, pytest.approx(0.1))
    assert (figures.duration.count, figures.duration.total) == (1, pytest.approx(1.25))
    assert figures.ttft.bounds == TTFT_BUCKETS and figures.tpot.bounds == TPOT_BUCKETS
    assert figures.duration.bounds == DURATION_BUCKETS
    waits = dict((tuple(key), h) for key, h in registry.latency.queue_waits())
    assert waits[(MODEL, "node-1", "p1")].count == 1 and waits[(MODEL, "node-1", "p1")].total == 0.0


def test_a_whole_answer_has_a_duration_and_no_ttft_or_tpot() -> None:
    """Non-streamed: a duration only, even with many tokens."""
    gateway, registry, node, clock = gateway_with_node()
    inference_id = submit(gateway, stream=False)
    clock.advance(2.0)
    finish(gateway, node, inference_id, completion_tokens=50)
    figures = series(registry)[(MODEL, "node-1", "p1", OK)]
    assert (figures.duration.count, figures.duration.total) == (1, 2.0)
    assert figures.ttft.count == 0 and figures.tpot.count == 0


def test_a_queue_wait_counts_from_admission_to_the_lease() -> None:
    """With the only lease taken, the second request waits until the first ends: its wait is that time."""
    gateway, registry, node, clock = gateway_with_node()
    first = [submit(gateway, stream=False) for _ in range(4)]  # capacity 4
    queued = submit(gateway, stream=False)
    clock.advance(0.75)
    finish(gateway, node, first[0], completion_tokens=1)
    waits = dict((tuple(key), h) for key, h in registry.latency.queue_waits())
    assert waits[(MODEL, "node-1", "p1")].count == 5
    assert waits[(MODEL, "node-1", "p1")].total == pytest.approx(0.75)
    assert queued in [message.inference_id for body, message in node.sent if body == "inference_request"]


def test_outcomes_say_whose_fault_a_failure_was() -> None:
    """An engine 500 is an error, a 400 is the client's, a client gone is cancelled: only errors count as errors."""
    gateway, registry, node, clock = gateway_with_node()
    server = submit(gateway, stream=False)
    finish(
        gateway,
        node,
        server,
        0,
        status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
        http_status=500,
        error_code="provider_error",
    )
    client = submit(gateway, stream=False)
    finish(
        gateway,
        node,
        client,
        0,
        status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
        http_status=400,
        error_code="invalid_request",
    )
    gone = submit(gateway, stream=True)
    clock.advance(0.5)
    chunk(gateway, node, gone)
    gateway.client_gone(gone)
    keys = set(series(registry))
    assert keys == {(MODEL, "node-1", "p1", outcome) for outcome in (ERROR, CLIENT_ERROR, CANCELLED)}
    latency = registry.latency.provider_latency("node-1", "p1", clock.seconds())
    assert latency is not None
    assert (latency.requests_total, latency.errors_total) == (3, 1)
    assert (latency.requests_recent, latency.errors_recent) == (3, 1)
    # The cancelled stream's first token did arrive: it counts in TTFT; no duration of a failure.
    assert sketch_from_wire(latency.ttft_total).count == 1
    assert not latency.HasField("duration_total") and not latency.HasField("tpot_recent")


def test_the_snapshot_carries_recent_and_cumulative_sketches() -> None:
    """Recent sketches cover the last minute; the cumulative ones keep everything since the Edge started."""
    gateway, registry, node, clock = gateway_with_node()
    status = StatusProvider(registry, clock)
    assert not status.snapshot().nodes[0].providers[0].HasField("latency")  # no request yet
    for ttft in (0.1, 0.2, 0.3, 0.4):
        inference_id = submit(gateway, stream=True)
        clock.advance(ttft)
        chunk(gateway, node, inference_id)
        clock.advance(1.0)
        finish(gateway, node, inference_id, completion_tokens=21)
    latency = status.snapshot().nodes[0].providers[0].latency
    assert latency.window_seconds == 60 and latency.requests_recent == 4
    assert latency.counting_since_ms == 1_000_000
    recent = sketch_from_wire(latency.ttft_recent)
    assert recent.count == 4 and abs(recent.quantile(1.0) - 0.4) <= 0.4 * RELATIVE_ERROR  # type: ignore[operator]  # four samples: the quantile is not None
    assert sketch_from_wire(latency.tpot_total).quantile(0.5) == pytest.approx(0.05, rel=RELATIVE_ERROR)
    assert len(latency.duration_total.index) <= MAX_BUCKETS
    clock.advance(120)
    later = status.snapshot().nodes[0].providers[0].latency
    assert later.requests_recent == 0 and not later.HasField("ttft_recent")
    assert later.requests_total == 4 and sketch_from_wire(later.ttft_total).count == 4


def test_metrics_show_the_genai_histograms_by_model_node_provider_and_outcome() -> None:
    """/metrics' families carry the GenAI names, the model label and the semconv boundaries."""
    recorder = LatencyRecorder(0.0)
    recorder.request_ended(MODEL, "node-1", "p1", OK, 0.0, 0.05, 1.0, 20)
    recorder.request_ended(MODEL, "", "", ERROR, 0.0, None, 30.0, None)  # never leased: metrics only
    families = {family.name: family for family in _latency_metrics(recorder)}
    ttft = families["gen_ai_server_time_to_first_token_seconds"]
    buckets = [s for s in ttft.samples if s.name.endswith("_bucket") and s.labels["outcome"] == OK]
    assert [s.labels["le"] for s in buckets] == [repr(b) for b in TTFT_BUCKETS] + ["+Inf"]
    assert buckets[0].labels["model"] == MODEL and buckets[0].labels["provider"] == "p1"
    duration = families["gen_ai_server_request_duration_seconds"]
    counts = {s.labels["outcome"]: s.value for s in duration.samples if s.name.endswith("_count")}
    assert counts == {OK: 1, ERROR: 1}
    assert recorder.provider_latency("", "", 30.0) is None


def test_label_sets_are_bounded() -> None:
    """Past MAX_SERIES label sets a request is counted as dropped, not as a new series."""
    recorder = LatencyRecorder(0.0)
    for index in range(MAX_SERIES + 3):
        recorder.request_ended(f"m{index}", "n", "p", OK, 0.0, None, 1.0, None)
    assert len(list(recorder.series())) == MAX_SERIES and recorder.dropped_series == 3
