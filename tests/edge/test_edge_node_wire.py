"""The Edge's Node wire protocol without sockets (StringTransport)."""

from __future__ import annotations

from edge_testing import decode_frames, edge_config, healthy, node_hello
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from twisted_iop.edge.node_wire import NodeServerFactory, NodeServerProtocol
from twisted_iop.edge.registry import NodeRegistry
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerSettings, frame, make_envelope


def connect() -> tuple[Clock, NodeRegistry, NodeServerProtocol, StringTransport, list[pb.EdgeEvent]]:
    """One Node connection on a fresh registry."""
    clock = Clock()
    registry = NodeRegistry(edge_config(), clock)
    events: list[pb.EdgeEvent] = []
    registry.relay.add_listener(events.append)
    factory = NodeServerFactory(registry, clock, PeerSettings(hello_timeout_seconds=5))
    proto = factory.buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    return clock, registry, proto, transport, events


def take(transport: StringTransport) -> list[pb.Envelope]:
    """Decode and clear what the Edge wrote."""
    envelopes = decode_frames(transport.value())
    transport.clear()
    return envelopes


def test_hello_byte_by_byte_then_ready() -> None:
    """Hello fed byte by byte is accepted (pending); NodeReady makes the node ready."""
    _, registry, proto, transport, events = connect()
    data = frame(make_envelope("node_hello_request", node_hello("node-1"), request_id=7))
    for i in range(len(data)):
        proto.dataReceived(data[i : i + 1])
    [reply] = take(transport)
    assert reply.request_id == 7 and reply.node_hello_response.accepted
    assert reply.node_hello_response.keepalive_interval_ms > 0
    assert not registry.is_ready("node-1")
    proto.dataReceived(frame(make_envelope("node_ready", pb.NodeReady(providers=healthy("mock-a")))))
    assert registry.is_ready("node-1")
    assert [e.kind for e in events] == ["node.pending", "node.ready"]
    proto.connectionLost()
    assert not registry.is_ready("node-1")
    assert events[-1].kind == "node.disconnected"


def test_frames_in_one_chunk() -> None:
    """Hello and NodeReady arriving in one chunk are both handled."""
    _, registry, proto, transport, _ = connect()
    chunk = frame(make_envelope("node_hello_request", node_hello("node-1"), 1)) + frame(
        make_envelope("node_ready", pb.NodeReady(providers=healthy("mock-a")))
    )
    proto.dataReceived(chunk)
    assert registry.is_ready("node-1")


def test_unknown_node_rejected_and_closed_without_events() -> None:
    """An unknown node id is answered accepted=false and closed; nothing changes."""
    _, registry, proto, transport, events = connect()
    proto.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-9"), 3)))
    [reply] = take(transport)
    response = reply.node_hello_response
    assert not response.accepted and response.permanent
    assert response.reason_code == "unknown_node" and "node-9" in response.reason
    assert transport.disconnecting
    proto.connectionLost()
    assert events == []
    assert registry.connection_count() == 0


def test_wrong_credential_rejected() -> None:
    """A wrong node credential is rejected with bad_credential."""
    _, _, proto, transport, _ = connect()
    proto.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-2", "nope"), 3)))
    [reply] = take(transport)
    assert reply.node_hello_response.reason_code == "bad_credential"
    assert "nope" not in reply.node_hello_response.reason


def test_message_before_hello_is_refused() -> None:
    """Anything but hello first gets HELLO_REQUIRED and a close."""
    _, _, proto, transport, _ = connect()
    proto.dataReceived(frame(make_envelope("node_ready", pb.NodeReady())))
    [reply] = take(transport)
    assert reply.error.code == pb.ERROR_CODE_HELLO_REQUIRED
    assert transport.disconnecting


def test_hello_timeout_closes() -> None:
    """A connection silent past the hello deadline gets HELLO_TIMEOUT and is closed."""
    clock, _, _, transport, _ = connect()
    clock.advance(5.1)
    [reply] = take(transport)
    assert reply.error.code == pb.ERROR_CODE_HELLO_TIMEOUT
    assert transport.disconnecting


def test_health_report_and_probe_round_trip() -> None:
    """The owner's health report updates health; probe() pairs with the answer by request_id."""
    _, registry, proto, transport, events = connect()
    proto.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-1"), 1)))
    proto.dataReceived(frame(make_envelope("node_ready", pb.NodeReady(providers=healthy("mock-a")))))
    take(transport)
    report = pb.NodeHealthReport(
        providers=[pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_UNHEALTHY, reason="oom")]
    )
    proto.dataReceived(frame(make_envelope("node_health_report", report)))
    health = registry.health("node-1", "mock-a")
    assert health is not None and health.reason == "oom"
    assert events[-1].kind == "provider.health_changed"
    answers: list[pb.NodeProbeResponse] = []
    proto.probe(2.0).addCallback(answers.append)
    [request] = take(transport)
    assert request.WhichOneof("body") == "node_probe_request"
    answer = pb.NodeProbeResponse(health=healthy("mock-a"))
    proto.dataReceived(frame(make_envelope("node_probe_response", answer, request.request_id)))
    assert answers and answers[0].health[0].health == pb.PROVIDER_HEALTH_HEALTHY


def test_malformed_frame_closes_but_registry_survives() -> None:
    """A frame that is not an envelope gets MALFORMED_FRAME and a close."""
    _, registry, proto, transport, _ = connect()
    proto.dataReceived(b"\x00\x00\x00\x03\xff\xff\xff")
    [reply] = take(transport)
    assert reply.error.code == pb.ERROR_CODE_MALFORMED_FRAME
    proto.connectionLost()
    assert registry.connection_count() == 0
