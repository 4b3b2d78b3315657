"""The WebSocket ``/client`` wire client (Autobahn on Twisted).

Every binary message is one ``ClientEnvelope``. A client sends
``ClientHelloRequest`` first; then it may subscribe to live events of one
edge or of the whole fleet.

One connection's envelopes and request pairing live in
:mod:`twisted_iop.client.wire_connection`. :class:`ClientWireClient` offers
two things:

* :meth:`ClientWireClient.hello` -- connect and say hello, answer the
  ``ClientHelloResponse`` (useful to check reachability and the protocol);
* :meth:`ClientWireClient.subscribe` -- an :class:`EventSubscription` on a
  connection of its own that, when the connection drops, reconnects with
  bounded exponential backoff and resumes after the last sequence it saw
  (edge sequences for one edge, fleet sequences for the fleet). Events the
  server could not deliver are reported to ``on_lost`` with the server's
  ``EventsLost`` (``resume_gap`` or ``slow_consumer``), never hidden.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Optional, get_args, get_type_hints
from urllib.parse import urlsplit

import attrs
from autobahn.twisted.websocket import WebSocketClientFactory
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults, succeed
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IReactorTime, IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop import __version__
from twisted_iop.client.errors import (
    ControlPlaneUnreachable,
    HelloRejected,
    WireClientError,
    WireConnectionLost,
    WireRequestError,
)
from twisted_iop.client.model_json import format_time
from twisted_iop.client.models import Event
from twisted_iop.client.repository import describe_connection_error
from twisted_iop.client.wire_connection import (
    REQUEST_TIMEOUT_SECONDS,
    ClientWireClientProtocol,
    error_code_name,
    make_client_envelope,
)
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.dialer import DialingService, backoff_delay

#: Environment variable naming the Control Plane's client WebSocket URL.
WIRE_URL_ENV = "IOP_CONTROL_PLANE_WIRE_URL"
#: Where the Control Plane's client WebSocket listens by default.
DEFAULT_WIRE_URL = "ws://127.0.0.1:8081/client"

#: Largest WebSocket message (and frame) accepted from the server, in bytes.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Autobahn sends a ping this often ...
AUTO_PING_INTERVAL_SECONDS = 15.0
#: ... and drops a server that does not answer it within this.
AUTO_PING_TIMEOUT_SECONDS = 10.0
#: TCP connect and WebSocket opening handshake deadlines.
CONNECT_TIMEOUT_SECONDS = 10.0
#: Closing handshake deadline.
CLOSE_TIMEOUT_SECONDS = 3.0

#: Reconnect backoff (exponential with full jitter, as the daemons dial).
BACKOFF_INITIAL_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 15.0


EventCallback = Callable[[pb.FleetEvent], Any]
LostCallback = Callable[[pb.EventsLost], Any]
#: ``EventsLost.reason`` when the Control Plane's numbering restarted under a
#: resumed subscription (its events are numbered from 1 again).
SEQUENCE_RESET = "sequence_reset"
StateCallback = Callable[[str, str], Any]


def wire_url_from_environment(url: Optional[str] = None) -> str:
    """The client WebSocket URL: ``url``, else the environment, else the default."""
    return url or os.environ.get(WIRE_URL_ENV) or DEFAULT_WIRE_URL


class ClientWireClient:
    """A client of the Control Plane's WebSocket ``/client`` wire.

    ``url`` defaults to ``$IOP_CONTROL_PLANE_WIRE_URL`` and then to
    ``ws://127.0.0.1:8081/client``; ``api_token`` goes into the hello;
    ``reactor`` is injected (the global one when ``None``).
    """

    _log = Logger()

    def __init__(
        self,
        url: Optional[str] = None,
        reactor: Optional[Reactor] = None,
        api_token: Optional[str] = None,
        client_name: str = f"twisted-iop/{__version__}",
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor

            reactor = global_reactor
        self.url = wire_url_from_environment(url)
        parts = urlsplit(self.url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise ValueError(f"not a ws:// or wss:// URL: {self.url!r}")
        self._reactor = reactor
        port = parts.port or (443 if parts.scheme == "wss" else 80)
        self._target = f"{parts.scheme}://{parts.hostname}:{port}{parts.path}"
        self._api_token = api_token or ""
        self._client_name = client_name
        self._connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self._max_message_bytes = max_message_bytes
        self._hello_connection: Optional[ClientWireClientProtocol] = None
        self._subscriptions: set[EventSubscription] = set()

    # -- connections ----------------------------------------------------------------

    @property
    def target(self) -> str:
        """The server's URL as log lines show it (without any user or password)."""
        return self._target

    def _factory(self) -> WebSocketClientFactory:
        factory = WebSocketClientFactory(self.url, useragent=self._client_name)
        factory.protocol = ClientWireClientProtocol
        # Every reconnect starts the factory again: no "Starting factory <...>" lines.
        factory.noisy = False
        factory.setProtocolOptions(
            maxFramePayloadSize=self._max_message_bytes,
            maxMessagePayloadSize=self._max_message_bytes,
            autoPingInterval=AUTO_PING_INTERVAL_SECONDS,
            autoPingTimeout=AUTO_PING_TIMEOUT_SECONDS,
            openHandshakeTimeout=self._connect_timeout,
            closeHandshakeTimeout=CLOSE_TIMEOUT_SECONDS,
        )
        return factory

    async def connect(self) -> ClientWireClientProtocol:
        """Open one WebSocket connection (no hello yet).

        Raises :class:`ControlPlaneUnreachable` when the server cannot be
        reached or the WebSocket does not open.
        """
        factory = self._factory()
        try:
            connected: Any = await self._endpoint(factory).connect(factory)
        except Exception as e:
            raise self.unreachable_error(e) from None
        protocol: ClientWireClientProtocol = connected
        try:
            await protocol.opened
        except WireConnectionLost as e:
            raise ControlPlaneUnreachable(self.url, f"the WebSocket did not open ({e})") from None
        return protocol

    def _endpoint(self, factory: WebSocketClientFactory) -> IStreamClientEndpoint:
        host = str(factory.host)
        endpoint: IStreamClientEndpoint = HostnameEndpoint(
            self._reactor, host, int(factory.port), timeout=self._connect_timeout
        )
        if factory.isSecure:
            from twisted.internet.ssl import optionsForClientTLS

            endpoint = wrapClientTLS(optionsForClientTLS(host), endpoint)
        return endpoint

    def unreachable_error(self, error: BaseException) -> BaseException:
        """``error`` as :class:`ControlPlaneUnreachable` if it is a connection problem, else itself."""
        if isinstance(error, WireClientError):
            return error
        reason = describe_connection_error(error, self._connect_timeout)
        return error if reason is None else ControlPlaneUnreachable(self.url, reason)

    def dialing_service(
        self,
        prepare: Callable[[ClientWireClientProtocol], Deferred[Any]],
        retry_policy: Callable[[int], float],
        attempt_failed: Optional[Callable[[Failure], None]] = None,
    ) -> DialingService:
        """A service that keeps a connection to the server, prepared by ``prepare`` (hello ...)."""
        factory = self._factory()
        return DialingService(
            self._endpoint(factory),
            self.target,
            factory,
            prepare,
            retry_policy,
            self.clock,
            attempt_failed,
        )

    async def say_hello(self, protocol: ClientWireClientProtocol) -> pb.ClientHelloResponse:
        """Send the hello on ``protocol`` and answer the server's response."""
        request = pb.ClientHelloRequest(
            client_name=self._client_name,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            api_token=self._api_token,
        )
        envelope = await protocol.request("client_hello_request", request, self._reactor, self.request_timeout)
        return envelope.client_hello_response

    async def hello(self) -> pb.ClientHelloResponse:
        """Connect (once) and say hello; answer the server's ``ClientHelloResponse``.

        A refused hello is returned (``accepted=False`` with its reason),
        not raised; the server closes that connection.
        """
        if self._hello_connection is None or not self._hello_connection.usable:
            self._hello_connection = await self.connect()
        return await self.say_hello(self._hello_connection)

    async def subscribe(
        self,
        edge_id: Optional[str] = None,
        since: Optional[int] = None,
        on_event: Optional[EventCallback] = None,
        on_lost: Optional[LostCallback] = None,
        on_state: Optional[StateCallback] = None,
        backoff_initial: float = BACKOFF_INITIAL_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
    ) -> EventSubscription:
        """Subscribe to live events of one edge (or the fleet when ``edge_id`` is empty).

        With ``since`` the server first replays the buffered events after
        that sequence. Returns once the first subscription is confirmed; the
        subscription then keeps itself alive until :meth:`EventSubscription.stop`.
        Raises :class:`ControlPlaneUnreachable`, :class:`HelloRejected` or
        :class:`WireRequestError` when that first subscription fails.
        """
        subscription = EventSubscription(
            self,
            edge_id=edge_id or "",
            since=since,
            on_event=on_event,
            on_lost=on_lost,
            on_state=on_state,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )
        self._subscriptions.add(subscription)
        subscription.done.addBoth(self._forget, subscription)
        await subscription.start()
        return subscription

    def _forget(self, result: Any, subscription: EventSubscription) -> Any:
        self._subscriptions.discard(subscription)
        return result

    @property
    def clock(self) -> IReactorTime:
        """The reactor's clock (for timers of subscriptions)."""
        clock: IReactorTime = self._reactor
        return clock

    async def close(self) -> None:
        """Stop every subscription and close every connection of this client."""
        waits: list[Deferred[Any]] = [s.stop() for s in list(self._subscriptions)]
        if self._hello_connection is not None:
            waits.append(self._hello_connection.close())
            self._hello_connection = None
        if waits:
            await gatherResults(waits, consumeErrors=True)


