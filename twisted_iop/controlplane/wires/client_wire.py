"""The client wire: WebSocket ``/client``, one ``ClientEnvelope`` per message.

After ``ClientHelloRequest`` a client may subscribe to live events (one
edge or the whole fleet), resuming after a sequence number. Backpressure is
explicit: while the socket cannot take more, events wait in a bounded
per-subscriber queue; what overflows it is counted and the subscriber is
told with ``EventsLost(reason="slow_consumer")`` before the next event, so
the server never buffers without bound and the client always knows.

The events recorded in one reactor turn reach each subscriber together at
the start of the next turn: their WebSocket frames are built by
:mod:`~twisted_iop.controlplane.wires.ws_frames` (binary, unmasked, one message
each, which says why and what it saves) and written as one write of at
most :data:`BATCH_BYTES`, instead of one Autobahn ``sendMessage`` per event.
A turn that queues :data:`BATCH_EVENTS` events (or reaches the queue's
bounds) for one subscriber writes them at once, so the queue's bounds drop
events of a full socket only, as before. Whatever the client sends is
answered after the events recorded before it. Each event is serialized
once, however many subscribers it goes to.

A socket that has not said hello within ``hello_timeout_seconds`` is
closed (code 4003), and so is one that keeps sending what the protocol
does not allow (code 4004 after ``max_violations``): an unidentified or
misbehaving client holds a socket only for a bounded time.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Optional

import attrs
from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from autobahn.websocket.protocol import WebSocketProtocol
from google.protobuf.message import DecodeError, Message
from twisted.internet.interfaces import IDelayedCall, IPushProducer, IReactorTime
from twisted.logger import Logger
from zope.interface import implementer

import twisted_iop
from twisted_iop.controlplane.fleet.event_log import EventBuffer, EventListener
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.live_event import event_frame, event_payload
from twisted_iop.controlplane.fleet.memory import event_size
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.auth import ApiTokens
from twisted_iop.controlplane.wires.ws_frames import frames_writable, refuse_compression
from twisted_iop.ids import id_problem
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb

FEATURES = ("events.subscribe", "events.resume", "events.backpressure")

#: WebSocket close codes of this wire (docs/wire.md).
CLOSE_SHUTTING_DOWN = 4000
CLOSE_BAD_TOKEN = 4001
CLOSE_UNSUPPORTED_VERSION = 4002
CLOSE_HELLO_TIMEOUT = 4003
CLOSE_TOO_MANY_VIOLATIONS = 4004
#: ``EventsLost.reason`` when a resumed subscription's sequence is ahead of
#: the buffer's newest: the numbering restarted under the client, which
#: starts over from 0 (the events replayed after it are new to it).
SEQUENCE_RESET = "sequence_reset"
#: How many buffered events a resume replays at most per request.
RESUME_BATCH = 10000
#: Events queued for one open subscriber within a turn that are written at
#: once instead of at the start of the next turn.
BATCH_EVENTS = 256
#: Wire bytes of events given to one subscriber's transport in one write;
#: between writes a full socket pauses the subscriber (flow control).
BATCH_BYTES = 64 * 1024


@attrs.frozen
class ClientWireSettings:
    """Limits of the client WebSocket."""

    max_message_bytes: int = 1024 * 1024
    auto_ping_interval_seconds: float = 20.0
    auto_ping_timeout_seconds: float = 10.0
    subscriber_queue: int = 1000
    #: Estimated bytes of the events one subscriber's queue may hold.
    subscriber_queue_bytes: int = 4 * 1024 * 1024
    tokens: ApiTokens = ApiTokens()
    path: str = "/client"
    #: A socket that has not said hello by then is closed (code 4003).
    hello_timeout_seconds: float = 10.0
    #: Refused messages (malformed, before hello, unexpected) after which
    #: the socket is closed (code 4004).
    max_violations: int = 10


@implementer(IPushProducer)
class _FlowControl:
    """Tells a subscriber when its socket is full (pause) or drained (resume)."""

    def __init__(self, protocol: ClientWireServerProtocol) -> None:
        self._protocol = protocol

    def pauseProducing(self) -> None:
        self._protocol.paused = True

    def resumeProducing(self) -> None:
        self._protocol.paused = False
        self._protocol.flush()

    def stopProducing(self) -> None:
        self._protocol.paused = True


def set_no_delay(transport: object) -> None:
    """Turn Nagle's algorithm off on ``transport`` where it is a TCP socket.

    Live events are small messages that must leave at once; with Nagle on,
    each waits for the previous one's ACK (up to the peer's delayed-ACK
    time, 40 ms on Linux). Autobahn's own attempt does not reach sockets
    handed over by the HTTP site (``/client`` on the HTTP port), so the
    protocol sets it itself on every transport it gets (TLS wrappers pass
    the call on to their socket).
    """
    set_tcp_no_delay = getattr(transport, "setTcpNoDelay", None)
    if set_tcp_no_delay is None:
        return
    # A UNIX socket refuses: there is no Nagle to turn off.
    with contextlib.suppress(OSError):
        set_tcp_no_delay(True)


class ClientWireServerProtocol(WebSocketServerProtocol):
    """One client WebSocket connection."""

    _log = Logger()
    factory: ClientWireFactory
    # Autobahn copies these from the factory when the connection is made
    # (annotations only: a class value would stop it doing so).
    maxMessagePayloadSize: int
    maskServerFrames: bool
    perMessageCompressionAccept: object

    def __init__(self) -> None:
        super().__init__()
        self.said_hello = False
        self.paused = False
        self._subscribed_edge: Optional[str] = None
        self._subscribed = False
        #: The queue length, and its estimated bytes, past which
        #: :meth:`_enqueue` looks at its bounds (set from the settings when
        #: the connection is made; until then at every event).
        self._write_at = 0
        self._max_queued_bytes = -1
        #: What the registry calls with each event while subscribed.
        self._listener: EventListener = self._enqueue
        self._queue: deque[EventRecord] = deque()
        #: The estimated bytes of each queued event, in step with the queue
        #: (plain ints beside it: a pair per event would be one more object
        #: for the garbage collector to walk).
        self._queue_sizes: deque[int] = deque()
        #: Estimated bytes of the queued events.
        self.queued_bytes = 0
        self._lost = 0
        self._lost_first = 0
        self._lost_last = 0
        self._hello_timer: Optional[IDelayedCall] = None
        #: Messages refused so far (malformed, before hello, unexpected).
        self.violations = 0
        #: Whether the factory will flush this subscriber at the next turn.
        self.flush_due = False
        #: Whether events are written as frames from ``ws_frames`` (decided
        #: from this socket's options when the connection is made) rather
        #: than by Autobahn's ``sendMessage``.
        self.frames_direct = False

    @property
    def queued_events(self) -> int:
        """Events waiting for this subscriber's socket to drain (and, within
        a reactor turn, those waiting for the turn's write)."""
        return len(self._queue)

    # -- Twisted and Autobahn hooks (Autobahn swallows exceptions in its ------
    # -- on* hooks, so log them) ----------------------------------------------

    def connectionMade(self) -> None:
        super().connectionMade()
        set_no_delay(self.transport)
        self.frames_direct = frames_writable(self)
        settings = self.factory.settings
        self._write_at = min(BATCH_EVENTS, settings.subscriber_queue + 1)
        self._max_queued_bytes = settings.subscriber_queue_bytes

    def onConnect(self, request: object) -> None:
        path = getattr(request, "path", "")
        if path != self.factory.settings.path:
            from autobahn.websocket.types import ConnectionDeny

            raise ConnectionDeny(404, f"no WebSocket at {path}; use {self.factory.settings.path}")

    def onOpen(self) -> None:
        self.factory.connections.add(self)
        seconds = self.factory.settings.hello_timeout_seconds
        self._hello_timer = self.factory.clock.callLater(seconds, self._hello_timed_out, seconds)
        try:
            self.registerProducer(_FlowControl(self), True)
        except Exception:
            self._log.failure("cannot register flow control")

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        try:
            self._on_message(payload, isBinary)
        except Exception:
            self._log.failure("client wire message failed")
            self._send_error(pb.ERROR_CODE_INTERNAL, "internal error", 0)

    def onClose(self, wasClean: bool, code: Optional[int], reason: Optional[str]) -> None:
        self._cancel_hello_timer()
        self.factory.connections.discard(self)
        self._unsubscribe()

    # -- messages ----------------------------------------------------------------

    def _send_envelope(self, body: str, message: Message, request_id: int = 0) -> None:
        if self.state != WebSocketProtocol.STATE_OPEN:
            # Closing: Autobahn refuses data frames now, and a message that
            # arrived just before our close needs no answer.
            return
        envelope = pb.ClientEnvelope(request_id=request_id)
        getattr(envelope, body).CopyFrom(message)
        self.sendMessage(envelope.SerializeToString(), isBinary=True)

    def _send_error(self, code: pb.ErrorCode, message: str, request_id: int) -> None:
        self._send_envelope("error", pb.Error(code=code, message=message), request_id)

    def _refuse(self, code: pb.ErrorCode, message: str, request_id: int) -> None:
        """Answer a message the protocol does not allow; close after too many."""
        self.violations += 1
        self._send_error(code, message, request_id)
        limit = self.factory.settings.max_violations
        if self.violations >= limit and self.state == WebSocketProtocol.STATE_OPEN:
            self._log.warn("closing a client socket after {count} refused messages", count=self.violations)
            self.sendClose(code=CLOSE_TOO_MANY_VIOLATIONS, reason=f"too many refused messages ({self.violations})")

    def _hello_timed_out(self, seconds: float) -> None:
        self._hello_timer = None
        if self.said_hello or self.state != WebSocketProtocol.STATE_OPEN:
            return
        message = f"no client_hello_request within {seconds:g}s"
        self._send_error(pb.ERROR_CODE_HELLO_TIMEOUT, message, 0)
        self.sendClose(code=CLOSE_HELLO_TIMEOUT, reason=message)

    def _cancel_hello_timer(self) -> None:
        if self._hello_timer is not None and self._hello_timer.active():
            self._hello_timer.cancel()
        self._hello_timer = None

    def _on_message(self, payload: bytes, is_binary: bool) -> None:
        if self._queue and not self.paused:
            # What was recorded before this message goes out before its answer.
            self.flush()
        if not is_binary:
            self._refuse(pb.ERROR_CODE_MALFORMED_FRAME, "messages must be binary ClientEnvelopes", 0)
            return
        envelope = pb.ClientEnvelope()
        try:
            envelope.ParseFromString(payload)
        except DecodeError:
            self._refuse(pb.ERROR_CODE_MALFORMED_FRAME, "message is not a valid ClientEnvelope", 0)
            return
        # An unknown oneof member (a newer client's message) parses as no
        # body at all; it is refused like an empty envelope.
        body = envelope.WhichOneof("body")
        rid = envelope.request_id
        if body == "client_hello_request":
            self._hello(envelope.client_hello_request, rid)
        elif not self.said_hello:
            self._refuse(pb.ERROR_CODE_HELLO_REQUIRED, "send client_hello_request first", rid)
        elif body == "subscribe_request":
            self._subscribe(envelope.subscribe_request, rid)
        elif body == "unsubscribe_request":
            self._unsubscribe()
            self._send_envelope("subscribe_response", pb.SubscribeResponse(), rid)
        else:
            self._refuse(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"unexpected message {body or '(empty or unknown)'}", rid)

    def _hello(self, hello: pb.ClientHelloRequest, rid: int) -> None:
        reason = ""
        tokens = self.factory.settings.tokens
        if hello.protocol_major != PROTOCOL_MAJOR:
            reason = f"protocol version {hello.protocol_major} is not supported (this server speaks {PROTOCOL_MAJOR}.x)"
        elif tokens.required and tokens.identify(hello.api_token.encode()) is None:
            reason = "the API token is missing or wrong"
        response = pb.ClientHelloResponse(
            accepted=not reason,
            reason=reason,
            server_version=twisted_iop.__version__,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            features=FEATURES,
        )
        self._send_envelope("client_hello_response", response, rid)
        if reason:
            self._log.warn("client hello rejected: {reason}", reason=reason)
            code = CLOSE_BAD_TOKEN if "token" in reason else CLOSE_UNSUPPORTED_VERSION
            self.sendClose(code=code, reason=reason[:100])
            return
        self._cancel_hello_timer()
        self.said_hello = True

    def _subscribe(self, request: pb.SubscribeRequest, rid: int) -> None:
        registry = self.factory.registry
        edge_id = request.edge_id
        buffer: EventBuffer
        if edge_id:
            if id_problem("edge_id", edge_id) is not None:
                self._send_error(pb.ERROR_CODE_INVALID_ARGUMENT, "malformed edge_id", rid)
                return
            record = registry.find(edge_id)
            if record is None:
                self._send_error(pb.ERROR_CODE_INVALID_ARGUMENT, f"no edge named {edge_id!r} is known", rid)
                return
            buffer = record.events
        else:
            buffer = registry.fleet_events
        self._unsubscribe()
        self._subscribed_edge = edge_id or None
        self._subscribed = True
        self._clear_queue()
        self._lost = 0
        first = buffer.first_sequence
        oldest = first if len(buffer) else 0
        self._send_envelope(
            "subscribe_response",
            pb.SubscribeResponse(edge_id=edge_id, last_sequence=buffer.last_sequence, oldest_sequence=oldest),
            rid,
        )
        if request.resume:
            since = request.since_sequence
            if since > buffer.last_sequence:
                # Numbers the client saw were given by an earlier numbering
                # (a Control Plane restarted without a durable store, or on a
                # new file): say so, and replay what this one has from its start.
                self._send_envelope("events_lost", pb.EventsLost(reason=SEQUENCE_RESET))
                since = 0
            elif since + 1 < first:
                missed = first - since - 1
                self._send_envelope(
                    "events_lost",
                    pb.EventsLost(count=missed, first_sequence=since + 1, last_sequence=first - 1, reason="resume_gap"),
                )
            for event in buffer.since(since, RESUME_BATCH):
                self._enqueue(event, event_size(event))
        # A subscriber of the whole fleet takes every event: its queue is
        # the listener itself, without a filter call per event.
        self._listener = self._event_recorded if self._subscribed_edge is not None else self._enqueue
        registry.event_log.add_listener(self._listener)
        self.flush()

    def _unsubscribe(self) -> None:
        if self._subscribed:
            self.factory.registry.event_log.remove_listener(self._listener)
        self._subscribed = False
        self._clear_queue()

    def _clear_queue(self) -> None:
        self._queue.clear()
        self._queue_sizes.clear()
        self.queued_bytes = 0

    def _event_recorded(self, event: EventRecord, size: int) -> None:
        if self._subscribed_edge is not None and event.edge_id != self._subscribed_edge:
            return
        self._enqueue(event, size)

    def _enqueue(self, event: EventRecord, size: int) -> None:
        """Queue ``event`` for the next turn's write.

        An open socket is written at once when the queue reaches a bound
        (:data:`BATCH_EVENTS`, or the queue's own count or byte bound): only
        a full socket's events wait beyond them, and of those the oldest
        are dropped (and reported as lost).
        """
        queue = self._queue
        queue.append(event)
        self._queue_sizes.append(size)
        self.queued_bytes += size
        if len(queue) >= self._write_at or self.queued_bytes > self._max_queued_bytes:
            self._queue_at_bound()
        if not self.flush_due and queue and not self.paused:
            self.flush_due = True
            self.factory.flush_next_turn(self)

    def _queue_at_bound(self) -> None:
        """A bound of :meth:`_enqueue` reached: an open socket is written at
        once; a paused one drops its oldest events (reported as lost)."""
        queue = self._queue
        settings = self.factory.settings
        if not self.paused and (
            len(queue) >= BATCH_EVENTS
            or len(queue) > settings.subscriber_queue
            or self.queued_bytes > settings.subscriber_queue_bytes
        ):
            self.flush()
        while len(queue) > 1 and (
            len(queue) > settings.subscriber_queue or self.queued_bytes > settings.subscriber_queue_bytes
        ):
            dropped = queue.popleft()
            self.queued_bytes -= self._queue_sizes.popleft()
            self._note_lost(dropped)

    def _sequence(self, event: EventRecord) -> int:
        return event.sequence if self._subscribed_edge is not None else event.fleet_sequence

    def _note_lost(self, event: EventRecord) -> None:
        seq = self._sequence(event)
        if self._lost == 0:
            self._lost_first = seq
        self._lost += 1
        self._lost_last = seq

    def flush(self) -> None:
        """Send queued events while the socket takes them: a lost-events
        notice first if any were dropped, then the events, at most
        :data:`BATCH_BYTES` of frames per write."""
        if self._lost:
            lost = pb.EventsLost(
                count=self._lost,
                first_sequence=self._lost_first,
                last_sequence=self._lost_last,
                reason="slow_consumer",
            )
            self._lost = 0
            self._send_envelope("events_lost", lost)
        queue = self._queue
        sizes = self._queue_sizes
        if self.state != WebSocketProtocol.STATE_OPEN:
            self._clear_queue()
            return
        if not self.frames_direct:
            self._flush_by_messages()
            return
        frame_of = self.factory.event_frame
        limit = self.maxMessagePayloadSize
        while queue and not self.paused:
            frames = []
            size = 0
            while queue and size < BATCH_BYTES:
                event = queue.popleft()
                self.queued_bytes -= sizes.popleft()
                frame = frame_of(event)
                if 0 < limit < len(frame):
                    self._oversized(event)
                    continue
                frames.append(frame)
                size += len(frame)
            if frames:
                self.sendData(b"".join(frames))
            if self.state != WebSocketProtocol.STATE_OPEN:
                self._clear_queue()
                return

    def _flush_by_messages(self) -> None:
        """:meth:`flush` by Autobahn's ``sendMessage``, one event at a time."""
        payload_of = self.factory.event_payload
        while self._queue and not self.paused:
            event = self._queue.popleft()
            self.queued_bytes -= self._queue_sizes.popleft()
            if self.state != WebSocketProtocol.STATE_OPEN:
                continue
            self.sendMessage(payload_of(event), isBinary=True)

    def _oversized(self, event: EventRecord) -> None:
        """An event whose frame exceeds the message bound (events are
        clipped far below it): dropped and logged, never sent."""
        self._log.warn(
            "event {sequence} of edge {edge_id} exceeds the client message bound; not sent",
            sequence=event.sequence,
            edge_id=event.edge_id,
        )


