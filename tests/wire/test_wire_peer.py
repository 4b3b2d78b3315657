"""The framed peer protocol without sockets: framing, correlation, keepalive."""

from __future__ import annotations

import struct

import pytest
from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from twisted_iop.testing.wires.frames import decode_frames
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.keepalive import KeepaliveSweeper
from twisted_iop.wire.peer import (
    FramedPeerProtocol,
    PeerDisconnected,
    PeerSettings,
    RemoteError,
    RequestTimeout,
    frame,
    make_envelope,
)
from twisted_iop.wire.preserialized import PreserializedAnswer, PreserializedRequest


class Recorder(FramedPeerProtocol):
    """Keeps every envelope handed to the subclass hook."""

    def __init__(self, clock: Clock, settings: PeerSettings = PeerSettings()) -> None:
        super().__init__(clock, settings)
        self.received: list[tuple[str, pb.Envelope]] = []
        self.disconnected = False

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        self.received.append((body, envelope))

    def peer_disconnected(self, reason: Failure) -> None:
        self.disconnected = True


def connected(settings: PeerSettings = PeerSettings()) -> tuple[Recorder, StringTransport, Clock]:
    """A protocol on a StringTransport with a fake clock."""
    clock = Clock()
    protocol = Recorder(clock, settings)
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport, clock


def sent(transport: StringTransport) -> list[pb.Envelope]:
    """Decode everything written to ``transport``."""
    return decode_frames(transport.value())


def event_frame(kind: str) -> bytes:
    """One framed edge_event envelope."""
    return frame(make_envelope("edge_event", pb.EdgeEvent(kind=kind)))


def test_frames_fed_byte_by_byte_arrive_whole() -> None:
    """Two frames delivered one byte at a time are decoded exactly once each."""
    protocol, _, _ = connected()
    data = event_frame("a") + event_frame("b")
    for i in range(len(data)):
        protocol.dataReceived(data[i : i + 1])
    assert [e.edge_event.kind for _, e in protocol.received] == ["a", "b"]


def test_many_frames_in_one_chunk() -> None:
    """A large chunk carrying 500 frames yields 500 envelopes in order."""
    protocol, _, _ = connected()
    protocol.dataReceived(b"".join(event_frame(str(i)) for i in range(500)))
    assert [e.edge_event.kind for _, e in protocol.received] == [str(i) for i in range(500)]


def test_oversize_length_prefix_gets_error_and_close() -> None:
    """A 2 GiB length prefix is refused at once with FRAME_TOO_LARGE, no buffering."""
    protocol, transport, _ = connected(PeerSettings(max_frame_bytes=1024))
    protocol.dataReceived(struct.pack(">I", 2 * 1024**3) + b"x" * 10)
    assert sent(transport)[0].error.code == pb.ERROR_CODE_FRAME_TOO_LARGE
    assert transport.disconnecting
    # Anything after the close is ignored, never parsed.
    protocol.dataReceived(event_frame("late"))
    assert protocol.received == []


def test_undecodable_frame_gets_error_and_close() -> None:
    """Random bytes in a frame are answered with MALFORMED_FRAME and a close."""
    protocol, transport, _ = connected()
    protocol.dataReceived(struct.pack(">I", 8) + b"\xff" * 8)
    assert sent(transport)[0].error.code == pb.ERROR_CODE_MALFORMED_FRAME
    assert transport.disconnecting


def test_request_is_answered_by_matching_response() -> None:
    """A response with the request's id fires the request's Deferred."""
    protocol, transport, _ = connected()
    d = protocol.request("edge_status_request", pb.EdgeStatusRequest(), 5)
    request = sent(transport)[0]
    answer = make_envelope("edge_status_response", pb.EdgeStatusResponse(edge_id="e"), request.request_id)
    protocol.dataReceived(frame(answer))
    results: list[pb.Envelope] = []
    d.addCallback(results.append)
    assert results[0].edge_status_response.edge_id == "e"
    assert protocol.pending_requests == 0


def test_error_answer_fails_the_request() -> None:
    """An error frame with the request's id fails it with RemoteError."""
    protocol, transport, _ = connected()
    d = protocol.request("edge_status_request", pb.EdgeStatusRequest(), 5)
    rid = sent(transport)[0].request_id
    protocol.dataReceived(frame(make_envelope("error", pb.Error(code=pb.ERROR_CODE_INTERNAL, message="boom"), rid)))
    failures: list[Failure] = []
    d.addErrback(failures.append)
    error = failures[0].value
    assert isinstance(error, RemoteError)
    assert error.code == pb.ERROR_CODE_INTERNAL


