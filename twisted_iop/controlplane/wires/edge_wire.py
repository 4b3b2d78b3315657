"""The edge wire: one framed-protobuf protocol per Edge connection.

The protocol holds only per-connection state (the edge id and connection
token once hello is accepted) and translates frames into registry calls.

Hello is checked by :func:`~twisted_iop.wire.hello.check_edge_hello`
(credentials kept as digests, and, with mutual TLS, the id the client
certificate proves). Failed attempts to prove an identity are counted per
source address and a blocked address's connections are closed at once
(:class:`~twisted_iop.wire.limits.FailedHelloLimiter`); hellos that would
are queued first
(:class:`~twisted_iop.controlplane.wires.hello_admission.HelloAdmission`: a
bounded FIFO worked off in slices of the event loop, an optional fixed
cap) and checked when their turn comes; one the queue cannot hold is
answered ``retry_later`` with ``retry_after_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional, Protocol, Union, overload

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

import twisted_iop
from twisted_iop.controlplane.fleet.memory import CatalogCache
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.edge_peer import StatusListener
from twisted_iop.controlplane.wires.hello_admission import HelloAdmission, HelloAdmissionSettings
from twisted_iop.credentials import Digests, digest_of, matches
from twisted_iop.tls import EDGE, peer_identity
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import FAILED_PROOF_CODES, MAX_TEXT, Rejection, RejectionCode, check_edge_hello
from twisted_iop.wire.limits import (
    FailedHelloLimiter,
    FailedHelloLimits,
    RefusedConnection,
    source_of,
)
from twisted_iop.wire.peer import (
    AcceptedPeerProtocol,
    PeerServerFactory,
    PeerSettings,
    RemoteError,
)
from twisted_iop.wire.preserialized import PreserializedAnswer, PreserializedRequest

#: The retry hint of a hello refused because the replica is not in its cluster.
CLUSTER_RETRY_MS = 2000


class HelloGate(Protocol):
    """Cluster mode: whether this replica may accept hellos now."""

    @property
    def accepting(self) -> bool:
        """Loaded and connected to the shared store."""


@attrs.frozen
class EdgeCredentials:
    """How edges prove who they are: per-edge secrets or shared ones, as digests.

    An edge with its own entry must present one of its secrets; any other
    edge one of the shared secrets. With neither configured, any
    well-formed edge id is accepted.
    """

    per_edge: Mapping[str, Digests] = attrs.field(factory=dict, repr=False)
    shared: Digests = attrs.field(default=(), repr=False)

    @classmethod
    def from_secrets(cls, per_edge: Mapping[str, str] = {}, shared: str = "") -> EdgeCredentials:
        """Credentials from plain values (each a secret or ``sha256:<hex>``)."""
        return cls(
            per_edge={edge_id: (digest_of(value),) for edge_id, value in per_edge.items()},
            shared=(digest_of(shared),) if shared else (),
        )

    @property
    def required(self) -> bool:
        """Whether a credential is checked at all."""
        return bool(self.per_edge) or bool(self.shared)

    def check(self, edge_id: str, given: str) -> bool:
        """Whether ``given`` is the right credential for ``edge_id`` (compared as digests)."""
        candidates = self.per_edge.get(edge_id, self.shared)
        if not candidates:
            return not self.required
        return matches(given, candidates)


class EdgeWireProtocol(AcceptedPeerProtocol):
    """The Control Plane's end of one Edge connection."""

    _log = Logger()
    factory: EdgeWireFactory

    def __init__(self, factory: EdgeWireFactory) -> None:
        super().__init__(factory)
        self.edge_id: Optional[str] = None
        self.token: Optional[int] = None
        #: The hello waiting in the admission queue for its turn.
        self._waiting_hello: Optional[pb.Envelope] = None

    def describe_peer(self) -> str:
        return f"edge {self.edge_id}" if self.edge_id else "an edge connection before hello"

    def connection_closed(self, reason: Failure) -> None:
        if self._waiting_hello is not None:
            self._waiting_hello = None
            self.factory.hello_admission.withdraw(self)
        if self.edge_id is not None and self.token is not None:
            if self.close_reason:
                text = self.close_reason
            elif self.peer_close_reason:
                text = f"the edge closed the connection: {self.peer_close_reason}"
            elif reason.check(ConnectionDone):
                text = "connection closed by the edge"
            else:
                text = "connection lost"
            self.factory.registry.disconnect(self.edge_id, self.token, text)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if self.token is None:
            if self._waiting_hello is not None:
                self.fail_connection(
                    pb.ERROR_CODE_UNEXPECTED_MESSAGE,
                    f"{body} before the hello was answered",
                    envelope.request_id,
                )
                return
            if body != "edge_hello_request":
                self.fail_connection(
                    pb.ERROR_CODE_HELLO_REQUIRED,
                    f"the first message must be edge_hello_request, not {body}",
                    envelope.request_id,
                )
                return
            self._offer_hello(envelope)
            return
        assert self.edge_id is not None
        if body == "edge_event":
            self.factory.registry.record_edge_event(self.edge_id, self.token, envelope.edge_event)
        elif body == "error" and not envelope.request_id:
            self.peer_goodbye(envelope.error)
        elif envelope.request_id:
            self.protocol_violation(
                pb.ERROR_CODE_UNEXPECTED_MESSAGE,
                f"{body} is not expected from an edge after hello",
                envelope.request_id,
            )

    def _offer_hello(self, envelope: pb.Envelope) -> None:
        """Queue the hello for its turn (it counts as received: the hello deadline stops)."""
        self.hello_done()
        self._waiting_hello = envelope
        wait = self.factory.hello_admission.offer(self, envelope.ByteSize())
        if wait is not None:
            self._waiting_hello = None
            # Not logged per hello: a reconnecting fleet would flood the log.
            self._reject(
                envelope.request_id,
                Rejection(RejectionCode.RETRY_LATER, "too many edges are saying hello right now; try again later"),
                max(1, math.ceil(wait * 1000)),
            )

    def hello_turn(self) -> None:
        """The admission queue's turn for this connection's hello (nothing if it closed meanwhile)."""
        envelope = self._waiting_hello
        self._waiting_hello = None
        if envelope is None or self.closing or self.transport is None:
            return
        self._hello(envelope)

    def _hello(self, envelope: pb.Envelope) -> None:
        hello = envelope.edge_hello_request
        factory = self.factory
        certified_id = (peer_identity(self.transport, EDGE) or "") if factory.require_certificate else None
        rejection = check_edge_hello(hello, factory.credentials, certified_id)
        if rejection is not None:
            self._log.warn("edge hello rejected: {reason}", reason=rejection.reason)
            if rejection.code in FAILED_PROOF_CODES:
                factory.failed_hellos.failed(self._source())
            self._reject(envelope.request_id, rejection)
            return
        cluster = factory.cluster
        if cluster is not None and not cluster.accepting:
            # A replica that cannot reach the shared store (or has not
            # loaded the fleet yet) sends the edge to try again: with a
            # list of addresses it tries another replica meanwhile.
            self._reject(
                envelope.request_id,
                Rejection(RejectionCode.RETRY_LATER, "this Control Plane replica is not in its cluster right now"),
                CLUSTER_RETRY_MS,
            )
            return
        # One text for the connection and the registry's record (each read
        # of a protobuf string field makes a new one).
        edge_id = self.edge_id = hello.edge_id
        info = EdgeHello(
            labels=dict(hello.labels),
            software_version=hello.software_version[:MAX_TEXT],
            protocol_version=f"{hello.protocol_major}.{hello.protocol_minor}",
            # Copies, so the kept catalog does not hold the whole hello
            # frame; one copy for every edge announcing the same catalog.
            commands=factory.catalogs.detached(hello.commands),
        )
        # Answer first so the edge learns it is accepted before any request
        # (status, command) that the registry's listeners might send.
        self.answer_preserialized(factory.hello_accepted, envelope.request_id)
        self.token = factory.registry.connect(edge_id, self, info)

    def _reject(self, request_id: int, rejection: Rejection, retry_after_ms: int = 0) -> None:
        self.factory.count_rejection(rejection.code.value)
        response = pb.EdgeHelloResponse(
            accepted=False,
            reason=rejection.reason,
            reason_code=rejection.code.value,
            permanent=rejection.permanent,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            server_version=twisted_iop.__version__,
            retry_after_ms=retry_after_ms,
        )
        self.send("edge_hello_response", response, request_id)
        self.close()

    def _source(self) -> Optional[str]:
        return source_of(self.transport.getPeer()) if self.transport is not None else None

    # -- the EdgePeer interface ------------------------------------------------

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Ask the edge for its status snapshot (ended through ``listener``, no Deferred)."""
        return self.request_preserialized(_STATUS_REQUEST, _StatusAnswer(listener), timeout, deadline=own_deadline)

    def cancel_status(self, request_id: int) -> None:
        """Stop waiting for the status ask ``request_id``."""
        self.cancel_request(request_id)

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command to the edge.

        No timer here: the gateway owns the command's deadline and keeps
        listening past it for a late answer, until it cancels the request
        or the connection ends.
        """
        d = self.request("edge_command_request", request, deadline=False)
        return d.addCallback(lambda envelope: _expect(envelope, "edge_command_response").edge_command_response)

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Send the edge its desired set (the deployment service owns the deadline)."""
        d = self.request("edge_deployments_request", request, deadline=False)
        return d.addCallback(lambda envelope: _expect(envelope, "edge_deployments_response").edge_deployments_response)

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Close this connection with an error frame saying why."""
        self.fail_connection(code, message)


