"""The framed protobuf peer shared by every TCP wire.

Both TCP wires (Edge -> Control Plane and Node -> Edge) speak the same
framing: a 4-byte big-endian length, then one serialized
:class:`~twisted_iop.wire.control_pb2.Envelope`. :class:`FramedPeerProtocol`
implements everything the two ends of both wires share:

* framing with an explicit maximum frame size (and a much smaller one
  while an accepted connection has not said hello); a frame that is too
  long or does not parse is answered with an ``Error`` frame and the
  connection is closed. Partial frames are kept in one ``bytearray``, so a
  frame trickled in tiny pieces costs what it costs whole;
* request/response correlation by ``request_id``, with a deadline per
  request; pending requests fail at once when the connection drops;
* ping/pong keepalive, driven by a
  :class:`~twisted_iop.wire.keepalive.KeepaliveSweeper` shared by all
  connections of one factory so that 10,000 connections cost one timer;
* an optional hello deadline for the accepting side, which also refuses
  any first frame that is not a hello;
* protocol violations (unknown or empty bodies, answers to requests never
  sent, messages not valid in this state) are counted: the first few are
  logged, the rest summed up in one line when the connection closes, and a
  peer that commits ``max_violations`` of them is closed.

Subclasses implement :meth:`FramedPeerProtocol.envelope_received` and the
``peer_*`` hooks; they never see pings, pongs or responses to their own
requests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional, Union, cast

from google.protobuf.message import DecodeError, Message
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IAddress, IDelayedCall, IHandshakeListener, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOProtocol
from twisted.python.failure import Failure
from zope.interface import implementer

from twisted_iop.eventloop.turn_writes import TurnBuffer
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.counters import WireCounters
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.keepalive import KeepaliveSweeper
from twisted_iop.wire.pending import Completion, PendingRequests
from twisted_iop.wire.preserialized import PreserializedAnswer, PreserializedRequest
from twisted_iop.wire.settings import PeerSettings

#: Bodies that answer a request; only these are matched against pending
#: requests, so a peer's own request can never be mistaken for a reply.
RESPONSE_BODIES = frozenset(
    {
        "error",
        "pong",
        "edge_hello_response",
        "edge_status_response",
        "edge_command_response",
        "edge_deployments_response",
        "node_hello_response",
        "node_probe_response",
        "node_provider_command_response",
        "node_instances_response",
    }
)

#: Bodies that open a connection on the accepting side of a TCP wire.
HELLO_BODIES = frozenset({"edge_hello_request", "node_hello_request"})

#: Size of the length prefix of every frame.
PREFIX_BYTES = 4

#: How many protocol warnings one connection may write to the log; the rest
#: are counted and summed up in one line when the connection closes.
WARNINGS_LOGGED_PER_CONNECTION = 5

#: How long a closing connection may take to flush its last frame before it
#: is aborted (a peer that never reads must not hold the socket open).
CLOSE_GRACE_SECONDS = 5.0


class WireError(Exception):
    """Base class for failures of a request on a framed wire."""


class PeerDisconnected(WireError):
    """The connection closed before the request was answered."""


class RequestTimeout(WireError):
    """The peer did not answer the request within its deadline."""


class RemoteError(WireError):
    """The peer answered the request with an ``Error`` frame."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{enum_name(pb.ErrorCode, code)}: {message}")
        self.code = code
        self.message = message


def make_envelope(body: str, message: Message, request_id: int = 0) -> pb.Envelope:
    """Wrap ``message`` as the ``body`` field of an envelope."""
    envelope = pb.Envelope(request_id=request_id)
    getattr(envelope, body).CopyFrom(message)
    return envelope


def frame(envelope: pb.Envelope) -> bytes:
    """Serialize ``envelope`` with its 4-byte big-endian length prefix."""
    data = envelope.SerializeToString()
    return len(data).to_bytes(4, "big") + data


def _disconnected() -> Exception:
    return PeerDisconnected("connection closed before the answer")


