"""What an outside attack run found against the framed wires, each pinned down.

Every test drives the real accepting side (the Control Plane's edge wire,
the Edge's node wire) or the framed peer itself over a StringTransport and
captures the log: a hostile peer must be answered or closed as
docs/wire.md says, never crash dispatch, and never flood the log.
"""

from __future__ import annotations

from typing import Any, Union

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet import operations
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.testing.wires.frames import field_bytes, field_varint, length_prefixed
from twisted_iop.testing.wires.wire import EdgeWireDriver, FramedConnection, LogCapture, NodeWireDriver
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label, enum_name
from twisted_iop.wire.peer import (
    WARNINGS_LOGGED_PER_CONNECTION,
    FramedPeerProtocol,
    PeerSettings,
    RemoteError,
    frame,
    make_envelope,
)

Driver = Union[EdgeWireDriver, NodeWireDriver]


def drivers() -> list[Any]:
    """Both TCP wires' accepting sides, as pytest params."""
    return [pytest.param(EdgeWireDriver, id="edge_wire"), pytest.param(NodeWireDriver, id="node_wire")]


def enrolled(driver: Driver) -> FramedConnection:
    """A connection whose hello was accepted."""
    connection = driver.connect()
    connection.send(driver.hello_body, driver.hello_message(), 1)
    assert not connection.closed
    return connection


class Recorder(FramedPeerProtocol):
    """A framed peer that keeps what reaches the subclass hook."""

    def __init__(self, settings: PeerSettings = PeerSettings()) -> None:
        super().__init__(Clock(), settings)
        self.received: list[str] = []
        self.envelopes: list[pb.Envelope] = []

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        self.received.append(body)
        self.envelopes.append(envelope)


# -- 1. unknown enum values ---------------------------------------------------------


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_enum_names_never_raise(value: int) -> None:
    """Any int32 gets a name from every wire enum; known values keep theirs."""
    for enum_type in (pb.ErrorCode, pb.ProviderStatus, pb.ProviderHealth, pb.CommandOutcome):
        name = enum_name(enum_type, value)
        label = enum_label(enum_type, value)
        if value in enum_type.values():
            assert name == enum_type.Name(value)
        else:
            assert name.endswith(str(value)) and label == f"unknown_{value}"


def test_enum_name_examples() -> None:
    """Known and unknown values are named the way logs and clients show them."""
    assert enum_name(pb.ErrorCode, pb.ERROR_CODE_HELLO_REQUIRED) == "ERROR_CODE_HELLO_REQUIRED"
    assert enum_name(pb.ErrorCode, 99) == "ERROR_CODE_99"
    assert enum_label(pb.ProviderHealth, pb.PROVIDER_HEALTH_DEGRADED) == "degraded"
    assert enum_label(pb.ErrorCode, 99, unknown="error_{value}") == "error_99"


def test_error_with_unknown_code_fails_only_its_request() -> None:
    """Error{code: 99} answering a request fails it; the connection and the rest of the read survive.

    The attack: 45 answered commands ended edge_disconnected because naming
    code 99 raised outside the dispatch guard and dropped the connection
    with its read buffer.
    """
    protocol = Recorder()
    connection = FramedConnection(protocol)
    failures: list[Failure] = []
    protocol.request("edge_status_request", pb.EdgeStatusRequest(), 5).addErrback(failures.append)
    answered: list[Any] = []
    protocol.request("edge_status_request", pb.EdgeStatusRequest(), 5).addCallback(answered.append)
    with LogCapture().active() as log:
        connection.feed(
            frame(make_envelope("error", pb.Error(code=99, message="odd"), 1))  # type: ignore[arg-type]  # an unknown enum value, on purpose
            + frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(edge_id="e"), 2))
            + frame(make_envelope("edge_event", pb.EdgeEvent(kind="after")))
        )
    assert log.errors() == [], log.describe(log.errors())
    error = failures[0].value
    assert isinstance(error, RemoteError)
    assert error.code == 99 and "ERROR_CODE_99" in str(error)
    assert answered[0].edge_status_response.edge_id == "e"
    assert protocol.received == ["edge_event"]
    assert not connection.closed


