"""The provider pool: leases per provider and admission queues per model.

This is the Edge's request-path API (no I/O). A caller asks for a lease on
a model with :meth:`ProviderPool.try_acquire` (now or never) or
:meth:`ProviderPool.admit` (a Deferred that waits in the model's admission
queue), and gives it back with :meth:`ProviderPool.release`.

Two lease classes share the pool: *general* leases count against a
provider's ``capacity``, *long-context* leases against its separate
``long_context_capacity`` and wait in their own queue, so long prompts never
starve short ones. Waiting requests show as ``queued`` pressure on every
provider that could serve them.

The pool holds only leases and queues. Whether a provider may take new work
(its Node dispatch-ready and not drained, the provider healthy or degraded,
its engine not saturated, the provider not cooling down) and what its
engine says of its own load are owned by the
:class:`~twisted_iop.edge.nodes.registry.NodeRegistry`; the pool asks it through
the read-only :class:`Availability` interface whenever it places work, and
the registry calls :meth:`ProviderPool.reconsider` (or
:meth:`ProviderPool.node_lost`) when the answer may have changed, so
waiting requests are admitted as soon as capacity appears.

Placement: the least loaded eligible provider, where a provider's load is
``max(its leases, its engine's running + waiting) / capacity`` (the
engine's figures only from a fresh reading); equals take turns (the turn
rotates per model), so two idle providers share the work. A provider with
``capacity: auto`` takes as many general leases as its engine says it runs
at once (``parallel``), and 1 until the engine says. A retried request
names the providers that already failed it (``avoid``) and is placed
elsewhere.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Optional, Protocol

import attrs
from twisted.internet.defer import Deferred

from twisted_iop.edge.config import ProviderConfig
from twisted_iop.edge.providers.load import EngineReading

#: A provider's key: (node id, provider id).
ProviderKey = tuple[str, str]
_NOTHING: frozenset[ProviderKey] = frozenset()


class Availability(Protocol):
    """What the pool asks before it places work (answered by the node registry)."""

    def node_takes_work(self, node_id: str) -> bool:
        """Whether ``node_id`` is dispatch-ready and not drained."""

    def provider_takes_work(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider may take new work (health, saturation, cool-down)."""

    def engine_load(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """The engine's fresh reading of its own load, ``None`` when unknown or stale."""

    def engine_parallel(self, node_id: str, provider_id: str) -> int:
        """Requests the engine says it runs at once; 0 when it has not said."""


class EverythingAvailable:
    """The :class:`Availability` of a pool with no registry: every provider takes work."""

    def node_takes_work(self, node_id: str) -> bool:
        """Always true."""
        return True

    def provider_takes_work(self, node_id: str, provider_id: str) -> bool:
        """Always true."""
        return True

    def engine_load(self, node_id: str, provider_id: str) -> Optional[EngineReading]:
        """Never known."""
        return None

    def engine_parallel(self, node_id: str, provider_id: str) -> int:
        """Never known."""
        return 0


class LeaseError(Exception):
    """A lease was used wrongly (released twice, or not from this pool)."""


class NoSuchModel(Exception):
    """No configured provider serves the model in that lease class."""


@attrs.define(eq=False)
class Lease:
    """One unit of in-flight work held on one provider."""

    node_id: str
    provider_id: str
    model: str
    long_context: bool
    released: bool = False
    #: The provider went away (node lost, provider removed) while held.
    lost: bool = False


@attrs.frozen
class LeaseCounters:
    """The pool's counters for one provider, as the snapshot shows them."""

    capacity: int
    in_flight: int
    queued: int
    long_context_capacity: int
    long_context_in_flight: int
    long_context_queued: int


@attrs.define
class _Provider:
    node_id: str
    config: ProviderConfig
    key: ProviderKey
    in_flight: int = 0
    long_context_in_flight: int = 0
    leases: set[Lease] = attrs.field(factory=set)

    def in_flight_of(self, long_context: bool) -> int:
        return self.long_context_in_flight if long_context else self.in_flight


@attrs.define(eq=False)
class _Waiter:
    model: str
    long_context: bool
    deferred: Deferred[Lease]
    avoid: frozenset[ProviderKey] = _NOTHING


_QueueKey = tuple[str, bool]


class ProviderPool:
    """Leases and admission queues over every configured provider.

    ``availability`` answers whether a provider may take new work; without
    one (a pool used on its own) every configured provider may.
    """

    def __init__(self, availability: Optional[Availability] = None) -> None:
        self._availability: Availability = availability if availability is not None else EverythingAvailable()
        self._providers: dict[tuple[str, str], _Provider] = {}
        self._queues: dict[_QueueKey, deque[_Waiter]] = {}
        self._by_model: dict[str, list[_Provider]] = {}
        #: Per model, where the next placement starts looking (equals take turns).
        self._turn: dict[str, int] = {}

    # -- configuration and availability --------------------------------------

    def configure_node(self, node_id: str, providers: Iterable[ProviderConfig]) -> None:
        """Set the providers of ``node_id``; counters of kept providers stay.

        A removed provider's leases are marked lost.
        """
        self.configure_nodes({node_id: providers})

    def configure_nodes(self, nodes: Mapping[str, Iterable[ProviderConfig]]) -> None:
        """Set the providers of several nodes at once (one rebuild of the model index, one pump)."""
        wanted = {node_id: {p.provider_id: p for p in providers} for node_id, providers in nodes.items()}
        for key in [k for k in self._providers if k[0] in wanted and k[1] not in wanted[k[0]]]:
            self._drop_leases(self._providers.pop(key))
        for node_id, configs in wanted.items():
            for provider_id, config in configs.items():
                existing = self._providers.get((node_id, provider_id))
                if existing is None:
                    self._providers[(node_id, provider_id)] = _Provider(node_id, config, (node_id, provider_id))
                else:
                    existing.config = config
        self._by_model = {}
        for provider in self._providers.values():
            for model in dict.fromkeys(provider.config.models):
                self._by_model.setdefault(model, []).append(provider)
        self._turn = {}
        self._pump()

    def remove_node(self, node_id: str) -> None:
        """Forget ``node_id`` and its providers (their leases are lost)."""
        self.configure_node(node_id, ())

    @property
    def availability(self) -> Availability:
        """What the pool asks before it places work."""
        return self._availability

    def reconsider(self) -> None:
        """Availability may have changed: admit waiting requests that now fit.

        The registry calls this whenever a Node becomes ready, is drained or
        undrained, or a provider's health changes.
        """
        self._pump()

    def node_lost(self, node_id: str) -> None:
        """The Node stopped being dispatch-ready: its held leases are lost.

        The work went with the connection; releasing a lost lease later is
        harmless. Waiting requests are then reconsidered.
        """
        for provider in self._node_providers(node_id):
            self._drop_leases(provider)
        self._pump()

    # -- leases --------------------------------------------------------------

    def try_acquire(
        self, model: str, long_context: bool = False, avoid: frozenset[ProviderKey] = _NOTHING
    ) -> Optional[Lease]:
        """A lease on the least loaded eligible provider not in ``avoid``, or ``None`` now."""
        provider = self._pick(model, long_context, avoid)
        if provider is None:
            return None
        return self._grant(provider, model, long_context)

    def admit(
        self, model: str, long_context: bool = False, avoid: frozenset[ProviderKey] = _NOTHING
    ) -> Deferred[Lease]:
        """A Deferred lease: at once if possible, else after waiting in queue.

        Fails with :class:`NoSuchModel` when no configured provider could
        ever serve the model in that class. Cancelling the Deferred leaves
        the queue. A waiter is placed only on a provider not in ``avoid``.
        """
        if not any(self._serves(p, model, long_context) for p in self._providers.values()):
            d: Deferred[Lease] = Deferred()
            kind = "long-context " if long_context else ""
            d.errback(NoSuchModel(f"no provider serves {kind}model {model!r}"))
            return d
        key = (model, long_context)
        queue = self._queues.get(key)
        if not queue:
            lease = self.try_acquire(model, long_context, avoid)
            if lease is not None:
                done: Deferred[Lease] = Deferred()
                done.callback(lease)
                return done

        def cancel(_: Deferred[Lease]) -> None:
            waiting = self._queues.get(key)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._queues[key]

        waiter = _Waiter(model, long_context, Deferred(cancel), avoid)
        self._queues.setdefault(key, deque()).append(waiter)
        return waiter.deferred

    def release(self, lease: Lease) -> None:
        """Give a lease back; releasing twice is an error."""
        if lease.released:
            raise LeaseError(f"lease on {lease.node_id}/{lease.provider_id} was already released")
        lease.released = True
        if lease.lost:
            return
        provider = self._providers.get((lease.node_id, lease.provider_id))
        if provider is None or lease not in provider.leases:
            raise LeaseError(f"lease on {lease.node_id}/{lease.provider_id} is not held in this pool")
        provider.leases.discard(lease)
        if lease.long_context:
            provider.long_context_in_flight -= 1
        else:
            provider.in_flight -= 1
        self._pump()

    # -- counters ------------------------------------------------------------

    def counters(self, node_id: str, provider_id: str) -> LeaseCounters:
        """The counters of one provider (zeros when it is not configured)."""
        provider = self._providers.get((node_id, provider_id))
        if provider is None:
            return LeaseCounters(0, 0, 0, 0, 0, 0)
        return LeaseCounters(
            capacity=self._capacity(provider, False),
            in_flight=provider.in_flight,
            queued=self._pressure(provider, False),
            long_context_capacity=provider.config.long_context_capacity,
            long_context_in_flight=provider.long_context_in_flight,
            long_context_queued=self._pressure(provider, True),
        )

    def in_flight(self, node_id: str, provider_id: str) -> int:
        """General-class leases held on one provider (0 when it is not configured)."""
        provider = self._providers.get((node_id, provider_id))
        return provider.in_flight if provider is not None else 0

    def queued_total(self, long_context: Optional[bool] = None) -> int:
        """Requests waiting in admission queues (one class, or both)."""
        return sum(len(q) for (model, lc), q in self._queues.items() if long_context is None or lc == long_context)

    def in_flight_total(self) -> int:
        """Leases held over the whole pool (both classes)."""
        return sum(p.in_flight + p.long_context_in_flight for p in self._providers.values())

    def queued(self, model: str, long_context: bool = False) -> int:
        """Requests waiting in the admission queue of ``model`` in one class."""
        return len(self._queues.get((model, long_context), ()))

    def could_grant(self, model: str, long_context: bool = False) -> bool:
        """Whether a lease on ``model`` in that class is free right now."""
        return self._pick(model, long_context, _NOTHING) is not None

    def another_takes_work(self, model: str, long_context: bool, avoid: frozenset[ProviderKey]) -> bool:
        """Whether a provider not in ``avoid`` serves ``model`` in that class and takes work now
        (free or not: a retry may wait for it)."""
        return any(
            p.key not in avoid and self._capacity(p, long_context) > 0 and self._available(p)
            for p in self._by_model.get(model, ())
        )

    def eligible(self, node_id: str, provider_id: str) -> bool:
        """Whether the provider would take a new lease of some class now."""
        provider = self._providers.get((node_id, provider_id))
        return provider is not None and self._available(provider)

    # -- internals -----------------------------------------------------------

    def _node_providers(self, node_id: str) -> list[_Provider]:
        return [p for (n, _), p in self._providers.items() if n == node_id]

    def _available(self, provider: _Provider) -> bool:
        availability = self._availability
        return availability.node_takes_work(provider.node_id) and availability.provider_takes_work(
            provider.node_id, provider.config.provider_id
        )

    def _capacity(self, provider: _Provider, long_context: bool) -> int:
        config = provider.config
        if long_context:
            return config.long_context_capacity
        if config.capacity_auto:
            return self._availability.engine_parallel(provider.node_id, config.provider_id) or config.capacity
        return config.capacity

    def _serves(self, provider: _Provider, model: str, long_context: bool) -> bool:
        # ``capacity: auto`` always serves the general class (1 until the engine says).
        return model in provider.config.models and (
            provider.config.long_context_capacity > 0 if long_context else provider.config.capacity > 0
        )

    def _pick(self, model: str, long_context: bool, avoid: frozenset[ProviderKey]) -> Optional[_Provider]:
        providers = self._by_model.get(model)
        if not providers:
            return None
        start = self._turn.get(model, 0) % len(providers)
        availability = self._availability
        best: Optional[_Provider] = None
        best_load = 0.0
        # Starting at the model's turn and taking only a strictly lower
        # load, equals take turns instead of the first configured winning.
        for provider in providers[start:] + providers[:start] if start else providers:
            if avoid and provider.key in avoid:
                continue
            config = provider.config
            if long_context:
                capacity = config.long_context_capacity
                used = provider.long_context_in_flight
            else:
                capacity = config.capacity
                if config.capacity_auto:
                    capacity = availability.engine_parallel(provider.node_id, config.provider_id) or capacity
                used = provider.in_flight
            if used >= capacity or not (
                availability.node_takes_work(provider.node_id)
                and availability.provider_takes_work(provider.node_id, config.provider_id)
            ):
                continue
            engine = availability.engine_load(provider.node_id, config.provider_id)
            load = (used if engine is None else max(used, engine.running + engine.waiting)) / capacity
            if best is None or load < best_load:
                best, best_load = provider, load
                if load == 0.0:
                    break  # nothing beats an idle provider
        return best

    def _grant(self, provider: _Provider, model: str, long_context: bool) -> Lease:
        self._turn[model] = self._turn.get(model, 0) + 1
        lease = Lease(provider.node_id, provider.config.provider_id, model, long_context)
        provider.leases.add(lease)
        if long_context:
            provider.long_context_in_flight += 1
        else:
            provider.in_flight += 1
        return lease

    def _drop_leases(self, provider: _Provider) -> None:
        for lease in provider.leases:
            lease.lost = True
        provider.leases.clear()
        provider.in_flight = 0
        provider.long_context_in_flight = 0

    def _pressure(self, provider: _Provider, long_context: bool) -> int:
        if not self._availability.node_takes_work(provider.node_id):
            return 0
        if self._capacity(provider, long_context) == 0:
            return 0
        return sum(len(self._queues.get((model, long_context), ())) for model in set(provider.config.models))

    def _pump(self) -> None:
        """Hand freed capacity to waiters, oldest first within each queue."""
        progress = True
        while progress:
            progress = False
            for key in list(self._queues):
                queue = self._queues.get(key)
                if not queue:
                    self._queues.pop(key, None)
                    continue
                model, long_context = key
                # The oldest waiter first; one that must avoid the only free
                # provider waits (and holds its queue) until another frees.
                provider = self._pick(model, long_context, queue[0].avoid)
                if provider is None:
                    continue
                waiter = queue.popleft()
                if not queue:
                    del self._queues[key]
                lease = self._grant(provider, model, long_context)
                progress = True
                waiter.deferred.callback(lease)
