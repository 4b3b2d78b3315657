"""Provider pool: leases, admission queues, drain, and property tests."""

from __future__ import annotations

from typing import Optional

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from twisted.internet.defer import Deferred

from twisted_iop.edge.config import ProviderConfig
from twisted_iop.edge.pool import Lease, LeaseError, NoSuchModel, ProviderPool

P1 = ProviderConfig("p1", "mock", ("m",), capacity=2, long_context_capacity=1)
P2 = ProviderConfig("p2", "mock", ("m", "x"), capacity=1, long_context_capacity=0)


def ready_pool() -> ProviderPool:
    """Two ready nodes: n1 with p1, n2 with p2."""
    pool = ProviderPool()
    pool.configure_node("n1", [P1])
    pool.configure_node("n2", [P2])
    pool.set_node_ready("n1", True)
    pool.set_node_ready("n2", True)
    return pool


def test_leases_respect_capacity_and_spread() -> None:
    """Leases go to the least loaded provider and stop at total capacity."""
    pool = ready_pool()
    leases = [pool.try_acquire("m") for _ in range(3)]
    assert all(lease is not None for lease in leases)
    assert pool.try_acquire("m") is None
    assert pool.counters("n1", "p1").in_flight == 2
    assert pool.counters("n2", "p2").in_flight == 1


def test_release_twice_is_an_error() -> None:
    """Releasing a lease twice raises LeaseError."""
    pool = ready_pool()
    lease = pool.try_acquire("x")
    assert lease is not None
    pool.release(lease)
    with pytest.raises(LeaseError):
        pool.release(lease)


def test_queue_pressure_and_grant_on_release() -> None:
    """Waiting requests count as queued on each candidate and get freed capacity in order."""
    pool = ready_pool()
    held = [pool.try_acquire("m") for _ in range(3)]
    first = pool.admit("m")
    second = pool.admit("m")
    assert not first.called
    assert pool.counters("n1", "p1").queued == 2
    assert pool.counters("n2", "p2").queued == 2
    got: list[Lease] = []
    first.addCallback(got.append)
    lease = held[0]
    assert lease is not None
    pool.release(lease)
    assert len(got) == 1 and not second.called
    assert pool.counters("n1", "p1").queued == 1


def test_cancel_leaves_queue() -> None:
    """Cancelling a waiting admission removes its pressure."""
    pool = ready_pool()
    for _ in range(3):
        pool.try_acquire("m")
    waiting = pool.admit("m")
    waiting.addErrback(lambda f: None)
    waiting.cancel()
    assert pool.counters("n1", "p1").queued == 0
    assert pool.queued_total() == 0


def test_long_context_is_a_separate_class() -> None:
    """Long-context leases use their own capacity and queue."""
    pool = ready_pool()
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
    pool = ready_pool()
    failures: list[Exception] = []
    pool.admit("nope").addErrback(lambda f: failures.append(f.value))
    assert isinstance(failures[0], NoSuchModel)


def test_drained_node_takes_no_new_leases() -> None:
    """A drained node keeps its leases but takes no new ones until undrained."""
    pool = ready_pool()
    held = pool.try_acquire("x")
    assert held is not None
    pool.set_node_drained("n2", True)
    assert pool.try_acquire("x") is None
    assert pool.counters("n2", "p2").in_flight == 1
    waiting = pool.admit("x")
    assert pool.counters("n2", "p2").queued == 0  # a drained node is no candidate
    pool.set_node_drained("n2", False)
    assert not waiting.called  # still full
    pool.release(held)
    assert waiting.called


def test_node_loss_drops_leases_and_release_is_harmless() -> None:
    """Leases of a node that stops being ready are lost; releasing one is not an error."""
    pool = ready_pool()
    lease = pool.try_acquire("x")
    assert lease is not None
    pool.set_node_ready("n2", False)
    assert lease.lost and pool.counters("n2", "p2").in_flight == 0
    pool.release(lease)
    with pytest.raises(LeaseError):
        pool.release(lease)


def test_unusable_provider_is_skipped() -> None:
    """An unhealthy provider takes no new leases."""
    pool = ready_pool()
    pool.set_provider_usable("n2", "p2", False)
    assert pool.try_acquire("x") is None


def test_reconfigure_keeps_counters_and_adds_providers() -> None:
    """configure_node keeps in-flight counts of kept providers and adds new ones."""
    pool = ready_pool()
    lease = pool.try_acquire("x")
    assert lease is not None
    p3 = ProviderConfig("p3", "mock", ("x",), capacity=3)
    pool.configure_node("n2", [P2, p3])
    assert pool.counters("n2", "p2").in_flight == 1
    assert pool.counters("n2", "p3").capacity == 3
    assert pool.try_acquire("x") is not None


class PoolMachine(RuleBasedStateMachine):
    """Acquire, admit, cancel, release, drain and node loss in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = ProviderPool()
        self.pool.configure_node("n1", [P1])
        self.pool.configure_node("n2", [P2])
        self.held: list[Lease] = []
        self.released: list[Lease] = []
        self.waiting: list[Deferred[Lease]] = []

    def _granted(self, lease: Lease) -> Lease:
        self.held.append(lease)
        return lease

    @rule(model=st.sampled_from(["m", "x"]), long_context=st.booleans())
    def acquire(self, model: str, long_context: bool) -> None:
        """Try for a lease now."""
        lease: Optional[Lease] = self.pool.try_acquire(model, long_context)
        if lease is not None:
            self.held.append(lease)

    @rule(model=st.sampled_from(["m", "x"]), long_context=st.booleans())
    def admit(self, model: str, long_context: bool) -> None:
        """Wait for a lease."""
        d = self.pool.admit(model, long_context)
        d.addCallback(self._granted)
        d.addErrback(lambda f: None)
        if not d.called:
            self.waiting.append(d)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Give up waiting."""
        pending = [d for d in self.waiting if not d.called]
        if pending:
            data.draw(st.sampled_from(pending)).cancel()

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

    @rule(node=st.sampled_from(["n1", "n2"]), ready=st.booleans())
    def set_ready(self, node: str, ready: bool) -> None:
        """A node comes or goes; leases of a lost node are lost."""
        self.pool.set_node_ready(node, ready)

    @rule(node=st.sampled_from(["n1", "n2"]), drained=st.booleans())
    def drain(self, node: str, drained: bool) -> None:
        """Drain or undrain a node."""
        self.pool.set_node_drained(node, drained)

    @invariant()
    def counters_are_sane(self) -> None:
        """No negative counters, in_flight within capacity, counts match held leases."""
        for node, provider in (("n1", "p1"), ("n2", "p2")):
            c = self.pool.counters(node, provider)
            assert 0 <= c.in_flight <= c.capacity
            assert 0 <= c.long_context_in_flight <= c.long_context_capacity
            assert c.queued >= 0 and c.long_context_queued >= 0
            live = [l for l in self.held if not l.lost and (l.node_id, l.provider_id) == (node, provider)]
            assert c.in_flight == sum(1 for l in live if not l.long_context)
            assert c.long_context_in_flight == sum(1 for l in live if l.long_context)

    @invariant()
    def no_waiter_could_be_served(self) -> None:
        """Nobody waits while a provider could serve the head of their queue."""
        for model in ("m", "x"):
            for long_context in (False, True):
                if self.pool.queued_total(long_context) and any(not d.called for d in self.waiting):
                    waiting_here = self.pool._queues.get((model, long_context))
                    if waiting_here:
                        assert self.pool._pick(model, long_context) is None


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
