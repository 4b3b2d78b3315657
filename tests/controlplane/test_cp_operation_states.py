"""The operation state machine with plain calls: transitions in any order,
late outcomes, and another replica's copies (legal, stale or forged),
checked against a model of the rules written out here."""

from __future__ import annotations

from itertools import pairwise
from typing import Optional

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.requests.operation_states import (
    ACCEPTED,
    ANSWER_STATES,
    FAILED,
    RUNNING,
    SENT,
    SUCCEEDED,
    TERMINAL_STATES,
    TIMED_OUT,
    LateOutcome,
    adopt,
    begin,
    follows,
)

#: The model: the in-flight order, and what ends an operation.
ORDER = [SENT, ACCEPTED, RUNNING]
ENDS = {"succeeded", "failed", "rejected", "timed_out", "edge_disconnected", "superseded"}
ANSWERS = {"succeeded", "failed", "rejected"}
#: Every state, and one no rule names.
STATES = [*ORDER, *sorted(ENDS), "bogus"]


def legal(current: str, state: str) -> bool:
    """The model's rule: forward from an in-flight state, never from an end."""
    return current in ORDER and (state in ENDS or (state in ORDER and ORDER.index(state) > ORDER.index(current)))


def operation(operation_id: str = "op-1") -> OperationRecord:
    """A just-dispatched operation (begun: ``sent`` at its creation)."""
    record = OperationRecord(operation_id, "edge-1", "node.drain", "node-1", {}, "", 1.0, 11.0)
    assert begin(record)
    return record


def test_the_model_and_the_module_agree_on_every_pair() -> None:
    """follows() is the model's rule, for every pair of states."""
    assert ENDS == TERMINAL_STATES and ANSWERS == ANSWER_STATES
    for current in STATES:
        for state in STATES:
            assert follows(current, state) is legal(current, state), (current, state)


def test_begin_happens_once() -> None:
    """A begun operation is not begun again (its history keeps one ``sent``)."""
    record = operation()
    assert not begin(record)
    assert record.history == [(SENT, 1.0, "")] and record.updated_at == 1.0


