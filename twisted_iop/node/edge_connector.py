"""The Node wire, Node side: hello, readiness, health and probe answers.

The tap wraps :class:`EdgeLink` in a ``ClientService`` (with
:meth:`EdgeLink.retry_delay` as its retry policy), so a lost Edge is dialled
again with exponential backoff and jitter. Every connection says hello;
once accepted the runtime probes its providers and sends ``NodeReady``.
A permanent rejection (unknown node, wrong credential, unsupported version)
is logged once and retried only at the maximum delay.
"""

from __future__ import annotations

import random
from typing import Callable, Optional

import attrs
from twisted.internet.interfaces import IAddress, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

import twisted_iop
from twisted_iop.edge.backoff import backoff_delay
from twisted_iop.node.config import NodeRuntimeConfig
from twisted_iop.node.runtime import NodeRuntime
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, KeepaliveSweeper, WireError


class EdgeLinkProtocol(FramedPeerProtocol):
    """The Node's end of its connection to the Edge."""

    _log = Logger()

    def __init__(self, link: "EdgeLink") -> None:
        super().__init__(link.clock, link.config.edge.peer_settings())
        self._link = link
        self.accepted = False

    def describe_peer(self) -> str:
        return "edge"

    def peer_connected(self) -> None:
        self._link.connection_made(self)
        d = self.request("node_hello_request", self._link.hello())
        d.addCallbacks(self._hello_answered, self._hello_failed)

    def _hello_answered(self, envelope: pb.Envelope) -> None:
        if envelope.WhichOneof("body") != "node_hello_response":
            self.fail_connection(pb.ERROR_CODE_UNEXPECTED_MESSAGE, "expected node_hello_response")
            return
        response = envelope.node_hello_response
        if not response.accepted:
            self._link.rejected(response)
            self.close()
            return
        interval_ms, deadline_ms = response.keepalive_interval_ms, response.keepalive_deadline_ms
        if interval_ms and deadline_ms > interval_ms:
            self._settings = attrs.evolve(
                self._settings,
                keepalive_interval_seconds=interval_ms / 1000.0,
                keepalive_deadline_seconds=deadline_ms / 1000.0,
            )
        self.accepted = True
        self._link.accepted(self)

    def _hello_failed(self, failure: Failure) -> None:
        failure.trap(WireError)
        if not self.closing:
            self._log.warn("edge did not answer hello: {error}", error=failure.getErrorMessage())
            self.close()

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if not self.accepted:
            self.send_error(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} before hello was accepted", envelope.request_id)
            return
        if body == "node_probe_request":
            request_id = envelope.request_id
            d = self._link.runtime.answer_probe_request()
            d.addCallback(lambda response: self.send("node_probe_response", response, request_id))
            d.addErrback(self._probe_crashed, request_id)
        elif envelope.request_id:
            self.send_error(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} is not valid on the node wire", envelope.request_id)
        else:
            self._log.warn("ignoring unexpected {body} from the edge", body=body)

    def _probe_crashed(self, failure: Failure, request_id: int) -> None:
        self._log.failure("answering a probe request failed", failure)
        self.send_error(pb.ERROR_CODE_INTERNAL, "probe failed on the node", request_id)

    def peer_disconnected(self, reason: Failure) -> None:
        self._link.connection_lost(self)

    # -- EdgeSession ----------------------------------------------------------

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeReady`` with the first probe results."""
        self.send("node_ready", pb.NodeReady(providers=reports))

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeHealthReport`` with the providers whose health changed."""
        self.send("node_health_report", pb.NodeHealthReport(providers=reports))


class EdgeLink:
    """State of this Node's link to its Edge (one connection at a time)."""

    _log = Logger()

    def __init__(
        self,
        config: NodeRuntimeConfig,
        runtime: NodeRuntime,
        clock: IReactorTime,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.clock = clock
        self._rand = rand
        self.current: Optional[EdgeLinkProtocol] = None
        self.acceptances = 0
        self.permanent_rejection: Optional[str] = None
        self._logged_rejection: Optional[str] = None
        self._sessions_without_acceptance = 0
        self._sweeper = KeepaliveSweeper(
            clock, config.edge.peer_settings(), lambda: [self.current] if self.current is not None else []
        )

    def factory(self) -> Factory:
        """The protocol factory for the ``ClientService``."""
        return _LinkFactory(self)

    def hello(self) -> pb.NodeHelloRequest:
        """This Node's hello (providers by id, kind and models only)."""
        return pb.NodeHelloRequest(
            node_id=self.config.node_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version=twisted_iop.__version__,
            credential=self.config.credential,
            providers=self.runtime.provider_specs(),
            labels=dict(self.config.labels),
        )

    def retry_delay(self, attempt: int) -> float:
        """The ``ClientService`` retry policy (see the Edge's connector)."""
        backoff = self.config.edge.backoff
        if self.permanent_rejection is not None:
            return backoff.max_seconds
        attempts = max(attempt, self._sessions_without_acceptance)
        return backoff_delay(attempts, backoff.initial_seconds, backoff.max_seconds, self._rand)

    def connection_made(self, protocol: EdgeLinkProtocol) -> None:
        """A TCP connection is up; hello is on its way."""
        self.current = protocol
        self._sweeper.start()
        self._log.info("connected to the edge; saying hello as node {node_id}", node_id=self.config.node_id)

    def accepted(self, protocol: EdgeLinkProtocol) -> None:
        """The Edge accepted hello (pending); probe and report ready."""
        self.acceptances += 1
        self._sessions_without_acceptance = 0
        self.permanent_rejection = None
        self._logged_rejection = None
        self._log.info("edge accepted node {node_id}; probing providers", node_id=self.config.node_id)
        self.runtime.session_accepted(protocol).addErrback(
            lambda f: self._log.failure("first probe round failed", f)
        )

    def rejected(self, response: pb.NodeHelloResponse) -> None:
        """The Edge refused hello."""
        code = response.reason_code or "rejected"
        if response.permanent:
            self.permanent_rejection = f"{code}: {response.reason}"
            if self._logged_rejection != self.permanent_rejection:
                self._logged_rejection = self.permanent_rejection
                self._log.error(
                    "the edge rejected node {node_id} permanently ({code}): {reason}; "
                    "fix the configuration; retrying every {delay:g}s",
                    node_id=self.config.node_id,
                    code=code,
                    reason=response.reason,
                    delay=self.config.edge.backoff.max_seconds,
                )
        else:
            self.permanent_rejection = None
            self._log.warn(
                "the edge rejected node {node_id} for now ({code}): {reason}",
                node_id=self.config.node_id,
                code=code,
                reason=response.reason,
            )

    def connection_lost(self, protocol: EdgeLinkProtocol) -> None:
        """The connection is gone; the ``ClientService`` dials again."""
        if self.current is not protocol:
            return
        self.current = None
        self._sweeper.stop()
        self.runtime.session_lost(protocol)
        if protocol.accepted:
            self._log.info("lost the edge connection; reconnecting")
        elif self.permanent_rejection is None:
            self._sessions_without_acceptance += 1

    def stop(self) -> None:
        """Stop the keepalive timer (service shutdown)."""
        self._sweeper.stop()


class _LinkFactory(Factory):
    # The ClientService restarts the factory on every attempt; keep logs quiet.
    noisy = False

    def __init__(self, link: EdgeLink) -> None:
        self._link = link

    def buildProtocol(self, addr: Optional[IAddress]) -> EdgeLinkProtocol:
        return EdgeLinkProtocol(self._link)
