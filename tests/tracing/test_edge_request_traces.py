"""Each request's trace at the Edge: attempts as child spans with their reasons, the
``traceparent`` on the node wire, the route header (the gateway on a fake clock, plain calls)."""

from __future__ import annotations

import json

import pytest
from twisted.internet.task import Clock

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.http import chat
from twisted_iop.testing.wires.peers import RecordingNodePeer
from twisted_iop.tracing.context import parse_traceparent
from twisted_iop.tracing.spans import EdgeTracer, RequestTrace, TraceSink
from twisted_iop.wire import control_pb2 as pb

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Traces(TraceSink):
    """Keeps the recorded traces handed over at their end."""

    def __init__(self) -> None:
        self.traces: list[RequestTrace] = []

    def add(self, trace: RequestTrace) -> None:
        """Keep it."""
        self.traces.append(trace)


class Sink:
    """How the request ended."""

    def __init__(self) -> None:
        self.completed = False
        self.error: InferenceError | None = None

    def chunks(self, events: list[bytes]) -> None:
        """Streamed events (unused)."""

    def complete(self, done: pb.InferenceDone) -> None:
        """Completed."""
        self.completed = True

    def fail(self, error: InferenceError) -> None:
        """Failed."""
        self.error = error


def fleet(sample_ratio: float = 1.0) -> tuple[InferenceGateway, dict[str, RecordingNodePeer], Clock, Traces]:
    """A gateway with Nodes n1 and n2 (providers p1 and p2) ready, recording every sampled trace."""
    clock = Clock()
    clock.advance(1000)
    config = parse_edge_config(
        {
            "control_plane": {"edge_id": "edge-a"},
            "nodes": [
                {
                    "node_id": f"n{i}",
                    "providers": [{"provider_id": f"p{i}", "kind": "mock", "models": [MODEL], "capacity": 4}],
                }
                for i in (1, 2)
            ],
        }
    )
    registry = NodeRegistry(config, clock)
    peers = {}
    for i in (1, 2):
        peer = RecordingNodePeer()
        spec = pb.NodeProviderSpec(provider_id=f"p{i}", models=[MODEL])
        token = registry.node_accepted(pb.NodeHelloRequest(node_id=f"n{i}", providers=[spec]), peer)
        health = pb.ProviderHealthReport(provider_id=f"p{i}", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
        registry.node_ready(token, [health])
        peers[f"n{i}"] = peer
    traces = Traces()
    gateway = InferenceGateway(registry, config.inference, clock, EdgeTracer(sample_ratio, traces))
    return gateway, peers, clock, traces


def start(gateway: InferenceGateway, traceparent: str | None = CLIENT, tracestate: str | None = None) -> RequestTrace:
    """A chat request's trace, as the HTTP API starts it from the client's headers."""
    return gateway.start_trace(
        pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
        MODEL,
        [traceparent.encode()] if traceparent is not None else None,
        [tracestate.encode()] if tracestate is not None else None,
    )


def submit(gateway: InferenceGateway, trace: RequestTrace) -> tuple[int, Sink]:
    """Submit a chat request with ``trace``."""
    sink = Sink()
    inference_id = gateway.submit(pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, MODEL, False, chat(), False, sink, trace)
    return inference_id, sink


def done_ok(inference_id: int) -> pb.InferenceDone:
    """A completed answer with usage."""
    done = pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK, http_status=200, body=b"{}")
    done.usage.prompt_tokens = 5
    done.usage.completion_tokens = 3
    return done


def overloaded(inference_id: int) -> pb.InferenceDone:
    """An engine's 429, as a Node reports it."""
    body = json.dumps({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}}).encode()
    return pb.InferenceDone(
        inference_id=inference_id,
        status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
        http_status=429,
        body=body,
        error_code="overloaded",
    )


def answer(gateway: InferenceGateway, peer: RecordingNodePeer, done: pb.InferenceDone) -> None:
    """``done`` from ``peer``."""
    gateway.node_message(peer, pb.Envelope(inference_done=done), "inference_done")


def sent_to(peers: dict[str, RecordingNodePeer]) -> list[tuple[str, pb.InferenceRequest]]:
    """Every inference request sent, with the Node it went to."""
    return [(node_id, request) for node_id, peer in peers.items() for request in peer.inference_requests]


def test_the_client_trace_is_continued_on_the_node_wire() -> None:
    """The Node gets the client's trace id with a new span id (the attempt's), and the tracestate."""
    gateway, peers, clock, traces = fleet()
    trace = start(gateway, tracestate="rojo=00f067aa0ba902b7")
    inference_id, sink = submit(gateway, trace)
    [(node_id, request)] = sent_to(peers)
    parent = parse_traceparent(request.traceparent)
    assert parent is not None and parent.trace_id == CLIENT.split("-")[1] and parent.sampled
    assert parent.span_id not in (CLIENT.split("-")[2], trace.span_id)
    assert request.tracestate == "rojo=00f067aa0ba902b7"
    clock.advance(0.25)
    answer(gateway, peers[node_id], done_ok(inference_id))
    assert sink.completed
    [recorded] = traces.traces
    assert recorded is trace and trace.parent_span_id == CLIENT.split("-")[2]
    assert (trace.input_tokens, trace.output_tokens, trace.status_code, trace.error_type) == (5, 3, 200, "")
    [attempt] = trace.attempts
    assert attempt.span_id == parent.span_id and attempt.end - attempt.start == 0.25
    assert trace.route_header() == f"node={node_id};provider=p{node_id[1]};attempts=1".encode()


