"""The Node wire, Edge side: one protocol per Node connection.

The protocol holds only per-connection state (the Node id and connection
token once hello is accepted) and turns wire messages into calls on the
:class:`~twisted_iop.edge.nodes.registry.NodeRegistry`:

* ``NodeHelloRequest`` -> accepted (pending) or rejected, then closed;
* ``NodeReady`` -> the connection may take ownership;
* ``NodeHealthReport`` -> provider health (counts only for the owner);
* ``NodeLoadReport`` -> the engines' own load (counts only for the owner);
* ``NodeInstancesReport`` -> the Edge's deployments (counts only for the owner);
* connection lost -> the registry decides whether anything changed.

Every frame of an accepted connection, keepalive pings and pongs and
answers to the Edge's own requests included, refreshes the Node's
``last_seen`` (it counts only while the connection owns the Node).

It also provides the registry's ``NodePeer`` interface (``close``,
``probe``).

With mutual TLS (``node_server.tls``) a hello's node id must be the one
the Node's client certificate proves. Failed attempts to prove an identity
(bad credential, identity mismatch, unknown node) are counted per source
address; a blocked address's connections are closed at once.
"""

from __future__ import annotations

from typing import Optional, Union, overload

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

import twisted_iop
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.inference.gateway import INFERENCE_BODIES_FROM_NODE, InferenceGateway
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.tls import NODE, peer_identity
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import FAILED_PROOF_CODES
from twisted_iop.wire.limits import FailedHelloLimiter, FailedHelloLimits, RefusedConnection, source_of
from twisted_iop.wire.peer import AcceptedPeerProtocol, PeerServerFactory
from twisted_iop.wire.settings import PeerSettings