class EventSubscription:
    """A live event subscription that survives reconnects.

    It runs on a :class:`~twisted_iop.wire.dialer.DialingService` (Twisted's
    ``ClientService``): every connection says hello and subscribes in
    ``prepareConnection``, resuming after ``last_sequence``, and the
    service's retry policy (exponential backoff with full jitter) dials
    again when the connection drops. ``last_sequence`` is the newest
    sequence seen (or announced by the server at subscription time); events
    at or below it are never delivered twice. ``done`` fires with ``None``
    after :meth:`stop`, or fails when the subscription cannot go on (the
    server refused the hello or the subscription on a reconnect).
    """

    _log = Logger()

    def __init__(
        self,
        client: ClientWireClient,
        edge_id: str,
        since: Optional[int],
        on_event: Optional[EventCallback],
        on_lost: Optional[LostCallback],
        on_state: Optional[StateCallback],
        backoff_initial: float = BACKOFF_INITIAL_SECONDS,
        backoff_max: float = BACKOFF_MAX_SECONDS,
        rng: Optional[random.Random] = None,
    ) -> None:
        self._client = client
        self.edge_id = edge_id
        self.last_sequence: Optional[int] = since
        self._on_event = on_event
        self._on_lost = on_lost
        self._on_state = on_state
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._rng = rng or random.Random()
        self._service: Optional[DialingService] = None
        self._protocol: Optional[ClientWireClientProtocol] = None
        self._subscribed_once = False
        self._stopping = False
        #: How many times the subscription was re-established after a drop.
        self.reconnects = 0
        #: The server's answer to the latest subscribe request.
        self.response: Optional[pb.SubscribeResponse] = None
        self.done: Deferred[None] = Deferred()

    # -- public ------------------------------------------------------------------

    async def start(self) -> pb.SubscribeResponse:
        """Start dialling; return once the first subscription is confirmed.

        A failure of that first attempt ends the subscription (it raises
        :class:`ControlPlaneUnreachable`, :class:`HelloRejected` or
        :class:`WireRequestError`); later drops are retried.
        """
        service = self._client.dialing_service(self._prepare, self.retry_delay, self._attempt_failed)
        self._service = service
        service.startService()
        clock = self._client.clock
        try:
            try:
                await service.whenConnected(failAfterFailures=1)
            finally:
                # whenConnected fires inside the service's state machine;
                # leave it before anything (our caller) can stop the service.
                await deferLater(clock, 0, lambda: None)
        except BaseException as e:
            self._stopping = True
            await service.stopService()
            error = self._client.unreachable_error(e)
            if not self.done.called:
                self.done.errback(Failure(error))
                self.done.addErrback(lambda _: None)
            raise error from None
        assert self.response is not None
        return self.response

    def stop(self) -> Deferred[None]:
        """Unsubscribe, close and stop dialling; fires when the connection is gone."""
        self._stopping = True
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.usable:
            try:
                protocol.send_envelope(make_client_envelope("unsubscribe_request", pb.UnsubscribeRequest()))
            except Exception:
                self._log.failure("sending the unsubscribe request failed")
        # Close the WebSocket properly first; then the service only has
        # its retries (if any) to cancel.
        closing = protocol.close() if protocol is not None else succeed(None)
        closing.addCallback(lambda _: self._stop_service())

        def finished(result: Any) -> None:
            if not self.done.called:
                self.done.callback(None)

        closing.addBoth(finished)
        return closing

    def abort_connection(self) -> None:
        """Drop the current connection abruptly (for tests of reconnection)."""
        if self._protocol is not None:
            self._protocol.abort()

    def retry_delay(self, attempt: int) -> float:
        """The dialling service's retry policy: exponential backoff with full jitter."""
        return backoff_delay(attempt, self._backoff_initial, self._backoff_max, self._rng.random)

    # -- internals ----------------------------------------------------------------

    def _stop_service(self) -> Optional[Deferred[None]]:
        if self._service is None or not self._service.running:
            return None
        return self._service.stopService()

    def _sequence_of(self, event: pb.FleetEvent) -> int:
        return int(event.sequence if self.edge_id else event.fleet_sequence)

    def _prepare(self, protocol: ClientWireClientProtocol) -> Deferred[pb.SubscribeResponse]:
        return ensureDeferred(self._subscribe(protocol))

    async def _subscribe(self, protocol: ClientWireClientProtocol) -> pb.SubscribeResponse:
        """``prepareConnection``: hello, then subscribe (resuming after the last sequence seen)."""
        try:
            await protocol.opened
        except WireConnectionLost as e:
            raise ControlPlaneUnreachable(self._client.url, f"the WebSocket did not open ({e})") from None
        if self._stopping:
            protocol.close()
            raise WireConnectionLost("the subscription was stopped")
        protocol.envelope_received = self._envelope_received
        try:
            hello = await self._client.say_hello(protocol)
            if not hello.accepted:
                raise HelloRejected(hello.reason or "no reason given")
            resume = self.last_sequence is not None
            request = pb.SubscribeRequest(edge_id=self.edge_id, resume=resume, since_sequence=self.last_sequence or 0)
            envelope = await protocol.request(
                "subscribe_request", request, self._client.clock, self._client.request_timeout
            )
        except BaseException:
            protocol.close()
            raise
        response = envelope.subscribe_response
        self.response = response
        if self.last_sequence is None:
            # Not resuming: later reconnects resume from what was newest now.
            self.last_sequence = int(response.last_sequence)
        self._protocol = protocol
        protocol.lost.addCallback(self._connection_lost, protocol)
        if self._subscribed_once:
            self.reconnects += 1
            # Tell the listener once the service holds the connection (it may stop us).
            self._client.clock.callLater(0, self._state, "resumed", f"after sequence {self.last_sequence}")
        self._subscribed_once = True
        return response

    def _attempt_failed(self, failure: Failure) -> None:
        """A dial or a (re)subscription failed; only the first one is ``start``'s to report."""
        if not self._subscribed_once or self._stopping:
            return
        if failure.check(HelloRejected, WireRequestError):
            # The server said no; asking again will not change its mind.
            self._stopping = True
            self._state("failed", failure.getErrorMessage())
            self._stop_service()
            if not self.done.called:
                self.done.errback(failure)
            return
        self._state("retrying", failure.getErrorMessage())

    def _envelope_received(self, envelope: pb.ClientEnvelope, body: str) -> None:
        if body == "event":
            event = envelope.event
            sequence = self._sequence_of(event)
            if self.last_sequence is not None and sequence <= self.last_sequence:
                return  # already delivered before a reconnect
            self.last_sequence = sequence
            self._call(self._on_event, event)
        elif body == "events_lost":
            lost = envelope.events_lost
            if lost.reason == SEQUENCE_RESET:
                # The server numbers from scratch: what it replays next is new here.
                self.last_sequence = 0
            elif self.last_sequence is None or lost.last_sequence > self.last_sequence:
                self.last_sequence = int(lost.last_sequence)
            self._call(self._on_lost, lost)
        elif body == "error":
            self._log.warn(
                "the Control Plane at {url} reported an error on the subscription: {code}: {message}",
                url=self._client.target,
                code=error_code_name(envelope.error.code),
                message=envelope.error.message,
            )
        else:
            self._log.debug("ignoring an unexpected {body} message", body=body)

    def _call(self, callback: Optional[Callable[[Any], Any]], value: Any) -> None:
        if callback is None:
            return
        try:
            result = callback(value)
            if isinstance(result, Deferred):
                result.addErrback(lambda f: self._log.failure("an event callback failed", f))
        except Exception:
            self._log.failure("an event callback failed")

    def _state(self, state: str, detail: str) -> None:
        if self._on_state is not None:
            try:
                self._on_state(state, detail)
            except Exception:
                self._log.failure("a state callback failed")

    def _connection_lost(self, _: object, protocol: ClientWireClientProtocol) -> None:
        if protocol is not self._protocol:
            return
        self._protocol = None
        if not self._stopping:
            # The dialling service reconnects; prepareConnection resumes.
            self._state("disconnected", protocol.close_reason)