def accepted_hello_response(settings: PeerSettings) -> pb.EdgeHelloResponse:
    """What the Control Plane answers to an accepted hello: versions and keepalive timing."""
    return pb.EdgeHelloResponse(
        accepted=True,
        protocol_major=PROTOCOL_MAJOR,
        protocol_minor=PROTOCOL_MINOR,
        server_version=twisted_iop.__version__,
        keepalive_interval_ms=int(settings.keepalive_interval_seconds * 1000),
        keepalive_deadline_ms=int(settings.keepalive_deadline_seconds * 1000),
    )


#: Every status request is the same empty message: serialized once, and
#: each request adds only its request id.
_STATUS_REQUEST = PreserializedRequest("edge_status_request", pb.EdgeStatusRequest())


class _StatusAnswer:
    """The end of one status ask: the answer's snapshot, or the error, to its listener."""

    __slots__ = ("listener",)

    def __init__(self, listener: StatusListener) -> None:
        self.listener = listener

    def answered(self, envelope: pb.Envelope) -> None:
        """The edge answered: its snapshot, unless it answered with another body."""
        got = envelope.WhichOneof("body")
        if got != "edge_status_response":
            error = RemoteError(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"expected edge_status_response, got {got}")
            self.listener.status_answered(None, error)
        else:
            self.listener.status_answered(envelope.edge_status_response, None)

    def failed(self, error: Exception) -> None:
        """No snapshot: the error says why."""
        self.listener.status_answered(None, error)