class FramedPeerProtocol(Protocol):
    """One end of a framed protobuf connection (either side, either wire)."""

    _log = Logger()

    #: Whether this wire's frames of one reactor turn go out as one write, sent
    #: at once (:mod:`twisted_iop.eventloop.turn_writes`): the Node wire, which carries a
    #: frame per streamed token.
    turn_writes = False
    #: How long a frame may wait for others to go out with it (turn writes only).
    turn_delay_seconds = 0.0

    def __init__(self, clock: IReactorTime, settings: PeerSettings, counters: Optional[WireCounters] = None) -> None:
        self.MAX_LENGTH = settings.max_frame_bytes
        #: Frames and bytes of this wire (shared by a factory's connections), for /metrics.
        self.wire_counters = counters if counters is not None else WireCounters()
        self._clock = clock
        self._settings = settings
        self._pending: PendingRequests[pb.Envelope] = PendingRequests()
        self._hello_timer: Optional[IDelayedCall] = None
        self._abort_timer: Optional[IDelayedCall] = None
        # Received bytes not yet decoded: at most one partial frame between
        # calls, in a bytearray (appending to it is amortized O(1), so a
        # frame trickled in tiny pieces is never re-copied per piece); b""
        # when there is none, as between most reads of most connections.
        self._buffer: Union[bytearray, bytes] = b""
        #: Whether the hello deadline runs (the small hello frame limit applies).
        self.awaiting_hello = False
        self._first_envelope_seen = False
        #: Protocol violations so far, and warnings left out of the log.
        self.violations = 0
        self._warnings_logged = 0
        self._warnings_suppressed = 0
        self.closing = False
        #: Why this side closed the connection ("" if the peer closed it).
        self.close_reason = ""
        #: Why the peer said it closes (its unsolicited error frame), if it said so.
        self.peer_close_reason = ""
        self.connected_at = 0.0
        self.last_received = 0.0
        self.last_ping_sent = 0.0
        self._turn: Optional[TurnBuffer] = None

    # -- hooks for subclasses -------------------------------------------

    def peer_connected(self) -> None:
        """The transport is up."""

    def first_envelope_received(self, envelope: pb.Envelope, body: Optional[str]) -> bool:
        """Vet the connection's first envelope; ``False`` if it closed the connection."""
        return True

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """A request or unsolicited message arrived (not ping/pong/reply).

        Unsolicited ``error`` frames (request_id 0: the peer is about to
        close, and says why) arrive here too.
        """

    def peer_disconnected(self, reason: Failure) -> None:
        """The transport is gone; pending requests have already failed."""

    # -- Twisted hooks --------------------------------------------------

    def connectionMade(self) -> None:
        now = self._clock.seconds()
        self.connected_at = now
        self.last_received = now
        self.last_ping_sent = now
        if self.turn_writes:
            self._turn = TurnBuffer(self.transport, self._clock, delay_seconds=self.turn_delay_seconds)
        self.peer_connected()

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return
        counters = self.wire_counters
        counters.bytes_in += len(data)  # metrics: one add per read
        buffer = self._buffer
        if buffer:
            # The rest of a partial frame (bytearray: appended in place).
            buffer += data
            source: Union[bytearray, bytes] = buffer
        else:
            # Whole frames are read from ``data`` itself, without a copy.
            source = data
        start = 0
        available = len(source)
        while not self.closing and available - start >= PREFIX_BYTES:
            length = int.from_bytes(source[start : start + PREFIX_BYTES], "big")
            limit = self.frame_limit()
            if length > limit:
                self._buffer = b""
                self.frame_too_large(length, limit)
                return
            end = start + PREFIX_BYTES + length
            if available < end:
                break
            payload = bytes(source[start + PREFIX_BYTES : end])
            start = end
            counters.frames_in += 1  # metrics: one add per frame
            self.frame_received(payload)
        if self.closing or start == available:
            self._buffer = b""
        elif source is data:
            self._buffer = bytearray(data[start:] if start else data)
        elif start:
            # One move per read, however many frames it carried (CPython
            # deletes a bytearray's head without copying the rest).
            del cast(bytearray, buffer)[:start]

    def frame_limit(self) -> int:
        """The largest frame this side accepts now."""
        if self.awaiting_hello:
            return min(self._settings.max_hello_frame_bytes, self.MAX_LENGTH)
        return self.MAX_LENGTH

    def frame_too_large(self, length: int, limit: int) -> None:
        """Refuse a frame whose length prefix is above ``limit``: error, then close."""
        before = " before hello" if self.awaiting_hello else ""
        self.fail_connection(
            pb.ERROR_CODE_FRAME_TOO_LARGE,
            f"frame of {length} bytes exceeds the limit of {limit} bytes{before}",
        )

    def frame_received(self, data: bytes) -> None:
        """Decode one frame and dispatch its envelope."""
        if self.closing:
            return
        self.last_received = self._clock.seconds()
        envelope = pb.Envelope()
        try:
            envelope.ParseFromString(data)
        except DecodeError:
            self.fail_connection(pb.ERROR_CODE_MALFORMED_FRAME, "frame is not a valid envelope")
            return
        body = envelope.WhichOneof("body")
        if not self._first_envelope_seen:
            self._first_envelope_seen = True
            if not self.first_envelope_received(envelope, body):
                return
        request_id = envelope.request_id
        if body == "ping":
            pong = pb.Pong(ping_sent_at_ms=envelope.ping.sent_at_ms)
            self.send("pong", pong, request_id)
            return
        if body == "pong":
            return
        if body in RESPONSE_BODIES and request_id in self._pending:
            self._resolve(request_id, envelope, body)
            return
        if body is None:
            # An empty envelope, or a body from a newer protocol minor that
            # this side does not know: fail the request, keep the connection.
            self.protocol_violation(pb.ERROR_CODE_UNEXPECTED_MESSAGE, "unknown or empty message body", request_id)
            return
        if body in RESPONSE_BODIES and (request_id or body != "error"):
            # A late answer to a request that already timed out is harmless;
            # an answer to a request this side never sent is a violation.
            # Neither is answered (answering answers could loop).
            if not self._pending.issued(request_id):
                self.protocol_violation(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} answers no request sent")
            return
        try:
            self.envelope_received(envelope, body)
        except Exception:
            self._log.failure("failed to handle {body} from {peer}", body=body, peer=self.describe_peer())
            if request_id and not self.closing:
                self.send_error(pb.ERROR_CODE_INTERNAL, "internal error handling " + body, request_id)

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.closing = True
        self._buffer = b""
        if self._turn is not None:
            self._turn.discard()
        for timer in (self._hello_timer, self._abort_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._hello_timer = self._abort_timer = None
        if self._warnings_suppressed:
            self._log.warn(
                "{count} more warnings about {peer} were not logged ({violations} protocol violations in all)",
                count=self._warnings_suppressed,
                peer=self.describe_peer(),
                violations=self.violations,
            )
            self._warnings_suppressed = 0
        self._pending.fail_all(_disconnected)
        self.peer_disconnected(reason)

    # -- violations and their log lines -------------------------------------

    def protocol_violation(self, code: pb.ErrorCode, message: str, request_id: int = 0) -> None:
        """Count a violation by the peer; answer ``request_id`` (if any) with ``code``.

        The connection stays open until the peer has committed
        ``max_violations`` of them; then it is closed.
        """
        if self.closing:
            return
        self.violations += 1
        if self.violations >= self._settings.max_violations:
            self.fail_connection(
                code,
                f"too many protocol violations ({self.violations}), the last: {message}",
                request_id,
            )
            return
        if request_id:
            self.send_error(code, message, request_id)
        self.warn_peer("protocol violation by {peer}: {message}", message=message)

    def warn_peer(self, log_format: str, **fields: object) -> None:
        """Log a warning about the peer, at most a few per connection.

        ``log_format`` may use ``{peer}``. Warnings past the per-connection
        budget are counted and summed up in one line at close, so a peer
        cannot flood the log.
        """
        if self._warnings_logged >= WARNINGS_LOGGED_PER_CONNECTION:
            self._warnings_suppressed += 1
            return
        self._warnings_logged += 1
        self._log.warn(log_format, peer=self.describe_peer(), **fields)

    # -- sending ------------------------------------------------------------

    def send(self, body: str, message: Message, request_id: int = 0) -> None:
        """Send ``message`` as ``body``; silently dropped once closing."""
        if self.closing or self.transport is None:
            return
        self.sendString(make_envelope(body, message, request_id).SerializeToString())

    def sendString(self, data: bytes) -> None:
        """Write ``data`` as one frame (its length prefix, then the bytes)."""
        if len(data) >= 2 ** (8 * PREFIX_BYTES):
            raise ValueError(f"a frame of {len(data)} bytes cannot be length-prefixed")
        assert self.transport is not None
        counters = self.wire_counters  # metrics: one add per frame, and its bytes
        counters.frames_out += 1
        counters.bytes_out += len(data) + PREFIX_BYTES
        framed = len(data).to_bytes(PREFIX_BYTES, "big") + data
        if self._turn is not None:
            self._turn.write(framed)
        else:
            self.transport.write(framed)

    def flush_writes(self) -> None:
        """Send the frames held for this turn now (before anything else closes the transport)."""
        if self._turn is not None:
            self._turn.flush()

    def send_error(self, code: pb.ErrorCode, message: str, request_id: int = 0) -> None:
        """Send an ``Error`` frame (as the answer to ``request_id``)."""
        self.send("error", pb.Error(code=code, message=message), request_id)

    def request(
        self, body: str, message: Message, timeout: Optional[float] = None, *, deadline: bool = True
    ) -> Deferred[pb.Envelope]:
        """Send a request; fire with the answering envelope.

        Fails with :class:`RemoteError` when the answer is an error frame,
        :class:`RequestTimeout` after ``timeout`` seconds and
        :class:`PeerDisconnected` as soon as the connection drops. With
        ``deadline=False`` no timer is set: the caller must cancel the
        Deferred itself when it stops waiting.
        """
        if self.closing or self.transport is None:
            return fail(PeerDisconnected("connection is closed"))
        request_id, d = self._pending.add(*self._deadline(timeout, deadline))
        self.sendString(make_envelope(body, message, request_id).SerializeToString())
        return d

    def request_preserialized(
        self,
        request: PreserializedRequest,
        completion: Completion[pb.Envelope],
        timeout: Optional[float] = None,
        *,
        deadline: bool = True,
    ) -> int:
        """Send a request serialized once, ended through ``completion``
        (no Deferred, no protobuf work per request).

        ``completion`` is ended once, with the answering envelope or with
        the error :meth:`request` would fail with (``CancelledError`` after
        :meth:`cancel_request`). Returns the request id (0 when the
        connection is closed: ``completion`` has then already failed with
        :class:`PeerDisconnected`).
        """
        if self.closing or self.transport is None:
            completion.failed(PeerDisconnected("connection is closed"))
            return 0
        request_id = self._pending.add_completion(completion, *self._deadline(timeout, deadline))
        self.sendString(request.envelope_bytes(request_id))
        return request_id

    def cancel_request(self, request_id: int) -> None:
        """Stop waiting for ``request_id`` (from :meth:`request_preserialized`)."""
        self._pending.cancel(request_id)

    def answer_preserialized(self, answer: PreserializedAnswer, request_id: int) -> None:
        """Answer ``request_id`` with an answer serialized once; silently dropped once closing."""
        if self.closing or self.transport is None:
            return
        self.sendString(answer.envelope_bytes(request_id))

    def _deadline(
        self, timeout: Optional[float], deadline: bool
    ) -> tuple[Optional[IReactorTime], float, Callable[[], Exception]]:
        """The clock, seconds and timeout error of a new request (no clock: no timer)."""
        if not deadline:
            return None, 0.0, _disconnected
        seconds = self._settings.request_timeout_seconds if timeout is None else timeout
        return self._clock, seconds, lambda: RequestTimeout(f"no answer within {seconds:g}s")

    @property
    def pending_requests(self) -> int:
        """How many requests wait for an answer."""
        return len(self._pending)

    def _resolve(self, request_id: int, envelope: pb.Envelope, body: str) -> None:
        if body == "error":
            self._pending.fail(request_id, RemoteError(envelope.error.code, envelope.error.message))
        else:
            self._pending.answer(request_id, envelope)

    # -- closing, hello and keepalive ---------------------------------------------

    def fail_connection(self, code: pb.ErrorCode, message: str, request_id: int = 0) -> None:
        """Send an error frame, then close; abort if the close stalls."""
        if self.closing:
            return
        self._log.warn(
            "closing connection from {peer}: {code}: {message}",
            peer=self.describe_peer(),
            code=enum_name(pb.ErrorCode, code),
            message=message,
        )
        self.close_reason = message
        self.send_error(code, message, request_id)
        self.close()

    def close(self) -> None:
        """Close after flushing; abort if that takes too long."""
        if self.closing:
            return
        self.closing = True
        if self.transport is None:
            return
        if self._turn is not None:
            self._turn.flush()  # the last frames (an error saying why) go first
        self.transport.loseConnection()
        self._abort_timer = self._clock.callLater(CLOSE_GRACE_SECONDS, self._abort)

    def _abort(self) -> None:
        self._abort_timer = None
        if self._turn is not None:
            self._turn.discard()
        if self.transport is not None:
            abort = getattr(self.transport, "abortConnection", None)
            if abort is not None:
                abort()

    def start_hello_timer(self) -> None:
        """Close the connection unless :meth:`hello_done` runs in time."""
        self.awaiting_hello = True
        self._hello_timer = self._clock.callLater(self._settings.hello_timeout_seconds, self._hello_deadline_passed)

    def _hello_deadline_passed(self) -> None:
        """The deadline passed: one more pass of the reactor's I/O, then close.

        The reactor runs its due timers before it reads the sockets that
        became readable meanwhile. When thousands of edges dial at once, the
        Control Plane accepts their connections faster than it reads their
        hellos, so a hello may sit unread in the socket past the deadline
        through no fault of the edge. A timed call scheduled from a timed
        call runs only after the next poll for I/O has been handled, so a
        hello already received is read (and stops this) before the close.
        """
        self._hello_timer = self._clock.callLater(0, self._hello_timed_out)

    def _hello_timed_out(self) -> None:
        self._hello_timer = None
        self.fail_connection(pb.ERROR_CODE_HELLO_TIMEOUT, f"no hello within {self._settings.hello_timeout_seconds:g}s")

    def hello_done(self) -> None:
        """Stop the hello deadline (and the small frame limit that goes with it)."""
        self.awaiting_hello = False
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self._hello_timer = None

    def check_keepalive(self, now: float) -> None:
        """Ping an idle peer; drop one that has been silent past the deadline."""
        if self.closing:
            return
        silent = now - self.last_received
        if silent > self._settings.keepalive_deadline_seconds:
            self.fail_connection(
                pb.ERROR_CODE_KEEPALIVE_TIMEOUT,
                f"peer silent for {silent:.1f}s",
            )
            return
        interval = self._settings.keepalive_interval_seconds
        if silent >= interval and now - self.last_ping_sent >= interval:
            self.last_ping_sent = now
            self.send("ping", pb.Ping(sent_at_ms=int(now * 1000)))

    def describe_peer(self) -> str:
        """A short peer description for logs of this side's own process."""
        return type(self).__name__

    def peer_goodbye(self, error: pb.Error) -> None:
        """The peer says why it is about to close (``SHUTTING_DOWN`` ...): keep it, bounded."""
        code = enum_name(pb.ErrorCode, error.code).removeprefix("ERROR_CODE_")
        self.peer_close_reason = f"{code}: {error.message[:GOODBYE_TEXT_CHARS]}"
        self._log.info(
            "{peer} is closing the connection: {reason}", peer=self.describe_peer(), reason=self.peer_close_reason
        )


#: How much of a peer's stated close reason is kept (it reaches logs and events).
GOODBYE_TEXT_CHARS = 200


@implementer(IHandshakeListener)
class AcceptedPeerProtocol(FramedPeerProtocol):
    """The accepting end of a connection: tracked by its factory, hello on a deadline.

    Over TLS the hello deadline starts when the handshake is done, and the
    handshake has a deadline of its own
    (``PeerSettings.tls_handshake_timeout_seconds``).

    The first frame must be a hello: anything else (a ping, a pong, an
    answer, an empty or unknown body) gets ``Error{HELLO_REQUIRED}`` and a
    close, before any subclass sees it.
    """

    #: Bodies this side accepts as a connection's first message.
    hello_bodies: frozenset[str] = HELLO_BODIES

    def __init__(self, factory: PeerServerFactory) -> None:
        super().__init__(factory.clock, factory.settings, factory.wire_counters)
        self.factory = factory

    def peer_connected(self) -> None:
        self.factory.connections.add(self)
        if isinstance(self.transport, TLSMemoryBIOProtocol):
            # The hello deadline starts when the TLS handshake is done: in
            # a reconnect herd the handshakes queue for the CPU, and a
            # deadline from the accept cut them all at once, so that every
            # peer dialed again and none got through.
            self.awaiting_hello = True
            seconds = self._settings.tls_handshake_timeout_seconds
            self._hello_timer = self._clock.callLater(seconds, self._handshake_expired, seconds)
        else:
            self.start_hello_timer()

    def handshakeCompleted(self) -> None:
        """The TLS handshake is done (``IHandshakeListener``): the hello deadline starts."""
        if self.closing or not self.awaiting_hello:
            return
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self.start_hello_timer()

    def _handshake_expired(self, seconds: float) -> None:
        self._hello_timer = None
        self._log.warn(
            "closing {peer}: no TLS handshake within {seconds:g}s", peer=self.describe_peer(), seconds=seconds
        )
        # No error frame: without a finished handshake nothing can be said.
        self.closing = True
        self._abort()

    def first_envelope_received(self, envelope: pb.Envelope, body: Optional[str]) -> bool:
        if body in self.hello_bodies:
            return True
        what = body or "an empty or unknown message"
        self.fail_connection(
            pb.ERROR_CODE_HELLO_REQUIRED, f"the first message must be a hello, not {what}", envelope.request_id
        )
        return False

    def peer_disconnected(self, reason: Failure) -> None:
        self.factory.connections.discard(self)
        self.connection_closed(reason)

    def connection_closed(self, reason: Failure) -> None:
        """The connection is gone and no longer tracked (for subclasses)."""


class PeerServerFactory(Factory):
    """Builds accepted connections; one keepalive sweeper covers all of them."""

    # Factory's "Starting factory <... object at 0x...>" lines tell a person nothing.
    noisy = False
    #: The protocol class built for each accepted connection.
    protocol_class: type[AcceptedPeerProtocol]

    def __init__(self, clock: IReactorTime, settings: PeerSettings) -> None:
        self.clock = clock
        self.settings = settings
        self.connections: set[AcceptedPeerProtocol] = set()
        #: Frames and bytes of every connection, and refused hellos by reason (for /metrics).
        self.wire_counters = WireCounters()
        self.hello_rejections: dict[str, int] = {}
        self.keepalive = KeepaliveSweeper(clock, settings, lambda: self.connections)

    def buildProtocol(self, addr: Optional[IAddress]) -> AcceptedPeerProtocol:
        return self.protocol_class(self)

    def count_rejection(self, code: str) -> None:
        """Count a hello refused with the rejection ``code``."""
        self.hello_rejections[code] = self.hello_rejections.get(code, 0) + 1

    def close_all(self, reason: str) -> None:
        """Close every connection, saying the server is shutting down."""
        for connection in list(self.connections):
            connection.fail_connection(pb.ERROR_CODE_SHUTTING_DOWN, reason)

    def startFactory(self) -> None:
        self.keepalive.start()

    def stopFactory(self) -> None:
        self.keepalive.stop()
