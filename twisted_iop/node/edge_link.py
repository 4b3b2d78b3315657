"""The Node wire, Node side: hello, readiness, health, load and probe answers.

The tap runs the :class:`~twisted_iop.wire.dialer.DialingService` that
:meth:`EdgeLink.client_service` builds, so a lost Edge is dialled again
with exponential backoff and full jitter. Every connection says hello in
that service's ``prepareConnection``; once accepted the runtime probes its
providers and sends ``NodeReady``. A permanent rejection (unknown node,
wrong credential, unsupported version) is logged once and retried only
after a hold-off near the maximum delay; that part is
:mod:`twisted_iop.wire.dialer`, shared with the Edge's link.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from twisted.internet.defer import maybeDeferred
from twisted.internet.interfaces import IReactorTime

import twisted_iop
from twisted_iop.node.config import NodeRuntimeConfig
from twisted_iop.node.inference import INFERENCE_BODIES_FROM_EDGE
from twisted_iop.node.runtime import NodeRuntime
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello_dialer import DialerLink, HelloDialerProtocol, HelloResponse


class EdgeLinkProtocol(HelloDialerProtocol["EdgeLink"]):
    """The Node's end of its connection to the Edge."""

    hello_request_body = "node_hello_request"
    hello_response_body = "node_hello_response"
    wire_name = "node wire"
    #: A frame per streamed token: those written within ``edge.coalesce_ms`` go out as one send.
    turn_writes = True

    def __init__(self, link: EdgeLink) -> None:
        super().__init__(link)
        self.turn_delay_seconds = link.config.edge.coalesce_seconds

    def describe_peer(self) -> str:
        return "edge"

    def peer_connected(self) -> None:
        # Inference frames are small and latency-critical: no Nagle delay.
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)
        super().peer_connected()

    def accepted_envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "node_probe_request":
            self.reply_when_done(
                self._link.runtime.answer_probe_request(),
                "node_probe_response",
                envelope.request_id,
                crash_log="answering a probe request failed",
                crash_message="probe failed on the node",
            )
        elif body == "node_provider_command_request":
            self.reply_when_done(
                self._link.runtime.answer_provider_command(envelope.node_provider_command_request),
                "node_provider_command_response",
                envelope.request_id,
                crash_log="answering a provider command failed",
                crash_message="the provider command failed on the node",
            )
        elif body == "node_instances_request":
            self.reply_when_done(
                maybeDeferred(self._link.runtime.answer_instances_request, envelope.node_instances_request),
                "node_instances_response",
                envelope.request_id,
                crash_log="converging to the desired instances failed",
                crash_message="the node failed to converge its instances",
            )
        elif body in INFERENCE_BODIES_FROM_EDGE and self._link.runtime.inference is not None:
            self._link.runtime.inference.handle(self, envelope, body)
        else:
            self.unexpected_envelope(envelope, body)

    # -- EdgeSession ----------------------------------------------------------

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeReady`` with the first probe results."""
        self.send("node_ready", pb.NodeReady(providers=reports))

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeHealthReport`` with the providers whose health changed."""
        self.send("node_health_report", pb.NodeHealthReport(providers=reports))

    def send_load(self, reports: list[pb.ProviderLoadReport]) -> None:
        """Send ``NodeLoadReport`` with every provider's engine load."""
        self.send("node_load_report", pb.NodeLoadReport(providers=reports))

    def send_instances(self, report: pb.NodeInstancesReport) -> None:
        """Send ``NodeInstancesReport``: an instance changed state."""
        self.send("node_instances_report", report)


class EdgeLink(DialerLink[EdgeLinkProtocol]):
    """State of this Node's link to its Edge (one connection at a time)."""

    protocol_class = EdgeLinkProtocol
    peer_name = "the edge"

    def __init__(
        self,
        config: NodeRuntimeConfig,
        runtime: NodeRuntime,
        clock: IReactorTime,
        rand: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(config.edge, clock, rand)
        self.config = config
        self.runtime = runtime

    def hello(self) -> pb.NodeHelloRequest:
        """This Node's hello (providers by id, kind and models only; its engine profiles and GPU slots)."""
        instances = self.runtime.instances
        return pb.NodeHelloRequest(
            profiles=instances.profile_specs() if instances is not None else [],
            gpus=self.config.gpus,
            free_gpus=instances.free_gpus() if instances is not None else self.config.gpus,
            node_id=self.config.node_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version=twisted_iop.__version__,
            credential=self.config.credential,
            providers=self.runtime.provider_specs(),
            labels=dict(self.config.labels),
        )

    def own_name(self) -> str:
        return f"node {self.config.node_id}"

    def connection_made(self, protocol: EdgeLinkProtocol) -> None:
        super().connection_made(protocol)
        self._log.info(
            "connected to the edge at {address}; saying hello as node {node_id}",
            address=self.config.edge.address,
            node_id=self.config.node_id,
        )

    def session_accepted(self, protocol: EdgeLinkProtocol, response: HelloResponse) -> None:
        """The Edge accepted hello (pending); probe and report ready."""
        self._log.info("edge accepted node {node_id}; probing providers", node_id=self.config.node_id)
        self.runtime.session_accepted(protocol).addErrback(lambda f: self._log.failure("first probe round failed", f))

    def session_ended(self, protocol: EdgeLinkProtocol) -> None:
        """Tell the runtime the session is gone; the ``ClientService`` dials again."""
        self.runtime.session_lost(protocol)
        if protocol.accepted:
            self._log.info("lost the edge connection; reconnecting")
