"""``twistd iop-control-plane``: Options and makeService."""

from __future__ import annotations

import gc
import os
from typing import Any, Optional

from twisted.application.internet import StreamServerEndpointService
from twisted.application.service import IService, MultiService
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory
from twisted.logger import Logger
from twisted.python import usage
from twisted.web.server import Site

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.client_wire import ClientWireFactory
from twisted_iop.controlplane.config import ControlPlaneConfig, load_config
from twisted_iop.controlplane.edge_server import EdgeWireFactory
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.http_views import ControlPlaneHttp, Readiness
from twisted_iop.controlplane.registry import EdgeRegistry


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


class BindError(RuntimeError):
    """A listener could not bind its address."""


#: Listen backlog used when a TCP endpoint does not name one. Twisted's
#: default (50) drops SYNs when thousands of Edges reconnect at once after a
#: restart, and each dropped SYN costs the Edge a one-second retry.
DEFAULT_BACKLOG = 1024

#: Young-generation threshold of the garbage collector in the daemon. A
#: fleet fan-out creates tens of thousands of short-lived objects per round;
#: with the default (700) they trigger several full collections per round.
GC_THRESHOLD = (50_000, 20, 100)


def with_backlog(description: str) -> str:
    """Add ``backlog=DEFAULT_BACKLOG`` to a TCP/SSL endpoint that has none."""
    kind = description.split(":", 1)[0]
    if kind in ("tcp", "tcp6", "ssl") and "backlog=" not in description:
        return f"{description}:backlog={DEFAULT_BACKLOG}"
    return description


def listen_problem(reactor: Any, description: str) -> Optional[str]:
    """Why Twisted cannot build a server endpoint from ``description``, or None.

    Building the endpoint binds nothing, but it parses every parameter and,
    for ``ssl:``, loads the key and certificate, so a typo or a missing file
    is reported before start-up instead of as a traceback.
    """
    try:
        serverFromString(reactor, with_backlog(description))
    except Exception as e:  # Twisted raises ValueError, KeyError, OSError, SSL errors ...
        return f"cannot use {description!r}: {e}"
    return None


def tune_garbage_collector() -> None:
    """Freeze start-up objects and raise the young-generation threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


class ListenerService(StreamServerEndpointService):
    """A listener that fails start-up if it cannot bind and reports its port."""

    _log = Logger()

    def __init__(self, label: str, description: str, factory: IProtocolFactory, reactor: Any, readiness: Readiness) -> None:
        super().__init__(serverFromString(reactor, with_backlog(description)), factory)
        self.setName(label)
        self._label = label
        self._description = description
        self._readiness = readiness
        self._raiseSynchronously = True
        readiness.expect(label)

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except Exception as e:
            raise BindError(f"cannot listen for {self._label} on {self._description}: {e}") from None
        if self._waitingForPort is not None:
            self._waitingForPort.addCallback(self._bound)

    def _bound(self, port: IListeningPort) -> IListeningPort:
        host = port.getHost()
        number = getattr(host, "port", 0)
        self._readiness.bound(self._label, number)
        self._log.info("{label} listening on {description} (port {port})", label=self._label, description=self._description, port=number)
        return port

    def stopService(self) -> Any:
        self._readiness.unbound(self._label)
        return super().stopService()


class ControlPlaneService(MultiService):
    """The whole Control Plane; its parts are reachable for tests and tools."""

    _log = Logger()

    def __init__(self, config: ControlPlaneConfig, reactor: Any) -> None:
        super().__init__()
        self.config = config
        self.readiness = Readiness()
        self.registry = EdgeRegistry(reactor, config.registry)
        self.registry.setServiceParent(self)
        self.gateway = EdgeGateway(self.registry, reactor, config.status_timeout_seconds)
        self.http = ControlPlaneHttp(self.registry, self.gateway, reactor, self.readiness, config.http)
        site = Site(self.http.app.resource())
        site.displayTracebacks = False
        site.noisy = False
        self.edge_factory = EdgeWireFactory(self.registry, reactor, config.edge_wire, config.credentials)
        self.edge_factory.noisy = False
        self.client_factory = ClientWireFactory(self.registry, config.client_wire)
        self.client_factory.noisy = False
        listeners: list[IService] = [
            ListenerService("edge_wire", config.edge_wire_listen, self.edge_factory, reactor, self.readiness),
            ListenerService("client_wire", config.wire_listen, self.client_factory, reactor, self.readiness),
            ListenerService("http", config.http_listen, site, reactor, self.readiness),
        ]
        for listener in listeners:
            listener.setServiceParent(self)

    #: Set by makeService: under twistd a bind failure ends the process
    #: with one clear line and exit code 1 instead of a traceback.
    exit_on_bind_failure = False
    #: Set by makeService: tune the garbage collector for a long-lived daemon.
    tune_gc = False

    def startService(self) -> None:
        if self.tune_gc:
            tune_garbage_collector()
        super().startService()

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except BindError as e:
            if not self.exit_on_bind_failure:
                raise
            self._log.error("start-up failed: {error}", error=str(e))
            raise SystemExit(f"iop-control-plane: {e}") from None

    def stopService(self) -> Any:
        """Stop listening, then close every Edge and client connection."""
        d = super().stopService()
        self.edge_factory.close_all("the Control Plane is shutting down")
        self.client_factory.close_all()
        return d

    def port(self, label: str) -> int:
        """The bound TCP port of listener ``label`` (after start-up)."""
        return self.readiness.ports[label]


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
