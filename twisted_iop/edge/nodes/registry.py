"""The Edge's Nodes: configured Nodes, their connections, drain state and providers (no I/O).

The registry owns which connection owns each Node (dispatch-ready
ownership, checked against its connection token by
:class:`~twisted_iop.edge.nodes.ownership.NodeOwnership`: only the current
owner's transitions become events and snapshot changes), drain, and the
providers each Node has (edge.yaml's and the deployments'). What decides
whether one provider takes work (health, holds, engine load, cool-downs)
is :class:`~twisted_iop.edge.providers.states.ProviderStates`
(``registry.providers``), fed with the owner's reports from here; the
:class:`~twisted_iop.edge.providers.pool.ProviderPool` holds only leases
and queues and asks the registry (its
:class:`~twisted_iop.edge.providers.pool.Availability`) when it places
work.

Node connections reach this service through the small :class:`NodePeer`
interface (close, probe), so the TCP protocol and test fakes are
interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional, Protocol, cast

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.edge.config import EdgeConfig, NodeConfig, ProviderConfig
from twisted_iop.edge.events import EventRelay
from twisted_iop.edge.inference.latency import LatencyRecorder
from twisted_iop.edge.inference.tokens import TokenCounter
from twisted_iop.edge.nodes.ownership import NodeOwnership, Transition, TransitionKind
from twisted_iop.edge.providers.load import EngineReading
from twisted_iop.edge.providers.pool import ProviderPool
from twisted_iop.edge.providers.states import ProviderStates
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import Rejection, check_node_hello


class NodePeer(Protocol):
    """What the registry needs from one Node connection."""

    def close(self) -> None:
        """Close the connection (its close comes back as ``node_closed``)."""

    def supersede(self) -> None:
        """Close the connection, telling the Node a newer one took over."""

    def probe(self, timeout: float) -> Deferred[pb.NodeProbeResponse]:
        """Ask the Node to re-read its providers and probe them now."""

    def provider_command(
        self, request: pb.NodeProviderCommandRequest, timeout: float
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Ask the Node to act on one provider's launched engine."""

    def instances(self, request: pb.NodeInstancesRequest, timeout: float) -> Deferred[pb.NodeInstancesResponse]:
        """Send the Node its whole desired set of instances; fire with its answer."""


class NodeListener(Protocol):
    """Who hears of Nodes saying hello and becoming ready (the Edge's deployments)."""

    def node_hello(self, node_id: str, hello: pb.NodeHelloRequest) -> None:
        """``node_id`` said hello on a connection that was accepted (pending)."""

    def node_became_ready(self, node_id: str) -> None:
        """``node_id`` has a dispatch-ready owner connection."""


class UnknownNode(Exception):
    """No Node with that id is configured on this Edge."""


