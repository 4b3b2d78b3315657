"""The Edge wire, Edge side: enrolling with the Control Plane and serving it.

The Edge dials out through the :class:`~twisted_iop.wire.dialer.DialingService`
that :meth:`ControlPlaneLink.client_service` builds (the tap adds it to the
Edge's services). On every connection that service's ``prepareConnection``
sends ``EdgeHelloRequest``; once the Control Plane accepts it the queued
events are flushed in order and from then on events go straight out,
status requests are answered from the status provider, commands are run
by the command runner and desired sets of instances are taken by the
Edge's deployments.

With several Control Plane replicas (``control_plane.addresses``) the
service dials them in an order shuffled once per Edge process, moving to
the next address on every failed attempt or lost connection (see
:class:`~twisted_iop.wire.dialer.EndpointRotation`); log lines name the
address it connected to.

Hello, the retry policy (exponential backoff with full jitter) and
rejections (a permanent one is logged once and retried only after a
hold-off near the maximum delay) are :mod:`twisted_iop.wire.dialer`'s,
shared with the Node's link to its Edge and the WebSocket client.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Optional

from twisted.internet.interfaces import IReactorTime

import twisted_iop
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.config import ControlPlaneLinkConfig
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello_dialer import DialerLink, HelloDialerProtocol, HelloResponse


class ControlPlaneProtocol(HelloDialerProtocol["ControlPlaneLink"]):
    """The Edge's end of its connection to the Control Plane."""

    hello_request_body = "edge_hello_request"
    hello_response_body = "edge_hello_response"
    wire_name = "edge wire"

    def describe_peer(self) -> str:
        return "control plane"

    @property
    def enrolled(self) -> bool:
        """Whether the Control Plane accepted this connection's hello."""
        return self.accepted

    def accepted_envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "edge_status_request":
            self.send("edge_status_response", self._link.status.snapshot(), envelope.request_id)
        elif body == "edge_deployments_request" and self._link.deployments is not None:
            self.send(
                "edge_deployments_response",
                self._link.deployments.take(envelope.edge_deployments_request),
                envelope.request_id,
            )
        elif body == "edge_command_request":
            self.reply_when_done(
                self._link.commands.run(envelope.edge_command_request),
                "edge_command_response",
                envelope.request_id,
                crash_log="command handling crashed",
                crash_message="internal error running the command",
            )
        else:
            self.unexpected_envelope(envelope, body)


class ControlPlaneLink(DialerLink[ControlPlaneProtocol]):
    """State of this Edge's link to the Control Plane (one connection at a time)."""

    protocol_class = ControlPlaneProtocol
    peer_name = "the control plane"

    def __init__(
        self,
        config: ControlPlaneLinkConfig,
        registry: NodeRegistry,
        status: StatusProvider,
        commands: CommandRunner,
        clock: IReactorTime,
        rand: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(config, clock, rand)
        self.config = config
        self.registry = registry
        self.status = status
        self.commands = commands
        self.enrolled_since = 0.0
        #: Takes the Control Plane's desired instances (set by the tap).
        self.deployments: Optional[EdgeDeployments] = None
        commands.add_diagnostics(self.diagnostics)

    def hello(self) -> pb.EdgeHelloRequest:
        """This Edge's hello."""
        return pb.EdgeHelloRequest(
            edge_id=self.config.edge_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version=twisted_iop.__version__,
            credential=self.config.credential,
            labels=dict(self.config.labels),
            commands=self.commands.catalog(),
        )

    def own_name(self) -> str:
        return f"edge {self.config.edge_id}"

    def connection_made(self, protocol: ControlPlaneProtocol) -> None:
        super().connection_made(protocol)
        self._log.info(
            "connected to the control plane at {address}; enrolling as edge {edge_id}",
            address=self.address,
            edge_id=self.config.edge_id,
        )

    def session_accepted(self, protocol: ControlPlaneProtocol, response: HelloResponse) -> None:
        """The Control Plane accepted hello: flush the outbox, go live."""
        self.enrolled_since = self.registry.now()
        flushed = self.registry.relay.attach(lambda event: protocol.send("edge_event", event))
        self._log.info(
            "enrolled with the control plane at {address} as edge {edge_id} "
            "(server {server_version}, {flushed} queued events sent)",
            address=self.address,
            edge_id=self.config.edge_id,
            server_version=response.server_version or "unknown",
            flushed=flushed,
        )

    def session_ended(self, protocol: ControlPlaneProtocol) -> None:
        """The connection is gone: queue events until the next enrollment."""
        if protocol.enrolled:
            self.registry.relay.detach()
            self._log.info(
                "lost the control plane connection at {address}; queueing events until enrolled again",
                address=self.address,
            )

    @property
    def enrollments(self) -> int:
        """How many times the Control Plane accepted this Edge."""
        return self.acceptances

    @property
    def is_enrolled(self) -> bool:
        """Whether events currently flow to the Control Plane."""
        return self.current is not None and self.current.enrolled

    def diagnostics(self) -> dict[str, str]:
        """The link's part of ``edge.diagnostics`` (no addresses, no credentials)."""
        return {
            "control_plane_enrolled": "true" if self.is_enrolled else "false",
            "control_plane_enrollments": str(self.enrollments),
        }
