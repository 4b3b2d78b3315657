"""The Edge's shared state and rules: configured Nodes, their connections,
health, drain state and the provider pool (no I/O).

The registry is the one owner of what decides whether a Node takes work:
dispatch-ready ownership, drain, provider health, the engines' own load
(:mod:`~twisted_iop.edge.providers.load`: a saturated engine takes no new
lease) and cool-downs of failing providers (:mod:`~twisted_iop.edge.providers.cooldown`),
and of the tokens counted from the engines' usage. The
:class:`~twisted_iop.edge.providers.pool.ProviderPool` holds only leases and queues
and asks the registry (its :class:`~twisted_iop.edge.providers.pool.Availability`)
when it places work; every change of those facts tells the pool to
reconsider its waiting requests.

Node connections reach this service through the small :class:`NodePeer`
interface (close, probe), so the TCP protocol and test fakes are
interchangeable. Every state change a connection causes is checked against
its connection token by :class:`~twisted_iop.edge.nodes.ownership.NodeOwnership`;
only the current owner's transitions become events and snapshot changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional, Protocol

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.edge.config import EdgeConfig, NodeConfig, ProviderConfig
from twisted_iop.edge.events import EventRelay
from twisted_iop.edge.inference.latency import LatencyRecorder
from twisted_iop.edge.inference.tokens import TokenCounter
from twisted_iop.edge.nodes.ownership import NodeOwnership, Transition, TransitionKind
from twisted_iop.edge.providers.cooldown import Cooldowns
from twisted_iop.edge.providers.launch import (
    EngineLaunchInfo,
    checked_launch,
    launch_change,
    launch_may_serve,
    launch_takes_work,
)
from twisted_iop.edge.providers.load import EngineLoads, EngineReading
from twisted_iop.edge.providers.pool import ProviderPool
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label
from twisted_iop.wire.hello import MAX_TEXT, Rejection, check_node_hello

#: Health values under which a provider takes new leases.
USABLE_HEALTH = frozenset({pb.PROVIDER_HEALTH_HEALTHY, pb.PROVIDER_HEALTH_DEGRADED})

#: Health values a Node may report; anything else (a newer Node's value,
#: or garbage) is recorded as UNKNOWN with a reason.
KNOWN_HEALTH = frozenset(pb.ProviderHealth.values()) - {pb.PROVIDER_HEALTH_UNSPECIFIED}

#: At most this many models of one provider's health report are kept.
MAX_MODELS = 256


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
class ProviderHealth:
    """The last health a Node's owner connection reported for a provider, with its
    engine's state when the Node launches it (``None``: someone else runs the engine)."""

    health: pb.ProviderHealth
    reason: str = ""
    models: tuple[str, ...] = ()
    launch: Optional[EngineLaunchInfo] = None