def _expect(envelope: pb.Envelope, body: str) -> pb.Envelope:
    """``envelope`` if it carries ``body``; a RemoteError otherwise."""
    got = envelope.WhichOneof("body")
    if got != body:
        raise RemoteError(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"expected {body}, got {got}")
    return envelope


class EdgeWireFactory(PeerServerFactory):
    """Builds :class:`EdgeWireProtocol`s over one registry.

    ``require_certificate`` is set when the listener requires client
    certificates (mutual TLS): each hello's edge id must then be the one
    its certificate proves.
    """

    protocol_class = EdgeWireProtocol

    def __init__(
        self,
        registry: EdgeRegistry,
        clock: IReactorTime,
        settings: PeerSettings,
        credentials: EdgeCredentials = EdgeCredentials(),
        *,
        require_certificate: bool = False,
        failed_hellos: FailedHelloLimits = FailedHelloLimits(),
        hello_admission: HelloAdmissionSettings = HelloAdmissionSettings(),
    ) -> None:
        super().__init__(clock, settings)
        self.registry = registry
        self.credentials = credentials
        #: The announced catalogs, one copy each for every edge announcing it.
        self.catalogs = CatalogCache()
        self.require_certificate = require_certificate
        self.failed_hellos = FailedHelloLimiter(clock, failed_hellos, "edge_wire")
        #: The queue hellos wait in for their turn (slices of the loop, bounds, a fixed cap).
        self.hello_admission = HelloAdmission(clock, hello_admission)
        #: Cluster mode: hellos wait until the replica is in its cluster.
        self.cluster: Optional[HelloGate] = None
        #: The answer to every accepted hello, serialized once: only the
        #: request id differs from one edge to the next.
        self.hello_accepted = PreserializedAnswer("edge_hello_response", accepted_hello_response(settings))

    @overload  # type: ignore[override]  # narrows the return for addr None, which the base's IAddress excludes
    def buildProtocol(self, addr: None) -> EdgeWireProtocol: ...

    @overload
    def buildProtocol(self, addr: IAddress) -> Union[EdgeWireProtocol, RefusedConnection]: ...

    def buildProtocol(self, addr: Optional[IAddress]) -> Union[EdgeWireProtocol, RefusedConnection]:
        """A new connection; a blocked address's is aborted at once (without an address: never refused)."""
        if self.failed_hellos.is_blocked(source_of(addr)):
            return RefusedConnection()
        protocol = super().buildProtocol(addr)
        assert isinstance(protocol, EdgeWireProtocol)
        return protocol

    def startFactory(self) -> None:
        super().startFactory()
        self.hello_admission.start()

    def stopFactory(self) -> None:
        super().stopFactory()
        self.failed_hellos.stop()
        self.hello_admission.stop()
