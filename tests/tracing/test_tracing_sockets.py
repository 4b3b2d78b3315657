"""Traces over real sockets: an Edge and two Nodes in this reactor, each Node in front of a
recording engine on 127.0.0.1:0; with ``tracing.otlp_endpoint`` set, a real OTLP/HTTP
receiver on 127.0.0.1:0 gets the spans."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

import pytest_twisted
from prometheus_client import generate_latest
from twisted.internet import reactor

from twisted_iop.edge.metrics import edge_metric_registry
from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.recording_engine import RecordingEngine, listen_recording_engine
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.testing.http import Answer, chat, post
from twisted_iop.testing.otlp_receiver import OtlpReceiver, decoded_spans, listen_otlp_receiver
from twisted_iop.tracing.context import parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT = f"00-{TRACE}-{CLIENT_SPAN}-01"
SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


class Fleet:
    """The Edge, its two Nodes, their engines and listening ports."""

    def __init__(self, edge: Any, nodes: list[Any], engines: list[RecordingEngine], ports: list[Any]) -> None:
        self.edge = edge
        self.nodes = nodes
        self.engines = engines
        self.ports = ports

    @property
    def base(self) -> str:
        """The Edge's inference API."""
        return f"http://127.0.0.1:{self.edge.inference_port}"

    async def chat(self, traceparent: Optional[str] = None, stream: bool = False, **headers: str) -> Answer:
        """One chat completion, with the client's trace headers."""
        sent: dict[bytes, list[bytes]] = {}
        if traceparent is not None:
            sent[b"traceparent"] = [traceparent.encode()]
        for name, value in headers.items():
            sent[name.encode()] = [value.encode()]
        return await post(self.base, "/v1/chat/completions", chat(max_tokens=2, stream=stream), sent)

    def engine_addresses(self) -> list[str]:
        """What must never show in a header or span: the engines' ports and the loopback address."""
        return ["127.0.0.1", *(f":{port.getHost().port}" for port in self.ports)]

    async def stop(self) -> None:
        """Stop everything."""
        await stop(*self.nodes, self.edge)
        for port in self.ports:
            await port.stopListening()


async def start_fleet(tmp_path: Path, tracing: Optional[dict[str, Any]] = None) -> Fleet:
    """Edge, Nodes node-1 (p1) and node-2 (p2) of kind openai, each before its recording engine."""
    engines = [RecordingEngine(), RecordingEngine()]
    listening = [listen_recording_engine(reactor, engine) for engine in engines]
    ports = [port for port, _ in listening]
    config = gateway_edge_yaml(capacity=2)
    if tracing is not None:
        config["tracing"] = tracing
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", config))
    await edge.inference_server.bound()
    nodes = []
    for index, (node_id, provider_id) in enumerate([("node-1", "p1"), ("node-2", "p2")]):
        provider = {
            "provider_id": provider_id,
            "kind": "openai",
            "models": [MODEL],
            "base_url": listening[index][1],
        }
        node_config = gateway_node_yaml(node_id, edge.node_port, provider)
        node_config["probes"] = {"interval_seconds": 60, "timeout_seconds": 1}
        nodes.append(start_node(write_yaml(tmp_path / f"{node_id}.yaml", node_config)))
    for node_id in ("node-1", "node-2"):
        await eventually(functools.partial(edge.registry.is_ready, node_id), message=f"{node_id} ready")
    return Fleet(edge, nodes, engines, ports)


def header(answer: Answer, name: bytes) -> str:
    """The one value of a response header."""
    values = answer.headers.getRawHeaders(name) or []
    assert len(values) == 1, f"{name!r}: {values}"
    return str(values[0].decode("ascii"))


def engine_traceparents(fleet: Fleet) -> list[tuple[int, str]]:
    """(engine index, traceparent) of every completion the engines got."""
    return [(i, r.traceparent or "") for i, engine in enumerate(fleet.engines) for r in engine.requests]


