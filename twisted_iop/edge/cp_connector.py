"""The Edge wire, Edge side: enrolling with the Control Plane and serving it.

The Edge dials out (a ``ClientService`` built by the tap with
:meth:`ControlPlaneLink.retry_delay` as its retry policy). On every
connection it sends ``EdgeHelloRequest``; once the Control Plane accepts it
the queued events are flushed in order and from then on events go straight
out, status requests are answered from the status provider and commands are
run by the command runner.

A rejected hello closes the connection. A *permanent* rejection (bad id,
bad credential, unsupported version) is logged once as an error and retried
only at the maximum backoff delay, since retrying sooner cannot help.
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
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.config import ControlPlaneConfig
from twisted_iop.edge.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, KeepaliveSweeper, WireError


class ControlPlaneProtocol(FramedPeerProtocol):
    """The Edge's end of its connection to the Control Plane."""

    _log = Logger()

    def __init__(self, link: "ControlPlaneLink") -> None:
        super().__init__(link.clock, link.config.peer_settings())
        self._link = link
        self.enrolled = False

    def describe_peer(self) -> str:
        return "control plane"

    def peer_connected(self) -> None:
        self._link.connection_made(self)
        hello = self._link.hello()
        d = self.request("edge_hello_request", hello)
        d.addCallbacks(self._hello_answered, self._hello_failed)

    def _hello_answered(self, envelope: pb.Envelope) -> None:
        if envelope.WhichOneof("body") != "edge_hello_response":
            self.fail_connection(pb.ERROR_CODE_UNEXPECTED_MESSAGE, "expected edge_hello_response")
            return
        response = envelope.edge_hello_response
        if not response.accepted:
            self._link.rejected(response)
            self.close()
            return
        interval_ms, deadline_ms = response.keepalive_interval_ms, response.keepalive_deadline_ms
        if interval_ms and deadline_ms > interval_ms:
            # The Control Plane's keepalive wins: both ends then agree on it.
            self._settings = attrs.evolve(
                self._settings,
                keepalive_interval_seconds=interval_ms / 1000.0,
                keepalive_deadline_seconds=deadline_ms / 1000.0,
            )
        self.enrolled = True
        self._link.enrolled(self, response)

    def _hello_failed(self, failure: Failure) -> None:
        failure.trap(WireError)
        if not self.closing:
            self._log.warn("control plane did not answer hello: {error}", error=failure.getErrorMessage())
            self.close()

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if not self.enrolled:
            self.send_error(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} before hello was accepted", envelope.request_id)
            return
        if body == "edge_status_request":
            self.send("edge_status_response", self._link.status.snapshot(), envelope.request_id)
        elif body == "edge_command_request":
            request_id = envelope.request_id
            d = self._link.commands.run(envelope.edge_command_request)
            d.addCallback(lambda response: self.send("edge_command_response", response, request_id))
            d.addErrback(self._command_crashed, request_id)
        elif envelope.request_id:
            self.send_error(pb.ERROR_CODE_UNEXPECTED_MESSAGE, f"{body} is not valid on the edge wire", envelope.request_id)
        else:
            self._log.warn("ignoring unexpected {body} from the control plane", body=body)

    def _command_crashed(self, failure: Failure, request_id: int) -> None:
        self._log.failure("command handling crashed", failure)
        self.send_error(pb.ERROR_CODE_INTERNAL, "internal error running the command", request_id)

    def peer_disconnected(self, reason: Failure) -> None:
        self._link.connection_lost(self)