def test_request_times_out_and_late_answer_is_ignored() -> None:
    """No answer within the deadline fails with RequestTimeout; a late answer is dropped."""
    protocol, transport, clock = connected()
    d = protocol.request("edge_status_request", pb.EdgeStatusRequest(), 2)
    failures: list[Failure] = []
    d.addErrback(failures.append)
    clock.advance(1.9)
    assert failures == []
    clock.advance(0.2)
    assert failures[0].check(RequestTimeout)
    rid = sent(transport)[0].request_id
    protocol.dataReceived(frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(), rid)))
    assert protocol.received == []


def test_pending_requests_fail_at_once_on_disconnect() -> None:
    """Dropping the connection fails every pending request with PeerDisconnected."""
    protocol, _, clock = connected()
    ds = [protocol.request("edge_status_request", pb.EdgeStatusRequest(), 60) for _ in range(3)]
    failures: list[Failure] = []
    for d in ds:
        d.addErrback(failures.append)
    protocol.connectionLost(Failure(ConnectionError("gone")))
    assert len(failures) == 3 and all(f.check(PeerDisconnected) for f in failures)
    assert protocol.disconnected
    assert clock.getDelayedCalls() == []


def test_ping_is_answered_with_pong() -> None:
    """A ping gets a pong carrying the ping's id and timestamp."""
    protocol, transport, _ = connected()
    protocol.dataReceived(frame(make_envelope("ping", pb.Ping(sent_at_ms=42), 7)))
    reply = sent(transport)[0]
    assert reply.request_id == 7 and reply.pong.ping_sent_at_ms == 42


def test_keepalive_pings_idle_peer_and_drops_silent_one() -> None:
    """An idle peer is pinged after the interval and dropped after the deadline."""
    settings = PeerSettings(keepalive_interval_seconds=1, keepalive_deadline_seconds=3)
    protocol, transport, clock = connected(settings)
    sweeper = KeepaliveSweeper(clock, settings, lambda: [protocol])
    sweeper.start()
    clock.advance(1.2)
    clock.advance(0.34)
    assert any(e.WhichOneof("body") == "ping" for e in sent(transport))
    assert not transport.disconnecting
    for _ in range(10):
        clock.advance(0.34)
    kinds = [e.WhichOneof("body") for e in sent(transport)]
    assert kinds[-1] == "error"
    assert sent(transport)[-1].error.code == pb.ERROR_CODE_KEEPALIVE_TIMEOUT
    assert transport.disconnecting
    sweeper.stop()


def test_traffic_keeps_a_peer_alive() -> None:
    """Frames arriving within the deadline keep the connection open."""
    settings = PeerSettings(keepalive_interval_seconds=1, keepalive_deadline_seconds=3)
    protocol, transport, clock = connected(settings)
    sweeper = KeepaliveSweeper(clock, settings, lambda: [protocol])
    sweeper.start()
    for _ in range(20):
        clock.advance(0.5)
        protocol.dataReceived(event_frame("tick"))
    assert not transport.disconnecting
    sweeper.stop()


def test_hello_timer_closes_a_silent_connection() -> None:
    """Without hello_done() in time, the connection gets HELLO_TIMEOUT and closes."""
    protocol, transport, clock = connected(PeerSettings(hello_timeout_seconds=2))
    protocol.start_hello_timer()
    clock.advance(2.1)
    assert sent(transport)[0].error.code == pb.ERROR_CODE_HELLO_TIMEOUT
    assert transport.disconnecting


def test_stalled_close_is_aborted() -> None:
    """A close that cannot flush is aborted after the grace period."""
    protocol, transport, clock = connected()
    aborted: list[bool] = []
    transport.abortConnection = lambda: aborted.append(True)  # type: ignore[method-assign]  # replaced for this test, to see the abort
    protocol.close()
    clock.advance(10)
    assert aborted == [True]


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 4096])
def test_chunked_delivery_of_mixed_frames(chunk: int) -> None:
    """Any chunking of a stream of frames yields the same envelopes."""
    protocol, _, _ = connected()
    data = b"".join(event_frame("k" * (i % 50)) for i in range(40))
    for i in range(0, len(data), chunk):
        protocol.dataReceived(data[i : i + chunk])
    assert [e.edge_event.kind for _, e in protocol.received] == ["k" * (i % 50) for i in range(40)]


#: The status request every preserialized test sends.
STATUS_REQUEST = PreserializedRequest("edge_status_request", pb.EdgeStatusRequest())