@pytest_twisted.ensureDeferred
async def test_a_client_trace_reaches_the_engine_and_the_answer_names_the_route(tmp_path: Path) -> None:
    """Same trace id at the engine, a new parent (span) id; the answer says node, provider and attempts, by id."""
    fleet = await start_fleet(tmp_path)
    try:
        answer = await fleet.chat(CLIENT, tracestate="rojo=00f067aa0ba902b7")
        assert answer.code == 200
        [(index, sent)] = engine_traceparents(fleet)
        at_engine = parse_traceparent(sent)
        assert at_engine is not None and at_engine.trace_id == TRACE and at_engine.sampled
        assert at_engine.span_id != CLIENT_SPAN
        assert fleet.engines[index].requests[0].tracestate == "rojo=00f067aa0ba902b7"
        served = parse_traceparent(header(answer, b"traceparent"))
        assert served is not None and served.trace_id == TRACE
        assert served.span_id not in (CLIENT_SPAN, at_engine.span_id)
        route = header(answer, b"x-iop-route")
        assert route == f"node=node-{index + 1};provider=p{index + 1};attempts=1"
        assert not any(address in route for address in fleet.engine_addresses())
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_no_traceparent_gets_one_and_a_bad_one_is_replaced(tmp_path: Path) -> None:
    """Without a header the Edge starts a trace; an invalid header is ignored, never an error."""
    fleet = await start_fleet(tmp_path)
    try:
        bad = f"00-{'0' * 32}-{CLIENT_SPAN}-01"
        for sent in (None, bad, f"00-{TRACE.upper()}-{CLIENT_SPAN}-01"):
            answer = await fleet.chat(sent)
            assert answer.code == 200
            served = parse_traceparent(header(answer, b"traceparent"))
            assert served is not None and served.trace_id not in ("0" * 32, TRACE)
            at_engines = [parse_traceparent(t) for _, t in engine_traceparents(fleet)]
            assert served.trace_id in {p.trace_id for p in at_engines if p is not None}
        assert len({parse_traceparent(t).trace_id for _, t in engine_traceparents(fleet)}) == 3  # type: ignore[union-attr]  # every engine request carries a valid traceparent
        assert fleet.edge.inference.tracer.invalid_traceparents == 2
        scraped = generate_latest(edge_metric_registry(fleet.edge)).decode()
        assert "iop_inference_invalid_traceparents_total 2.0" in scraped
        assert "iop_trace_spans" not in scraped  # no export configured
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_failover_is_two_attempts_of_one_trace(tmp_path: Path) -> None:
    """Engine 1 is overloaded: both engines see the client's trace with different span ids; attempts=2."""
    fleet = await start_fleet(tmp_path)
    try:
        fleet.engines[0].overloaded = True
        answer = await fleet.chat(CLIENT)
        assert answer.code == 200
        assert header(answer, b"x-iop-route") == "node=node-2;provider=p2;attempts=2"
        sent = engine_traceparents(fleet)
        assert [index for index, _ in sent] == [0, 1]
        (_, first), (_, second) = sent
        one, two = parse_traceparent(first), parse_traceparent(second)
        assert one is not None and two is not None
        assert one.trace_id == two.trace_id == TRACE and one.span_id != two.span_id
        # Both overloaded: the error answer names where it was last tried, and how often.
        fleet.engines[1].overloaded = True
        fleet.edge.registry.providers.cooldowns.forget_provider("node-1", "p1")
        before = len(engine_traceparents(fleet))
        refused = await fleet.chat(CLIENT)
        assert refused.code == 429
        tried = len(engine_traceparents(fleet)) - before
        route = header(refused, b"x-iop-route")
        assert tried >= 2 and route.startswith("node=node-") and route.endswith(f";attempts={tried}")
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_streamed_answer_carries_the_route(tmp_path: Path) -> None:
    """The event stream's headers name the route and the Edge's span, as a whole answer's do."""
    fleet = await start_fleet(tmp_path)
    try:
        answer = await fleet.chat(CLIENT, stream=True)
        assert answer.code == 200 and answer.events[-1] == b"[DONE]"
        assert header(answer, b"x-iop-route").endswith(";attempts=1")
        served = parse_traceparent(header(answer, b"traceparent"))
        assert served is not None and served.trace_id == TRACE
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_spans_reach_an_otlp_receiver_with_a_failover_as_two_children(tmp_path: Path) -> None:
    """The server span continues the client's, and the failover is two child spans: the first with its error."""
    import opentelemetry.sdk.trace  # noqa: F401  (the [tracing] extra, installed by `make setup`)

    receiver = OtlpReceiver()
    collector, endpoint = listen_otlp_receiver(reactor, receiver)
    fleet = await start_fleet(
        tmp_path, {"otlp_endpoint": endpoint, "service_name": "edge-under-test", "export_interval_seconds": 0.05}
    )
    try:
        fleet.engines[0].overloaded = True
        answer = await fleet.chat(CLIENT)
        assert answer.code == 200
        await eventually(lambda: len(decoded_spans(receiver.bodies)) >= 3, message="three spans exported")
        spans = decoded_spans(receiver.bodies)
        assert receiver.content_types[0] == "application/x-protobuf"
        [server] = [s for s in spans if s.kind == SPAN_KIND_SERVER]
        children = sorted((s for s in spans if s.kind == SPAN_KIND_CLIENT), key=lambda s: s.attributes["iop.attempt"])
        assert server.trace_id == TRACE and server.parent_span_id == CLIENT_SPAN
        assert server.service_name == "edge-under-test" and server.name == f"chat {MODEL}"
        assert server.attributes["gen_ai.request.model"] == MODEL
        assert server.attributes["gen_ai.operation.name"] == "chat"
        assert server.attributes["gen_ai.usage.input_tokens"] == 5
        assert server.attributes["gen_ai.usage.output_tokens"] == 2
        assert server.attributes["iop.node.id"] == "node-2" and server.attributes["iop.attempts"] == 2
        assert "error.type" not in server.attributes and server.status_code != STATUS_ERROR
        first, second = children
        assert {first.parent_span_id, second.parent_span_id} == {server.span_id}
        assert first.trace_id == second.trace_id == TRACE
        assert first.attributes["iop.node.id"] == "node-1" and first.attributes["iop.provider.id"] == "p1"
        assert first.attributes["error.type"] and first.status_code == STATUS_ERROR
        assert second.attributes["iop.node.id"] == "node-2" and "error.type" not in second.attributes
        assert second.attributes["iop.retry.reason"] == first.attributes["error.type"]
        # The engines saw the attempts' own span ids.
        sent = [parse_traceparent(t) for _, t in engine_traceparents(fleet)]
        assert [p.span_id for p in sent if p is not None] == [first.span_id, second.span_id]
        for span in spans:
            assert "server.address" not in span.attributes
            assert not any(a in str(v) for v in span.attributes.values() for a in fleet.engine_addresses())
        export = fleet.edge.trace_export
        assert export is not None
        await eventually(lambda: export.exported_spans == 3, message="exported counted")
        assert export.dropped_spans == 0 and export.failed_spans == 0
        scraped = generate_latest(edge_metric_registry(fleet.edge)).decode()
        assert 'iop_trace_spans_total{result="exported"} 3.0' in scraped
        assert 'iop_trace_spans_total{result="dropped"} 0.0' in scraped
    finally:
        await fleet.stop()
        stopped = collector.stopListening()
        if stopped is not None:
            await stopped
