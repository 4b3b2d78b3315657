"""Provider pool over the node registry: leases, admission queues, drain, and property tests.

The registry owns readiness, drain and health; the pool only holds leases and
queues and asks the registry. So these tests drive the real registry (Nodes
connect, report health, are drained) and watch what the pool grants.
"""

from __future__ import annotations

from typing import Optional

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from twisted_iop.edge.config import NodeConfig, ProviderConfig
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.providers.pool import Lease, LeaseError, NoSuchModel, ProviderPool
from twisted_iop.edge.providers.states import USABLE_HEALTH
from twisted_iop.testing.configs import edge_config
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb

P1 = ProviderConfig("p1", "mock", ("m",), capacity=2, long_context_capacity=1)
P2 = ProviderConfig("p2", "mock", ("m", "x"), capacity=1, long_context_capacity=0)
PROVIDERS = {"n1": P1, "n2": P2}


def registry_with_nodes() -> NodeRegistry:
    """A registry configuring n1 (p1: m) and n2 (p2: m, x); nobody connected yet."""
    config = attrs.evolve(
        edge_config(), nodes=tuple(NodeConfig(node_id, providers=(p,)) for node_id, p in PROVIDERS.items())
    )
    return NodeRegistry(config, Clock())


def hello(node_id: str) -> pb.NodeHelloRequest:
    """The hello of ``node_id``, announcing its configured provider."""
    p = PROVIDERS[node_id]
    spec = pb.NodeProviderSpec(provider_id=p.provider_id, kind=p.kind, models=list(p.models))
    return pb.NodeHelloRequest(node_id=node_id, protocol_major=1, providers=[spec])


def report(node_id: str, health: int = pb.PROVIDER_HEALTH_HEALTHY) -> list[pb.ProviderHealthReport]:
    """One health report for the provider of ``node_id``."""
    return [pb.ProviderHealthReport(provider_id=PROVIDERS[node_id].provider_id, health=health)]  # type: ignore[arg-type]  # the stubs want the enum type; the health is its int value


def connect(registry: NodeRegistry, node_id: str, health: int = pb.PROVIDER_HEALTH_HEALTHY) -> int:
    """Accept a connection of ``node_id`` and make it ready; return its token."""
    token = registry.node_accepted(hello(node_id), FakeNodePeer())
    registry.node_ready(token, report(node_id, health))
    return token


def ready_registry() -> tuple[NodeRegistry, dict[str, int]]:
    """Both nodes connected, ready and healthy; their owner tokens."""
    registry = registry_with_nodes()
    return registry, {node_id: connect(registry, node_id) for node_id in PROVIDERS}


def test_leases_respect_capacity_and_spread() -> None:
    """Leases go to the least loaded provider and stop at total capacity."""
    registry, _ = ready_registry()
    pool = registry.pool
    leases = [pool.try_acquire("m") for _ in range(3)]
    assert all(lease is not None for lease in leases)
    assert pool.try_acquire("m") is None
    assert pool.counters("n1", "p1").in_flight == 2
    assert pool.counters("n2", "p2").in_flight == 1


def test_release_twice_is_an_error() -> None:
    """Releasing a lease twice raises LeaseError."""
    registry, _ = ready_registry()
    lease = registry.pool.try_acquire("x")
    assert lease is not None
    registry.pool.release(lease)
    with pytest.raises(LeaseError):
        registry.pool.release(lease)


def test_queue_pressure_and_grant_on_release() -> None:
    """Waiting requests count as queued on each candidate and get freed capacity in order."""
    registry, _ = ready_registry()
    pool = registry.pool
    held = [pool.try_acquire("m") for _ in range(3)]
    first = pool.admit("m")
    second = pool.admit("m")
    assert not first.called
    assert pool.counters("n1", "p1").queued == 2
    assert pool.counters("n2", "p2").queued == 2
    assert pool.queued("m") == 2
    got: list[Lease] = []
    first.addCallback(got.append)
    lease = held[0]
    assert lease is not None
    pool.release(lease)
    assert len(got) == 1 and not second.called
    assert pool.counters("n1", "p1").queued == 1


def test_cancel_leaves_queue() -> None:
    """Cancelling a waiting admission removes its pressure."""
    registry, _ = ready_registry()
    pool = registry.pool
    for _ in range(3):
        pool.try_acquire("m")
    waiting = pool.admit("m")
    waiting.addErrback(lambda f: None)
    waiting.cancel()
    assert pool.counters("n1", "p1").queued == 0
    assert pool.queued_total() == 0


