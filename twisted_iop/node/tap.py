"""``twistd iop-node``: options and service composition of the Node runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Optional, cast

from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IReactorTime

from twisted_iop.daemon import DaemonOptions, DaemonService, compose
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.listeners import ListenerService
from twisted_iop.metrics import metrics_site
from twisted_iop.node.config import NodeRuntimeConfig, load_node_config, unauthenticated_exposures
from twisted_iop.node.deployments.instances import RETIRE_DRAIN_SECONDS, NodeInstances
from twisted_iop.node.edge_link import EdgeLink
from twisted_iop.node.engines.http import InferenceHTTPClient
from twisted_iop.node.engines.probes import HTTPClient, ProviderProber
from twisted_iop.node.inference import InferenceRunner
from twisted_iop.node.launch.readiness import readiness_check
from twisted_iop.node.launch.supervisor import EngineSupervisor
from twisted_iop.node.metrics import node_metric_registry
from twisted_iop.node.runtime import NodeRuntime


class Options(DaemonOptions[NodeRuntimeConfig]):
    """Command line of ``twistd iop-node``."""

    daemon_name = "iop-node"
    sample_config = "configs/node.yaml"
    optParameters: ClassVar[list[list[Any]]] = [
        ["config", "c", None, "Path to node.yaml (see configs/node.yaml)."],
    ]

    def load(self, path: Optional[str], environ: Mapping[str, str]) -> NodeRuntimeConfig:
        """Read node.yaml and the environment."""
        return load_node_config(path, environ)

    def summary(self, config: NodeRuntimeConfig) -> str:
        """Who it is and where it dials."""
        metrics = config.metrics_listen or "nothing (disabled)"
        launched = sum(1 for p in config.providers if p.launch is not None)
        engines = f", engines launched: {launched} (pidfiles in {config.state_directory})" if launched else ""
        if config.engines:
            engines += f", engine profiles: {', '.join(p.name for p in config.engines)}"
        return (
            f"node {config.node_id}, providers: {len(config.providers)}{engines}, edge at {config.edge.address}, "
            f"metrics on {metrics}"
        )


#: What the Node tells its Edge when it stops.
SHUTTING_DOWN_REASON = "the Node is shutting down"


class NodeService(DaemonService):
    """The Node: its runtime (state) first, the engines it launches, its metrics listener (if
    any), then the link to its Edge.

    Services stop in the reverse order, after the graceful stop's drain:
    the link, the listener, then the engines (each its stop signal, SIGKILL
    after its stop timeout), then the runtime.
    """

    daemon_name = "iop-node"

    def __init__(self, config: NodeRuntimeConfig, reactor: Reactor, http: Optional[HTTPClient] = None) -> None:
        super().__init__(reactor, config.shutdown.grace_seconds)
        self.config = config
        clock: IReactorTime = reactor
        prober = ProviderProber(clock, http)
        self.runtime = NodeRuntime(config, clock, prober)
        runtime = self.runtime
        self.inference = runtime.inference = InferenceRunner(
            lambda: runtime.providers, clock, cast(Optional[InferenceHTTPClient], http)
        )
        self.engines = runtime.engines = EngineSupervisor(
            config.providers, config.state_directory, reactor, readiness_check(prober), runtime.running_on
        )
        self.engines.listener = runtime
        if config.engines:
            self.engines.launches_instances = True
            # An instance a desired set no longer names lets its requests in flight finish first.
            self.engines.retire_drain_seconds = RETIRE_DRAIN_SECONDS
            runtime.instances = NodeInstances(
                config, clock, self.engines, runtime.instances_applied, runtime.configured_ids
            )
        self.inference.refusal = self.engines.refusal
        self.add_state(self.runtime)
        self.engines.setServiceParent(self)
        self.link = EdgeLink(config, self.runtime, clock)
        self.metrics_server: Optional[ListenerService] = None
        if config.metrics_listen:
            self.metrics_server = self.add_listener(
                "metrics", config.metrics_listen, metrics_site(node_metric_registry(self), reactor), reactor
            )
        self.edge = self.add_dialer(
            "edge-link", self.link.client_service(clientFromString(reactor, config.edge.address))
        )

    # -- the graceful stop (see twisted_iop.daemon) ------------------------------

    def exposures(self) -> list[str]:
        """Listeners reachable from other machines without authentication."""
        return unauthenticated_exposures(self.config)

    def stop_accepting(self) -> None:
        """New inference requests from the Edge are refused."""
        self.inference.refuse_new(SHUTTING_DOWN_REASON)

    def in_flight(self) -> int:
        """Inference requests still running."""
        return self.inference.running()

    def end_in_flight(self) -> None:
        """What is left ends with an error answer to the Edge (its client sees an error)."""
        self.inference.end_all(SHUTTING_DOWN_REASON)

    def close_connections(self) -> None:
        """Tell the Edge ``SHUTTING_DOWN``; the link closes when its service stops."""
        self.link.say_goodbye(SHUTTING_DOWN_REASON)
        self.link.stop()
        self.inference.close()


def makeService(options: Options, reactor: Optional[Reactor] = None, http: Optional[HTTPClient] = None) -> NodeService:
    """Compose the Node: the runtime first, then the Edge link."""
    return compose(options, reactor, lambda config, reactor: NodeService(config, reactor, http))
