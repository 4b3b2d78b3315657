"""What each provider's engine says of its own load, as the Edge keeps it (no I/O).

A Node sends ``NodeLoadReport`` every few seconds with one ``EngineLoad``
per provider (running and waiting requests, KV-cache use, parallelism,
the reading's age). :class:`EngineLoads` checks and bounds every value,
keeps the last reading per provider stamped with the Edge's receipt time,
and answers the questions admission asks:

* the *fresh* reading (at most ``stale_after_seconds`` old, counted from
  when the engine was read): an older one counts as unknown;
* whether the engine is *saturated*: waiting above ``max_waiting`` or KV
  cache above ``max_kv_cache`` in a fresh reading, and until a reading is
  clearly below (waiting at most half of ``max_waiting``, KV cache 0.05
  under its bound): the hysteresis keeps one busy moment from flipping
  the state at every reading;
* how many requests the Edge may have in flight on a saturated engine
  (its *lease limit*): saturated is "not now", not "no": the Edge keeps
  its in-flight where the engine holds ``max_waiting`` waiting, so the
  other requests wait in the Edge's queue and one is sent each time a
  request ends. The requests the Edge sent after the engine was read
  (its in-flight above what the engine reported) are counted as already
  there;
* the engine's parallelism (``capacity: auto``): the last one reported on
  the current connection, whatever its age (it is a property of how the
  engine was started, not of the moment).

Readings are kept per Node and dropped when the Node disconnects. Whether
a reading is still fresh is kept as state (:meth:`EngineLoads.expire`,
called by the registry's timer when a reading reaches its bound), so the
questions admission asks on every placement are dictionary look-ups, not
clock reads: through the registry, ``try_acquire`` + ``release`` over 8
providers took 14.6 us with clock reads and 5 us this way (4.2 us
before engine load existed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Optional

import attrs

from twisted_iop.wire import control_pb2 as pb

#: Bounds of the figures accepted from a Node (anything above is clamped).
MAX_ENGINE_REQUESTS = 1_000_000
MAX_ENGINE_PARALLEL = 100_000
#: A reading said to be older than this (ms) is clamped to it.
MAX_READING_AGE_MS = 3_600_000
#: A saturated engine's KV cache must fall this far under its bound to recover.
KV_HYSTERESIS = 0.05


@attrs.frozen
class EngineReading:
    """One checked reading of an engine's load."""

    running: int
    waiting: int
    #: Fraction 0..1 of the KV cache in use; ``None`` when the engine does not say.
    kv_cache_usage: Optional[float]
    #: Requests the engine runs at once; 0 when it does not say.
    parallel: int
    #: When the engine was read, on the Edge's clock (receipt time minus the reported age).
    read_at: float

    def busy(self) -> int:
        """Requests the engine holds: running and waiting."""
        return self.running + self.waiting

    def to_wire(self, now: float) -> pb.EngineLoad:
        """The reading as ``EngineLoad`` with its age at ``now``."""
        age_ms = min(MAX_READING_AGE_MS, max(0, int((now - self.read_at) * 1000)))
        return pb.EngineLoad(
            known=True,
            running=self.running,
            waiting=self.waiting,
            kv_cache_usage=self.kv_cache_usage if self.kv_cache_usage is not None else -1.0,
            parallel=self.parallel,
            age_ms=age_ms,
        )


def checked_reading(load: pb.EngineLoad, received_at: float) -> Optional[EngineReading]:
    """``load`` as an :class:`EngineReading`, every value bounded; ``None`` if not known.

    A KV-cache figure that is NaN, infinite, negative or above 1 is unknown.
    """
    if not load.known:
        return None
    kv: Optional[float] = load.kv_cache_usage
    if kv is None or not math.isfinite(kv) or kv < 0.0 or kv > 1.0:
        kv = None
    age_ms = min(load.age_ms, MAX_READING_AGE_MS)
    return EngineReading(
        running=min(load.running, MAX_ENGINE_REQUESTS),
        waiting=min(load.waiting, MAX_ENGINE_REQUESTS),
        kv_cache_usage=kv,
        parallel=min(load.parallel, MAX_ENGINE_PARALLEL),
        read_at=received_at - age_ms / 1000.0,
    )