class Ends:
    """A completion for each named request, keeping ``(name, envelope, error)`` in the order they end."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, object, object]] = []

    def of(self, name: str) -> Ending:
        """The completion of the request named ``name``."""
        return Ending(self.ends, name)


class Ending:
    """One request's completion: appends how it ended to the shared list."""

    def __init__(self, ends: list[tuple[str, object, object]], name: str) -> None:
        self.ends = ends
        self.name = name

    def answered(self, result: pb.Envelope) -> None:
        """Keep the answer."""
        self.ends.append((self.name, result, None))

    def failed(self, error: Exception) -> None:
        """Keep the error."""
        self.ends.append((self.name, None, error))


def test_preserialized_request_is_numbered_and_answered_like_request() -> None:
    """request_preserialized takes the next request id after request, and the answer ends its completion."""
    protocol, transport, _ = connected()
    first = protocol.request("edge_status_request", pb.EdgeStatusRequest(), 5.0)
    ends = Ends()
    second = protocol.request_preserialized(STATUS_REQUEST, ends.of("second"), 5.0)
    envelopes = sent(transport)
    assert [e.request_id for e in envelopes] == [1, 2] == [1, second]
    assert envelopes[1] == make_envelope("edge_status_request", pb.EdgeStatusRequest(), 2)
    protocol.dataReceived(frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(edge_id="e"), 2)))
    [(name, envelope, error)] = ends.ends
    assert name == "second" and error is None
    assert isinstance(envelope, pb.Envelope) and envelope.edge_status_response.edge_id == "e"
    assert not first.called


def test_preserialized_requests_end_once_each() -> None:
    """request_preserialized: the answer, an error frame, the deadline, a cancel and a
    disconnect each end their own request once, and nothing else happens after."""
    protocol, transport, clock = connected()
    ends = Ends()
    answered, refused, late, cancelled, dropped = (
        protocol.request_preserialized(STATUS_REQUEST, ends.of(name), 5.0, deadline=name == "late")
        for name in ("answered", "refused", "late", "cancelled", "dropped")
    )
    assert [e.request_id for e in sent(transport)] == [1, 2, 3, 4, 5] == [answered, refused, late, cancelled, dropped]
    protocol.dataReceived(frame(make_envelope("edge_status_response", pb.EdgeStatusResponse(edge_id="e"), answered)))
    protocol.dataReceived(frame(make_envelope("error", pb.Error(code=pb.ERROR_CODE_INTERNAL, message="no"), refused)))
    clock.advance(5.0)
    protocol.cancel_request(cancelled)
    protocol.cancel_request(cancelled)  # twice: the second changes nothing
    protocol.connectionLost(Failure(ConnectionError()))
    by_name = {name: (envelope, error) for name, envelope, error in ends.ends}
    assert [name for name, _, _ in ends.ends] == ["answered", "refused", "late", "cancelled", "dropped"]
    envelope, error = by_name["answered"]
    assert error is None and isinstance(envelope, pb.Envelope) and envelope.edge_status_response.edge_id == "e"
    assert isinstance(by_name["refused"][1], RemoteError)
    assert isinstance(by_name["late"][1], RequestTimeout)
    assert isinstance(by_name["cancelled"][1], CancelledError)
    assert isinstance(by_name["dropped"][1], PeerDisconnected)
    assert clock.getDelayedCalls() == [] and protocol.pending_requests == 0


def test_preserialized_request_on_a_closed_connection_ends_at_once() -> None:
    """On a closing connection nothing is sent and the completion fails with PeerDisconnected at once."""
    protocol, transport, _ = connected()
    protocol.close()
    ends = Ends()
    assert protocol.request_preserialized(STATUS_REQUEST, ends.of("x"), 5.0) == 0
    assert transport.value() == b"" and len(ends.ends) == 1 and isinstance(ends.ends[0][2], PeerDisconnected)


def test_preserialized_answer_carries_the_request_id_it_answers() -> None:
    """answer_preserialized writes the answer with the asker's request id, and nothing once closing."""
    protocol, transport, _ = connected()
    message = pb.EdgeHelloResponse(accepted=True, server_version="v")
    answer = PreserializedAnswer("edge_hello_response", message)
    protocol.answer_preserialized(answer, 7)
    assert sent(transport) == [make_envelope("edge_hello_response", message, 7)]
    protocol.close()
    transport.clear()
    protocol.answer_preserialized(answer, 8)
    assert transport.value() == b""
