"""The Control Plane's edge wire protocol without sockets."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.edge_wire import (
    EdgeCredentials,
    EdgeWireFactory,
    EdgeWireProtocol,
    accepted_hello_response,
)
from twisted_iop.ids import id_problem
from twisted_iop.testing.wires.frames import decode_frames
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import MAX_COMMANDS, MAX_LABELS, MAX_TEXT, RejectionCode
from twisted_iop.wire.peer import frame, make_envelope
from twisted_iop.wire.settings import PeerSettings


def connect(
    credentials: EdgeCredentials = EdgeCredentials(),
) -> tuple[EdgeWireProtocol, StringTransport, EdgeRegistry, Clock]:
    """One edge-wire protocol on a StringTransport."""
    clock = Clock()
    registry = EdgeRegistry(clock)
    factory = EdgeWireFactory(registry, clock, PeerSettings(hello_timeout_seconds=5), credentials)
    protocol = factory.buildProtocol(None)
    assert isinstance(protocol, EdgeWireProtocol)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, registry, clock


def hello_frame(edge_id: str, major: int = PROTOCOL_MAJOR, credential: str = "", **extra: object) -> bytes:
    """A framed EdgeHelloRequest with request id 1."""
    return frame(
        make_envelope(
            "edge_hello_request",
            pb.EdgeHelloRequest(edge_id=edge_id, protocol_major=major, credential=credential, **extra),  # type: ignore[arg-type]  # keyword values of mixed types
            1,
        )
    )


def test_valid_hello_byte_by_byte_enrolls() -> None:
    """A hello fed one byte at a time is accepted and the edge is registered."""
    protocol, transport, registry, _ = connect()
    data = hello_frame("edge-a", labels={"site": "x"}, commands=[pb.CommandSpec(name="node.drain")])
    for i in range(len(data)):
        protocol.dataReceived(data[i : i + 1])
    answer = decode_frames(transport.value())[0]
    assert answer.request_id == 1 and answer.edge_hello_response.accepted
    assert answer.edge_hello_response.keepalive_deadline_ms == 45000
    assert registry.get("edge-a").connected
    assert registry.get("edge-a").command_names == ["node.drain"]


@pytest.mark.parametrize(
    ("edge_id", "major", "code"),
    [
        ("", PROTOCOL_MAJOR, "invalid_id"),
        ("has space", PROTOCOL_MAJOR, "invalid_id"),
        ("x" * 65, PROTOCOL_MAJOR, "invalid_id"),
        ("edge-a", PROTOCOL_MAJOR + 1, "unsupported_version"),
        ("edge-a", 0, "unsupported_version"),
    ],
)
def test_bad_hello_is_rejected_and_closed(edge_id: str, major: int, code: str) -> None:
    """Malformed ids and unsupported versions get accepted=false, a reason, and a close."""
    protocol, transport, registry, _ = connect()
    protocol.dataReceived(hello_frame(edge_id, major))
    answer = decode_frames(transport.value())[0].edge_hello_response
    assert not answer.accepted and answer.reason_code == code and answer.reason
    assert answer.permanent
    assert transport.disconnecting
    assert list(registry.edges()) == []


@pytest.mark.parametrize(
    "extra",
    [
        {"labels": {f"k{i}": "v" for i in range(MAX_LABELS + 1)}},
        {"labels": {"site": "x" * (MAX_TEXT + 1)}},
        {"commands": [pb.CommandSpec(name=f"c{i}") for i in range(MAX_COMMANDS + 1)]},
        {"commands": [pb.CommandSpec(name="")]},
    ],
)
def test_oversized_hello_is_rejected_as_invalid_hello(extra: dict[str, Any]) -> None:
    """Labels or a catalog over the bounds get the invalid_hello code, permanent, and a close."""
    protocol, transport, registry, _ = connect()
    protocol.dataReceived(hello_frame("edge-a", **extra))
    answer = decode_frames(transport.value())[0].edge_hello_response
    assert not answer.accepted and answer.reason_code == RejectionCode.INVALID_HELLO.value == "invalid_hello"
    assert answer.permanent and transport.disconnecting
    assert list(registry.edges()) == []


def test_every_edge_rejection_code_is_a_shared_code() -> None:
    """The edge wire's codes are values of the one RejectionCode enum, all permanent."""
    cases = [
        hello_frame("", PROTOCOL_MAJOR),
        hello_frame("edge-a", PROTOCOL_MAJOR + 1),
        hello_frame("edge-a", credential="guess"),
        hello_frame("edge-a", credential="s3cret", labels={"k": "x" * (MAX_TEXT + 1)}),
    ]
    codes = set()
    for data in cases:
        protocol, transport, _, _ = connect(EdgeCredentials.from_secrets(shared="s3cret"))
        protocol.dataReceived(data)
        answer = decode_frames(transport.value())[0].edge_hello_response
        assert answer.permanent
        codes.add(RejectionCode(answer.reason_code))
    assert codes == {
        RejectionCode.INVALID_ID,
        RejectionCode.UNSUPPORTED_VERSION,
        RejectionCode.BAD_CREDENTIAL,
        RejectionCode.INVALID_HELLO,
    }