def test_unknown_enum_values_in_a_status_answer_reach_the_views_as_unknown() -> None:
    """A status answer with status/health 99 is kept and shown as unavailable/unknown."""
    driver = EdgeWireDriver()
    connection = enrolled(driver)
    driver.open_requests(connection)
    request = next(e for e in connection.sent() if e.WhichOneof("body") == "edge_status_request")
    provider = pb.ProviderSnapshot(provider_id="p", status=99, health=77)  # type: ignore[arg-type]  # unknown enum values, on purpose
    answer = pb.EdgeStatusResponse(edge_id="edge-1", nodes=[pb.EdgeNodeSnapshot(node_id="n", providers=[provider])])
    with LogCapture().active() as log:
        connection.send("edge_status_response", answer, request.request_id)
    assert log.errors() == [], log.describe(log.errors())
    [nodes, counts] = driver.outcomes[:2]
    assert nodes[0]["providers"][0]["status"] == "unavailable"
    assert nodes[0]["providers"][0]["health"] == "unknown"
    assert counts[2] == 1  # the provider is counted once


def test_unknown_command_outcome_fails_the_operation_with_a_reason() -> None:
    """A command answer with outcome 99 ends the operation as failed, naming the outcome."""
    driver = EdgeWireDriver()
    connection = enrolled(driver)
    driver.open_requests(connection)
    request = next(e for e in connection.sent() if e.WhichOneof("body") == "edge_command_request")
    answer = pb.EdgeCommandResponse(command_id=request.edge_command_request.command_id, outcome=99)  # type: ignore[arg-type]  # an unknown enum value, on purpose
    with LogCapture().active() as log:
        connection.send("edge_command_response", answer, request.request_id)
    assert log.errors() == [], log.describe(log.errors())
    operation = next(o for o in driver.outcomes if isinstance(o, operations.OperationRecord))
    assert operation.state == operation_states.FAILED
    assert "COMMAND_OUTCOME_99" in operation.reason


def test_unknown_health_from_a_node_is_named_in_the_event() -> None:
    """A NodeHealthReport with health 42 is recorded as unknown; its event's reason names the value."""
    driver = NodeWireDriver()
    connection = enrolled(driver)
    events: list[pb.EdgeEvent] = []
    driver.registry.relay.add_listener(events.append)
    healthy = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
    odd = pb.ProviderHealthReport(provider_id="mock-a", health=42)  # type: ignore[arg-type]  # an unknown enum value, on purpose
    with LogCapture().active() as log:
        connection.send("node_ready", pb.NodeReady(providers=[healthy]))
        connection.send("node_health_report", pb.NodeHealthReport(providers=[odd]))
    assert log.errors() == [], log.describe(log.errors())
    changed = [e for e in events if e.kind == "provider.health_changed"]
    assert changed and changed[-1].attributes["health"] == "unknown"
    assert "42" in changed[-1].attributes["reason"]


# -- 2. frame size before hello, and linear buffering -----------------------------------


@pytest.mark.parametrize("driver_class", drivers())
def test_a_large_frame_before_hello_is_refused(driver_class: Any) -> None:
    """Before hello, a frame above max_hello_frame_bytes gets FRAME_TOO_LARGE and a close."""
    driver = driver_class(PeerSettings(max_hello_frame_bytes=1024))
    connection = driver.connect()
    connection.feed(length_prefixed(b"\x00" * 2000)[:100])
    [error] = connection.sent()
    assert error.error.code == pb.ERROR_CODE_FRAME_TOO_LARGE and "before hello" in error.error.message
    assert connection.closed


def test_a_large_frame_after_hello_is_accepted() -> None:
    """After hello the full frame limit applies again (a big status answer is fine)."""
    driver = EdgeWireDriver(PeerSettings(max_hello_frame_bytes=1024))
    connection = enrolled(driver)
    driver.open_requests(connection)
    request = next(e for e in connection.sent() if e.WhichOneof("body") == "edge_status_request")
    nodes = [pb.EdgeNodeSnapshot(node_id=f"n{i}", labels={"k": "v" * 100}) for i in range(100)]
    data = frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(nodes=nodes), request.request_id))
    assert len(data) > 10_000
    for i in range(0, len(data), 200):
        connection.feed(data[i : i + 200])
    assert not connection.closed
    assert len(driver.outcomes[0]) == 100


def test_a_trickled_frame_arrives_once_and_whole() -> None:
    """A large frame fed 200 bytes at a time arrives once, intact, with its
    last piece; a partial frame after whole ones in one read is kept for the next."""
    protocol = Recorder()
    connection = FramedConnection(protocol)
    text = "".join(chr(0x41 + i % 26) for i in range(100_000))
    data = frame(make_envelope("edge_event", pb.EdgeEvent(message=text)))
    *pieces, last = [data[i : i + 200] for i in range(0, len(data), 200)]
    for piece in pieces:
        connection.feed(piece)
    assert protocol.received == []
    connection.feed(last)
    assert protocol.received == ["edge_event"] and protocol.envelopes[0].edge_event.message == text
    # Two whole frames and half of a third in one read: the half waits for its rest.
    small = [frame(make_envelope("edge_event", pb.EdgeEvent(message=m))) for m in ("a", "b", "c", "d")]
    connection.feed(small[0] + small[1] + small[2][:5])
    assert [e.edge_event.message for e in protocol.envelopes[1:]] == ["a", "b"]
    # The rest of the third, the fourth byte by byte, and nothing left over.
    connection.feed(small[2][5:])
    for i in range(len(small[3])):
        connection.feed(small[3][i : i + 1])
    assert [e.edge_event.message for e in protocol.envelopes[1:]] == ["a", "b", "c", "d"]
    assert not protocol.closing and protocol.violations == 0