@attrs.frozen
class RefreshSummary:
    """What a providers refresh changed."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    ignored_nodes: tuple[str, ...]


class NodeRegistry(Service):
    """Every configured Node: ownership, health, drain and the pool."""

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
        self._health: dict[str, dict[str, ProviderHealth]] = {}
        self._drained: set[str] = set()
        self.engine_loads = EngineLoads(config.inference.saturation)
        self.cooldowns = Cooldowns(config.inference.cooldown)
        self.tokens = TokenCounter()
        #: Providers a command holds out of new leases (a restart or stop of its engine), with why.
        self._held: dict[tuple[str, str], str] = {}
        #: Timers that reconsider waiting work when a cool-down ends or a
        #: saturated reading goes stale, per (node, provider, which).
        self._timers: dict[tuple[str, str, str], IDelayedCall] = {}
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
        changed = self._update_health(node_id, reports, announce=True)
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
        now = self._clock.seconds()
        loads = self.engine_loads
        known = [p.provider_id for p in self.node(node_id).providers]
        before = {p: loads.saturated(node_id, p) for p in known}
        in_flight = {p: self.pool.in_flight(node_id, p) for p in known}
        updated = loads.update(node_id, known, reports, now, in_flight)
        for provider_id in updated:
            saturated = loads.saturated(node_id, provider_id)
            if saturated != before[provider_id]:
                self._log.info(
                    "node {node_id} provider {provider_id} engine {state}",
                    node_id=node_id,
                    provider_id=provider_id,
                    state=(
                        f"saturated: at most {loads.lease_limit(node_id, provider_id)} requests in flight"
                        if saturated
                        else "no longer saturated"
                    ),
                )
            reading = loads.fresh(node_id, provider_id)
            if reading is not None:
                # Unless a newer reading comes, this one stops counting when stale.
                self._set_timer(node_id, provider_id, "stale", loads.stale_in(reading, now))
            else:
                self._cancel_timer(node_id, provider_id, "stale")
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
                self._health[node_id] = {}
                self._update_health(node_id, reports.get(transition.token, []), announce=False)
                healthy = sum(1 for h in self._health[node_id].values() if h.health in USABLE_HEALTH)
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
                self._health.pop(node_id, None)
                self.engine_loads.forget_node(node_id)
                for provider in self.node(node_id).providers:
                    self._cancel_timer(node_id, provider.provider_id, "stale")
                self.pool.node_lost(node_id)
                self._log.info("node {node_id} disconnected", node_id=node_id)
                self.relay.emit("node.disconnected", node_id=node_id, message=f"node {node_id} disconnected")

    def _update_health(self, node_id: str, reports: Iterable[pb.ProviderHealthReport], announce: bool) -> list[str]:
        node = self._nodes.get(node_id)
        if node is None:
            return []
        known = {p.provider_id for p in node.providers}
        current = self._health.setdefault(node_id, {})
        changed: list[str] = []
        for report in reports:
            if report.provider_id not in known:
                continue
            new = self._checked_health(node_id, report)
            old = current.get(report.provider_id)
            current[report.provider_id] = new
            if announce:
                self._announce_launch(node_id, report.provider_id, old.launch if old is not None else None, new.launch)
            if self._recovered(old, new):
                self._end_cooldown(node_id, report.provider_id)
            if old is not None and (old.health, old.reason) == (new.health, new.reason):
                if old.launch != new.launch:
                    changed.append(report.provider_id)
                continue
            changed.append(report.provider_id)
            if announce:
                before = _health_name(old.health) if old is not None else "unknown"
                after = _health_name(new.health)
                self._log.info(
                    "node {node_id} provider {provider_id} health {before} -> {after}",
                    node_id=node_id,
                    provider_id=report.provider_id,
                    before=before,
                    after=after,
                )
                self.relay.emit(
                    "provider.health_changed",
                    node_id=node_id,
                    provider_id=report.provider_id,
                    message=f"provider {report.provider_id} on node {node_id} is {after}",
                    attributes={"previous": before, "health": after, "reason": new.reason},
                )
        # Configured providers the Node does not report cannot take work.
        for provider in node.providers:
            if provider.provider_id not in current:
                current[provider.provider_id] = ProviderHealth(pb.PROVIDER_HEALTH_UNKNOWN, "not reported by the node")
        return changed

    @staticmethod
    def _recovered(old: Optional[ProviderHealth], new: ProviderHealth) -> bool:
        """Whether a report says a provider that could not take work now can."""
        usable = new.health in USABLE_HEALTH and launch_takes_work(new.launch)
        was_usable = old is not None and old.health in USABLE_HEALTH and launch_takes_work(old.launch)
        return usable and not was_usable

    def _end_cooldown(self, node_id: str, provider_id: str) -> None:
        """The Node says the engine answers again: its cool-down (if any) ends now."""
        if self.cooldowns.cooling(node_id, provider_id) is None:
            return
        self._cancel_timer(node_id, provider_id, "cooldown")
        self.cooldowns.end(node_id, provider_id)
        self._log.info(
            "node {node_id} provider {provider_id} answers again: its cool-down ends",
            node_id=node_id,
            provider_id=provider_id,
        )

    def _announce_launch(
        self, node_id: str, provider_id: str, old: Optional[EngineLaunchInfo], new: Optional[EngineLaunchInfo]
    ) -> None:
        """A ``provider.launch_changed`` event when the engine's state (or its reason or restarts) changed."""
        attributes = launch_change(old, new)
        if new is None or attributes is None:
            return
        if attributes["previous"] != new.name:
            self._log.info(
                "node {node_id} provider {provider_id} engine {before} -> {after} {reason}",
                node_id=node_id,
                provider_id=provider_id,
                before=attributes["previous"],
                after=new.name,
                reason=new.reason,
            )
        self.relay.emit(
            "provider.launch_changed",
            node_id=node_id,
            provider_id=provider_id,
            message=f"provider {provider_id} on node {node_id}: engine {new.name}",
            attributes=attributes,
        )

    def _checked_health(self, node_id: str, report: pb.ProviderHealthReport) -> ProviderHealth:
        """``report`` as a :class:`ProviderHealth`, every wire value checked.

        A health value this Edge does not know (a newer Node, or garbage)
        becomes UNKNOWN, which takes no work, with a reason saying so; the
        connection stays up. Texts and model lists are bounded.
        """
        reason = report.reason[:MAX_TEXT]
        health = report.health
        if health not in KNOWN_HEALTH:
            self._log.warn(
                "node {node_id} reported unknown health value {value} for provider {provider_id}; "
                "treating it as unknown",
                node_id=node_id,
                value=health,
                provider_id=report.provider_id,
            )
            if health == pb.PROVIDER_HEALTH_UNSPECIFIED:
                detail = "node reported no health value"
            else:
                detail = f"node reported unknown health value {health}"
            reason = f"{detail}: {reason}" if reason else detail
            health = pb.PROVIDER_HEALTH_UNKNOWN
        models = tuple(model[:MAX_TEXT] for model in report.models[:MAX_MODELS])
        launch = checked_launch(report)
        if launch is not None and launch.name == "unknown":
            self._log.warn(
                "node {node_id} reported an engine state this edge does not know for provider {provider_id}: "
                "{reason}; it takes no work",
                node_id=node_id,
                provider_id=report.provider_id,
                reason=launch.reason,
            )
        return ProviderHealth(health, reason, models, launch)

    # -- queries for the status provider and commands ------------------------

    def is_ready(self, node_id: str) -> bool:
        """Whether ``node_id`` has a dispatch-ready owner connection."""
        return self.ownership.owner(node_id) is not None

    def is_drained(self, node_id: str) -> bool:
        """Whether ``node_id`` is drained."""
        return node_id in self._drained

    def health(self, node_id: str, provider_id: str) -> Optional[ProviderHealth]:
        """The owner's last health report for a provider, if ready."""
        return self._health.get(node_id, {}).get(provider_id)

    # -- the pool's Availability ----------------------------------------------

    def node_takes_work(self, node_id: str) -> bool:
        """Whether ``node_id`` is dispatch-ready and not drained."""
        return node_id not in self._drained and self.is_ready(node_id)

    def provider_healthy(self, node_id: str, provider_id: str) -> bool:
        """Whether the owner's last health report lets the provider take new work."""
        health = self.health(node_id, provider_id)
        return health is not None and health.health in USABLE_HEALTH

    def provider_takes_work(self, node_id: str, provider_id: str) -> bool:
        """Healthy (or degraded), its launched engine (if any) ready and not held by a command,
        its engine not saturated, not cooling down."""
        health = self._health.get(node_id, {}).get(provider_id)
        if health is None or health.health not in USABLE_HEALTH or not launch_takes_work(health.launch):
            return False
        if (node_id, provider_id) in self._held:
            return False
        if self.cooldowns.cooling(node_id, provider_id) is not None:
            return False
        limit = self.engine_loads.lease_limit(node_id, provider_id)
        return limit is None or self.pool.in_flight(node_id, provider_id) < limit

    def engine_load(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """The engine's fresh reading, ``None`` when unknown or stale."""
        return self.engine_loads.fresh(node_id, provider_id)

    def engine_parallel(self, node_id: str, provider_id: str) -> int:
        """The engine's reported parallelism (``capacity: auto``); 0 when unknown."""
        return self.engine_loads.parallel(node_id, provider_id)

    def saturated(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider's engine is over a saturation threshold now."""
        return self.engine_loads.saturated(node_id, provider_id)

    def cooling_down(self, node_id: str, provider_id: str) -> Optional[str]:
        """Why the provider cools down now, or ``None``."""
        return self.cooldowns.cooling(node_id, provider_id)

    def launch(self, node_id: str, provider_id: str) -> Optional[EngineLaunchInfo]:
        """The state of the provider's launched engine as its Node last reported it, if it launches it."""
        health = self.health(node_id, provider_id)
        return health.launch if health is not None else None

    def provider_may_serve(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider takes work now or is only "not now": saturated, cooling
        down, re-probing (its Node is ready but its engine does not answer yet) or a
        launched engine on its way back. Requests for its models wait in the queue.

        Gone (requests are refused at once): its Node is not connected or is
        drained, or its launched engine is ``stopped`` or ``failed`` and will
        not come back by itself.
        """
        if not self.node_takes_work(node_id):
            return False
        return (node_id, provider_id) in self._held or launch_may_serve(self.launch(node_id, provider_id))

    def held(self, node_id: str, provider_id: str) -> Optional[str]:
        """Why a command holds the provider out of new leases now, or ``None``."""
        return self._held.get((node_id, provider_id))

    # -- provider commands ------------------------------------------------------------

    def hold_provider(self, node_id: str, provider_id: str, reason: str) -> None:
        """No new leases for the provider until :meth:`release_provider` (a restart or stop of its engine).

        Held before the command is sent: every request leased earlier was
        sent to the Node before the command, on the same connection, so the
        Node's drain sees them all.
        """
        self._held[(node_id, provider_id)] = reason

    def release_provider(self, node_id: str, provider_id: str) -> None:
        """The command ended: the provider takes work again when its state lets it."""
        if self._held.pop((node_id, provider_id), None) is not None:
            self.pool.reconsider()

    def provider_command(
        self, node_id: str, request: pb.NodeProviderCommandRequest, timeout: float
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Send ``request`` to the owner connection of ``node_id``; fire with the Node's answer."""
        peer = self.owner_peer(node_id)
        if peer is None:
            return fail(UnknownNode(f"node {node_id!r} is not connected"))
        return peer.provider_command(request, timeout)

    # -- outcomes of requests (cool-downs) ------------------------------------

    def request_succeeded(self, node_id: str, provider_id: str) -> None:
        """A request on the provider ended well (counts for the failure share)."""
        self.cooldowns.record(node_id, provider_id, False, self._clock.seconds())

    def request_failed(self, node_id: str, provider_id: str, reason: str, cool_down_now: bool) -> None:
        """A request on the provider failed on the provider's side.

        ``cool_down_now``: the provider could not take it at all (refused,
        reset, overloaded): it cools down at once. Otherwise the failure
        counts towards the failure share of its window.
        """
        now = self._clock.seconds()
        if cool_down_now:
            until = self.cooldowns.start(node_id, provider_id, now, reason)
        else:
            until = self.cooldowns.record(node_id, provider_id, True, now, reason)
        if until is None:
            return
        reason = self.cooldowns.cooling(node_id, provider_id) or reason
        self._log.warn(
            "node {node_id} provider {provider_id} cools down for {seconds:g}s: {reason}",
            node_id=node_id,
            provider_id=provider_id,
            seconds=until - now,
            reason=reason,
        )
        self._set_timer(node_id, provider_id, "cooldown", until - now)
        if self.is_ready(node_id):
            # Early re-probe: the Node reports what it now sees of the engine.
            self.probe_node(node_id, self._config.node_server.probe_timeout_seconds).addErrback(
                self._probe_failed, node_id
            )

    def _probe_failed(self, failure: Failure, node_id: str) -> None:
        self._log.info(
            "node {node_id}: early re-probe failed: {error}", node_id=node_id, error=failure.getErrorMessage()
        )

    def _set_timer(self, node_id: str, provider_id: str, which: str, seconds: float) -> None:
        key = (node_id, provider_id, which)
        timer = self._timers.get(key)
        if timer is not None and timer.active():
            timer.reset(seconds)
        else:
            self._timers[key] = self._clock.callLater(seconds, self._timer_fired, key)

    def _cancel_timer(self, node_id: str, provider_id: str, which: str) -> None:
        timer = self._timers.pop((node_id, provider_id, which), None)
        if timer is not None and timer.active():
            timer.cancel()

    def _timer_fired(self, key: tuple[str, str, str]) -> None:
        self._timers.pop(key, None)
        node_id, provider_id, which = key
        if which == "stale":
            self.engine_loads.expire(node_id, provider_id)
        else:
            self.cooldowns.end(node_id, provider_id)
            self._log.info(
                "node {node_id} provider {provider_id} cool-down over", node_id=node_id, provider_id=provider_id
            )
        self.pool.reconsider()

    def stopService(self) -> Optional[Deferred[None]]:
        """Cancel the timers of cool-downs and stale readings."""
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
        return super().stopService()  # type: ignore[no-any-return]

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
        for provider_id in old - new:
            self.engine_loads.forget_provider(node_id, provider_id)
            self.cooldowns.forget_provider(node_id, provider_id)
            self._cancel_timer(node_id, provider_id, "stale")
            self._cancel_timer(node_id, provider_id, "cooldown")
        health = self._health.get(node_id)
        if health is not None:
            for provider_id in list(health):
                if provider_id not in new:
                    del health[provider_id]
            for provider_id in new:
                if provider_id not in health:
                    health[provider_id] = ProviderHealth(pb.PROVIDER_HEALTH_UNKNOWN, "not yet probed")
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
            from twisted.internet.defer import fail

            return fail(UnknownNode(f"node {node_id!r} is not ready"))

        def answered(response: pb.NodeProbeResponse) -> list[str]:
            if not self.ownership.is_owner(token):
                return []
            self.ownership.seen(token)
            changed = self._update_health(node_id, response.health, announce=True)
            self.pool.reconsider()
            return changed

        return peer.probe(timeout).addCallback(answered)


def _health_name(value: pb.ProviderHealth) -> str:
    return enum_label(pb.ProviderHealth, value)