class NodeServerProtocol(AcceptedPeerProtocol):
    """The Edge's end of one Node connection."""

    _log = Logger()
    #: Inference requests of one turn to this Node go out as one write.
    turn_writes = True

    factory: NodeServerFactory

    def __init__(self, factory: NodeServerFactory) -> None:
        super().__init__(factory)
        self._registry = factory.registry
        self.node_id: Optional[str] = None
        self.token: Optional[int] = None

    def peer_connected(self) -> None:
        # Inference frames are small and latency-critical: no Nagle delay.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        super().peer_connected()

    def connection_closed(self, reason: Failure) -> None:
        if self.token is not None:
            self._registry.node_closed(self.token)
        if self.factory.inference is not None:  # after node_closed: its leases are lost, not freed
            self.factory.inference.connection_lost(self)

    def describe_peer(self) -> str:
        return f"node {self.node_id}" if self.node_id else "unidentified node connection"

    def frame_received(self, data: bytes) -> None:
        # Here, not in envelope_received: pings, pongs and probe answers
        # never reach envelope_received, and they are what a quiet Node sends.
        if self.token is not None and not self.closing:
            self._registry.node_seen(self.token)
        super().frame_received(data)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        inference = self.factory.inference
        if body in INFERENCE_BODIES_FROM_NODE and self.token is not None and inference is not None:
            inference.node_message(self, envelope, body)  # first: a streamed token's, the most frequent by far
            return
        if body == "node_hello_request":
            self._hello(envelope.request_id, envelope.node_hello_request)
        elif self.token is None:
            self.fail_connection(pb.ERROR_CODE_HELLO_REQUIRED, "send node_hello_request first", envelope.request_id)
        elif body == "node_ready":
            self._registry.node_ready(self.token, envelope.node_ready.providers)
        elif body == "node_health_report":
            self._registry.node_health(self.token, envelope.node_health_report.providers)
        elif body == "node_load_report":
            self._registry.node_load(self.token, envelope.node_load_report.providers)
        elif body == "node_instances_report":
            if self.factory.deployments is not None and self._registry.ownership.is_owner(self.token):
                assert self.node_id is not None
                self._registry.ownership.seen(self.token)
                self.factory.deployments.node_report(self.node_id, envelope.node_instances_report)
        elif body == "error" and not envelope.request_id:
            self.peer_goodbye(envelope.error)
        elif envelope.request_id:
            self.protocol_violation(
                pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} is not valid on the node wire", envelope.request_id
            )
        else:
            self.protocol_violation(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"unexpected {body} ignored")

    def _hello(self, request_id: int, hello: pb.NodeHelloRequest) -> None:
        if self.token is not None:
            self.protocol_violation(pb.ERROR_CODE_UNEXPECTED_MESSAGE, "hello was already accepted", request_id)
            return
        self.hello_done()
        response = pb.NodeHelloResponse(
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            server_version=twisted_iop.__version__,
            keepalive_interval_ms=int(self._settings.keepalive_interval_seconds * 1000),
            keepalive_deadline_ms=int(self._settings.keepalive_deadline_seconds * 1000),
        )
        certified_id = (peer_identity(self.transport, NODE) or "") if self.factory.require_certificate else None
        rejection = self._registry.check_hello(hello, certified_id)
        if rejection is not None:
            if rejection.code in FAILED_PROOF_CODES and self.transport is not None:
                self.factory.failed_hellos.failed(source_of(self.transport.getPeer()))
            # A rejected connection changes no state and produces no event.
            self._log.warn(
                "rejected node connection claiming {node_id!r}: {reason}",
                node_id=hello.node_id[:80],
                reason=rejection.reason,
            )
            self.factory.count_rejection(rejection.code.value)
            response.accepted = False
            response.reason = rejection.reason
            response.reason_code = rejection.code.value
            response.permanent = rejection.permanent
            self.send("node_hello_response", response, request_id)
            self.close()
            return
        self.node_id = hello.node_id
        self.token = self._registry.node_accepted(hello, self)
        response.accepted = True
        self.send("node_hello_response", response, request_id)

    # -- NodePeer -------------------------------------------------------------

    def supersede(self) -> None:
        """Close with ``Error{SUPERSEDED}`` so the Node backs off instead of racing back."""
        self.fail_connection(pb.ERROR_CODE_SUPERSEDED, "a newer connection of this node took over")

    def probe(self, timeout: float) -> Deferred[pb.NodeProbeResponse]:
        """Send ``NodeProbeRequest``; fire with the Node's answer."""
        d = self.request("node_probe_request", pb.NodeProbeRequest(), timeout=timeout)
        return d.addCallback(lambda envelope: envelope.node_probe_response)

    def provider_command(
        self, request: pb.NodeProviderCommandRequest, timeout: float
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Send ``NodeProviderCommandRequest``; fire with the Node's answer (an error frame fails it)."""
        d = self.request("node_provider_command_request", request, timeout=timeout)
        return d.addCallback(_provider_command_answer)

    def instances(self, request: pb.NodeInstancesRequest, timeout: float) -> Deferred[pb.NodeInstancesResponse]:
        """Send ``NodeInstancesRequest``; fire with the Node's ``NodeInstancesResponse`` (an error frame fails it)."""
        d = self.request("node_instances_request", request, timeout=timeout)
        return d.addCallback(_instances_answer)


def _provider_command_answer(envelope: pb.Envelope) -> pb.NodeProviderCommandResponse:
    if envelope.WhichOneof("body") != "node_provider_command_response":
        raise ValueError(f"the node answered {envelope.WhichOneof('body')} to a provider command")
    return envelope.node_provider_command_response


def _instances_answer(envelope: pb.Envelope) -> pb.NodeInstancesResponse:
    if envelope.WhichOneof("body") != "node_instances_response":
        raise ValueError(f"the node answered {envelope.WhichOneof('body')} to its desired instances")
    return envelope.node_instances_response


class NodeServerFactory(PeerServerFactory):
    """Builds Node connections over the Edge's registry.

    ``require_certificate`` is set when the listener requires client
    certificates: each hello's node id must then be the one its
    certificate proves.
    """

    protocol_class = NodeServerProtocol

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        settings: PeerSettings,
        *,
        require_certificate: bool = False,
        failed_hellos: FailedHelloLimits = FailedHelloLimits(),
    ) -> None:
        super().__init__(clock, settings)
        self.registry = registry
        self.require_certificate = require_certificate
        self.failed_hellos = FailedHelloLimiter(clock, failed_hellos, "node_server")
        #: The inference gateway, once the tap has built it.
        self.inference: Optional[InferenceGateway] = None
        #: The Edge's deployments (instance reports go there), once the tap has built them.
        self.deployments: Optional[EdgeDeployments] = None

    @overload  # type: ignore[override]  # narrows the return for addr None, which the base's IAddress excludes
    def buildProtocol(self, addr: None) -> NodeServerProtocol: ...

    @overload
    def buildProtocol(self, addr: IAddress) -> Union[NodeServerProtocol, RefusedConnection]: ...

    def buildProtocol(self, addr: Optional[IAddress]) -> Union[NodeServerProtocol, RefusedConnection]:
        """A new connection; a blocked address's is aborted at once (without an address: never refused)."""
        if self.failed_hellos.is_blocked(source_of(addr)):
            return RefusedConnection()
        protocol = super().buildProtocol(addr)
        assert isinstance(protocol, NodeServerProtocol)
        return protocol

    def stopFactory(self) -> None:
        super().stopFactory()
        self.failed_hellos.stop()