class ControlPlaneLink:
    """State of this Edge's link to the Control Plane (one connection at a time)."""

    _log = Logger()

    def __init__(
        self,
        config: ControlPlaneConfig,
        registry: NodeRegistry,
        status: StatusProvider,
        commands: CommandRunner,
        clock: IReactorTime,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.registry = registry
        self.status = status
        self.commands = commands
        self.clock = clock
        self._rand = rand
        self.current: Optional[ControlPlaneProtocol] = None
        self.enrollments = 0
        self.permanent_rejection: Optional[str] = None
        self._logged_rejection: Optional[str] = None
        self._sessions_without_enrollment = 0
        self.enrolled_since = 0.0
        self._sweeper = KeepaliveSweeper(
            clock, config.peer_settings(), lambda: [self.current] if self.current is not None else []
        )
        commands.add_diagnostics(self.diagnostics)

    def factory(self) -> Factory:
        """The protocol factory for the ``ClientService``."""
        return _LinkFactory(self)

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

    def retry_delay(self, attempt: int) -> float:
        """The ``ClientService`` retry policy.

        Counts connections that ended without enrollment too (the
        ``ClientService`` resets its own count on every TCP connect).
        """
        backoff = self.config.backoff
        if self.permanent_rejection is not None:
            return backoff.max_seconds
        attempts = max(attempt, self._sessions_without_enrollment)
        return backoff_delay(attempts, backoff.initial_seconds, backoff.max_seconds, self._rand)

    # -- protocol callbacks ---------------------------------------------------

    def connection_made(self, protocol: ControlPlaneProtocol) -> None:
        """A TCP connection is up; hello is on its way."""
        self.current = protocol
        self._sweeper.start()
        self._log.info("connected to the control plane; enrolling as edge {edge_id}", edge_id=self.config.edge_id)

    def enrolled(self, protocol: ControlPlaneProtocol, response: pb.EdgeHelloResponse) -> None:
        """The Control Plane accepted hello: flush the outbox, go live."""
        self.enrollments += 1
        self._sessions_without_enrollment = 0
        self.permanent_rejection = None
        self._logged_rejection = None
        self.enrolled_since = self.registry.now()
        flushed = self.registry.relay.attach(lambda event: protocol.send("edge_event", event))
        self._log.info(
            "enrolled with the control plane as edge {edge_id} (server {server_version}, {flushed} queued events sent)",
            edge_id=self.config.edge_id,
            server_version=response.server_version or "unknown",
            flushed=flushed,
        )

    def rejected(self, response: pb.EdgeHelloResponse) -> None:
        """The Control Plane refused hello."""
        code = response.reason_code or "rejected"
        if response.permanent:
            self.permanent_rejection = f"{code}: {response.reason}"
            if self._logged_rejection != self.permanent_rejection:
                self._logged_rejection = self.permanent_rejection
                self._log.error(
                    "the control plane rejected edge {edge_id} permanently ({code}): {reason}; "
                    "fix the configuration; retrying every {delay:g}s",
                    edge_id=self.config.edge_id,
                    code=code,
                    reason=response.reason,
                    delay=self.config.backoff.max_seconds,
                )
        else:
            self.permanent_rejection = None
            self._log.warn(
                "the control plane rejected edge {edge_id} for now ({code}): {reason}",
                edge_id=self.config.edge_id,
                code=code,
                reason=response.reason,
            )

    def connection_lost(self, protocol: ControlPlaneProtocol) -> None:
        """The connection is gone: queue events until the next enrollment."""
        if self.current is not protocol:
            return
        self.current = None
        self._sweeper.stop()
        if protocol.enrolled:
            self.registry.relay.detach()
            self._log.info("lost the control plane connection; queueing events until it is back")
        elif self.permanent_rejection is None:
            self._sessions_without_enrollment += 1

    def stop(self) -> None:
        """Stop the keepalive timer (service shutdown)."""
        self._sweeper.stop()

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


class _LinkFactory(Factory):
    # The ClientService restarts the factory on every attempt; keep logs quiet.
    noisy = False

    def __init__(self, link: ControlPlaneLink) -> None:
        self._link = link

    def buildProtocol(self, addr: Optional[IAddress]) -> ControlPlaneProtocol:
        return ControlPlaneProtocol(self._link)
