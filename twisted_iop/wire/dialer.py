"""Dialling out: one ``ClientService`` recipe for every outbound wire.

Three links dial out and must stay up: the Edge's to the Control Plane, the
Node's to its Edge (both framed TCP) and a WebSocket ``/client``
subscription. All of them are a :class:`DialingService`, Twisted's
``ClientService`` with:

* the link's handshake in ``prepareConnection``: a connection counts as
  made only once hello (and, for a subscription, subscribe) was answered,
  so a refused or unanswered hello is a failed attempt like a refused TCP
  connect, and ``ClientService`` counts them for the retry policy;
* a retry policy of exponential backoff with full jitter on every retry,
  the first one included, so a fleet that lost its peer at the same moment
  does not come back in lockstep (:func:`backoff_delay`);
* log lines that name the peer by its address (the endpoint string or the
  URL), never by an object's repr;
* one or several addresses of the same peer (replicas): an
  :class:`EndpointRotation` shuffles them once per process and dials the
  next one on every attempt, so a failed attempt or a lost connection moves
  on to the next address, and processes given the same list spread over
  it. A single address is a rotation of one.

For the framed TCP wires, :class:`DialerLink` (one outbound link: its
hello, what happens once the peer accepts it, and its retry policy) and
:class:`HelloDialerProtocol` (the hello exchange and the requests it serves
afterwards) implement the rest once:

* the hello answer must be the matching hello response; its keepalive
  values (when sane) replace the configured ones so that both ends agree;
* a rejected hello closes the connection. A *permanent* rejection (bad id,
  bad credential, unsupported version) is logged once as an error and
  retried only after a hold-off near the maximum delay
  (:func:`hold_off_delay`), since retrying sooner cannot help; so is a
  connection the peer closed as ``SUPERSEDED``.
* a rejection that carries a delay hint (``retry_after_ms``, sent with
  ``retry_later`` when the Control Plane's hello rate is exceeded) makes the
  next attempt wait at least that long.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Generic, Optional, Protocol, TypeVar

import attrs
from google.protobuf.message import Message
from twisted.application.internet import ClientService
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.internet.interfaces import (
    IAddress,
    ILoggingContext,
    IProtocol,
    IProtocolFactory,
    IReactorTime,
    IStreamClientEndpoint,
    ITransport,
)
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.counters import WireCounters
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.peer import FramedPeerProtocol, KeepaliveSweeper, WireError
from twisted_iop.wire.settings import DialConfig

T = TypeVar("T")
LinkT = TypeVar("LinkT", bound="DialerLink[Any]")
ProtocolT = TypeVar("ProtocolT", bound="HelloDialerProtocol[Any]")

#: Prepares one new connection (hello ...); fails to reject it.
PrepareConnection = Callable[[Any], Any]


def backoff_delay(attempt: int, initial: float, maximum: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter: uniform in ``[0, ceiling]``.

    The ceiling is ``initial`` for the first retry and doubles per retry in
    a row up to ``maximum``. Every delay is drawn at random, the first one
    too, so peers that lost their connection together spread out instead
    of dialling again in lockstep.
    """
    exponent = max(0, attempt - 1)
    ceiling = maximum if exponent >= 63 else min(maximum, initial * (2.0**exponent))
    return rand() * ceiling


def hold_off_delay(maximum: float, rand: Callable[[], float] = random.random) -> float:
    """The wait after a refusal that retrying soon cannot fix: in ``[maximum / 2, maximum]``.

    Close to the maximum, so a misconfigured process costs its peer little,
    and still jittered, so a fleet refused together (a rotated credential)
    does not retry together.
    """
    return maximum * (0.5 + 0.5 * rand())


def shuffled(items: Sequence[T], rand: Callable[[], float] = random.random) -> list[T]:
    """``items`` in a random order drawn from ``rand`` (Fisher-Yates).

    ``rand`` returns floats in ``[0, 1)`` like :func:`random.random`; one
    that always returns values near 1 keeps the order as it is.
    """
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = min(i, max(0, int(rand() * (i + 1))))
        out[i], out[j] = out[j], out[i]
    return out


