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

The framed TCP wires' hello exchange and links built on it are in
:mod:`twisted_iop.wire.hello_dialer`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Optional, TypeVar

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
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

T = TypeVar("T")

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
        return super().stopService()

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
