"""``twistd iop-control-plane``: Options and makeService."""

from __future__ import annotations

import gc
import os
from typing import Any, Optional

from twisted.python import usage

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.client_wire import ClientWireFactory
from twisted_iop.controlplane.config import ControlPlaneConfig, load_config, unauthenticated_exposures
from twisted_iop.controlplane.edge_wire import EdgeWireFactory
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.http_routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.metrics import control_plane_registry
from twisted_iop.controlplane.registry import EdgeRegistry
from twisted_iop.http_site import GuardedSite
from twisted_iop.listeners import DaemonService, ListenerService, listen_problem


class Options(usage.Options):
    """Command line of ``twistd iop-control-plane``."""

    optParameters = [
        ["config", "c", None, "Path to control-plane.yaml (default: embedded defaults)."],
    ]

    def postOptions(self) -> None:
        try:
            config = load_config(self["config"], os.environ)
        except ConfigError as e:
            raise usage.UsageError(f"bad configuration: {e}") from None
        from twisted.internet import reactor

        for field, description in (
            ("http.listen", config.http_listen),
            ("client_wire.listen", config.wire_listen),
            ("edge_wire.listen", config.edge_wire_listen),
        ):
            problem = listen_problem(reactor, description)
            if problem is not None:
                raise usage.UsageError(f"bad configuration: {field}: {problem}")
        self["parsed_config"] = config


#: Young-generation threshold of the garbage collector in the daemon. A
#: fleet fan-out creates tens of thousands of short-lived objects per round;
#: with the default (700) they trigger several full collections per round.
GC_THRESHOLD = (50_000, 20, 100)


def tune_garbage_collector() -> None:
    """Freeze start-up objects and raise the young-generation threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class ControlPlaneService(DaemonService):
    """The whole Control Plane; its parts are reachable for tests and tools."""

    daemon_name = "iop-control-plane"

    def __init__(self, config: ControlPlaneConfig, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self.registry = EdgeRegistry(reactor, config.registry)
        self.registry.setServiceParent(self)
        self.gateway = EdgeGateway(self.registry, reactor, config.status_timeout_seconds)
        self.listeners: list[ListenerService] = []
        self.readiness = ListenerReadiness(self.listeners)
        self.http = ControlPlaneHttp(
            self.registry, self.gateway, reactor, self.readiness, config.http, metrics=control_plane_registry(self)
        )
        site = self.http_site = GuardedSite(
            self.http.app.resource(), config.http_site, self.http.check_headers, reactor
        )
        self.edge_factory = EdgeWireFactory(
            self.registry,
            reactor,
            config.edge_wire,
            config.credentials,
            require_certificate=config.edge_wire_tls is not None,
            failed_hellos=config.edge_wire_failed_hellos,
            max_hellos_per_second=config.max_hellos_per_second,
        )
        self.edge_factory.noisy = False
        self.client_factory = ClientWireFactory(self.registry, config.client_wire)
        self.client_factory.noisy = False
        self.listeners += [
            ListenerService("edge_wire", config.edge_wire_listen, self.edge_factory, reactor, config.edge_wire_tls),
            ListenerService("client_wire", config.wire_listen, self.client_factory, reactor),
            ListenerService("http", config.http_listen, site, reactor),
        ]
        for listener in self.listeners:
            listener.setServiceParent(self)

    #: Set by makeService: tune the garbage collector for a long-lived daemon.
    tune_gc = False

    def startService(self) -> None:
        if self.tune_gc:
            tune_garbage_collector()
        for exposure in unauthenticated_exposures(self.config):
            self._log.warn("SECURITY WARNING: {exposure}", exposure=exposure)
        super().startService()

    def stopService(self) -> Any:
        """Stop listening, then close every Edge and client connection."""
        d = super().stopService()
        self.edge_factory.close_all("the Control Plane is shutting down")
        self.client_factory.close_all()
        return d

    def port(self, label: str) -> int:
        """The TCP port listener ``label`` was bound to (kept after a stop)."""
        for listener in self.listeners:
            if listener.label == label and listener.port_number:
                return listener.port_number
        raise KeyError(f"listener {label!r} has not been bound")


def makeService(options: Options, reactor: Optional[Any] = None) -> ControlPlaneService:
    """Compose the Control Plane from parsed options."""
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    config = options.get("parsed_config") or load_config(options["config"], os.environ)
    service = ControlPlaneService(config, reactor)
    service.exit_on_bind_failure = True
    service.tune_gc = True
    return service
