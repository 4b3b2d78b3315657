"""``twistd iop-edge``: options and service composition of the Edge agent."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Optional, cast

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IProtocolFactory, IReactorTime

from twisted_iop.configuration import ConfigError
from twisted_iop.daemon import CLOSE_WAIT_SECONDS, DaemonOptions, DaemonService, compose, wait_until
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.config import EdgeConfig, load_edge_config, unauthenticated_exposures
from twisted_iop.edge.control_plane_link import ControlPlaneLink
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.inference.api import InferenceAPI, inference_site
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.metrics import edge_metric_registry
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.nodes.wire import NodeServerFactory
from twisted_iop.edge.status import StatusProvider
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.listeners import ListenerService
from twisted_iop.metrics import metrics_site
from twisted_iop.tracing.export import TraceExport, missing_sdk
from twisted_iop.tracing.spans import EdgeTracer


class Options(DaemonOptions[EdgeConfig]):
    """Command line of ``twistd iop-edge``."""

    daemon_name = "iop-edge"
    sample_config = "configs/edge.yaml"
    optParameters: ClassVar[list[list[Any]]] = [
        ["config", "c", None, "Path to edge.yaml (see configs/edge.yaml)."],
    ]

    def load(self, path: Optional[str], environ: Mapping[str, str]) -> EdgeConfig:
        """Read edge.yaml and the environment."""
        return load_edge_config(path, environ)

    def summary(self, config: EdgeConfig) -> str:
        """Who it is, where it listens and dials."""
        traces = f", traces to {config.tracing.otlp_endpoint}" if config.tracing.otlp_endpoint else ""
        return (
            f"edge {config.control_plane.edge_id}, nodes: {len(config.nodes)}, "
            f"node_server on {config.node_server.listen}, inference on {config.inference.listen}, "
            f"metrics on {config.metrics_listen or 'nothing (disabled)'}, "
            f"control plane at {', '.join(config.control_plane.addresses)}{traces}"
        )

    def check(self, config: EdgeConfig) -> str:
        """With ``tracing.otlp_endpoint`` set, the ``[tracing]`` extra must be installed."""
        if config.tracing.otlp_endpoint:
            problem = missing_sdk()
            if problem is not None:
                raise ConfigError(problem)
        return ""


#: What the Edge tells its Nodes and the Control Plane when it stops.
SHUTTING_DOWN_REASON = "the Edge is shutting down"


class EdgeService(DaemonService):
    """The Edge: node registry first, then the Node listener, then the Control Plane link."""

    daemon_name = "iop-edge"

    def __init__(self, config: EdgeConfig, reactor: Reactor, rand: Callable[[], float] = random.random) -> None:
        super().__init__(reactor, config.shutdown.grace_seconds)
        self.config = config
        clock: IReactorTime = reactor
        self.registry = NodeRegistry(config, clock)
        self.add_state(self.registry)
        # The trace export (tracing.otlp_endpoint): started before the listeners, stopped after them.
        self.trace_export: Optional[TraceExport] = None
        if config.tracing.otlp_endpoint:
            self.trace_export = TraceExport(config.tracing, reactor)
            self.trace_export.setServiceParent(self)
        tracer = EdgeTracer(config.tracing.sample_ratio, self.trace_export)
        self.deployments = EdgeDeployments(
            self.registry, clock, config.deployments.hold, config.deployments.node_timeout_seconds
        )
        self.status = StatusProvider(self.registry, clock, self.deployments)
        self.commands = CommandRunner(
            self.registry, clock, probe_timeout_seconds=config.node_server.probe_timeout_seconds
        )
        self.commands.deployments = self.deployments
        self.commands.add_diagnostics(self.deployments.diagnostics)
        # rand shuffles the Control Plane addresses (once) and jitters the backoff.
        self.link = ControlPlaneLink(config.control_plane, self.registry, self.status, self.commands, clock, rand)
        self.link.deployments = self.deployments
        self.node_factory = NodeServerFactory(
            self.registry,
            clock,
            config.node_server.peer_settings(),
            require_certificate=config.node_server.tls is not None,
            failed_hellos=config.node_server.failed_hellos,
        )
        self.node_factory.deployments = self.deployments
        self.node_server = self.add_listener(
            "node_server",
            config.node_server.listen,
            cast(IProtocolFactory, self.node_factory),
            reactor,
            config.node_server.tls,
        )
        # The inference gateway: its own listener; Node messages reach it through the node server.
        self.inference = self.node_factory.inference = InferenceGateway(self.registry, config.inference, clock, tracer)
        site = self.inference_site = inference_site(InferenceAPI(self.inference), config.inference, reactor)
        self.inference_server = self.add_listener("inference", config.inference.listen, site, reactor)
        self.metrics_server: Optional[ListenerService] = None
        if config.metrics_listen:
            self.metrics_server = self.add_listener(
                "metrics", config.metrics_listen, metrics_site(edge_metric_registry(self), reactor), reactor
            )
        self.control_plane = self.add_dialer(
            "control-plane",
            self.link.client_service_for(
                config.control_plane.addresses, lambda address: clientFromString(reactor, address)
            ),
        )

    def exposures(self) -> list[str]:
        """Listeners reachable from other machines without authentication."""
        return unauthenticated_exposures(self.config)

    @property
    def node_port(self) -> int:
        """The Node listener's TCP port (0 until bound)."""
        return self.node_server.port_number

    def node_listening_port(self) -> Deferred[int]:
        """Fires with the Node listener's TCP port once it is bound."""
        return self.node_server.bound()

    @property
    def inference_port(self) -> int:
        """The inference API's TCP port (0 until bound)."""
        return self.inference_server.port_number

    # -- the graceful stop (see twisted_iop.daemon) ------------------------------

    def stop_accepting(self) -> None:
        """New inference requests get 503 ``shutting_down`` (the listeners close next)."""
        self.inference.stopping = True

    def in_flight(self) -> int:
        """Inference requests admitted and not ended, and commands still running."""
        return self.inference.running() + self.commands.running

    def end_in_flight(self) -> None:
        """What is left ends with a 503 (or an error event mid-stream) to its client."""
        self.inference.stop()

    def close_connections(self) -> Deferred[Any]:
        """Close the Nodes with ``SHUTTING_DOWN``, then say it to the Control Plane.

        The Nodes' ``node.disconnected`` events go to the Control Plane
        before the goodbye, on the link that is still open.
        """
        self.node_factory.close_all(SHUTTING_DOWN_REASON)
        closed = wait_until(self.clock, lambda: not self.node_factory.connections, CLOSE_WAIT_SECONDS)

        def goodbye(_: bool) -> None:
            self.link.say_goodbye(SHUTTING_DOWN_REASON)
            self.link.stop()
            # Every inference answer is written by now: close after sending it.
            self.inference_site.close_all()

        return closed.addCallback(goodbye)


def makeService(options: Options, reactor: Optional[Reactor] = None) -> EdgeService:
    """Compose the Edge: registry first, then the Node listener, then the Control Plane link."""
    return compose(options, reactor, EdgeService)
