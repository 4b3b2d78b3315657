"""The inference request lifecycle over the real provider pool: plain cases and a
Hypothesis state machine (no lease leaks, counters in bounds, FIFO per queue)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from twisted_iop.edge.config import ProviderConfig
from twisted_iop.edge.inference.lifecycle import InferenceLifecycle, Outcome, Phase, QueueFull, Ticket
from twisted_iop.edge.providers.pool import NoSuchModel, ProviderPool

NODES = ("n1", "n2")
MODELS = ("m1", "m2")
PROVIDERS = {
    "n1": [ProviderConfig("a", "mock", ("m1",), capacity=2, long_context_capacity=1)],
    "n2": [ProviderConfig("b", "mock", ("m1", "m2"), capacity=1, long_context_capacity=0)],
}


class Switches:
    """The pool's availability, switched by hand (the node registry's role at a real Edge)."""

    def __init__(self) -> None:
        self.ready = dict.fromkeys(NODES, True)
        self.drained = dict.fromkeys(NODES, False)

    def node_takes_work(self, node_id: str) -> bool:
        """Ready and not drained."""
        return self.ready[node_id] and not self.drained[node_id]

    def provider_takes_work(self, node_id: str, provider_id: str) -> bool:
        """Every provider is healthy here."""
        return True

    def engine_load(self, node_id: str, provider_id: str) -> None:
        """No engine reports its load here."""
        return None

    def engine_parallel(self, node_id: str, provider_id: str) -> int:
        """No engine reports its parallelism here."""
        return 0


def make_pool() -> ProviderPool:
    """Two ready nodes: m1 on both, m2 on n2 only, long-context only on n1."""
    pool = ProviderPool(Switches())
    for node_id, providers in PROVIDERS.items():
        pool.configure_node(node_id, providers)
    return pool


def set_ready(pool: ProviderPool, node_id: str, ready: bool) -> None:
    """A Node becomes ready (waiting work is reconsidered) or is lost (its leases with it)."""
    switches = pool.availability
    assert isinstance(switches, Switches)
    switches.ready[node_id] = ready
    if ready:
        pool.reconsider()
    else:
        pool.node_lost(node_id)


def set_drained(pool: ProviderPool, node_id: str, drained: bool) -> None:
    """Drain or undrain a Node."""
    switches = pool.availability
    assert isinstance(switches, Switches)
    switches.drained[node_id] = drained
    pool.reconsider()


def test_lease_now_then_queue_then_full() -> None:
    """Capacity first, then the FIFO queue up to its bound, then QueueFull."""
    lifecycle = InferenceLifecycle(make_pool(), max_queued_per_model=1)
    granted: list[int] = []
    tickets = [lifecycle.submit("m2", False, lambda t: granted.append(t.inference_id)) for _ in range(2)]
    assert [t.phase for t in tickets] == [Phase.LEASED, Phase.QUEUED]
    with pytest.raises(QueueFull):
        lifecycle.submit("m2", False, lambda t: None)
    assert lifecycle.finish(tickets[0], Outcome.COMPLETED) is False
    assert tickets[1].phase is Phase.LEASED and granted == [1, 2]
    assert lifecycle.finish(tickets[1], Outcome.CLIENT_GONE) is True  # the Node must be told
    assert lifecycle.pool.in_flight_total() == 0


def test_no_long_context_provider_is_no_such_model() -> None:
    """m2 has no long-context capacity anywhere."""
    lifecycle = InferenceLifecycle(make_pool(), max_queued_per_model=5)
    with pytest.raises(NoSuchModel):
        lifecycle.submit("m2", True, lambda t: None)
    assert lifecycle.tickets == {}


def test_node_lost_before_output_requeues_while_retries_are_left() -> None:
    """A lost Node before any output sends the request back to its queue; with one retry, the second loss ends it."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5, max_retries=1)
    ticket = lifecycle.submit("m2", False, lambda t: None)
    set_ready(pool, "n2", False)
    assert lifecycle.node_lost(ticket) is True and ticket.phase is Phase.QUEUED
    set_ready(pool, "n2", True)
    assert ticket.phase is Phase.LEASED and ticket.attempts == 2
    set_ready(pool, "n2", False)
    assert lifecycle.node_lost(ticket) is False and ticket.outcome is Outcome.NODE_LOST
    set_ready(pool, "n2", True)
    assert pool.in_flight_total() == 0 and lifecycle.tickets == {}


