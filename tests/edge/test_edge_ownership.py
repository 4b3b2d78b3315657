"""Node ownership: pending/ready/owner rules, unit and property tests."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule
from twisted.internet.task import Clock

from twisted_iop.edge.nodes.ownership import NodeOwnership, TransitionKind


def test_first_connection_is_pending_then_ready() -> None:
    """A first connection is pending (node.pending) and becomes owner when ready."""
    clock = Clock()
    ownership = NodeOwnership(clock)
    token, transitions = ownership.open("n")
    assert [t.kind for t in transitions] == [TransitionKind.PENDING]
    assert ownership.owner("n") is None
    clock.advance(5)
    assert [t.kind for t in ownership.ready(token)] == [TransitionKind.READY]
    assert ownership.owner("n") == token
    assert ownership.owner_since("n") == 5


def test_second_connection_does_not_disturb_owner() -> None:
    """A second pending connection leaves the owner alone, and its close changes nothing."""
    ownership = NodeOwnership(Clock())
    first, _ = ownership.open("n")
    ownership.ready(first)
    second, transitions = ownership.open("n")
    assert transitions == []
    assert ownership.owner("n") == first
    assert ownership.close(second) == []
    assert ownership.owner("n") == first


def test_ready_second_connection_supersedes_owner() -> None:
    """When the second connection is ready it owns the node; the old one's close is stale."""
    ownership = NodeOwnership(Clock())
    first, _ = ownership.open("n")
    ownership.ready(first)
    second, _ = ownership.open("n")
    transitions = ownership.ready(second)
    assert [(t.kind, t.token) for t in transitions] == [
        (TransitionKind.SUPERSEDED, first),
        (TransitionKind.READY, second),
    ]
    assert transitions[0].replaced_by == second
    assert ownership.close(first) == []
    assert ownership.owner("n") == second


def test_owner_close_disconnects() -> None:
    """Only the owner's close is a node.disconnected transition."""
    clock = Clock()
    ownership = NodeOwnership(clock)
    token, _ = ownership.open("n")
    ownership.ready(token)
    clock.advance(3)
    assert [t.kind for t in ownership.close(token)] == [TransitionKind.DISCONNECTED]
    assert ownership.owner("n") is None
    assert ownership.last_seen("n") == 3
    assert ownership.close(token) == []


def test_ready_twice_and_unknown_tokens_change_nothing() -> None:
    """Ready from the owner again, or from an unknown token, is no transition."""
    ownership = NodeOwnership(Clock())
    token, _ = ownership.open("n")
    ownership.ready(token)
    assert ownership.ready(token) == []
    assert ownership.ready(999) == []
    assert ownership.close(999) == []


class OwnershipMachine(RuleBasedStateMachine):
    """Connections of up to three nodes opened, readied and closed in any order."""

    tokens = Bundle("tokens")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.ownership = NodeOwnership(self.clock)
        self.owner: dict[str, int] = {}
        self.pending: dict[str, set[int]] = {}
        self.node_of: dict[int, str] = {}

    @rule(target=tokens, node=st.sampled_from(["a", "b", "c"]))
    def open(self, node: str) -> int:
        """Open a connection: node.pending only when the node had nothing."""
        had_nothing = node not in self.owner and not self.pending.get(node)
        token, transitions = self.ownership.open(node)
        assert [t.kind for t in transitions] == ([TransitionKind.PENDING] if had_nothing else [])
        self.pending.setdefault(node, set()).add(token)
        self.node_of[token] = node
        return token

    @rule(token=tokens)
    def ready(self, token: int) -> None:
        """Ready: a pending token takes over; anything else changes nothing."""
        node = self.node_of[token]
        before = self.owner.get(node)
        transitions = self.ownership.ready(token)
        if token in self.pending.get(node, set()):
            self.pending[node].discard(token)
            expected = []
            if before is not None:
                expected.append((TransitionKind.SUPERSEDED, before))
            expected.append((TransitionKind.READY, token))
            assert [(t.kind, t.token) for t in transitions] == expected
            self.owner[node] = token
        else:
            assert transitions == []
            assert self.ownership.owner(node) == before

    @rule(token=tokens)
    def close(self, token: int) -> None:
        """Close: only the owner's close is a transition; stale closes change nothing."""
        node = self.node_of[token]
        before = self.ownership.owner(node)
        transitions = self.ownership.close(token)
        if self.owner.get(node) == token:
            assert [(t.kind, t.token) for t in transitions] == [(TransitionKind.DISCONNECTED, token)]
            del self.owner[node]
        else:
            assert transitions == []
            assert self.ownership.owner(node) == before
            self.pending.get(node, set()).discard(token)

    @rule(seconds=st.floats(min_value=0, max_value=10))
    def tick(self, seconds: float) -> None:
        """Time passes."""
        self.clock.advance(seconds)

    @invariant()
    def at_most_one_owner(self) -> None:
        """Each node has at most one owner and it matches the model."""
        for node in ("a", "b", "c"):
            owners = [t for t, n in self.node_of.items() if n == node and self.ownership.is_owner(t)]
            assert len(owners) <= 1
            assert self.ownership.owner(node) == self.owner.get(node)
            assert self.ownership.pending(node) == frozenset(self.pending.get(node, set()))


TestOwnershipMachine = OwnershipMachine.TestCase
TestOwnershipMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