@attrs.frozen
class SaturationRule:
    """When an engine takes no new lease (``inference.saturation``)."""

    #: Waiting requests inside the engine above this: saturated.
    max_waiting: int = 5
    #: KV-cache use above this fraction: saturated.
    max_kv_cache: float = 0.8
    #: A reading older than this counts as unknown (never saturated).
    stale_after_seconds: float = 30.0

    def saturated(self, reading: EngineReading) -> bool:
        """Whether ``reading`` is over either threshold."""
        kv = reading.kv_cache_usage
        return reading.waiting > self.max_waiting or (kv is not None and kv > self.max_kv_cache)

    def recovered(self, reading: EngineReading) -> bool:
        """Whether ``reading`` is clearly under both thresholds (a saturated engine leaves the state)."""
        kv = reading.kv_cache_usage
        return reading.waiting <= self.max_waiting // 2 and (kv is None or kv <= self.max_kv_cache - KV_HYSTERESIS)

    def lease_limit(self, reading: EngineReading, in_flight: int) -> int:
        """Requests the Edge may have in flight on a saturated engine, given its ``in_flight``
        when ``reading`` arrived.

        The engine holds ``running + waiting``; the Edge's requests above that
        were sent after the engine was read and count as waiting too. The limit
        is what brings the engine's waiting to ``max_waiting`` (KV over its
        bound: no more than the engine already holds).
        """
        busy = reading.busy()
        unseen = max(0, in_flight - busy)
        if reading.kv_cache_usage is not None and reading.kv_cache_usage > self.max_kv_cache:
            return max(0, in_flight - unseen)
        return max(0, in_flight - unseen - (reading.waiting - self.max_waiting))


class EngineLoads:
    """The last checked reading of every provider's engine, per Node."""

    def __init__(self, rule: SaturationRule) -> None:
        self.rule = rule
        self._readings: dict[tuple[str, str], EngineReading] = {}
        #: Readings not yet older than the rule's bound (expired by a timer).
        self._fresh: dict[tuple[str, str], EngineReading] = {}
        #: Providers saturated now, with how many requests the Edge may have in flight on each.
        self._saturated: dict[tuple[str, str], int] = {}
        self._by_node: dict[str, set[str]] = {}

    def update(
        self,
        node_id: str,
        known_providers: Iterable[str],
        reports: Iterable[pb.ProviderLoadReport],
        now: float,
        in_flight: Optional[Mapping[str, int]] = None,
    ) -> list[str]:
        """Keep the readings of ``reports`` for providers in ``known_providers``; return their ids.

        Unknown provider ids are ignored; a provider reported as not known
        loses its reading. A reading that arrives already stale is kept
        (for its parallelism) but not fresh. ``in_flight``: the Edge's
        requests on each provider now (for a saturated engine's lease limit).
        """
        known = set(known_providers)
        updated: list[str] = []
        for report in reports:
            provider_id = report.provider_id
            if provider_id not in known:
                continue
            reading = checked_reading(report.load, now)
            key = (node_id, provider_id)
            if reading is None:
                self.forget_provider(node_id, provider_id)
            else:
                self._readings[key] = reading
                self._by_node.setdefault(node_id, set()).add(provider_id)
                if self.stale_in(reading, now) > 0:
                    self._fresh[key] = reading
                    rule = self.rule
                    if rule.saturated(reading) or (key in self._saturated and not rule.recovered(reading)):
                        ours = (in_flight or {}).get(provider_id, reading.busy())
                        self._saturated[key] = rule.lease_limit(reading, ours)
                    else:
                        self._saturated.pop(key, None)
                else:
                    self.expire(node_id, provider_id)
            updated.append(provider_id)
        return updated

    def stale_in(self, reading: EngineReading, now: float) -> float:
        """Seconds until ``reading`` stops counting (0 or less: it is stale)."""
        return reading.read_at + self.rule.stale_after_seconds - now

    def expire(self, node_id: str, provider_id: str) -> None:
        """The provider's reading reached its age bound: it counts as unknown now."""
        key = (node_id, provider_id)
        self._fresh.pop(key, None)
        self._saturated.pop(key, None)

    def forget_node(self, node_id: str) -> None:
        """``node_id`` disconnected: its readings go with it."""
        for provider_id in list(self._by_node.pop(node_id, set())):
            self.forget_provider(node_id, provider_id)

    def forget_provider(self, node_id: str, provider_id: str) -> None:
        """A provider was removed from the configuration (or its engine no longer reports)."""
        self._readings.pop((node_id, provider_id), None)
        self.expire(node_id, provider_id)
        self._by_node.get(node_id, set()).discard(provider_id)

    def last(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """The last reading, whatever its age."""
        return self._readings.get((node_id, provider_id))

    def fresh(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """The last reading if it is not older than the rule's bound."""
        return self._fresh.get((node_id, provider_id))

    def saturated(self, node_id: str, provider_id: str) -> bool:
        """Whether the fresh reading is over a threshold (unknown is never saturated)."""
        return (node_id, provider_id) in self._saturated

    def lease_limit(self, node_id: str, provider_id: str) -> Optional[int]:
        """How many requests the Edge may have in flight on a saturated engine; ``None`` when not saturated."""
        return self._saturated.get((node_id, provider_id))

    def parallel(self, node_id: str, provider_id: str) -> int:
        """The engine's parallelism from its last reading; 0 when unknown."""
        reading = self._readings.get((node_id, provider_id))
        return reading.parallel if reading is not None else 0