@implementer(IStreamClientEndpoint)
class EndpointRotation:
    """Several addresses of one peer, each ``connect()`` dialling the next one.

    ``endpoints`` pairs each address (as log lines name it) with its
    endpoint. Their order is shuffled once, here, with ``rand``, so that
    processes given the same list start on different addresses; from then
    on every ``connect()`` takes the next address in that order and wraps
    around at the end. Under a ``ClientService`` that means a refused
    connect, a failed hello and a lost connection all move on to the next
    address, while the service's retry count (and so its backoff) keeps
    growing across the list until a connection is made.

    Its repr is the address the next ``connect()`` dials (what
    ``ClientService`` names when it schedules a retry).
    """

    def __init__(
        self, endpoints: Sequence[tuple[str, IStreamClientEndpoint]], rand: Callable[[], float] = random.random
    ) -> None:
        if not endpoints:
            raise ValueError("an endpoint rotation needs at least one endpoint")
        self.order: tuple[tuple[str, IStreamClientEndpoint], ...] = tuple(shuffled(endpoints, rand))
        self._next = 0
        #: The address of the latest ``connect()`` (before any: the first to dial).
        self.current = self.order[0][0]

    @property
    def addresses(self) -> tuple[str, ...]:
        """The addresses in the order they are dialled."""
        return tuple(address for address, _ in self.order)

    @property
    def upcoming(self) -> str:
        """The address the next ``connect()`` dials."""
        return self.order[self._next][0]

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        address, endpoint = self.order[self._next]
        self._next = (self._next + 1) % len(self.order)
        self.current = address
        return endpoint.connect(protocolFactory)

    def __repr__(self) -> str:
        return self.upcoming


class HelloRefused(WireError):
    """The peer answered hello with ``accepted=false``."""

    def __init__(self, code: str, reason: str, permanent: bool) -> None:
        super().__init__(f"hello refused ({code}): {reason}")
        self.code = code
        self.reason = reason
        self.permanent = permanent


class HelloFailed(WireError):
    """Hello got no usable answer (a wrong message, a timeout, a closed connection)."""


# -- the ClientService recipe -------------------------------------------------------


class DialingService(ClientService):
    """A ``ClientService`` whose connections count once ``prepare`` succeeded.

    ``prepare(protocol)`` gets each new connection's protocol (the one the
    factory built) and returns a Deferred: hello, subscribe ... It should
    close the connection when it fails; the connection is closed in any
    case, and ``ClientService`` counts the attempt as failed, so
    ``retry_policy`` sees refused hellos in its attempt count.

    ``target`` names the peer in log lines (an endpoint string or a URL).
    ``endpoint`` is one endpoint, or an :class:`EndpointRotation` over
    several addresses of the peer (each attempt then dials the next one;
    ``target`` names them all and :attr:`rotation` says which one an attempt
    dialled); a single endpoint is a rotation of one named ``target``.
    ``attempt_failed``, if given, hears why each attempt failed (a refused
    TCP connect or a failed ``prepare``); it runs outside the service's
    state machine, so it may stop the service.

    ``ClientService`` only knows how to lose a connection that it holds
    (one that passed ``prepareConnection``); losing any other raises
    ``automat.NoTransition`` from ``connectionLost`` and may even make it
    drop the live connection. So the loss of a connection that was never
    prepared is kept from it: that attempt has already failed.
    """

    def __init__(
        self,
        endpoint: IStreamClientEndpoint | EndpointRotation,
        target: str,
        factory: IProtocolFactory,
        prepare: PrepareConnection,
        retry_policy: Callable[[int], float],
        clock: IReactorTime,
        attempt_failed: Optional[Callable[[Failure], None]] = None,
    ) -> None:
        self.target = target
        #: The peer's addresses, dialled in turn.
        self.rotation = endpoint if isinstance(endpoint, EndpointRotation) else EndpointRotation([(target, endpoint)])
        self._prepare_connection = prepare
        self._attempt_failed = attempt_failed
        remembering = _RememberingFactory(factory)
        self._endpoint = _GuardedEndpoint(self.rotation, remembering, self._report_failure)
        super().__init__(
            self._endpoint,
            remembering,
            retryPolicy=retry_policy,
            clock=clock,
            prepareConnection=self._prepare,
        )

    def stopService(self) -> Deferred[None]:
        """Stop; frames the connection holds for its turn are sent before it is closed."""
        guard = self._endpoint.last_guard
        flush = getattr(guard.application, "flush_writes", None) if guard is not None else None
        if flush is not None:
            flush()
        return super().stopService()  # type: ignore[no-any-return]

    def _prepare(self, wrapped: IProtocol) -> Deferred[None]:
        # ClientService attempts one connection at a time: this is the last one made.
        guard = self._endpoint.last_guard
        assert guard is not None and guard.wrapped is wrapped
        d: Deferred[Any] = maybeDeferred(self._prepare_connection, guard.application)
        guard.preparing = d

        def prepared(_: object) -> None:
            guard.preparing = None
            guard.prepared = True

        def failed(failure: Failure) -> Failure:
            guard.preparing = None
            transport: Optional[ITransport] = getattr(guard.application, "transport", None)
            if transport is not None:
                transport.loseConnection()
            if not failure.check(CancelledError):
                self._report_failure(failure)
            return failure

        d.addCallbacks(prepared, failed)
        return d

    def _report_failure(self, failure: Failure) -> None:
        if self._attempt_failed is None:
            return
        try:
            self._attempt_failed(failure)
        except Exception:
            Logger().failure("reporting a failed attempt to reach {target} failed", target=self.target)