class OperationStatesMachine(RuleBasedStateMachine):
    """Transitions, late outcomes and copies from another replica, in any order.

    The model: the state moves only as :func:`legal` says; an end is final
    and sets ``finished_at``; the history is a legal walk from ``sent``
    ending at the state, and only grows; a late outcome is kept only after
    the end, once, and only for an answer state.
    """

    def __init__(self) -> None:
        super().__init__()
        self.record = operation()
        self.state = SENT
        self.late: Optional[LateOutcome] = None
        self.ended_at: Optional[float] = None
        self.history = list(self.record.history)
        self.now = 1.0

    def _moved(self, state: str, at: float) -> None:
        self.state = state
        if state in ENDS:
            self.ended_at = at

    @rule(state=st.sampled_from(STATES), reason=st.sampled_from(["", "why"]))
    def advance(self, state: str, reason: str) -> None:
        self.now += 1
        expected = legal(self.state, state)
        assert self.record.advance(state, self.now, reason, {"k": "v"} if reason else None) is expected
        if expected:
            self._moved(state, self.now)

    @rule(state=st.sampled_from(STATES))
    def late_answer(self, state: str) -> None:
        outcome = LateOutcome(state, "late", {}, self.now)
        expected = self.state in ENDS and self.late is None and state in ANSWERS
        assert self.record.note_late_outcome(outcome) is expected
        if expected:
            self.late = outcome

    @rule(walk=st.lists(st.sampled_from(STATES), max_size=4), late=st.sampled_from([None, *STATES]))
    def adopt_a_walked_copy(self, walk: list[str], late: Optional[str]) -> None:
        """Another replica's record of the operation, moved through the rules."""
        copy = operation()
        for at, state in enumerate(walk, start=int(self.now) + 1):
            copy.advance(state, float(at), f"by {state}")
        if late is not None:
            copy.note_late_outcome(LateOutcome(late, "late there", {}, self.now))
        self._adopt(copy)

    @rule(
        state=st.sampled_from(STATES),
        history=st.lists(st.tuples(st.sampled_from(STATES), st.floats(0, 100), st.just("")), max_size=4),
        finished_at=st.sampled_from([None, 50.0]),
        late=st.sampled_from([None, *STATES]),
    )
    def adopt_a_forged_copy(
        self, state: str, history: list[tuple[str, float, str]], finished_at: Optional[float], late: Optional[str]
    ) -> None:
        """A copy read from the store with any state and history (the codec checks shapes, not rules)."""
        copy = OperationRecord(
            "op-1",
            "edge-1",
            "node.drain",
            "node-1",
            {},
            "",
            1.0,
            11.0,
            state=state,
            updated_at=40.0,
            finished_at=finished_at,
            history=history,
            late_outcome=None if late is None else LateOutcome(late, "forged", {}, 40.0),
        )
        self._adopt(copy)

    def _adopt(self, copy: OperationRecord) -> None:
        moves = legal(self.state, copy.state)
        if moves:
            self._moved(copy.state, copy.finished_at if copy.finished_at is not None else copy.updated_at)
        late = copy.late_outcome
        keeps_late = late is not None and self.state in ENDS and self.late is None and late.state in ANSWERS
        if keeps_late:
            self.late = late
        assert adopt(self.record, copy) is (moves or keeps_late)

    @invariant()
    def the_state_is_the_models(self) -> None:
        record = self.record
        assert record.state == self.state
        assert record.finished is (self.state in ENDS)
        assert record.finished_at == self.ended_at
        assert record.late_outcome == self.late
        if record.late_outcome is not None:
            assert record.finished and record.late_outcome.state in ANSWERS

    @invariant()
    def the_history_is_a_legal_walk_that_only_grows(self) -> None:
        history = self.record.history
        assert history[: len(self.history)] == self.history
        assert history[0][0] == SENT and history[-1][0] == self.record.state
        assert all(legal(a[0], b[0]) for a, b in pairwise(history))
        self.history = list(history)


TestOperationStatesMachine = OperationStatesMachine.TestCase


def test_a_copy_that_is_behind_changes_nothing() -> None:
    """A stale copy (``accepted``) of a ``running`` operation leaves it running."""
    kept, copy = operation(), operation()
    kept.advance(RUNNING, 3.0)
    copy.advance(ACCEPTED, 2.0)
    assert not adopt(kept, copy)
    assert kept.state == RUNNING and [h[0] for h in kept.history] == [SENT, RUNNING]


def test_a_copy_ahead_carries_its_history_and_end() -> None:
    """A copy that went further moves the kept record there, with the copy's steps."""
    kept, copy = operation(), operation()
    copy.advance(ACCEPTED, 2.0)
    copy.advance(SUCCEEDED, 3.0, "done", {"k": "v"})
    assert adopt(kept, copy)
    assert (kept.state, kept.reason, kept.result, kept.finished_at) == (SUCCEEDED, "done", {"k": "v"}, 3.0)
    assert kept.history == copy.history


def test_an_end_stays_and_a_late_outcome_is_kept_once() -> None:
    """A copy ending otherwise does not change an ended operation; its late
    outcome is kept once, a second one is not."""
    kept, copy = operation(), operation()
    kept.advance(TIMED_OUT, 5.0)
    copy.advance(FAILED, 4.0)
    copy.note_late_outcome(LateOutcome(SUCCEEDED, "late", {}, 6.0))
    assert adopt(kept, copy)
    assert kept.state == TIMED_OUT and kept.late_outcome == LateOutcome(SUCCEEDED, "late", {}, 6.0)
    other = operation()
    other.advance(TIMED_OUT, 5.0)
    other.note_late_outcome(LateOutcome(FAILED, "later", {}, 7.0))
    assert not adopt(kept, other)
    assert kept.late_outcome is not None and kept.late_outcome.state == SUCCEEDED