def event_from_wire(event: pb.FleetEvent) -> Event:
    """The wire ``FleetEvent`` as the same typed :class:`Event` the HTTP views give."""

    def when(ms: int) -> Optional[datetime]:
        return datetime.fromtimestamp(ms / 1000.0, tz=UTC) if ms else None

    return Event(
        sequence=int(event.sequence),
        fleet_sequence=int(event.fleet_sequence),
        edge_id=event.edge_id,
        kind=event.kind,
        occurred_at=when(event.occurred_at_ms),
        recorded_at=when(event.recorded_at_ms),
        node_id=event.node_id or None,
        provider_id=event.provider_id or None,
        command_id=event.command_id or None,
        message=event.message,
        attributes=dict(event.attributes),
        unknown=_unknown_members(event),
    )


def _wire_name(name: str, kind: object) -> str:
    """The ``FleetEvent`` field a member of :class:`Event` comes from (a time ``x`` as ``x_ms``)."""
    return name + "_ms" if datetime in get_args(kind) else name


#: The ``FleetEvent`` fields :func:`event_from_wire` reads: one per member
#: of :class:`Event` (but the members it does not know).
_KNOWN_WIRE_FIELDS = frozenset(
    _wire_name(field.name, get_type_hints(Event)[field.name])
    for field in attrs.fields(Event)
    if not field.metadata.get("rest")
)


def _unknown_members(event: pb.FleetEvent) -> dict[str, Any]:
    """The fields of a newer Control Plane's event that this client does not
    know, in the HTTP view's shape: a time ``x`` sent as ``x_ms`` becomes an
    ISO 8601 ``x``, an empty text null."""
    unknown: dict[str, Any] = {}
    for field, value in event.ListFields():
        name = field.name
        if name in _KNOWN_WIRE_FIELDS:
            continue
        if name.endswith("_ms") and isinstance(value, int):
            unknown[name[:-3]] = format_time(datetime.fromtimestamp(value / 1000.0, tz=UTC))
        elif isinstance(value, (str, int, bool, float)):
            unknown[name] = value
        else:
            unknown[name] = dict(value)
    for declared in event.DESCRIPTOR.fields:
        # proto3 leaves empty texts out: the view shows them as null.
        name = declared.name
        if name not in _KNOWN_WIRE_FIELDS and name not in unknown and declared.type == declared.TYPE_STRING:
            unknown[name] = None
    return unknown
