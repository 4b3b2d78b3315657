"""The Edge's Node wire protocol without sockets (StringTransport)."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, capturedLogs, formatEvent

from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.nodes.wire import NodeServerFactory, NodeServerProtocol
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_config, healthy, node_hello
from twisted_iop.testing.wires.frames import decode_frames
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import MAX_PROVIDERS, RejectionCode
from twisted_iop.wire.peer import frame, make_envelope
from twisted_iop.wire.settings import PeerSettings


def connect(start: float = 0.0) -> tuple[Clock, NodeRegistry, NodeServerProtocol, StringTransport, list[pb.EdgeEvent]]:
    """One Node connection on a fresh registry, made at ``start`` on the Edge's clock."""
    clock = Clock()
    clock.advance(start)
    registry = NodeRegistry(edge_config(), clock)
    events: list[pb.EdgeEvent] = []
    registry.relay.add_listener(events.append)
    factory = NodeServerFactory(registry, clock, PeerSettings(hello_timeout_seconds=5))
    proto = factory.buildProtocol(None)
    assert isinstance(proto, NodeServerProtocol)
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
    _, registry, proto, _transport, _ = connect()
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
    health = registry.providers.health("node-1", "mock-a")
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


def ready_connection() -> tuple[Clock, NodeRegistry, NodeServerProtocol, StringTransport, list[pb.EdgeEvent]]:
    """One Node connection that said hello and is ready (the node's owner)."""
    clock, registry, proto, transport, events = connect(start=1000)
    proto.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-1"), 1)))
    proto.dataReceived(frame(make_envelope("node_ready", pb.NodeReady(providers=healthy("mock-a")))))
    take(transport)
    return clock, registry, proto, transport, events


def last_seen_ms(registry: NodeRegistry, clock: Clock) -> int:
    """``last_seen_ms`` of node-1 in the Edge's snapshot."""
    snapshot = StatusProvider(registry, clock).snapshot()
    return next(n for n in snapshot.nodes if n.node_id == "node-1").last_seen_ms


def test_keepalive_frames_advance_last_seen() -> None:
    """Regression: a quiet owner's pings and pongs keep last_seen current (it used to freeze at ready)."""
    clock, registry, proto, transport, _ = ready_connection()
    assert last_seen_ms(registry, clock) == 1_000_000
    clock.advance(120)
    proto.dataReceived(frame(make_envelope("ping", pb.Ping(sent_at_ms=1))))
    [pong] = take(transport)
    assert pong.WhichOneof("body") == "pong"
    assert last_seen_ms(registry, clock) == 1_120_000
    # The Edge's own keepalive ping, answered by the Node's pong.
    clock.advance(30)
    proto.check_keepalive(clock.seconds())
    [ping] = take(transport)
    assert ping.WhichOneof("body") == "ping"
    proto.dataReceived(frame(make_envelope("pong", pb.Pong(ping_sent_at_ms=ping.ping.sent_at_ms), ping.request_id)))
    assert last_seen_ms(registry, clock) == 1_150_000
    assert not transport.disconnecting


def test_probe_answer_advances_last_seen() -> None:
    """An answer to the Edge's own request is a frame from the Node too."""
    clock, registry, proto, transport, _ = ready_connection()
    proto.probe(5.0)
    [request] = take(transport)
    clock.advance(3)
    answer = pb.NodeProbeResponse(health=healthy("mock-a"))
    proto.dataReceived(frame(make_envelope("node_probe_response", answer, request.request_id)))
    assert last_seen_ms(registry, clock) == 1_003_000


def test_pending_connection_frames_do_not_touch_owner_last_seen() -> None:
    """Only the current owner's frames count: a second, pending connection's pings do not."""
    clock, registry, _, _, _ = ready_connection()
    factory = NodeServerFactory(registry, clock, PeerSettings(hello_timeout_seconds=5))
    other = factory.buildProtocol(None)
    other_transport = StringTransport()
    other.makeConnection(other_transport)
    other.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-1"), 1)))
    clock.advance(60)
    other.dataReceived(frame(make_envelope("ping", pb.Ping(sent_at_ms=1))))
    assert last_seen_ms(registry, clock) == 1_000_000


