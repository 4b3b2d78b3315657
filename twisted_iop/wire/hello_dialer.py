"""The framed TCP wires' outbound links: hello, then serve the peer.

For the framed TCP wires (the Edge's to the Control Plane, the Node's to
its Edge), :class:`DialerLink` (one outbound link: its
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
from typing import Any, ClassVar, Generic, Optional, Protocol, TypeVar, cast

import attrs
from google.protobuf.message import Message
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IAddress,
    IReactorTime,
    IStreamClientEndpoint,
)
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.counters import WireCounters
from twisted_iop.wire.dialer import DialingService, EndpointRotation, backoff_delay, hold_off_delay
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.keepalive import KeepaliveSweeper
from twisted_iop.wire.peer import FramedPeerProtocol, WireError
from twisted_iop.wire.settings import DialConfig

LinkT = TypeVar("LinkT", bound="DialerLink[Any]")
ProtocolT = TypeVar("ProtocolT", bound="HelloDialerProtocol[Any]")


class HelloRefused(WireError):
    """The peer answered hello with ``accepted=false``."""

    def __init__(self, code: str, reason: str, permanent: bool) -> None:
        super().__init__(f"hello refused ({code}): {reason}")
        self.code = code
        self.reason = reason
        self.permanent = permanent


class HelloFailed(WireError):
    """Hello got no usable answer (a wrong message, a timeout, a closed connection)."""


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
        return cast("HelloDialerProtocol[Any]", self._link.protocol_class(self._link))