@implementer(IProtocolFactory)
class _RememberingFactory:
    """The application's factory, remembering the protocol it built last."""

    def __init__(self, factory: IProtocolFactory) -> None:
        self._factory = factory
        self.last_built: Optional[IProtocol] = None

    def buildProtocol(self, addr: IAddress) -> Optional[IProtocol]:
        self.last_built = self._factory.buildProtocol(addr)
        return self.last_built

    def doStart(self) -> None:
        self._factory.doStart()

    def doStop(self) -> None:
        self._factory.doStop()


@implementer(IStreamClientEndpoint)
class _GuardedEndpoint:
    """The real endpoints, with each connection behind a :class:`_ConnectionGuard`.

    Its repr is the address the next attempt dials, which is what
    ``ClientService`` logs when it schedules a retry.
    """

    def __init__(
        self,
        endpoint: EndpointRotation,
        built: _RememberingFactory,
        connect_failed: Callable[[Failure], None],
    ) -> None:
        self._endpoint = endpoint
        self._built = built
        self._connect_failed = connect_failed
        #: The guard of the latest connection made.
        self.last_guard: Optional[_ConnectionGuard] = None

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        d: Deferred[Any] = self._endpoint.connect(_GuardFactory(protocolFactory, self._built))

        def connected(guard: _ConnectionGuard) -> IProtocol:
            # ClientService wants back the protocol its factory built.
            self.last_guard = guard
            return guard.wrapped

        def failed(failure: Failure) -> Failure:
            if not failure.check(CancelledError):
                self._connect_failed(failure)
            return failure

        d.addCallbacks(connected, failed)
        return d

    def __repr__(self) -> str:
        return repr(self._endpoint)


@implementer(IProtocolFactory)
class _GuardFactory:
    """Wraps ``ClientService``'s protocols in guards (see :class:`DialingService`)."""

    def __init__(self, factory: IProtocolFactory, built: _RememberingFactory) -> None:
        self._factory = factory
        self._built = built

    def buildProtocol(self, addr: IAddress) -> Optional[IProtocol]:
        wrapped = self._factory.buildProtocol(addr)
        application = self._built.last_built
        if wrapped is None or application is None:
            return None
        return _ConnectionGuard(wrapped, application)

    def doStart(self) -> None:
        self._factory.doStart()

    def doStop(self) -> None:
        self._factory.doStop()


@implementer(IProtocol, ILoggingContext)
class _ConnectionGuard:
    """Stands between a transport and ``ClientService``'s protocol wrapper.

    Passes everything through; the loss of a connection that was never
    prepared reaches only the application's protocol.
    """

    def __init__(self, wrapped: IProtocol, application: IProtocol) -> None:
        self.wrapped = wrapped
        self.application = application
        self.prepared = False
        self.preparing: Optional[Deferred[Any]] = None

    def makeConnection(self, transport: ITransport) -> None:
        self.wrapped.makeConnection(transport)

    def connectionMade(self) -> None:
        """Nothing: ``makeConnection`` tells the application's protocol."""

    def dataReceived(self, data: bytes) -> None:
        self.wrapped.dataReceived(data)

    def connectionLost(self, reason: Failure) -> None:
        if self.prepared:
            self.wrapped.connectionLost(reason)
            return
        try:
            self.application.connectionLost(reason)
        finally:
            if self.preparing is not None:
                # Whatever it waited for, this connection is gone.
                self.preparing.cancel()

    def logPrefix(self) -> str:
        if ILoggingContext.providedBy(self.application):
            prefix: str = ILoggingContext(self.application).logPrefix()
            return prefix
        return type(self.application).__name__