def test_node_lost_after_output_is_not_retried() -> None:
    """Once output reached the client, a lost Node ends the request."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5)
    ticket = lifecycle.submit("m1", False, lambda t: None)
    lifecycle.first_output(ticket)
    assert lifecycle.node_lost(ticket) is False and ticket.outcome is Outcome.NODE_LOST
    assert pool.in_flight_total() == 0


def test_failed_before_output_is_retried_on_another_provider() -> None:
    """A provider that failed a request before its first output is avoided: the retry runs elsewhere."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5)
    grants: list[str] = []
    ticket = lifecycle.submit("m1", False, lambda t: grants.append(t.lease.node_id if t.lease else ""))
    first = grants[-1]
    assert lifecycle.failed_before_output(ticket) is True
    assert ticket.phase is Phase.LEASED and grants[-1] != first
    # Both providers of m1 failed it: nobody is left, the caller ends it with the error.
    assert lifecycle.failed_before_output(ticket) is False and ticket.phase is Phase.LEASED
    assert lifecycle.finish(ticket, Outcome.PROVIDER_ERROR) is False
    assert pool.in_flight_total() == 0 and lifecycle.tickets == {}


def test_failed_before_output_waits_for_the_other_provider_when_it_is_full() -> None:
    """The other provider is busy: the retry queues for it and never lands on the one that failed."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5)
    busy = lifecycle.submit("m1", False, lambda t: None)  # turn order: first on one provider
    ticket = lifecycle.submit("m1", False, lambda t: None)
    assert busy.lease is not None and ticket.lease is not None
    if ticket.lease.node_id == "n1":
        busy, ticket = ticket, busy  # make ``ticket`` the request on n2 (capacity 1)
    blocker = lifecycle.submit("m1", False, lambda t: None)  # n1's second slot
    assert blocker.lease is not None and blocker.lease.node_id == "n1"
    assert lifecycle.failed_before_output(ticket) is True and ticket.phase is Phase.QUEUED
    lifecycle.finish(busy, Outcome.COMPLETED)
    assert ticket.phase is Phase.LEASED and ticket.lease is not None and ticket.lease.node_id == "n1"


def test_no_retry_after_the_first_output() -> None:
    """Once output reached the client, a provider failure is not retried."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5)
    ticket = lifecycle.submit("m1", False, lambda t: None)
    lifecycle.first_output(ticket)
    assert lifecycle.failed_before_output(ticket) is False and ticket.phase is Phase.STREAMING


def test_retries_stop_at_max_retries() -> None:
    """With no retry allowed, a failure before output is the client's error at once."""
    pool = make_pool()
    lifecycle = InferenceLifecycle(pool, max_queued_per_model=5, max_retries=0)
    ticket = lifecycle.submit("m1", False, lambda t: None)
    assert lifecycle.failed_before_output(ticket) is False


