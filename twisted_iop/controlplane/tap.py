"""``twistd iop-control-plane``: Options and makeService."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any, ClassVar, Optional

from autobahn.twisted.resource import WebSocketResource
from twisted.internet.defer import Deferred
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.cluster.replica import ClusterReplica
from twisted_iop.controlplane.cluster.rollout_store import ClusterRollouts
from twisted_iop.controlplane.config import ControlPlaneConfig, load_config, unauthenticated_exposures
from twisted_iop.controlplane.deployments.service import DeploymentService
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.metrics import control_plane_metric_registry
from twisted_iop.controlplane.requests.errors import SHUTTING_DOWN_REASON
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.restore import restore
from twisted_iop.controlplane.rollouts.service import RolloutService
from twisted_iop.controlplane.slo.service import SloService
from twisted_iop.controlplane.store.backends import describe_store, make_store
from twisted_iop.controlplane.store.interface import StoreError
from twisted_iop.controlplane.wires.client_wire import ClientWireFactory
from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory
from twisted_iop.daemon import CLOSE_WAIT_SECONDS, DaemonOptions, DaemonService, compose, wait_until
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.web.http_site import GuardedSite


class Options(DaemonOptions[ControlPlaneConfig]):
    """Command line of ``twistd iop-control-plane``."""

    daemon_name = "iop-control-plane"
    optParameters: ClassVar[list[list[Any]]] = [
        ["config", "c", None, "Path to control-plane.yaml (default: embedded defaults)."],
    ]

    def load(self, path: Optional[str], environ: Mapping[str, str]) -> ControlPlaneConfig:
        """Read control-plane.yaml (or the embedded defaults) and the environment."""
        return load_config(path, environ)

    def summary(self, config: ControlPlaneConfig) -> str:
        """Where it listens."""
        where = (
            f"http on {config.http_listen}, client_wire on {config.wire_listen}, edge_wire on {config.edge_wire_listen}"
        )
        if config.cluster.enabled:
            where += f"; cluster replica {config.cluster.replica_id} on {config.cluster.redis}"
        return where

    def notices(self, config: ControlPlaneConfig) -> tuple[str, ...]:
        """Deprecated spellings found in the file."""
        return config.notices

    def check(self, config: ControlPlaneConfig) -> str:
        """The store's file: writable, not a directory, a version this release reads."""
        try:
            return describe_store(config.store)
        except StoreError as e:
            raise ConfigError(str(e)) from None


class HttpRoot(Resource):
    """The HTTP site: the client WebSocket at ``/client``, the Klein app for the rest.

    With ``/client`` on the HTTP port, one port (behind one reverse proxy)
    serves the views, the console and the live events.

    It is a leaf: the site hands it every request with the whole path
    still to route, and it renders the request with the resource the path
    names, which sees the request as the site's own root would (the Klein
    app routes on the whole path). No traversal step per request.
    """

    isLeaf = True

    def __init__(self, app: IResource, client: IResource) -> None:
        super().__init__()
        self._app = app
        self._client = client

    def render(self, request: Request) -> Any:
        if request.postpath == [b"client"]:
            channel: Any = request.channel  # the GuardedSite's GuardedChannel
            # The socket outlives the HTTP request: no HTTP idle timeout on it.
            channel.setTimeout(None)
            # The WebSocket takes the socket over; the site still counts it
            # until it closes.
            channel.prepare_takeover()
            return self._client.render(request)
        return self._app.render(request)