def test_wrong_credential_is_rejected() -> None:
    """With per-edge credentials, a wrong one is refused; the right one is accepted."""
    credentials = EdgeCredentials.from_secrets(per_edge={"edge-a": "s3cret"})
    protocol, transport, _registry, _ = connect(credentials)
    protocol.dataReceived(hello_frame("edge-a", credential="guess"))
    answer = decode_frames(transport.value())[0].edge_hello_response
    assert not answer.accepted and answer.reason_code == "bad_credential"
    assert "guess" not in answer.reason and "s3cret" not in answer.reason
    protocol, transport, _registry, _ = connect(credentials)
    protocol.dataReceived(hello_frame("edge-a", credential="s3cret"))
    assert decode_frames(transport.value())[0].edge_hello_response.accepted
    # An edge without its own secret has no credential to match.
    protocol, transport, _registry, _ = connect(credentials)
    protocol.dataReceived(hello_frame("edge-b", credential=""))
    assert not decode_frames(transport.value())[0].edge_hello_response.accepted


def test_first_message_must_be_hello() -> None:
    """Any other first message gets HELLO_REQUIRED and a close."""
    protocol, transport, _registry, _ = connect()
    protocol.dataReceived(frame(make_envelope("edge_event", pb.EdgeEvent(kind="x"))))
    assert decode_frames(transport.value())[0].error.code == pb.ERROR_CODE_HELLO_REQUIRED
    assert transport.disconnecting


def test_hello_timeout() -> None:
    """A connection that never says hello is closed at the hello deadline."""
    _protocol, transport, _, clock = connect()
    clock.advance(5.1)
    assert decode_frames(transport.value())[0].error.code == pb.ERROR_CODE_HELLO_TIMEOUT
    assert transport.disconnecting


def test_unexpected_request_after_hello_gets_error_and_stays_open() -> None:
    """A request the Control Plane does not serve is answered with an error, not a close."""
    protocol, transport, _registry, _ = connect()
    protocol.dataReceived(hello_frame("edge-a"))
    transport.clear()
    protocol.dataReceived(frame(make_envelope("edge_status_request", pb.EdgeStatusRequest(), 5)))
    answer = decode_frames(transport.value())[0]
    assert answer.request_id == 5 and answer.error.code == pb.ERROR_CODE_UNEXPECTED_MESSAGE
    assert not transport.disconnecting


def test_connection_loss_marks_edge_disconnected() -> None:
    """Losing the transport disconnects the edge in the registry with a reason."""
    protocol, _transport, registry, _ = connect()
    protocol.dataReceived(hello_frame("edge-a"))
    protocol.connectionLost()
    record = registry.get("edge-a")
    assert not record.connected
    assert record.events.since(0, 10)[-1].kind == "edge.disconnected"


@given(chunks=st.lists(st.binary(max_size=64), max_size=12), with_hello=st.booleans())
def test_arbitrary_bytes_never_escape_as_exceptions(chunks: list[bytes], with_hello: bool) -> None:
    """Any byte stream, after a hello or not, is handled: nothing raises, a close comes with an error frame."""
    protocol, transport, registry, _ = connect()
    if with_hello:
        protocol.dataReceived(hello_frame("edge-a"))
        transport.clear()
    for chunk in chunks:
        protocol.dataReceived(chunk)
    if transport.disconnecting and transport.value():
        frames = decode_frames(transport.value())
        assert frames and frames[-1].WhichOneof("body") == "error"
    if with_hello and not transport.disconnecting:
        assert registry.get("edge-a").connected


@given(edge_id=st.text(max_size=80), major=st.integers(min_value=0, max_value=5), credential=st.text(max_size=20))
def test_any_hello_gets_an_answer(edge_id: str, major: int, credential: str) -> None:
    """Every well-framed hello is answered: accepted with a valid id and version, rejected with a reason otherwise."""
    protocol, transport, _registry, _ = connect()
    protocol.dataReceived(hello_frame(edge_id, major, credential))
    answer = decode_frames(transport.value())[0].edge_hello_response
    valid = major == PROTOCOL_MAJOR and id_problem("edge_id", edge_id) is None
    assert answer.accepted == valid
    assert answer.accepted or (answer.reason and answer.reason_code and transport.disconnecting)


@pytest.mark.parametrize("request_id", [1, 127, 128, 300, 2**40])
def test_the_accepted_answer_is_the_full_response_with_the_hellos_request_id(request_id: int) -> None:
    """The answer serialized once per factory carries the hello's request id and
    the same versions and keepalive timing a fresh response would."""
    clock = Clock()
    settings = PeerSettings(keepalive_interval_seconds=7.5, keepalive_deadline_seconds=22.0)
    factory = EdgeWireFactory(EdgeRegistry(clock), clock, settings)
    protocol = factory.buildProtocol(None)
    transport = StringTransport()
    protocol.makeConnection(transport)
    hello = pb.EdgeHelloRequest(edge_id="edge-a", protocol_major=PROTOCOL_MAJOR)
    protocol.dataReceived(frame(make_envelope("edge_hello_request", hello, request_id)))
    [answer] = decode_frames(transport.value())
    assert answer == make_envelope("edge_hello_response", accepted_hello_response(settings), request_id)
    response = answer.edge_hello_response
    assert response.accepted and response.keepalive_interval_ms == 7500 and response.keepalive_deadline_ms == 22000
    assert response.server_version and response.protocol_major == PROTOCOL_MAJOR