def test_long_context_is_a_separate_class() -> None:
    """Long-context leases use their own capacity and queue."""
    registry, _ = ready_registry()
    pool = registry.pool
    lease = pool.try_acquire("m", long_context=True)
    assert lease is not None and lease.provider_id == "p1"
    assert pool.try_acquire("m", long_context=True) is None
    assert pool.try_acquire("m") is not None
    waiting = pool.admit("m", long_context=True)
    counters = pool.counters("n1", "p1")
    assert (counters.long_context_in_flight, counters.long_context_queued, counters.queued) == (1, 1, 0)
    # p2 has no long-context capacity: no pressure there.
    assert pool.counters("n2", "p2").long_context_queued == 0
    pool.release(lease)
    assert waiting.called


def test_unknown_model_fails_admission() -> None:
    """A model no provider serves fails at once."""
    registry, _ = ready_registry()
    failures: list[Failure] = []
    registry.pool.admit("nope").addErrback(failures.append)
    assert isinstance(failures[0].value, NoSuchModel)


def test_drained_node_takes_no_new_leases() -> None:
    """A drained node keeps its leases but takes no new ones until undrained."""
    registry, _ = ready_registry()
    pool = registry.pool
    held = pool.try_acquire("x")
    assert held is not None
    registry.set_drained("n2", True)
    assert pool.try_acquire("x") is None and not pool.eligible("n2", "p2")
    assert pool.counters("n2", "p2").in_flight == 1
    waiting = pool.admit("x")
    assert pool.counters("n2", "p2").queued == 0  # a drained node is no candidate
    registry.set_drained("n2", False)
    assert not waiting.called  # still full
    pool.release(held)
    assert waiting.called


def test_undrain_admits_waiting_requests_at_once() -> None:
    """Regression: a request queued while its only node was drained is granted on undrain."""
    registry, _ = ready_registry()
    registry.set_drained("n2", True)
    waiting = registry.pool.admit("x")
    assert not waiting.called
    registry.set_drained("n2", False)
    lease = waiting.result
    assert isinstance(lease, Lease) and (lease.node_id, lease.provider_id) == ("n2", "p2")


def test_node_becoming_ready_admits_waiting_requests() -> None:
    """A request queued before any node serving its model was ready gets the first ready one."""
    registry = registry_with_nodes()
    waiting = registry.pool.admit("x")
    token = registry.node_accepted(hello("n2"), FakeNodePeer())
    assert not waiting.called  # pending is not ready
    registry.node_ready(token, report("n2"))
    assert waiting.called and waiting.result.node_id == "n2"


def test_health_recovery_admits_waiting_requests() -> None:
    """A provider turning healthy again hands its capacity to the queue."""
    registry, tokens = ready_registry()
    registry.node_health(tokens["n2"], report("n2", pb.PROVIDER_HEALTH_UNHEALTHY))
    waiting = registry.pool.admit("x")
    assert not waiting.called
    registry.node_health(tokens["n2"], report("n2", pb.PROVIDER_HEALTH_DEGRADED))
    assert waiting.called


def test_node_loss_drops_leases_and_release_is_harmless() -> None:
    """Leases of a node that stops being ready are lost; releasing one is not an error."""
    registry, tokens = ready_registry()
    pool = registry.pool
    lease = pool.try_acquire("x")
    assert lease is not None
    registry.node_closed(tokens["n2"])
    assert lease.lost and pool.counters("n2", "p2").in_flight == 0
    pool.release(lease)
    with pytest.raises(LeaseError):
        pool.release(lease)


def test_unusable_provider_is_skipped() -> None:
    """An unhealthy provider takes no new leases."""
    registry, tokens = ready_registry()
    registry.node_health(tokens["n2"], report("n2", pb.PROVIDER_HEALTH_UNHEALTHY))
    assert registry.pool.try_acquire("x") is None


def test_reconfigure_keeps_counters_and_adds_providers() -> None:
    """A providers refresh keeps in-flight counts of kept providers and adds new ones (once probed)."""
    registry, tokens = ready_registry()
    pool = registry.pool
    lease = pool.try_acquire("x")
    assert lease is not None
    p3 = ProviderConfig("p3", "mock", ("x",), capacity=3)
    registry.replace_providers([NodeConfig("n2", providers=(P2, p3))])
    assert pool.counters("n2", "p2").in_flight == 1
    assert pool.counters("n2", "p3").capacity == 3
    assert pool.try_acquire("x") is None  # p3 is not probed yet
    registry.node_health(tokens["n2"], [pb.ProviderHealthReport(provider_id="p3", health=pb.PROVIDER_HEALTH_HEALTHY)])
    assert pool.try_acquire("x") is not None


