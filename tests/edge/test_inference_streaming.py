"""How streamed events travel through the Edge: the events of one reactor turn
reach the client together, in order and unchanged; the end of a request comes
after them; a client that stops reading is still cut off at its buffer bound.

The first tests drive :class:`InferenceGateway` on a fake clock with a
recording sink and a fake Node connection; the last one runs a real Edge and
Node on loopback with a client that reads nothing.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet.task import Clock
from twisted.web.test.requesthelper import DummyRequest as TwistedDummyRequest

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.inference.api import _HttpResponseSink
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, mock_provider, write_yaml
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
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


class RecordingSink:
    """A response sink that records every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def chunks(self, events: list[bytes]) -> None:
        """Record a batch of events."""
        self.calls.append(("chunks", list(events)))

    def complete(self, done: pb.InferenceDone) -> None:
        """Record the end."""
        self.calls.append(("complete", done.status))

    def fail(self, error: InferenceError) -> None:
        """Record an error."""
        self.calls.append(("fail", error.code))


class DummyRequest(TwistedDummyRequest):
    """Twisted's dummy request, taking a push producer (its own loops on a pull producer)."""

    def registerProducer(self, prod: Any, s: bool) -> None:
        """Keep the producer."""
        self.producer = prod

    def unregisterProducer(self) -> None:
        """Forget the producer."""
        self.producer = None


def gateway_with_node() -> tuple[InferenceGateway, RecordingNodePeer, Clock]:
    """A gateway whose only Node is ready and connected through a RecordingNodePeer."""
    clock = Clock()
    config = parse_edge_config(EDGE)
    registry = NodeRegistry(config, clock)
    node = RecordingNodePeer()
    hello = pb.NodeHelloRequest(node_id="node-1", providers=[pb.NodeProviderSpec(provider_id="p1", models=[MODEL])])
    token = registry.node_accepted(hello, node)
    registry.node_ready(
        token, [pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])]
    )
    return InferenceGateway(registry, config.inference, clock), node, clock


def submit_stream(gateway: InferenceGateway) -> tuple[int, RecordingSink]:
    """Submit one streaming chat request; its id and sink."""
    sink = RecordingSink()
    inference_id = gateway.submit(pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, MODEL, False, chat(stream=True), True, sink)
    return inference_id, sink


def chunk(inference_id: int, data: bytes) -> pb.Envelope:
    """An ``inference_chunk`` envelope."""
    return pb.Envelope(inference_chunk=pb.InferenceChunk(inference_id=inference_id, data=data))


def done(inference_id: int) -> pb.Envelope:
    """An OK ``inference_done`` envelope."""
    return pb.Envelope(inference_done=pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK))


def test_events_of_one_turn_reach_the_sink_together_in_order() -> None:
    """Events received in one turn arrive in one call, in order; later ones in the next call."""
    gateway, node, clock = gateway_with_node()
    first, sink = submit_stream(gateway)
    second, other = submit_stream(gateway)
    assert [body for body, _ in node.sent] == ["inference_request", "inference_request"]
    for index in range(5):
        gateway.node_message(node, chunk(first, b'{"n":%d}' % index), "inference_chunk")
        gateway.node_message(node, chunk(second, b'{"m":%d}' % index), "inference_chunk")
    assert sink.calls == [] and other.calls == []  # nothing is written inside the turn
    clock.advance(0)
    assert sink.calls == [("chunks", [b'{"n":%d}' % i for i in range(5)])]
    assert other.calls == [("chunks", [b'{"m":%d}' % i for i in range(5)])]
    gateway.node_message(node, chunk(first, b'{"n":5}'), "inference_chunk")
    clock.advance(0)
    assert sink.calls[1:] == [("chunks", [b'{"n":5}'])]


def test_the_end_of_a_request_comes_after_its_events() -> None:
    """Done in the same turn as events: the events first, then complete; nothing later."""
    gateway, node, clock = gateway_with_node()
    inference_id, sink = submit_stream(gateway)
    gateway.node_message(node, chunk(inference_id, b"a"), "inference_chunk")
    gateway.node_message(node, chunk(inference_id, b"b"), "inference_chunk")
    gateway.node_message(node, done(inference_id), "inference_done")
    assert sink.calls == [("chunks", [b"a", b"b"]), ("complete", pb.INFERENCE_STATUS_OK)]
    clock.advance(0)
    assert len(sink.calls) == 2
    assert gateway.running() == 0 and gateway.outcomes == {"completed": 1}


def test_lost_node_sends_the_events_then_the_error() -> None:
    """A Node lost after output: what arrived is written, then the error (no retry)."""
    gateway, node, _clock = gateway_with_node()
    inference_id, sink = submit_stream(gateway)
    gateway.node_message(node, chunk(inference_id, b"a"), "inference_chunk")
    gateway.connection_lost(node)
    assert sink.calls == [("chunks", [b"a"]), ("fail", "node_lost")]


def test_client_gone_drops_the_pending_events_and_cancels() -> None:
    """A client gone mid-turn: its pending events are dropped, the Node is told to cancel."""
    gateway, node, clock = gateway_with_node()
    inference_id, sink = submit_stream(gateway)
    gateway.node_message(node, chunk(inference_id, b"a"), "inference_chunk")
    gateway.client_gone(inference_id)
    clock.advance(0)
    assert sink.calls == []
    assert [body for body, _ in node.sent] == ["inference_request", "inference_cancel"]


def test_http_response_sink_writes_a_batch_as_one_event_stream_write() -> None:
    """The HTTP side writes a batch once: each event as its own ``data:`` line, in order."""
    gateway, _, _ = gateway_with_node()
    request = DummyRequest([b"v1", b"chat", b"completions"])
    sink = _HttpResponseSink(request, True, gateway)
    sink.chunks([b'{"a":1}', b'{"b":2}', b'{"c":3}'])
    sink.chunks([b'{"d":4}'])
    assert request.written == [b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: {"c":3}\n\n', b'data: {"d":4}\n\n']
    assert request.responseHeaders.getRawHeaders(b"content-type") == [b"text/event-stream"]


@pytest_twisted.ensureDeferred
async def test_a_client_that_stops_reading_is_cut_off_and_the_node_stops(tmp_path: Path) -> None:
    """Unpaced tokens to a client that reads nothing: cut off at its buffer bound, lease freed, Node cancelled."""
    edge = await start_edge(
        write_yaml(
            tmp_path / "edge.yaml",
            gateway_edge_yaml(inference={"max_client_buffer_bytes": 64 * 1024}, second_node=False),
        )
    )
    services: list[Any] = [edge]
    client = socket.socket()
    try:
        await edge.inference_server.bound()
        node = start_node(
            write_yaml(tmp_path / "node.yaml", gateway_node_yaml("node-1", edge.node_port, mock_provider("p1")))
        )
        services.insert(0, node)
        await eventually(lambda: edge.registry.is_ready("node-1"), message="node ready")

        # A small receive window, so the kernel holds little on the client's behalf.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", edge.inference_port))
        body = chat(stream=True, max_tokens=1_000_000)
        client.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await eventually(
            lambda: edge.inference.outcomes.get("client_too_slow") == 1, timeout=60, message="slow client cut off"
        )
        runner = node.runtime.inference
        assert runner is not None
        await eventually(lambda: runner.cancelled == 1 and runner.running() == 0, message="node cancelled the run")
        pool = edge.registry.pool
        assert pool.in_flight_total() == 0 and edge.inference.running() == 0
    finally:
        client.close()
        await stop(*services)