class ClientWireFactory(WebSocketServerFactory):
    """Serves ``/client`` over one registry, with explicit Autobahn limits."""

    _log = Logger()
    protocol = ClientWireServerProtocol  # type: ignore[assignment]  # Twisted's stubs want a _ProtoWithFactory; Autobahn's protocol is not typed as one
    noisy = False  # no "Starting factory <... object at 0x...>" lines

    def __init__(
        self,
        registry: EdgeRegistry,
        settings: ClientWireSettings = ClientWireSettings(),
        clock: Optional[IReactorTime] = None,
    ) -> None:
        super().__init__()
        if clock is None:
            from twisted.internet import reactor

            clock = reactor
        self.registry = registry
        self.settings = settings
        #: Runs the hello deadline of every socket.
        self.clock: IReactorTime = clock
        self.connections: set[ClientWireServerProtocol] = set()
        self.setProtocolOptions(
            maxFramePayloadSize=settings.max_message_bytes,
            maxMessagePayloadSize=settings.max_message_bytes,
            autoPingInterval=settings.auto_ping_interval_seconds,
            autoPingTimeout=settings.auto_ping_timeout_seconds,
            failByDrop=False,
            # Set here, not left to Autobahn's defaults: ws_frames writes
            # this wire's frames, uncompressed and unmasked.
            perMessageCompressionAccept=refuse_compression,
            maskServerFrames=False,
        )
        #: The newest event serialized, and its message and frame: every
        #: subscriber it goes to now shares one serialization.
        self._last_event: Optional[EventRecord] = None
        self._last_payload = b""
        self._last_frame_event: Optional[EventRecord] = None
        self._last_frame = b""
        #: While a turn's writes run for several subscribers: the frames
        #: built in it (by event identity), so each event is framed once.
        self._turn_frames: Optional[dict[int, tuple[EventRecord, bytes]]] = None
        #: Subscribers with events queued in this turn, and the call that
        #: writes them at the start of the next.
        self._flushing: list[ClientWireServerProtocol] = []
        self._flush_call: Optional[IDelayedCall] = None

    def event_payload(self, event: EventRecord) -> bytes:
        """``event``'s WebSocket message (:func:`event_payload`), serialized once
        for all the subscribers it goes to in a row."""
        if self._last_event is not event:
            self._last_payload = event_payload(event)
            self._last_event = event
        return self._last_payload

    def event_frame(self, event: EventRecord) -> bytes:
        """``event``'s WebSocket frame (:func:`event_frame`),
        built once for all the subscribers it goes to in a row, and once in
        a turn whose writes go to several subscribers."""
        if self._last_frame_event is event:
            return self._last_frame
        frames = self._turn_frames
        kept = frames.get(id(event)) if frames is not None else None
        if kept is not None and kept[0] is event:
            frame = kept[1]
        else:
            frame = event_frame(event)
            if frames is not None:
                frames[id(event)] = (event, frame)
        self._last_frame = frame
        self._last_frame_event = event
        return frame

    def flush_next_turn(self, protocol: ClientWireServerProtocol) -> None:
        """Write ``protocol``'s queued events at the start of the next reactor turn."""
        self._flushing.append(protocol)
        if self._flush_call is None:
            self._flush_call = self.clock.callLater(0, self._flush_turn)

    def _flush_turn(self) -> None:
        """Every subscriber with events from the last turn: one write each."""
        self._flush_call = None
        flushing, self._flushing = self._flushing, []
        # Several subscribers mostly get the same events: frame each once.
        # The frames live only as long as this turn's writes.
        self._turn_frames = {} if len(flushing) > 1 else None
        try:
            for protocol in flushing:
                protocol.flush_due = False
                if not protocol.paused:
                    try:
                        protocol.flush()
                    except Exception:
                        self._log.failure("client wire flush failed")
        finally:
            self._turn_frames = None

    def close_all(self) -> None:
        """Close every client connection (the Control Plane is stopping)."""
        for connection in list(self.connections):
            connection.sendClose(code=CLOSE_SHUTTING_DOWN, reason="the Control Plane is shutting down")
