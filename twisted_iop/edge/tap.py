"""``twistd iop-edge``: options and service composition of the Edge agent."""

from __future__ import annotations

import os
from typing import Any, cast

from twisted.application.internet import ClientService
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import clientFromString
from twisted.internet.interfaces import IProtocolFactory
from twisted.python import usage

from twisted_iop.configuration import ConfigError
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.config import EdgeConfig, load_edge_config
from twisted_iop.edge.control_plane_link import ControlPlaneLink
from twisted_iop.edge.node_wire import NodeServerFactory
from twisted_iop.edge.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.listeners import DaemonService, ListenerService, listen_problem


class Options(usage.Options):
    """Command line of ``twistd iop-edge``."""

    optParameters = [
        ["config", "c", None, "Path to edge.yaml (see configs/edge.yaml)."],
    ]

    def postOptions(self) -> None:
        """Parse edge.yaml now so a bad config is a usage error, not a traceback."""
        if not self["config"]:
            raise usage.UsageError("--config PATH is required (see configs/edge.yaml)")
        try:
            config = load_edge_config(self["config"], os.environ)
        except ConfigError as e:
            raise usage.UsageError(f"bad edge config: {e}") from None
        from twisted.internet import reactor

        problem = listen_problem(reactor, config.node_server.listen)
        if problem is not None:
            raise usage.UsageError(f"bad edge config: node_server.listen: {problem}")
        self["edge_config"] = config


class EdgeService(DaemonService):
    """The Edge's services, with handles on the parts tests and tools need."""

    daemon_name = "iop-edge"

    def __init__(
        self,
        config: EdgeConfig,
        registry: NodeRegistry,
        status: StatusProvider,
        commands: CommandRunner,
        link: ControlPlaneLink,
        node_server: ListenerService,
        node_factory: NodeServerFactory,
        control_plane: ClientService,
    ) -> None:
        super().__init__()
        self.config = config
        self.registry = registry
        self.status = status
        self.commands = commands
        self.link = link
        self.node_server = node_server
        self.node_factory = node_factory
        self.control_plane = control_plane

    @property
    def node_port(self) -> int:
        """The Node listener's TCP port (0 until bound)."""
        return self.node_server.port_number

    def node_listening_port(self) -> Deferred[int]:
        """Fires with the Node listener's TCP port once it is bound."""
        return self.node_server.bound()

    def stopService(self) -> Deferred[None] | None:
        """Stop listening and dialing, then close every Node connection."""
        self.link.stop()
        d = cast("Deferred[None] | None", super().stopService())
        self.node_factory.close_all("the Edge is shutting down")
        return d


def makeService(options: Any, reactor: Any = None) -> EdgeService:
    """Compose the Edge: registry first, then the Node listener, then the CP link."""
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    config: EdgeConfig = options["edge_config"] if "edge_config" in options else load_edge_config(options["config"])
    clock: Any = reactor
    registry = NodeRegistry(config, clock)
    status = StatusProvider(registry, clock)
    commands = CommandRunner(registry, clock, probe_timeout_seconds=config.node_server.probe_timeout_seconds)
    link = ControlPlaneLink(config.control_plane, registry, status, commands, clock)

    node_factory = NodeServerFactory(
        registry,
        clock,
        config.node_server.peer_settings(),
        require_certificate=config.node_server.tls is not None,
        failed_hellos=config.node_server.failed_hellos,
    )
    node_server = ListenerService(
        "node_server", config.node_server.listen, cast(IProtocolFactory, node_factory), reactor, config.node_server.tls
    )

    endpoint = clientFromString(reactor, config.control_plane.address)
    control_plane = ClientService(
        endpoint, cast(IProtocolFactory, link.factory()), retryPolicy=link.retry_delay, clock=clock
    )
    control_plane.setName("control-plane")

    service = EdgeService(config, registry, status, commands, link, node_server, node_factory, control_plane)
    service.exit_on_bind_failure = True
    registry.setServiceParent(service)
    node_server.setServiceParent(service)
    control_plane.setServiceParent(service)
    return service
