"""Whether each provider of a ready Node takes work now, and why not (no I/O).

:class:`ProviderStates` is the one owner of the provider-level facts that
decide admission:

* the **health** the Node's owner connection last reported (checked: an
  unknown value is UNKNOWN with a reason), with a launched engine's state
  (:mod:`~twisted_iop.edge.providers.launch`);
* **holds** by a ``provider.*`` command (a restart or stop of its engine);
* the engine's own **load** (:mod:`~twisted_iop.edge.providers.load`: a
  saturated engine takes a lease limit);
* **cool-downs** of failing providers (:mod:`~twisted_iop.edge.providers.cooldown`),
  ended early when the Node says the engine answers again;
* the timers that end a cool-down or a stale reading, after which the
  pool reconsiders its waiting requests.

The node registry (:class:`~twisted_iop.edge.nodes.registry.NodeRegistry`)
owns the Nodes and their connections; it feeds this object the owner's
reports and adds the node's own state (ready, drained) to its answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from twisted_iop.edge.events import EventRelay
from twisted_iop.edge.providers.cooldown import CooldownRule, Cooldowns
from twisted_iop.edge.providers.launch import (
    EngineLaunchInfo,
    checked_launch,
    launch_change,
    launch_may_serve,
    launch_takes_work,
)
from twisted_iop.edge.providers.load import EngineLoads, EngineReading, SaturationRule
from twisted_iop.edge.providers.pool import ProviderPool
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label
from twisted_iop.wire.hello import MAX_TEXT

#: Health values under which a provider takes new leases.
USABLE_HEALTH = frozenset({pb.PROVIDER_HEALTH_HEALTHY, pb.PROVIDER_HEALTH_DEGRADED})

#: Health values a Node may report; anything else (a newer Node's value,
#: or garbage) is recorded as UNKNOWN with a reason.
KNOWN_HEALTH = frozenset(pb.ProviderHealth.values()) - {pb.PROVIDER_HEALTH_UNSPECIFIED}

#: At most this many models of one provider's health report are kept.
MAX_MODELS = 256

#: The timers per provider: a cool-down's end, a saturated reading going stale.
COOLDOWN_TIMER = "cooldown"
STALE_TIMER = "stale"


@attrs.frozen
class ProviderHealth:
    """The last health a Node's owner connection reported for a provider, with its
    engine's state when the Node launches it (``None``: someone else runs the engine)."""

    health: pb.ProviderHealth
    reason: str = ""
    models: tuple[str, ...] = ()
    launch: Optional[EngineLaunchInfo] = None