class ControlPlaneService(DaemonService):
    """The whole Control Plane; its parts are reachable for tests and tools."""

    daemon_name = "iop-control-plane"
    #: Whether the store was opened (and what it kept restored).
    store_opened = False

    def __init__(self, config: ControlPlaneConfig, reactor: Reactor) -> None:
        super().__init__(reactor, config.shutdown.grace_seconds)
        self.config = config
        #: What outlives the process (first: it starts first and stops last,
        #: after everything it is told has been recorded).
        self.store = make_store(config.store, reactor, config.cluster)
        self.add_state(self.store)
        self.registry = EdgeRegistry(reactor, config.registry)
        self.registry.store = self.store
        self.add_state(self.registry)
        self.gateway = EdgeGateway(self.registry, reactor, config.status_timeout_seconds, config.fleet_max_age_seconds)
        #: Cluster mode: this replica's link to the shared fleet (None: memory).
        self.cluster: Optional[ClusterReplica] = None
        if config.cluster.enabled:
            self.cluster = ClusterReplica(config.cluster, self.registry, self.gateway, reactor)
            self.add_state(self.cluster)
            self.store.attach(self.cluster.link)
        #: Capacity history: sampled every interval, kept in tiers in the store.
        self.history = HistoryService(config.history, self.registry, self.gateway, self.store, reactor)
        self.add_state(self.history)
        self.readiness = ListenerReadiness(self.listeners)
        rollout_link = None if self.cluster is None else ClusterRollouts.of(self.cluster, config.rollouts.max_kept)
        self.rollouts = RolloutService(
            self.registry,
            self.gateway,
            reactor,
            config.rollouts,
            cluster=rollout_link,
            replica=self.cluster,
            store=self.store,
        )
        #: SLOs: evaluated every interval from the edges' snapshots, kept in the store.
        self.slos = SloService(
            config.slos, self.registry, self.gateway, self.store, self.rollouts.event_buffer, reactor
        )
        self.add_state(self.slos)
        #: Deployments: kept in the store, sent to the edges they select.
        self.deployments = DeploymentService(
            self.registry, self.gateway, self.store, self.rollouts.event_buffer, reactor
        )
        self.add_state(self.deployments)
        self.http = ControlPlaneHttp(
            self.registry,
            self.gateway,
            reactor,
            self.readiness,
            config.http,
            metrics=control_plane_metric_registry(self),
            cluster=self.cluster,
            rollouts=self.rollouts,
            store=self.store,
            history=self.history,
            slos=self.slos,
            deployments=self.deployments,
        )
        self.edge_factory = EdgeWireFactory(
            self.registry,
            reactor,
            config.edge_wire,
            config.credentials,
            require_certificate=config.edge_wire_tls is not None,
            failed_hellos=config.edge_wire_failed_hellos,
            hello_admission=config.hello_admission,
        )
        if self.cluster is not None:
            self.edge_factory.cluster = self.cluster
        self.client_factory = ClientWireFactory(self.registry, config.client_wire, reactor)
        root = HttpRoot(self.http.app.resource(), WebSocketResource(self.client_factory))
        site = self.http_site = GuardedSite(
            root,
            config.http_site,
            self.http.check_headers,
            reactor,
            access_log=config.http_access_log,
            allowed_methods=self.http.allow_header,
        )
        self.add_listener("edge_wire", config.edge_wire_listen, self.edge_factory, reactor, config.edge_wire_tls)
        self.add_listener("client_wire", config.wire_listen, self.client_factory, reactor)
        self.add_listener("http", config.http_listen, site, reactor)

    def exposures(self) -> list[str]:
        """Listeners reachable from other machines without authentication."""
        return unauthenticated_exposures(self.config)

    def privilegedStartService(self) -> None:
        """Read back what the store kept (before anything listens), then bind."""
        self.open_store()
        super().privilegedStartService()

    def open_store(self) -> None:
        """Open the store and put back what it kept (once); a store that
        cannot be opened ends start-up with one line under twistd."""
        if self.store_opened:
            return
        self.store_opened = True
        # Reading back a full store makes a million objects that all live on:
        # collecting while they are made walks them again and again (it took
        # as long as reading them). One collection follows, in startService.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._open_store()
        finally:
            if collecting:
                gc.enable()

    def _open_store(self) -> None:
        try:
            kept = self.store.open()
        except StoreError as e:
            if not self.exit_on_bind_failure:
                raise
            self._log.error("start-up failed: {error}", error=str(e))
            raise SystemExit(f"{self.daemon_name}: {e}") from None
        if kept.slos is not None:
            self.slos.restore_kept(dict(kept.slos))
        if kept.deployments is not None:
            self.deployments.restore_kept(dict(kept.deployments))
        if not kept.empty:
            restored = restore(kept, self.registry, self.gateway, self.rollouts)
            self._log.info(
                "restored from the store: {edges} edges (disconnected until they dial in), {events} events, "
                "{operations} operations ({operations_ended} ended: in flight at the restart), {rollouts} rollouts",
                **restored,
            )

    def startService(self) -> None:
        self.open_store()
        super().startService()
        self.rollouts.start()

    # -- the graceful stop (see twisted_iop.daemon) ------------------------------

    def stop_accepting(self) -> None:
        """``/readyz`` says 503 from now; new requests and commands are refused."""
        self.readiness.stopping = True
        self.http_site.stop_accepting()
        self.gateway.refuse_new()
        self.rollouts.shut_down()

    def in_flight(self) -> int:
        """HTTP callers waiting on the gateway (commands, status, fleet rounds)."""
        return self.gateway.waiting_callers()

    def end_in_flight(self) -> None:
        """Pending commands end ``failed``; every waiting caller gets 503 ``shutting_down``."""
        self.gateway.shut_down()

    def close_connections(self) -> Deferred[bool]:
        """Tell every Edge ``SHUTTING_DOWN``, close the clients, then the HTTP connections."""
        self.edge_factory.close_all(SHUTTING_DOWN_REASON)
        self.client_factory.close_all()
        self.http_site.close_all()
        return wait_until(
            self.clock, lambda: not self.edge_factory.connections and not self.http_site.connections, CLOSE_WAIT_SECONDS
        )


def makeService(options: Options, reactor: Optional[Reactor] = None) -> ControlPlaneService:
    """Compose the Control Plane: registry first, then its three listeners."""
    return compose(options, reactor, ControlPlaneService)