class LifecycleMachine(RuleBasedStateMachine):
    """Random interleavings of requests, outcomes, node loss and drain."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool()
        self.lifecycle = InferenceLifecycle(self.pool, max_queued_per_model=3)
        self.live: list[Ticket] = []
        self.grants: list[Ticket] = []
        self.ready = dict.fromkeys(NODES, True)

    def _granted(self, ticket: Ticket) -> None:
        # FIFO: no older request of the same queue may still be waiting.
        for other in self.live:
            if (
                other is not ticket
                and other.phase is Phase.QUEUED
                and (other.model, other.long_context) == (ticket.model, ticket.long_context)
            ):
                assert other.sequence > ticket.sequence or ticket.sequence == 0, "FIFO violated"
        assert ticket.lease is not None
        assert (ticket.lease.node_id, ticket.lease.provider_id) not in ticket.avoid, (
            "placed on a provider that failed it"
        )
        assert ticket.attempts <= 1 + self.lifecycle.max_retries
        self.grants.append(ticket)

    @rule(model=st.sampled_from(MODELS), long_context=st.booleans())
    def submit(self, model: str, long_context: bool) -> None:
        """A client sends a request."""
        try:
            ticket = self.lifecycle.submit(model, long_context, self._granted)
        except (QueueFull, NoSuchModel):
            return
        self.live.append(ticket)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100), outcome=st.sampled_from(list(Outcome)))
    def finish(self, index: int, outcome: Outcome) -> None:
        """A request ends, however."""
        ticket = self.live[index % len(self.live)]
        self.lifecycle.finish(ticket, outcome)
        self.live.remove(ticket)

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def output(self, index: int) -> None:
        """A request's first output reaches its client."""
        self.lifecycle.first_output(self.live[index % len(self.live)])

    @precondition(lambda self: self.live)
    @rule(index=st.integers(0, 100))
    def fail_before_output(self, index: int) -> None:
        """A request's provider fails it (refused, overloaded): retried elsewhere, or it ends with the error."""
        ticket = self.live[index % len(self.live)]
        if ticket.phase is Phase.QUEUED:
            return
        if not self.lifecycle.failed_before_output(ticket):
            self.lifecycle.finish(ticket, Outcome.PROVIDER_ERROR)
            self.live.remove(ticket)

    @rule(node=st.sampled_from(NODES))
    def lose_node(self, node: str) -> None:
        """A Node's connection drops: the gateway reports each of its requests lost."""
        if not self.ready[node]:
            return
        self.ready[node] = False
        on_node = [t for t in self.live if t.lease is not None and t.lease.node_id == node]
        set_ready(self.pool, node, False)
        for ticket in on_node:
            if ticket.phase is Phase.FINISHED:
                continue
            if not self.lifecycle.node_lost(ticket):
                self.live.remove(ticket)

    @rule(node=st.sampled_from(NODES))
    def node_back(self, node: str) -> None:
        """The Node is ready again."""
        self.ready[node] = True
        set_ready(self.pool, node, True)

    @rule(node=st.sampled_from(NODES), drained=st.booleans())
    def drain(self, node: str, drained: bool) -> None:
        """Drain or undrain a Node."""
        set_drained(self.pool, node, drained)

    @invariant()
    def counters_in_bounds(self) -> None:
        """No provider is ever below 0 or above its capacity in either class."""
        for node_id, providers in PROVIDERS.items():
            for provider in providers:
                counters = self.pool.counters(node_id, provider.provider_id)
                assert 0 <= counters.in_flight <= counters.capacity
                assert 0 <= counters.long_context_in_flight <= counters.long_context_capacity

    @invariant()
    def no_lease_leaks(self) -> None:
        """Every held lease belongs to a live request, and the pool counts exactly those."""
        held = [t for t in self.live if t.lease is not None and not t.lease.lost and not t.lease.released]
        assert self.pool.in_flight_total() == len(held)
        for ticket in self.live:
            assert ticket.phase is not Phase.FINISHED
            assert (ticket.phase is Phase.QUEUED) == (ticket.lease is None)
        assert self.pool.queued_total() == sum(1 for t in self.live if t.phase is Phase.QUEUED)
        assert self.lifecycle.queued_total() == self.pool.queued_total()
        assert set(self.lifecycle.tickets) == {t.inference_id for t in self.live}

    def teardown(self) -> None:
        """Ending every live request leaves the pool empty."""
        for ticket in list(self.live):
            self.lifecycle.finish(ticket, Outcome.EDGE_STOPPING)
        assert self.pool.in_flight_total() == 0 and self.pool.queued_total() == 0


TestLifecycleMachine = LifecycleMachine.TestCase
TestLifecycleMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