def test_standalone_pool_treats_every_provider_as_available() -> None:
    """Without a registry the pool places work on any configured provider with room."""
    pool = ProviderPool()
    pool.configure_node("n1", [P1])
    assert pool.try_acquire("m") is not None and pool.try_acquire("m") is not None
    assert pool.try_acquire("m") is None and not pool.could_grant("m")


class PoolRegistryMachine(RuleBasedStateMachine):
    """Nodes connect, get superseded, close, drain and report health (and their launched
    engines' states) while provider commands hold and release providers and requests come
    and go.

    The registry is the only owner of readiness, drain and health; the
    invariants check that the pool never leaks or over-counts a lease, keeps
    every queue first-in first-out, and never places new work where the
    registry says no.
    """

    connections = Bundle("connections")

    def __init__(self) -> None:
        super().__init__()
        self.registry = registry_with_nodes()
        self.pool = self.registry.pool
        self.held: list[Lease] = []
        self.released: list[Lease] = []
        #: Waiting admissions per queue, oldest first.
        self.queues: dict[tuple[str, bool], list[Deferred[Lease]]] = {}

    # -- nodes ----------------------------------------------------------------

    @rule(target=connections, node=st.sampled_from(sorted(PROVIDERS)), ready=st.booleans())
    def open_connection(self, node: str, ready: bool) -> int:
        """A connection of ``node`` is accepted, and maybe becomes ready (superseding any owner)."""
        token = self.registry.node_accepted(hello(node), FakeNodePeer())
        if ready:
            self.registry.node_ready(token, report(node))
        return token

    @rule(token=connections)
    def become_ready(self, token: int) -> None:
        """A connection says it is ready (a stale or owner token changes nothing)."""
        node = self.registry.ownership.node_of(token)
        if node is not None:
            self.registry.node_ready(token, report(node))

    @rule(token=consumes(connections))
    def close(self, token: int) -> None:
        """A connection closes; only the owner's close loses the node and its leases."""
        self.registry.node_closed(token)

    @rule(
        token=connections,
        health=st.sampled_from(
            [
                pb.PROVIDER_HEALTH_HEALTHY,
                pb.PROVIDER_HEALTH_DEGRADED,
                pb.PROVIDER_HEALTH_UNHEALTHY,
                pb.PROVIDER_HEALTH_OFFLINE,
                pb.PROVIDER_HEALTH_UNKNOWN,
                pb.PROVIDER_HEALTH_UNSPECIFIED,
                99,
            ]
        ),
    )
    def health(self, token: int, health: int) -> None:
        """A connection reports health (only the owner's report counts; unknown values too)."""
        node = self.registry.ownership.node_of(token)
        if node is not None:
            self.registry.node_health(token, report(node, health))

    @rule(
        token=connections,
        state=st.sampled_from([*pb.EngineState.values(), 42]),
    )
    def launch(self, token: int, state: int) -> None:
        """A connection reports its provider healthy with a launched engine's state (any, unknown too)."""
        node = self.registry.ownership.node_of(token)
        if node is not None:
            (healthy,) = report(node)
            healthy.launch.state = state  # type: ignore[assignment]  # the stubs want the enum type; the state is its int value
            self.registry.node_health(token, [healthy])

    @rule(node=st.sampled_from(sorted(PROVIDERS)), held=st.booleans())
    def hold(self, node: str, held: bool) -> None:
        """A provider.* command holds the node's provider, or ends and releases it."""
        provider_id = PROVIDERS[node].provider_id
        if held:
            self.registry.providers.hold(node, provider_id, "provider.restart")
        else:
            self.registry.providers.release(node, provider_id)

    @rule(node=st.sampled_from(sorted(PROVIDERS)), drained=st.booleans())
    def drain(self, node: str, drained: bool) -> None:
        """Drain or undrain a node."""
        self.registry.set_drained(node, drained)

    # -- requests -------------------------------------------------------------

    def _check_placement(self, lease: Lease) -> None:
        registry = self.registry
        assert registry.is_ready(lease.node_id), "lease on a node that is not dispatch-ready"
        assert not registry.is_drained(lease.node_id), "lease on a drained node"
        health = registry.providers.health(lease.node_id, lease.provider_id)
        assert health is not None and health.health in USABLE_HEALTH, "lease on an unusable provider"
        assert health.launch is None or health.launch.ready, "lease on a launched engine that is not ready"
        assert registry.providers.held(lease.node_id, lease.provider_id) is None, "lease on a provider a command holds"
        assert not lease.lost and not lease.released

    @rule(model=st.sampled_from(["m", "x"]), long_context=st.booleans())
    def acquire(self, model: str, long_context: bool) -> None:
        """Try for a lease now; it is refused while anyone waits in that queue."""
        queued_before = self.pool.queued(model, long_context)
        lease: Optional[Lease] = self.pool.try_acquire(model, long_context)
        if lease is not None:
            assert queued_before == 0
            self._check_placement(lease)
            self.held.append(lease)

    @rule(model=st.sampled_from(["m", "x"]), long_context=st.booleans())
    def admit(self, model: str, long_context: bool) -> None:
        """Wait for a lease in the model's queue."""
        key = (model, long_context)
        d = self.pool.admit(model, long_context)

        def granted(lease: Lease) -> Lease:
            waiting = self.queues.get(key, [])
            if d in waiting:
                assert waiting[0] is d, "a later request was served before an earlier one"
                waiting.remove(d)
            self._check_placement(lease)
            self.held.append(lease)
            return lease

        failures: list[BaseException] = []
        d.addCallbacks(granted, lambda f: failures.append(f.value))
        if not d.called:
            self.queues.setdefault(key, []).append(d)
        else:
            # Only a model nobody serves in that class fails at once (x has no long-context capacity).
            assert not failures or (isinstance(failures[0], NoSuchModel) and key == ("x", True))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Give up waiting."""
        pending = [(key, d) for key, ds in self.queues.items() for d in ds]
        if pending:
            key, d = data.draw(st.sampled_from(pending))
            self.queues[key].remove(d)
            d.cancel()

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """Release a held lease (lost ones too)."""
        if self.held:
            lease = data.draw(st.sampled_from(self.held))
            self.held.remove(lease)
            self.pool.release(lease)
            self.released.append(lease)

    @rule(data=st.data())
    def release_twice(self, data: st.DataObject) -> None:
        """Releasing an already released lease is always an error."""
        if self.released:
            lease = data.draw(st.sampled_from(self.released))
            with pytest.raises(LeaseError):
                self.pool.release(lease)

    # -- invariants -----------------------------------------------------------

    @invariant()
    def counters_match_leases(self) -> None:
        """No negative counter, none above capacity, and in-flight equals the live leases held."""
        for node, provider in PROVIDERS.items():
            c = self.pool.counters(node, provider.provider_id)
            assert 0 <= c.in_flight <= c.capacity
            assert 0 <= c.long_context_in_flight <= c.long_context_capacity
            assert c.queued >= 0 and c.long_context_queued >= 0
            live = [lease for lease in self.held if not lease.lost and lease.node_id == node]
            assert c.in_flight == sum(1 for lease in live if not lease.long_context)
            assert c.long_context_in_flight == sum(1 for lease in live if lease.long_context)
        assert self.pool.in_flight_total() == sum(1 for lease in self.held if not lease.lost)

    @invariant()
    def queues_match_waiters(self) -> None:
        """The pool's queues hold exactly the requests still waiting."""
        for model in ("m", "x"):
            for long_context in (False, True):
                assert self.pool.queued(model, long_context) == len(self.queues.get((model, long_context), []))

    @invariant()
    def nobody_waits_for_free_capacity(self) -> None:
        """No request waits while a provider could serve its queue (undrain, ready and recovery included)."""
        for model in ("m", "x"):
            for long_context in (False, True):
                if self.pool.queued(model, long_context):
                    assert not self.pool.could_grant(model, long_context)

    @invariant()
    def unready_or_drained_nodes_show_no_pressure(self) -> None:
        """Only nodes that take work show queued pressure."""
        for node, provider in PROVIDERS.items():
            if not self.registry.is_ready(node) or self.registry.is_drained(node):
                c = self.pool.counters(node, provider.provider_id)
                assert c.queued == 0 and c.long_context_queued == 0

    def teardown(self) -> None:
        """Releasing every held lease leaves nothing in flight: no lease leaked."""
        for waiting in list(self.queues.values()):
            for d in list(waiting):
                waiting.remove(d)
                d.cancel()
        assert self.pool.queued_total() == 0
        while self.held:
            self.pool.release(self.held.pop())
        assert self.pool.in_flight_total() == 0


TestPoolRegistryMachine = PoolRegistryMachine.TestCase
TestPoolRegistryMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