@attrs.frozen
class RefreshSummary:
    """What a providers refresh changed."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    ignored_nodes: tuple[str, ...]


class NodeRegistry(Service):
    """Every configured Node: its connections' ownership, drain, its providers and the pool."""

    _log = Logger()
    name = "registry"

    def __init__(self, config: EdgeConfig, clock: IReactorTime, relay: Optional[EventRelay] = None) -> None:
        self._config = config
        self._clock = clock
        self.relay = (
            relay
            if relay is not None
            else EventRelay(clock, config.control_plane.outbox_size, config.control_plane.outbox_bytes)
        )
        self.ownership = NodeOwnership(clock)
        self.pool = ProviderPool(self)
        self._nodes: dict[str, NodeConfig] = {node.node_id: node for node in config.nodes}
        #: The providers edge.yaml gives each Node; deployments add theirs (``_deployed``).
        self._configured: dict[str, tuple[ProviderConfig, ...]] = {n.node_id: n.providers for n in config.nodes}
        self._deployed: dict[str, tuple[ProviderConfig, ...]] = {}
        #: Hears of hellos and readiness (set by the tap: the Edge's deployments).
        self.listener: Optional[NodeListener] = None
        self._peers: dict[int, NodePeer] = {}
        self._drained: set[str] = set()
        #: Health, holds, engine load and cool-downs of the ready Nodes' providers.
        self.providers = ProviderStates(
            config.inference.saturation, config.inference.cooldown, clock, self.relay, self.pool, self._reprobe
        )
        self.tokens = TokenCounter()
        self.started_at = clock.seconds()
        #: How fast its requests went (the gateway records, /metrics and the snapshot read).
        self.latency = LatencyRecorder(self.started_at)
        for node in config.nodes:
            self.pool.configure_node(node.node_id, node.providers)

    def now(self) -> float:
        """The Edge clock's time, in seconds."""
        return self._clock.seconds()

    # -- configuration -------------------------------------------------------

    @property
    def config(self) -> EdgeConfig:
        """The Edge's configuration (providers as last refreshed)."""
        return self._config

    @property
    def edge_id(self) -> str:
        """This Edge's id."""
        return self._config.control_plane.edge_id

    def nodes(self) -> list[NodeConfig]:
        """Every configured Node, in configuration order."""
        return list(self._nodes.values())

    def node(self, node_id: str) -> NodeConfig:
        """The configured Node ``node_id``; :class:`UnknownNode` otherwise."""
        try:
            return self._nodes[node_id]
        except KeyError:
            raise UnknownNode(f"no node named {node_id!r} is configured on this edge") from None

    # -- node connections ----------------------------------------------------

    def check_hello(self, hello: pb.NodeHelloRequest, certified_id: Optional[str] = None) -> Optional[Rejection]:
        """Why this hello must be rejected, or ``None`` to accept it (no state change).

        ``certified_id`` is the node id the client certificate proves, when
        the listener requires one (see :func:`~twisted_iop.wire.hello.check_node_hello`).
        """
        credentials = {node.node_id: node.credentials for node in self._nodes.values()}
        return check_node_hello(hello, credentials, certified_id)

    def node_accepted(self, hello: pb.NodeHelloRequest, peer: NodePeer) -> int:
        """Record an accepted (pending) connection; return its token."""
        node = self.node(hello.node_id)
        token, transitions = self.ownership.open(node.node_id)
        self._peers[token] = peer
        announced = {spec.provider_id for spec in hello.providers}
        configured = {p.provider_id for p in self._configured.get(node.node_id, ())}
        if not announced >= configured:
            self._log.warn(
                "node {node_id} announces providers {announced} but this edge configures {configured}",
                node_id=node.node_id,
                announced=sorted(announced),
                configured=sorted(configured),
            )
        self._log.info("node {node_id} connected (pending, connection {token})", node_id=node.node_id, token=token)
        if self.listener is not None:
            self.listener.node_hello(node.node_id, hello)
        self._apply(transitions, {})
        return token

    def node_ready(self, token: int, reports: Iterable[pb.ProviderHealthReport]) -> None:
        """The connection ``token`` finished its first probes: it takes ownership."""
        transitions = self.ownership.ready(token)
        self._apply(transitions, {token: list(reports)})

    def node_health(self, token: int, reports: Iterable[pb.ProviderHealthReport]) -> list[str]:
        """Health reported by ``token``; only the owner's reports count.

        Returns the ids of providers whose health changed.
        """
        if not self.ownership.is_owner(token):
            return []
        node_id = self.ownership.node_of(token)
        assert node_id is not None
        self.ownership.seen(token)
        changed = self.providers.take_health(node_id, self._provider_ids(node_id), reports, announce=True)
        self.pool.reconsider()
        return changed

    def node_load(self, token: int, reports: Iterable[pb.ProviderLoadReport]) -> list[str]:
        """Engine load reported by ``token``; only the owner's reports count.

        Returns the ids of providers whose reading was taken. Waiting
        requests are reconsidered (a reading may say an engine recovered).
        """
        if not self.ownership.is_owner(token):
            return []
        node_id = self.ownership.node_of(token)
        assert node_id is not None
        self.ownership.seen(token)
        updated = self.providers.take_load(node_id, self._provider_ids(node_id), reports)
        self.pool.reconsider()
        return updated

    def node_seen(self, token: int) -> None:
        """``token`` sent a frame, keepalive included (keeps the owner's last_seen fresh)."""
        self.ownership.seen(token)

    def node_closed(self, token: int) -> None:
        """The connection ``token`` closed (stale/pending closes change nothing)."""
        self._peers.pop(token, None)
        self._apply(self.ownership.close(token), {})

    def _apply(self, transitions: list[Transition], reports: Mapping[int, list[pb.ProviderHealthReport]]) -> None:
        for transition in transitions:
            node_id = transition.node_id
            if transition.kind is TransitionKind.PENDING:
                self.relay.emit("node.pending", node_id=node_id, message=f"node {node_id} connected, not yet ready")
            elif transition.kind is TransitionKind.SUPERSEDED:
                old = self._peers.pop(transition.token, None)
                if old is not None:
                    old.supersede()
                self._log.info(
                    "node {node_id}: connection {old} superseded by {new}",
                    node_id=node_id,
                    old=transition.token,
                    new=transition.replaced_by,
                )
                self.relay.emit(
                    "node.superseded",
                    node_id=node_id,
                    message=f"node {node_id} reconnected; the older connection was closed",
                )
            elif transition.kind is TransitionKind.READY:
                healthy = self.providers.node_ready(
                    node_id, self._provider_ids(node_id), reports.get(transition.token, [])
                )
                self._log.info(
                    "node {node_id} is ready ({healthy}/{total} providers usable)",
                    node_id=node_id,
                    healthy=healthy,
                    total=len(self.node(node_id).providers),
                )
                self.relay.emit(
                    "node.ready",
                    node_id=node_id,
                    message=f"node {node_id} is ready",
                    attributes={"providers": str(len(self.node(node_id).providers)), "usable": str(healthy)},
                )
                self.pool.reconsider()
                if self.listener is not None:
                    self.listener.node_became_ready(node_id)
            elif transition.kind is TransitionKind.DISCONNECTED:
                self.providers.node_lost(node_id, self._provider_ids(node_id))
                self.pool.node_lost(node_id)
                self._log.info("node {node_id} disconnected", node_id=node_id)
                self.relay.emit("node.disconnected", node_id=node_id, message=f"node {node_id} disconnected")

    # -- queries for the status provider and commands ------------------------

    def is_ready(self, node_id: str) -> bool:
        """Whether ``node_id`` has a dispatch-ready owner connection."""
        return self.ownership.owner(node_id) is not None

    def is_drained(self, node_id: str) -> bool:
        """Whether ``node_id`` is drained."""
        return node_id in self._drained

    # -- the pool's Availability ----------------------------------------------

    def node_takes_work(self, node_id: str) -> bool:
        """Whether ``node_id`` is dispatch-ready and not drained."""
        return node_id not in self._drained and self.is_ready(node_id)

    def provider_takes_work(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider may take new work now (see :meth:`ProviderStates.takes_work`)."""
        return self.providers.takes_work(node_id, provider_id)

    def engine_load(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """The engine's fresh reading, ``None`` when unknown or stale."""
        return self.providers.engine_load(node_id, provider_id)

    def engine_parallel(self, node_id: str, provider_id: str) -> int:
        """The engine's reported parallelism (``capacity: auto``); 0 when unknown."""
        return self.providers.engine_parallel(node_id, provider_id)

    def provider_may_serve(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider takes work now or is only "not now": saturated, cooling
        down, re-probing (its Node is ready but its engine does not answer yet) or a
        launched engine on its way back. Requests for its models wait in the queue.

        Gone (requests are refused at once): its Node is not connected or is
        drained, or its launched engine is ``stopped`` or ``failed`` and will
        not come back by itself.
        """
        return self.node_takes_work(node_id) and self.providers.may_come_back(node_id, provider_id)

    # -- provider commands ------------------------------------------------------------

    def provider_command(
        self, node_id: str, request: pb.NodeProviderCommandRequest, timeout: float
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Send ``request`` to the owner connection of ``node_id``; fire with the Node's answer."""
        peer = self.owner_peer(node_id)
        if peer is None:
            return fail(UnknownNode(f"node {node_id!r} is not connected"))
        return peer.provider_command(request, timeout)

    def _reprobe(self, node_id: str) -> None:
        """Early re-probe after a failure: the Node reports what it now sees of its engines."""
        if self.is_ready(node_id):
            self.probe_node(node_id, self._config.node_server.probe_timeout_seconds).addErrback(
                self._probe_failed, node_id
            )

    def _probe_failed(self, failure: Failure, node_id: str) -> None:
        self._log.info(
            "node {node_id}: early re-probe failed: {error}", node_id=node_id, error=failure.getErrorMessage()
        )

    def stopService(self) -> Optional[Deferred[None]]:
        """Cancel the timers of cool-downs and stale readings."""
        self.providers.stop()
        return cast(Optional[Deferred[None]], super().stopService())  # Service.stopService is untyped

    def _provider_ids(self, node_id: str) -> list[str]:
        return [p.provider_id for p in self.node(node_id).providers]

    def connection_count(self) -> int:
        """Live Node connections (owners and pending)."""
        return len(self._peers)

    def owner_peer(self, node_id: str) -> Optional[NodePeer]:
        """The owner connection of ``node_id``, if ready."""
        token = self.ownership.owner(node_id)
        return self._peers.get(token) if token is not None else None

    # -- operations ----------------------------------------------------------

    def set_drained(self, node_id: str, drained: bool, reason: str = "", command_id: str = "") -> bool:
        """Drain or undrain ``node_id``; return whether anything changed."""
        self.node(node_id)
        if drained == (node_id in self._drained):
            return False
        if drained:
            self._drained.add(node_id)
        else:
            self._drained.discard(node_id)
        kind = "node.drained" if drained else "node.undrained"
        self._log.info("node {node_id} {what}", node_id=node_id, what="drained" if drained else "undrained")
        attributes = {"reason": reason} if reason else {}
        self.relay.emit(
            kind,
            node_id=node_id,
            command_id=command_id,
            message=f"node {node_id} {'drained' if drained else 'undrained'}",
            attributes=attributes,
        )
        # Undrained: queued requests may now fit (a drain only stops new work).
        self.pool.reconsider()
        return True

    def disconnect_node(self, node_id: str) -> int:
        """Close every connection of ``node_id``; return how many."""
        self.node(node_id)
        tokens = self.ownership.tokens(node_id)
        peers = [self._peers[t] for t in tokens if t in self._peers]
        for peer in peers:
            peer.close()
        return len(peers)

    def replace_providers(self, nodes: Iterable[NodeConfig]) -> RefreshSummary:
        """Take the providers of configured Nodes from a re-read edge.yaml.

        Nodes that are not configured already are ignored (adding or
        removing Nodes needs a restart, because it changes who may connect).
        The providers deployments run on a Node stay.
        """
        added: list[str] = []
        removed: list[str] = []
        changed: list[str] = []
        fresh = {node.node_id: node for node in nodes}
        ignored = [node_id for node_id in fresh if node_id not in self._nodes]
        for node_id in list(self._nodes):
            new = fresh.get(node_id)
            if new is None:
                continue
            old_providers = {p.provider_id: p for p in self._configured.get(node_id, ())}
            new_providers: dict[str, ProviderConfig] = {p.provider_id: p for p in new.providers}
            added += [f"{node_id}/{p}" for p in new_providers if p not in old_providers]
            removed += [f"{node_id}/{p}" for p in old_providers if p not in new_providers]
            changed += [
                f"{node_id}/{p}" for p in new_providers if p in old_providers and old_providers[p] != new_providers[p]
            ]
            self._configured[node_id] = new.providers
            self._set_providers(node_id)
        self.pool.reconsider()
        return RefreshSummary(tuple(added), tuple(removed), tuple(changed), tuple(ignored))

    def set_deployed_providers(self, node_id: str, providers: tuple[ProviderConfig, ...]) -> None:
        """The providers deployments run on ``node_id`` now (beside the ones edge.yaml gives it)."""
        self.set_deployed({node_id: providers})

    def set_deployed(self, nodes: Mapping[str, tuple[ProviderConfig, ...]]) -> None:
        """The providers deployments run on each of ``nodes`` now (one pool update for all).

        An instance whose id edge.yaml already gives the Node is left out
        (the configured provider wins).
        """
        changed = []
        for node_id, providers in nodes.items():
            self.node(node_id)
            configured = {p.provider_id for p in self._configured.get(node_id, ())}
            deployed = tuple(p for p in providers if p.provider_id not in configured)
            if deployed != self._deployed.get(node_id, ()):
                self._deployed[node_id] = deployed
                changed.append(node_id)
        if not changed:
            return
        for node_id in changed:
            self._set_providers(node_id, pool=False)
        self.pool.configure_nodes({node_id: self._nodes[node_id].providers for node_id in changed})
        self._config = attrs.evolve(self._config, nodes=tuple(self._nodes.values()))
        self.pool.reconsider()

    def _set_providers(self, node_id: str, pool: bool = True) -> None:
        """Give ``node_id`` its configured and deployed providers: the pool (unless ``pool`` is
        false: the caller updates it), health and readings follow."""
        node = self._nodes[node_id]
        providers = self._configured.get(node_id, ()) + self._deployed.get(node_id, ())
        old = {p.provider_id for p in node.providers}
        new = {p.provider_id for p in providers}
        self._nodes[node_id] = attrs.evolve(node, providers=providers)
        if pool:
            self.pool.configure_node(node_id, providers)
        self.providers.set_providers(node_id, old, new)
        if pool:
            self._config = attrs.evolve(self._config, nodes=tuple(self._nodes.values()))

    def ready_nodes(self) -> list[str]:
        """Ids of dispatch-ready Nodes, in configuration order."""
        return [node_id for node_id in self._nodes if self.is_ready(node_id)]

    def probe_node(self, node_id: str, timeout: float) -> Deferred[list[str]]:
        """Ask the owner of ``node_id`` to probe again; apply its answer.

        Fires with the ids of providers whose health changed. The answer
        counts only if the same connection still owns the Node.
        """
        token = self.ownership.owner(node_id)
        peer = self._peers.get(token) if token is not None else None
        if token is None or peer is None:
            return fail(UnknownNode(f"node {node_id!r} is not ready"))

        def answered(response: pb.NodeProbeResponse) -> list[str]:
            if not self.ownership.is_owner(token):
                return []
            self.ownership.seen(token)
            changed = self.providers.take_health(node_id, self._provider_ids(node_id), response.health, announce=True)
            self.pool.reconsider()
            return changed

        return peer.probe(timeout).addCallback(answered)