def test_a_failover_is_a_second_attempt_with_the_first_ones_code_as_its_reason() -> None:
    """An overloaded engine: the request runs on the other Node as attempt 2, reason ``overloaded``."""
    gateway, peers, clock, traces = fleet()
    trace = start(gateway)
    inference_id, sink = submit(gateway, trace)
    [(first_node, first)] = sent_to(peers)
    clock.advance(0.1)
    answer(gateway, peers[first_node], overloaded(inference_id))
    requests = sent_to(peers)
    assert len(requests) == 2
    [(second_node, second)] = [pair for pair in requests if pair[1] is not first]
    assert second_node != first_node
    one, two = (parse_traceparent(r.traceparent) for r in (first, second))
    assert one is not None and two is not None
    assert one.trace_id == two.trace_id and one.span_id != two.span_id
    answer(gateway, peers[second_node], done_ok(inference_id))
    assert sink.completed and traces.traces == [trace]
    a, b = trace.attempts
    assert (a.node_id, a.error_type, a.retry_reason) == (first_node, "overloaded", "")
    assert (b.node_id, b.error_type, b.retry_reason) == (second_node, "", "overloaded")
    assert trace.route_header() == f"node={second_node};provider=p{second_node[1]};attempts=2".encode()


def test_a_lost_node_is_the_reason_of_the_retry() -> None:
    """The Node's connection drops before output: attempt 1 ends ``node_lost``, attempt 2 says why."""
    gateway, peers, _clock, _traces = fleet()
    trace = start(gateway)
    inference_id, _sink = submit(gateway, trace)
    [(first_node, _)] = sent_to(peers)
    gateway.connection_lost(peers[first_node])
    second_node = next(n for n, r in sent_to(peers) if n != first_node)
    answer(gateway, peers[second_node], done_ok(inference_id))
    assert [(a.node_id, a.error_type, a.retry_reason) for a in trace.attempts] == [
        (first_node, "node_lost", ""),
        (second_node, "", "node_lost"),
    ]


def test_no_or_a_bad_traceparent_starts_a_new_trace() -> None:
    """Without a header, or with an invalid one, the Edge's own trace id goes to the Node."""
    gateway, peers, _clock, _traces = fleet()
    bad = "00-" + "0" * 32 + "-00f067aa0ba902b7-01"
    for header in (None, bad, "garbage"):
        trace = start(gateway, header)
        assert trace.parent_span_id == "" and trace.trace_id != "0" * 32
        submit(gateway, trace)
    traces_sent = {parse_traceparent(r.traceparent).trace_id for _, r in sent_to(peers)}  # type: ignore[union-attr]  # every request sent carries a valid traceparent
    assert len(traces_sent) == 3 and CLIENT.split("-")[1] not in traces_sent
    assert gateway.tracer.invalid_traceparents == 2


def test_a_refused_request_ends_its_trace_with_the_code() -> None:
    """A request refused at admission (unknown model) is a server span with its error and no attempt."""
    gateway, _peers, _clock, traces = fleet()
    trace = gateway.start_trace(pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, "no-such-model", None, None)
    with pytest.raises(InferenceError, match="does not exist"):
        gateway.submit(pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, "no-such-model", False, chat(), False, Sink(), trace)
    assert traces.traces == [trace] and trace.error_type == "model_not_found" and trace.status_code == 404
    assert trace.attempts == [] and trace.route_header() is None


def test_an_unsampled_client_trace_is_propagated_but_not_recorded() -> None:
    """The client's sampled flag 0 is passed on and nothing is kept for export."""
    gateway, peers, _clock, traces = fleet()
    trace = start(gateway, CLIENT[:-2] + "00")
    inference_id, _ = submit(gateway, trace)
    [(node_id, request)] = sent_to(peers)
    assert request.traceparent.endswith("-00")
    answer(gateway, peers[node_id], done_ok(inference_id))
    assert traces.traces == []


def test_the_sample_ratio_decides_new_traces() -> None:
    """At ratio 0 no new trace is recorded, and the flag sent on says so."""
    gateway, peers, _clock, traces = fleet(sample_ratio=0.0)
    trace = start(gateway, None)
    inference_id, _ = submit(gateway, trace)
    [(node_id, request)] = sent_to(peers)
    assert request.traceparent.endswith("-00") and not trace.recording
    answer(gateway, peers[node_id], done_ok(inference_id))
    assert traces.traces == []