# -- framed TCP links -----------------------------------------------------------------


class HelloResponse(Protocol):
    """What every hello response carries (``EdgeHelloResponse``, ``NodeHelloResponse``)."""

    accepted: bool
    reason: str
    reason_code: str
    permanent: bool
    server_version: str
    keepalive_interval_ms: int
    keepalive_deadline_ms: int


class HelloDialerProtocol(FramedPeerProtocol, Generic[LinkT]):
    """The dialling end of a framed connection: says hello, then serves its peer."""

    #: The envelope body of this wire's hello request, and of its answer.
    hello_request_body: ClassVar[str]
    hello_response_body: ClassVar[str]
    #: The wire's name in error messages ("edge wire").
    wire_name: ClassVar[str]

    def __init__(self, link: LinkT) -> None:
        super().__init__(link.clock, link.dial.peer_settings(), link.wire_counters)
        self._link = link
        #: Whether the peer accepted this connection's hello.
        self.accepted = False

    def peer_connected(self) -> None:
        self._link.connection_made(self)

    def say_hello(self) -> Deferred[None]:
        """Send hello; fire once the peer accepted it.

        Fails with :class:`HelloRefused` when the peer refuses it and with
        :class:`HelloFailed` when there is no usable answer; the connection
        is then closed.
        """
        d = self.request(self.hello_request_body, self._link.hello())
        return d.addCallbacks(self._hello_answered, self._hello_failed)

    def _hello_answered(self, envelope: pb.Envelope) -> None:
        if envelope.WhichOneof("body") != self.hello_response_body:
            self.fail_connection(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"expected {self.hello_response_body}")
            raise HelloFailed(f"expected {self.hello_response_body}, got {envelope.WhichOneof('body')}")
        response: HelloResponse = getattr(envelope, self.hello_response_body)
        if not response.accepted:
            self._link.rejected(response)
            self.close()
            raise HelloRefused(response.reason_code or "rejected", response.reason, response.permanent)
        interval_ms, deadline_ms = response.keepalive_interval_ms, response.keepalive_deadline_ms
        if interval_ms and deadline_ms > interval_ms:
            # The peer's keepalive wins: both ends then agree on it.
            self._settings = attrs.evolve(
                self._settings,
                keepalive_interval_seconds=interval_ms / 1000.0,
                keepalive_deadline_seconds=deadline_ms / 1000.0,
            )
        self.accepted = True
        self._link.accepted(self, response)

    def _hello_failed(self, failure: Failure) -> None:
        failure.trap(WireError)
        if not self.closing:
            self._log.warn(
                "{peer} did not answer hello: {error}", peer=self.describe_peer(), error=failure.getErrorMessage()
            )
            self.close()
        raise HelloFailed(f"no answer to hello: {failure.getErrorMessage()}")

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "error":
            # The peer says why it is about to close this connection.
            self._link.closing_because(envelope.error)
            return
        if not self.accepted:
            self.protocol_violation(
                pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} before hello was accepted", envelope.request_id
            )
            return
        self.accepted_envelope_received(envelope, body)

    def accepted_envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """Serve a request or message that arrived after hello was accepted.

        Subclasses handle their wire's bodies and pass anything else to
        :meth:`unexpected_envelope`.
        """
        self.unexpected_envelope(envelope, body)

    def unexpected_envelope(self, envelope: pb.Envelope, body: str) -> None:
        """Answer a request this end does not serve with an error; ignore anything else."""
        if envelope.request_id:
            self.protocol_violation(
                pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} is not valid on the {self.wire_name}", envelope.request_id
            )
        else:
            self.protocol_violation(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"unexpected {body} ignored")

    def reply_when_done(
        self, d: Deferred[Any], body: str, request_id: int, *, crash_log: str, crash_message: str
    ) -> None:
        """Send the result of ``d`` as ``body``; if it fails, log and answer an internal error."""
        d.addCallback(lambda response: self.send(body, response, request_id))
        d.addErrback(self._reply_failed, request_id, crash_log, crash_message)

    def _reply_failed(self, failure: Failure, request_id: int, crash_log: str, crash_message: str) -> None:
        self._log.failure(crash_log, failure)
        self.send_error(pb.ERROR_CODE_INTERNAL, crash_message, request_id)

    def peer_disconnected(self, reason: Failure) -> None:
        self._link.connection_lost(self)