# -- 3. log flooding and the violation limit --------------------------------------------


def test_violations_are_logged_sparingly_and_close_the_peer() -> None:
    """Unknown bodies after hello: a few warnings, then a close at max_violations and one summary."""
    driver = EdgeWireDriver(PeerSettings(max_violations=10))
    connection = enrolled(driver)
    empty = length_prefixed(b"")
    with LogCapture().active() as log:
        connection.feed(empty * 1000)
        connection.drop()
    assert connection.closed
    last = connection.sent()[-1]
    assert last.error.code == pb.ERROR_CODE_UNEXPECTED_MESSAGE and "too many protocol violations" in last.error.message
    assert connection.protocol.violations == 10
    # The first few violations, the close, the summary and the registry's
    # own disconnect line: bounded whatever the peer sends.
    assert len(log.warnings()) <= WARNINGS_LOGGED_PER_CONNECTION + 2
    assert any("were not logged" in str(e.get("log_format")) for e in log.warnings())
    assert log.errors() == []


def test_a_request_with_an_unknown_body_is_answered_and_counted() -> None:
    """An unknown oneof member with a request id gets UNEXPECTED_MESSAGE; the connection stays open."""
    driver = NodeWireDriver()
    connection = enrolled(driver)
    connection.feed(length_prefixed(field_varint(1, 9) + field_bytes(99, b"newer")))
    answer = connection.sent()[-1]
    assert answer.request_id == 9 and answer.error.code == pb.ERROR_CODE_UNEXPECTED_MESSAGE
    assert not connection.closed and connection.protocol.violations == 1


def test_an_answer_to_a_request_never_sent_is_a_violation_not_answered() -> None:
    """A response whose request id was never issued is counted and not answered."""
    driver = EdgeWireDriver()
    connection = enrolled(driver)
    before = len(connection.sent())
    connection.send("edge_status_response", pb.EdgeStatusResponse(), 777)
    assert len(connection.sent()) == before
    assert connection.protocol.violations == 1 and not connection.closed


# -- 4. the first frame must be a hello ---------------------------------------------------

FIRST_FRAMES = {
    "ping": frame(make_envelope("ping", pb.Ping(sent_at_ms=1), 3)),
    "pong": frame(make_envelope("pong", pb.Pong(), 3)),
    "empty": length_prefixed(b""),
    "unknown_body": length_prefixed(field_varint(1, 3) + field_bytes(99, b"")),
    "response": frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(), 3)),
    "error": frame(make_envelope("error", pb.Error(code=pb.ERROR_CODE_INTERNAL), 0)),
    "event": frame(make_envelope("edge_event", pb.EdgeEvent(kind="x"))),
}


@pytest.mark.parametrize("driver_class", drivers())
@pytest.mark.parametrize("first", sorted(FIRST_FRAMES))
def test_first_frame_must_be_a_hello(driver_class: Any, first: str) -> None:
    """A ping, pong, empty, unknown, answer or event first gets HELLO_REQUIRED at once and a close."""
    driver = driver_class()
    connection = driver.connect()
    with LogCapture().active() as log:
        connection.feed(FIRST_FRAMES[first] * 50)
    [error] = connection.sent()
    assert error.error.code == pb.ERROR_CODE_HELLO_REQUIRED
    assert connection.closed
    assert len(log.warnings()) == 1 and log.errors() == []
    driver.check_good_peer()


@pytest.mark.parametrize("driver_class", drivers())
def test_repeated_hello_is_refused_and_the_connection_stays_open(driver_class: Any) -> None:
    """A second hello after acceptance gets UNEXPECTED_MESSAGE; the connection stays open (docs/wire.md)."""
    driver = driver_class()
    connection = enrolled(driver)
    connection.send(driver.hello_body, driver.hello_message(), 5)
    answer = connection.sent()[-1]
    assert answer.request_id == 5 and answer.error.code == pb.ERROR_CODE_UNEXPECTED_MESSAGE
    assert not connection.closed
    connection.send("ping", pb.Ping(), 6)
    assert connection.sent()[-1].WhichOneof("body") == "pong"