def test_unknown_health_value_is_unknown_with_a_reason_and_keeps_the_connection() -> None:
    """Regression: ProviderHealth=99 from a Node is recorded as UNKNOWN (no work), logged, connection kept."""
    clock, registry, proto, transport, events = ready_connection()
    report = pb.NodeHealthReport(
        providers=[pb.ProviderHealthReport(provider_id="mock-a", health=99, reason="new state")]  # type: ignore[arg-type]  # an unknown enum value, on purpose
    )
    with capturedLogs() as logs:
        proto.dataReceived(frame(make_envelope("node_health_report", report)))
    assert take(transport) == [] and not transport.disconnecting
    warnings = [e for e in logs if e["log_level"] == LogLevel.warn]
    assert warnings and "99" in formatEvent(warnings[0])
    assert not [e for e in logs if e.get("log_failure") is not None]
    health = registry.providers.health("node-1", "mock-a")
    assert health is not None and health.health == pb.PROVIDER_HEALTH_UNKNOWN
    assert "99" in health.reason and "new state" in health.reason
    assert registry.pool.try_acquire("llama-3-8b") is None
    snapshot = StatusProvider(registry, clock).snapshot()
    provider = next(n for n in snapshot.nodes if n.node_id == "node-1").providers[0]
    assert provider.health == pb.PROVIDER_HEALTH_UNKNOWN and "99" in provider.health_reason
    changed = [e for e in events if e.kind == "provider.health_changed"]
    assert changed and changed[-1].attributes["health"] == "unknown"
    # Health reporting keeps working afterwards.
    proto.dataReceived(frame(make_envelope("node_health_report", pb.NodeHealthReport(providers=healthy("mock-a")))))
    assert registry.pool.try_acquire("llama-3-8b") is not None


def test_unknown_health_value_in_ready_does_not_break_readiness() -> None:
    """An unknown health value in NodeReady still makes the node ready, with that provider unknown."""
    _, registry, proto, transport, _ = connect()
    proto.dataReceived(frame(make_envelope("node_hello_request", node_hello("node-1"), 1)))
    reports = [pb.ProviderHealthReport(provider_id="mock-a", health=42)]  # type: ignore[arg-type]  # an unknown enum value, on purpose
    proto.dataReceived(frame(make_envelope("node_ready", pb.NodeReady(providers=reports))))
    assert registry.is_ready("node-1") and not transport.disconnecting
    health = registry.providers.health("node-1", "mock-a")
    assert health is not None and health.health == pb.PROVIDER_HEALTH_UNKNOWN and "42" in health.reason


def test_hello_rejections_use_the_shared_codes() -> None:
    """Bad id, bad version and an oversized hello are refused with RejectionCode values, permanently."""
    too_many = node_hello("node-1")
    too_many.providers.extend(pb.NodeProviderSpec(provider_id=f"p{i}") for i in range(MAX_PROVIDERS + 1))
    cases = [
        (node_hello("bad id"), RejectionCode.INVALID_ID),
        (node_hello("node-1", major=99), RejectionCode.UNSUPPORTED_VERSION),
        (node_hello("node-9"), RejectionCode.UNKNOWN_NODE),
        (node_hello("node-2", "nope"), RejectionCode.BAD_CREDENTIAL),
        (too_many, RejectionCode.INVALID_HELLO),
    ]
    for hello, code in cases:
        _, registry, proto, transport, events = connect()
        proto.dataReceived(frame(make_envelope("node_hello_request", hello, 3)))
        [reply] = take(transport)
        response = reply.node_hello_response
        assert not response.accepted and response.permanent and response.reason
        assert response.reason_code == code.value
        assert transport.disconnecting and events == [] and registry.connection_count() == 0