class DialerLink(Generic[ProtocolT]):
    """State of one outbound framed link: one connection at a time, retried with backoff.

    :meth:`client_service` builds the :class:`DialingService` that dials
    it. Protocols call :meth:`connection_made`, :meth:`accepted`,
    :meth:`rejected` and :meth:`connection_lost`; subclasses say hello
    (:meth:`hello`) and act on acceptance and loss
    (:meth:`session_accepted`, :meth:`session_ended`).
    """

    _log = Logger()

    #: Builds this link's connections.
    protocol_class: type[ProtocolT]
    #: The peer as log lines name it ("the control plane").
    peer_name: ClassVar[str]

    def __init__(self, dial: DialConfig, clock: IReactorTime, rand: Callable[[], float] = random.random) -> None:
        self.dial = dial
        self.clock = clock
        self._rand = rand
        self.current: Optional[ProtocolT] = None
        #: How many connections the peer accepted.
        self.acceptances = 0
        #: ``"code: reason"`` of the last rejection while it was permanent.
        self.permanent_rejection: Optional[str] = None
        self._logged_rejection: Optional[str] = None
        #: Whether the peer closed the last connection as superseded.
        self.superseded = False
        #: Failed attempts in a row, as the ``ClientService`` last counted them.
        self.failed_attempts = 0
        #: The peer's delay hint from the last rejection, for the next attempt only.
        self.retry_after_seconds = 0.0
        #: Frames and bytes of every connection of this link (for /metrics).
        self.wire_counters = WireCounters()
        self._rotation: Optional[EndpointRotation] = None
        self._sweeper = KeepaliveSweeper(
            clock, dial.peer_settings(), lambda: [self.current] if self.current is not None else []
        )

    def client_service(self, endpoint: IStreamClientEndpoint) -> DialingService:
        """The service that dials ``endpoint`` (made from ``dial.address``) and keeps this link up."""
        return self.client_service_for([self.dial.address], lambda _: endpoint)

    def client_service_for(
        self, addresses: Sequence[str], endpoint_for: Callable[[str], IStreamClientEndpoint]
    ) -> DialingService:
        """The service that keeps this link up over ``addresses`` (replicas of the peer).

        ``endpoint_for`` makes each address's endpoint. The addresses are
        shuffled once, with this link's random source, and dialled in turn
        (see :class:`EndpointRotation`); the retry policy's count keeps
        growing across them until a hello is accepted.
        """
        self._rotation = EndpointRotation([(address, endpoint_for(address)) for address in addresses], self._rand)
        return DialingService(
            self._rotation,
            ", ".join(addresses),
            self.factory(),
            self.prepare_connection,
            self.retry_delay,
            self.clock,
        )

    @property
    def address(self) -> str:
        """The peer's address this link dialled last (the one it is on while connected)."""
        return self._rotation.current if self._rotation is not None else self.dial.address

    def factory(self) -> Factory:
        """The protocol factory for the ``ClientService``."""
        return _DialerFactory(self)

    def prepare_connection(self, protocol: ProtocolT) -> Deferred[None]:
        """The ``ClientService``'s ``prepareConnection``: hello, accepted or failed."""
        return protocol.say_hello()

    def retry_delay(self, attempt: int) -> float:
        """The ``ClientService`` retry policy (``attempt`` failed attempts in a row).

        A refused or unanswered hello is a failed attempt too. After a
        permanent rejection or a supersede the delay is a hold-off near the
        maximum.
        """
        self.failed_attempts = attempt
        backoff = self.dial.backoff
        hint, self.retry_after_seconds = self.retry_after_seconds, 0.0
        if self.permanent_rejection is not None or self.superseded:
            return max(hint, hold_off_delay(backoff.max_seconds, self._rand))
        return max(hint, backoff_delay(attempt, backoff.initial_seconds, backoff.max_seconds, self._rand))

    def stop(self) -> None:
        """Stop the keepalive timer (service shutdown)."""
        self._sweeper.stop()

    def say_goodbye(self, message: str) -> None:
        """This end is stopping: tell the peer ``SHUTTING_DOWN`` on the current connection.

        The connection stays open: the dialing service closes it when it
        stops, after what was written before (answers, events) and the
        goodbye itself are sent.
        """
        current = self.current
        if current is not None and not current.closing and current.transport is not None:
            current.send_error(pb.ERROR_CODE_SHUTTING_DOWN, message)
            # The dialing service closes the transport itself: what is held goes first.
            current.flush_writes()

    # -- for subclasses -------------------------------------------------------

    def hello(self) -> Message:
        """This end's hello request."""
        raise NotImplementedError

    def own_name(self) -> str:
        """This end as log lines name it ("edge edge-a")."""
        raise NotImplementedError

    def session_accepted(self, protocol: ProtocolT, response: HelloResponse) -> None:
        """The peer accepted hello on ``protocol``: start serving it."""

    def session_ended(self, protocol: ProtocolT) -> None:
        """The current connection is gone, accepted or not (``protocol.accepted`` says)."""

    # -- protocol callbacks ---------------------------------------------------

    def connection_made(self, protocol: ProtocolT) -> None:
        """A TCP connection is up; hello is about to go out."""
        self.current = protocol
        self._sweeper.start()

    def accepted(self, protocol: ProtocolT, response: HelloResponse) -> None:
        """The peer accepted hello: reset the hold-offs, then go live."""
        self.acceptances += 1
        self.failed_attempts = 0
        self.permanent_rejection = None
        self._logged_rejection = None
        self.superseded = False
        self.session_accepted(protocol, response)

    def rejected(self, response: HelloResponse) -> None:
        """The peer refused hello; a permanent refusal is logged once."""
        code = response.reason_code or "rejected"
        # Only the edge wire's response has the hint; the node wire's has none.
        self.retry_after_seconds = getattr(response, "retry_after_ms", 0) / 1000.0
        if response.permanent:
            self.permanent_rejection = f"{code}: {response.reason}"
            if self._logged_rejection != self.permanent_rejection:
                self._logged_rejection = self.permanent_rejection
                self._log.error(
                    "{peer} at {address} rejected {own} permanently ({code}): {reason}; "
                    "fix the configuration; retrying every {low:g} to {high:g}s",
                    peer=self.peer_name,
                    address=self.address,
                    own=self.own_name(),
                    code=code,
                    reason=response.reason,
                    low=self.dial.backoff.max_seconds / 2,
                    high=self.dial.backoff.max_seconds,
                )
        else:
            self.permanent_rejection = None
            self._log.warn(
                "{peer} at {address} rejected {own} for now ({code}): {reason}; retrying in at least {delay:g}s",
                peer=self.peer_name,
                address=self.address,
                own=self.own_name(),
                code=code,
                reason=response.reason,
                delay=self.retry_after_seconds,
            )

    def closing_because(self, error: pb.Error) -> None:
        """The peer is closing the connection and said why.

        ``SUPERSEDED`` means another process with this identity took over:
        racing back at once would only push it out again, so this end
        holds off near the maximum delay (and says so).
        """
        if error.code == pb.ERROR_CODE_SUPERSEDED:
            self.superseded = True
            self._log.warn(
                "{peer} closed {own}: {message}; another process with this id is running? "
                "retrying in {low:g} to {high:g}s",
                peer=self.peer_name,
                own=self.own_name(),
                message=error.message,
                low=self.dial.backoff.max_seconds / 2,
                high=self.dial.backoff.max_seconds,
            )
        else:
            self._log.info(
                "{peer} is closing the connection of {own}: {code}: {message}",
                peer=self.peer_name,
                own=self.own_name(),
                code=enum_name(pb.ErrorCode, error.code),
                message=error.message,
            )

    def connection_lost(self, protocol: ProtocolT) -> None:
        """The connection is gone; the ``ClientService`` dials again."""
        if self.current is not protocol:
            return
        self.current = None
        self._sweeper.stop()
        self.session_ended(protocol)


class _DialerFactory(Factory):
    # The ClientService starts the factory on every attempt; keep logs quiet.
    noisy = False

    def __init__(self, link: DialerLink[Any]) -> None:
        self._link = link

    def buildProtocol(self, addr: Optional[IAddress]) -> HelloDialerProtocol[Any]:
        return self._link.protocol_class(self._link)