class ProviderStates:
    """Health, holds, engine load and cool-downs of every provider of the ready Nodes."""

    _log = Logger()

    def __init__(
        self,
        saturation: SaturationRule,
        cooldown: CooldownRule,
        clock: IReactorTime,
        relay: EventRelay,
        pool: ProviderPool,
        reprobe: Callable[[str], None],
    ) -> None:
        self._clock = clock
        self._relay = relay
        self._pool = pool
        #: Asks a ready Node to probe its engines again now (after a failure).
        self._reprobe = reprobe
        self._health: dict[str, dict[str, ProviderHealth]] = {}
        #: Providers a command holds out of new leases (a restart or stop of its engine), with why.
        self._held: dict[tuple[str, str], str] = {}
        #: Timers that reconsider waiting work when a cool-down ends or a
        #: saturated reading goes stale, per (node, provider, which).
        self._timers: dict[tuple[str, str, str], IDelayedCall] = {}
        self.engine_loads = EngineLoads(saturation)
        self.cooldowns = Cooldowns(cooldown)

    # -- what the owner connection reports ----------------------------------------

    def node_ready(self, node_id: str, providers: Iterable[str], reports: Iterable[pb.ProviderHealthReport]) -> int:
        """A Node became ready with these first reports; return how many providers are usable."""
        self._health[node_id] = {}
        self.take_health(node_id, providers, reports, announce=False)
        return sum(1 for h in self._health[node_id].values() if h.health in USABLE_HEALTH)

    def node_lost(self, node_id: str, providers: Iterable[str]) -> None:
        """The Node is no longer ready: its health and readings are forgotten."""
        self._health.pop(node_id, None)
        self.engine_loads.forget_node(node_id)
        for provider_id in providers:
            self._cancel_timer(node_id, provider_id, STALE_TIMER)

    def take_health(
        self, node_id: str, providers: Iterable[str], reports: Iterable[pb.ProviderHealthReport], announce: bool
    ) -> list[str]:
        """Take the owner's health reports for ``node_id`` (whose providers are ``providers``);
        return the ids whose health (or launched engine's state) changed."""
        known = set(providers)
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
            if _recovered(old, new):
                self._end_cooldown(node_id, report.provider_id)
            if old is not None and (old.health, old.reason) == (new.health, new.reason):
                if old.launch != new.launch:
                    changed.append(report.provider_id)
                continue
            changed.append(report.provider_id)
            if announce:
                self._announce_health(node_id, report.provider_id, old, new)
        # Configured providers the Node does not report cannot take work.
        for provider_id in known:
            if provider_id not in current:
                current[provider_id] = ProviderHealth(pb.PROVIDER_HEALTH_UNKNOWN, "not reported by the node")
        return changed

    def take_load(self, node_id: str, providers: list[str], reports: Iterable[pb.ProviderLoadReport]) -> list[str]:
        """Take the owner's engine-load reports for ``node_id``; return the ids whose reading was taken."""
        now = self._clock.seconds()
        loads = self.engine_loads
        before = {p: loads.saturated(node_id, p) for p in providers}
        in_flight = {p: self._pool.in_flight(node_id, p) for p in providers}
        updated = loads.update(node_id, providers, reports, now, in_flight)
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
                self._set_timer(node_id, provider_id, STALE_TIMER, loads.stale_in(reading, now))
            else:
                self._cancel_timer(node_id, provider_id, STALE_TIMER)
        return updated

    def set_providers(self, node_id: str, old: set[str], new: set[str]) -> None:
        """The Node's providers changed from ``old`` to ``new`` (a refresh, a deployment)."""
        for provider_id in old - new:
            self.engine_loads.forget_provider(node_id, provider_id)
            self.cooldowns.forget_provider(node_id, provider_id)
            self._cancel_timer(node_id, provider_id, STALE_TIMER)
            self._cancel_timer(node_id, provider_id, COOLDOWN_TIMER)
        health = self._health.get(node_id)
        if health is not None:
            for provider_id in list(health):
                if provider_id not in new:
                    del health[provider_id]
            for provider_id in new:
                if provider_id not in health:
                    health[provider_id] = ProviderHealth(pb.PROVIDER_HEALTH_UNKNOWN, "not yet probed")

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

    def _announce_health(
        self, node_id: str, provider_id: str, old: Optional[ProviderHealth], new: ProviderHealth
    ) -> None:
        before = _health_name(old.health) if old is not None else "unknown"
        after = _health_name(new.health)
        self._log.info(
            "node {node_id} provider {provider_id} health {before} -> {after}",
            node_id=node_id,
            provider_id=provider_id,
            before=before,
            after=after,
        )
        self._relay.emit(
            "provider.health_changed",
            node_id=node_id,
            provider_id=provider_id,
            message=f"provider {provider_id} on node {node_id} is {after}",
            attributes={"previous": before, "health": after, "reason": new.reason},
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
        self._relay.emit(
            "provider.launch_changed",
            node_id=node_id,
            provider_id=provider_id,
            message=f"provider {provider_id} on node {node_id}: engine {new.name}",
            attributes=attributes,
        )

    def _end_cooldown(self, node_id: str, provider_id: str) -> None:
        """The Node says the engine answers again: its cool-down (if any) ends now."""
        if self.cooldowns.cooling(node_id, provider_id) is None:
            return
        self._cancel_timer(node_id, provider_id, COOLDOWN_TIMER)
        self.cooldowns.end(node_id, provider_id)
        self._log.info(
            "node {node_id} provider {provider_id} answers again: its cool-down ends",
            node_id=node_id,
            provider_id=provider_id,
        )

    # -- queries ----------------------------------------------------------------------

    def health(self, node_id: str, provider_id: str) -> Optional[ProviderHealth]:
        """The owner's last health report for a provider, if its Node is ready."""
        return self._health.get(node_id, {}).get(provider_id)

    def healthy(self, node_id: str, provider_id: str) -> bool:
        """Whether the owner's last health report lets the provider take new work."""
        health = self.health(node_id, provider_id)
        return health is not None and health.health in USABLE_HEALTH

    def takes_work(self, node_id: str, provider_id: str) -> bool:
        """Healthy (or degraded), its launched engine (if any) ready and not held by a command,
        its engine not saturated, not cooling down (its Node's own state aside)."""
        health = self.health(node_id, provider_id)
        if health is None or health.health not in USABLE_HEALTH or not launch_takes_work(health.launch):
            return False
        if (node_id, provider_id) in self._held:
            return False
        if self.cooldowns.cooling(node_id, provider_id) is not None:
            return False
        limit = self.engine_loads.lease_limit(node_id, provider_id)
        return limit is None or self._pool.in_flight(node_id, provider_id) < limit

    def may_come_back(self, node_id: str, provider_id: str) -> bool:
        """Whether a provider that does not take work now is only "not now" (held by a
        command, or a launched engine that is not ``stopped`` or ``failed``), its Node's
        own state aside."""
        return (node_id, provider_id) in self._held or launch_may_serve(self.launch(node_id, provider_id))

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

    def held(self, node_id: str, provider_id: str) -> Optional[str]:
        """Why a command holds the provider out of new leases now, or ``None``."""
        return self._held.get((node_id, provider_id))

    # -- holds by commands -------------------------------------------------------------

    def hold(self, node_id: str, provider_id: str, reason: str) -> None:
        """No new leases for the provider until :meth:`release` (a restart or stop of its engine).

        Held before the command is sent: every request leased earlier was
        sent to the Node before the command, on the same connection, so the
        Node's drain sees them all.
        """
        self._held[(node_id, provider_id)] = reason

    def release(self, node_id: str, provider_id: str) -> None:
        """The command ended: the provider takes work again when its state lets it."""
        if self._held.pop((node_id, provider_id), None) is not None:
            self._pool.reconsider()

    # -- outcomes of requests (cool-downs) ------------------------------------------

    def request_succeeded(self, node_id: str, provider_id: str) -> None:
        """A request on the provider ended well (counts for the failure share)."""
        self.cooldowns.record(node_id, provider_id, False, self._clock.seconds())

    def request_failed(self, node_id: str, provider_id: str, reason: str, cool_down_now: bool) -> None:
        """A request on the provider failed on the provider's side.

        ``cool_down_now``: the provider could not take it at all (refused,
        reset, overloaded): it cools down at once. Otherwise the failure
        counts towards the failure share of its window. A provider that
        starts cooling down has its Node re-probe its engines at once.
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
        self._set_timer(node_id, provider_id, COOLDOWN_TIMER, until - now)
        self._reprobe(node_id)

    # -- timers -------------------------------------------------------------------------

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
        if which == STALE_TIMER:
            self.engine_loads.expire(node_id, provider_id)
        else:
            self.cooldowns.end(node_id, provider_id)
            self._log.info(
                "node {node_id} provider {provider_id} cool-down over", node_id=node_id, provider_id=provider_id
            )
        self._pool.reconsider()

    def stop(self) -> None:
        """Cancel the timers of cool-downs and stale readings."""
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()


def _recovered(old: Optional[ProviderHealth], new: ProviderHealth) -> bool:
    """Whether a report says a provider that could not take work now can."""
    usable = new.health in USABLE_HEALTH and launch_takes_work(new.launch)
    was_usable = old is not None and old.health in USABLE_HEALTH and launch_takes_work(old.launch)
    return usable and not was_usable


def _health_name(value: pb.ProviderHealth) -> str:
    return enum_label(pb.ProviderHealth, value)
