"""Dialling out on a framed wire: hello, retry policy, one connection at a time.

Both outbound links, the Edge's to the Control Plane and the Node's to its
Edge, follow one pattern, implemented here once:

* every connection starts with a hello request; the answer must be the
  matching hello response, and its keepalive values (when sane) replace the
  configured ones so that both ends agree on them;
* a rejected hello closes the connection. A *permanent* rejection (bad id,
  bad credential, unsupported version) is logged once as an error and
  retried only at the maximum backoff delay, since retrying sooner cannot
  help;
* the ``ClientService`` retry policy is exponential backoff with full
  jitter, counting connections that ended before hello was accepted too;
  a rejection that carries a delay hint (``retry_after_ms``, sent with
  ``retry_later``) makes the next attempt wait at least that long.

A wire's own link subclasses :class:`DialerLink` (its hello, and what
happens once the peer accepts it) and :class:`HelloDialerProtocol` (the
hello bodies and the requests it serves once accepted).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Optional, Protocol, TypeVar

import attrs
from google.protobuf.message import Message
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.configuration import DialConfig
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, KeepaliveSweeper, WireError

LinkT = TypeVar("LinkT", bound="DialerLink[Any]")
ProtocolT = TypeVar("ProtocolT", bound="HelloDialerProtocol[Any]")


def backoff_delay(attempt: int, initial: float, maximum: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter, bounded by ``initial`` and ``maximum``.

    The ceiling doubles per attempt from ``initial`` up to ``maximum``; the
    delay is uniform between ``initial`` and that ceiling, so a fleet of
    Edges restarting together spreads out and never hammers faster than
    ``initial``.
    """
    exponent = max(0, attempt - 1)
    ceiling = maximum if exponent >= 63 else min(maximum, initial * (2.0**exponent))
    return initial + rand() * (ceiling - initial)


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
        super().__init__(link.clock, link.dial.peer_settings())
        self._link = link
        #: Whether the peer accepted this connection's hello.
        self.accepted = False

    def peer_connected(self) -> None:
        self._link.connection_made(self)
        d = self.request(self.hello_request_body, self._link.hello())
        d.addCallbacks(self._hello_answered, self._hello_failed)

    def _hello_answered(self, envelope: pb.Envelope) -> None:
        if envelope.WhichOneof("body") != self.hello_response_body:
            self.fail_connection(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"expected {self.hello_response_body}")
            return
        response: HelloResponse = getattr(envelope, self.hello_response_body)
        if not response.accepted:
            self._link.rejected(response)
            self.close()
            return
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

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "error":
            # The peer says why it is about to close this connection.
            self._link.closing_because(envelope.error)
            return
        if not self.accepted:
            self.send_error(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} before hello was accepted", envelope.request_id)
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
            self.send_error(
                pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} is not valid on the {self.wire_name}", envelope.request_id
            )
        else:
            self._log.warn("ignoring unexpected {body} from the {peer}", body=body, peer=self.describe_peer())

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
    """State of one outbound link: one connection at a time, retried with backoff.

    Protocols call :meth:`connection_made`, :meth:`accepted`,
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
        self._sessions_without_acceptance = 0
        #: The peer's delay hint from the last rejection, for the next attempt only.
        self.retry_after_seconds = 0.0
        self._sweeper = KeepaliveSweeper(
            clock, dial.peer_settings(), lambda: [self.current] if self.current is not None else []
        )

    @property
    def sessions_without_acceptance(self) -> int:
        """Connections that ended before hello was accepted, since the last acceptance."""
        return self._sessions_without_acceptance

    def factory(self) -> Factory:
        """The protocol factory for the ``ClientService``."""
        return _DialerFactory(self)

    def retry_delay(self, attempt: int) -> float:
        """The ``ClientService`` retry policy.

        Counts connections that ended before hello was accepted too (the
        ``ClientService`` resets its own count on every TCP connect).
        """
        backoff = self.dial.backoff
        hint, self.retry_after_seconds = self.retry_after_seconds, 0.0
        if self.permanent_rejection is not None or self.superseded:
            return max(backoff.max_seconds, hint)
        attempts = max(attempt, self._sessions_without_acceptance)
        return max(hint, backoff_delay(attempts, backoff.initial_seconds, backoff.max_seconds, self._rand))

    def stop(self) -> None:
        """Stop the keepalive timer (service shutdown)."""
        self._sweeper.stop()

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
        """A TCP connection is up; hello is on its way."""
        self.current = protocol
        self._sweeper.start()

    def accepted(self, protocol: ProtocolT, response: HelloResponse) -> None:
        """The peer accepted hello: reset the backoff, then go live."""
        self.acceptances += 1
        self._sessions_without_acceptance = 0
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
                    "{peer} rejected {own} permanently ({code}): {reason}; "
                    "fix the configuration; retrying every {delay:g}s",
                    peer=self.peer_name,
                    own=self.own_name(),
                    code=code,
                    reason=response.reason,
                    delay=self.dial.backoff.max_seconds,
                )
        else:
            self.permanent_rejection = None
            self._log.warn(
                "{peer} rejected {own} for now ({code}): {reason}; retrying in at least {delay:g}s",
                peer=self.peer_name,
                own=self.own_name(),
                code=code,
                reason=response.reason,
                delay=self.retry_after_seconds,
            )

    def closing_because(self, error: pb.Error) -> None:
        """The peer is closing the connection and said why.

        ``SUPERSEDED`` means another process with this identity took over:
        racing back at once would only push it out again, so this end
        waits the maximum delay (and says so once).
        """
        if error.code == pb.ERROR_CODE_SUPERSEDED:
            self.superseded = True
            self._log.warn(
                "{peer} closed {own}: {message}; another process with this id is running? retrying in {delay:g}s",
                peer=self.peer_name,
                own=self.own_name(),
                message=error.message,
                delay=self.dial.backoff.max_seconds,
            )
        else:
            self._log.info(
                "{peer} is closing the connection of {own}: {code}: {message}",
                peer=self.peer_name,
                own=self.own_name(),
                code=pb.ErrorCode.Name(error.code),
                message=error.message,
            )

    def connection_lost(self, protocol: ProtocolT) -> None:
        """The connection is gone; the ``ClientService`` dials again."""
        if self.current is not protocol:
            return
        self.current = None
        self._sweeper.stop()
        self.session_ended(protocol)
        if not protocol.accepted and self.permanent_rejection is None:
            self._sessions_without_acceptance += 1


class _DialerFactory(Factory):
    # The ClientService restarts the factory on every attempt; keep logs quiet.
    noisy = False

    def __init__(self, link: DialerLink[Any]) -> None:
        self._link = link

    def buildProtocol(self, addr: Optional[IAddress]) -> HelloDialerProtocol[Any]:
        return self._link.protocol_class(self._link)
