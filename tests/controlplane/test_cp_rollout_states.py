"""The rollout state machine (``rollout_states.py``), driven by Hypothesis.

Random strategies, abort criteria and fleets; random interleavings of the
clock, edges coming and going, executions ending, pause, resume and
cancel. After every step: never more in flight than ``max_in_flight``,
counts add up to the targets and agree with the executions, nothing is
dispatched while paused or after an end, and abort fires exactly when
its criteria are first met. At the end, the rollout is driven to its end
and every target has exactly one terminal execution state.
"""

from __future__ import annotations

import json
from typing import Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.controlplane.store import forms as stored_forms


def _rollout(targets: int, strategy: rs.Strategy, abort: rs.AbortCriteria, disconnected: str = rs.WAIT) -> rs.Rollout:
    return rs.Rollout(
        rollout_id="r1",
        command=rs.RolloutCommand("node.drain", "node-1"),
        selector="",
        strategy=strategy,
        abort=abort,
        timeout_seconds=10.0,
        disconnected=disconnected,
        wait_seconds=5.0,
        created_at=1000.0,
        targets=[f"edge-{i:03d}" for i in range(targets)],
    )


class RolloutMachine(RuleBasedStateMachine):
    """A rollout and a fleet whose edges come and go."""

    rollout: rs.Rollout
    now: float
    connected: set[str]
    in_flight: list[str]

    @initialize(
        count=st.integers(0, 25),
        size=st.one_of(st.none(), st.integers(1, 8)),
        percent=st.one_of(st.none(), st.floats(1, 100)),
        max_in_flight=st.integers(1, 5),
        pause=st.sampled_from([0.0, 1.0, 3.0]),
        factor=st.sampled_from([1.0, 1.5, 2.0]),
        failure_percent=st.one_of(st.none(), st.floats(0, 60)),
        min_executed=st.integers(0, 6),
        any_failure=st.booleans(),
        disconnected=st.sampled_from([rs.WAIT, rs.SKIP]),
        down=st.sets(st.integers(0, 24)),
        latency=st.booleans(),
    )
    def start(
        self,
        count: int,
        size: Optional[int],
        percent: Optional[float],
        max_in_flight: int,
        pause: float,
        factor: float,
        failure_percent: Optional[float],
        min_executed: int,
        any_failure: bool,
        disconnected: str,
        down: set[int],
        latency: bool,
    ) -> None:
        """A rollout over ``count`` edges, some of them down, started."""
        strategy = rs.Strategy(
            batch_size=size,
            batch_percent=None if size is not None else percent,
            max_in_flight=max_in_flight,
            pause_seconds=pause,
            increase_factor=factor,
        )
        criterion = rs.LatencyCriterion("ttft_p95", 20.0, 10, watch_seconds=5.0) if latency else None
        abort = rs.AbortCriteria(failure_percent, min_executed, any_failure, criterion)
        self.rollout = _rollout(count, strategy, abort, disconnected)
        self.now = 1000.0
        self.connected = {t for i, t in enumerate(self.rollout.targets) if i not in down}
        self.in_flight = []
        self.rollout.start(self.now)
        self._step()

    def _step(self) -> None:
        before = self.rollout.state
        chosen = self.rollout.step(self.now, self.connected.__contains__)
        if before != rs.RUNNING:
            assert chosen == [], f"dispatched while {before}"
        for edge_id in chosen:
            assert edge_id in self.connected
            assert self.rollout.executions[edge_id].state == rs.IN_FLIGHT
        self.in_flight.extend(chosen)

    def _criteria_met(self) -> bool:
        counts, abort = self.rollout.counts, self.rollout.abort
        failures = counts[rs.FAILED] + counts[rs.TIMED_OUT]
        executed = failures + counts[rs.SUCCEEDED]
        if abort.any_failure and failures:
            return True
        return (
            abort.failure_percent is not None
            and executed >= max(abort.min_executed, 1)
            and 100.0 * failures / executed > abort.failure_percent
        )

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 2.0, 6.0]))
    def tick(self, seconds: float) -> None:
        """The clock moves and the runner steps."""
        self.now += seconds
        self._step()

    @rule(index=st.integers(0, 24))
    def flip(self, index: int) -> None:
        """An edge connects or disconnects."""
        if index < len(self.rollout.targets):
            self.connected ^= {self.rollout.targets[index]}

    @precondition(lambda self: bool(self.in_flight))
    @rule(index=st.integers(0, 100), outcome=st.sampled_from([rs.SUCCEEDED, rs.SUCCEEDED, rs.FAILED, rs.TIMED_OUT]))
    def end(self, index: int, outcome: str) -> None:
        """An execution in flight ends; abort fires exactly when its criteria are first met."""
        edge_id = self.in_flight.pop(index % len(self.in_flight))
        going = self.rollout.state in (rs.RUNNING, rs.PAUSED)
        met_before = self._criteria_met()
        self.rollout.execution_ended(edge_id, outcome, "", self.now)
        if going:
            assert not met_before
            assert (self.rollout.state == rs.ABORTED) == self._criteria_met()
        self._step()

    @precondition(lambda self: bool(self.rollout.watching))
    @rule(index=st.integers(0, 100), after=st.sampled_from([0.05, 0.1, 0.119, 0.121, 0.5]))
    def judge(self, index: int, after: float) -> None:
        """A watched execution's latency is read (before 0.1 s): the rollout
        aborts exactly when the rise is over 20 %, else the watch ends."""
        watched = sorted(self.rollout.watching)
        edge_id = watched[index % len(watched)]
        going = self.rollout.state in (rs.RUNNING, rs.PAUSED)
        batch = self.rollout.batch_number
        self.rollout.latency_judged(edge_id, 0.1, after, self.now)
        assert edge_id not in self.rollout.watching
        if going:
            assert (self.rollout.state == rs.ABORTED) == (after > 0.12)
        if self.rollout.state == rs.ABORTED and going:
            assert edge_id in (self.rollout.reason or "") and "100.0 ms" in (self.rollout.reason or "")
        assert self.rollout.batch_number == batch
        self._step()

    @rule()
    def pause(self) -> None:
        """Pause is allowed from pending and running only; nothing is dispatched while paused."""
        state = self.rollout.state
        if state in rs.REQUESTED_MOVES["pause"]:
            self.rollout.pause(self.now)
            assert self.rollout.state == rs.PAUSED
            self.now += 10
            self._step()
        else:
            with pytest.raises(rs.InvalidTransition):
                self.rollout.pause(self.now)
            assert self.rollout.state == state

    @rule()
    def resume(self) -> None:
        """Resume is allowed from paused only."""
        state = self.rollout.state
        if state == rs.PAUSED:
            self.rollout.resume(self.now)
            assert self.rollout.state in (rs.RUNNING, rs.SUCCEEDED, rs.FAILED)
        else:
            with pytest.raises(rs.InvalidTransition):
                self.rollout.resume(self.now)
            assert self.rollout.state == state

    @rule()
    def cancel(self) -> None:
        """Cancel ends it: nothing pending or waiting is left; in flight stays in flight."""
        state = self.rollout.state
        flying = self.rollout.counts[rs.IN_FLIGHT]
        if state in rs.REQUESTED_MOVES["cancel"]:
            self.rollout.cancel(self.now)
            assert self.rollout.state == rs.CANCELLED
            assert self.rollout.counts[rs.IN_FLIGHT] == flying
            assert self.rollout.counts[rs.PENDING] == self.rollout.counts[rs.WAITING] == 0
        else:
            with pytest.raises(rs.InvalidTransition):
                self.rollout.cancel(self.now)

    @invariant()
    def bounded_and_counted(self) -> None:
        """At most max_in_flight in flight; counts add up and agree with the executions."""
        rollout = self.rollout
        assert rollout.counts[rs.IN_FLIGHT] <= rollout.strategy.max_in_flight
        assert sum(rollout.counts.values()) == len(rollout.targets)
        seen = dict.fromkeys(rs.EXECUTION_STATES, 0)
        for execution in rollout.executions.values():
            seen[execution.state] += 1
        assert seen == rollout.counts
        assert rollout.counts[rs.IN_FLIGHT] == len(self.in_flight)
        if rollout.ended:
            assert rollout.counts[rs.PENDING] == rollout.counts[rs.WAITING] == 0
            assert not rollout.watching
        # Only succeeded executions are watched, and only with a latency criterion;
        # while one is watched, its batch is not done.
        assert all(rollout.executions[e].state == rs.SUCCEEDED for e in rollout.watching)
        assert not rollout.watching or rollout.abort.latency is not None
        if rollout.watching:
            assert rollout.next_batch_at is None
        assert 0.0 <= rollout.progress <= 1.0

    def teardown(self) -> None:
        """Driven to its end, every target has exactly one terminal execution state."""
        if not hasattr(self, "rollout"):
            return
        rollout = self.rollout
        if rollout.state == rs.PAUSED:
            rollout.resume(self.now)
        self.connected = set(rollout.targets)
        for _ in range(4 * len(rollout.targets) + 10):
            if rollout.settled:
                break
            while self.in_flight:
                rollout.execution_ended(self.in_flight.pop(), rs.SUCCEEDED, "", self.now)
            self.now += 10
            self._step()
        assert rollout.settled
        assert all(e.state in rs.EXECUTION_TERMINAL for e in rollout.executions.values())
        assert rollout.finished_at is not None
        if rollout.state == rs.SUCCEEDED:
            assert rollout.counts[rs.SUCCEEDED] + rollout.counts[rs.SKIPPED] == len(rollout.targets)
        if rollout.state == rs.FAILED:
            assert rollout.counts[rs.FAILED] + rollout.counts[rs.TIMED_OUT] > 0


RolloutMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRolloutMachine = RolloutMachine.TestCase


def test_batches_grow_by_the_increase_factor_and_never_exceed_the_targets() -> None:
    """batch_size 2 doubling over 13 targets: batches of 2, 4, 7 (what was left)."""
    rollout = _rollout(13, rs.Strategy(batch_size=2, max_in_flight=100, increase_factor=2.0), rs.AbortCriteria())
    rollout.start(0.0)
    sizes = []
    for _ in range(5):
        chosen = rollout.step(0.0, lambda _: True)
        if not chosen:
            break
        sizes.append(len(chosen))
        for edge_id in chosen:
            rollout.execution_ended(edge_id, rs.SUCCEEDED, "", 0.0)
    assert sizes == [2, 4, 7]
    assert rollout.state == rs.SUCCEEDED and rollout.progress == 1.0


def test_batch_percent_rounds_up_and_pause_seconds_separates_batches() -> None:
    """batch_percent 25 of 10 targets is 3 a batch; the next waits pause_seconds after the last end."""
    rollout = _rollout(10, rs.Strategy(batch_percent=25.0, pause_seconds=5.0), rs.AbortCriteria())
    rollout.start(0.0)
    first = rollout.step(0.0, lambda _: True)
    assert len(first) == 3 and rollout.batch_size == 3
    for edge_id in first:
        rollout.execution_ended(edge_id, rs.SUCCEEDED, "", 1.0)
    assert rollout.step(5.9, lambda _: True) == []
    assert rollout.next_wake() == 6.0
    assert len(rollout.step(6.0, lambda _: True)) == 3 and rollout.batch_number == 2


def test_abort_names_its_reason_and_cancels_what_was_not_dispatched() -> None:
    """failure_percent 10 after min_executed 5: the fifth end with one failure aborts (20% > 10%)."""
    rollout = _rollout(20, rs.Strategy(max_in_flight=5), rs.AbortCriteria(failure_percent=10.0, min_executed=5))
    rollout.start(0.0)
    chosen = rollout.step(0.0, lambda _: True)
    rollout.execution_ended(chosen[0], rs.FAILED, "told to fail", 1.0)
    for edge_id in chosen[1:4]:
        rollout.execution_ended(edge_id, rs.SUCCEEDED, "", 1.0)
    assert rollout.state == rs.RUNNING
    rollout.execution_ended(chosen[4], rs.SUCCEEDED, "", 2.0)
    assert rollout.state == rs.ABORTED
    assert rollout.reason is not None and "1 of 5" in rollout.reason
    assert rollout.counts[rs.CANCELLED] == 15 and rollout.finished_at == 2.0
    kinds = [n.kind for n in rollout.take_notices()]
    assert kinds == ["rollout.created", "rollout.started", "rollout.batch_started", "rollout.aborted"]


def test_a_disconnected_edge_waits_then_is_skipped_or_dispatched_when_back() -> None:
    """wait_seconds 5: one edge back in time is dispatched; one that stays away is skipped."""
    rollout = _rollout(2, rs.Strategy(), rs.AbortCriteria())
    rollout.start(0.0)
    assert rollout.step(0.0, lambda _: False) == []
    assert rollout.counts[rs.WAITING] == 2 and rollout.next_wake() == 5.0
    assert rollout.step(3.0, lambda edge: edge == "edge-000") == ["edge-000"]
    rollout.step(5.0, lambda edge: False)
    assert rollout.executions["edge-001"].state == rs.SKIPPED
    rollout.execution_ended("edge-000", rs.SUCCEEDED, "", 6.0)
    assert rollout.state == rs.SUCCEEDED


def test_a_rollout_without_targets_succeeds_at_once() -> None:
    """No edge matched: it ends succeeded with progress 1."""
    rollout = _rollout(0, rs.Strategy(), rs.AbortCriteria())
    rollout.start(0.0)
    assert rollout.state == rs.SUCCEEDED and rollout.progress == 1.0 and rollout.settled


def test_dispatch_pace_bounds_what_goes_out_per_second() -> None:
    """The pace lets a tenth of a second's worth out at once, then one more per 1/rate seconds."""
    from twisted_iop.controlplane.rollouts.settings import DispatchPace

    pace = DispatchPace(1000.0)
    assert pace.allowed(0.0) == 100
    pace.took(100)
    assert pace.allowed(0.0) == 0
    assert 0.0 < pace.next_at(0.0) - 0.0 <= 0.003
    assert pace.allowed(0.05) == 50
    assert DispatchPace(0.0).allowed(0.0) is None


def test_step_dispatches_at_most_its_limit_and_the_rest_later() -> None:
    """A limit of 3 under max_in_flight 10: 3 go now, the next step takes 3 more; nothing is lost."""
    rollout = _rollout(10, rs.Strategy(max_in_flight=10), rs.AbortCriteria())
    rollout.start(0.0)
    first = rollout.step(0.0, lambda _: True, 3)
    second = rollout.step(0.0, lambda _: True, 3)
    assert len(first) == len(second) == 3 and not set(first) & set(second)
    rest = rollout.step(0.0, lambda _: True)
    assert len(rest) == 4
    for edge_id in first + second + rest:
        rollout.execution_ended(edge_id, rs.SUCCEEDED, "", 0.0)
    assert rollout.state == rs.SUCCEEDED


LATENCY = rs.LatencyCriterion("ttft_p95", 20.0, 50, watch_seconds=30.0)


def test_a_latency_watch_holds_the_batch_and_a_rise_aborts_naming_both_figures() -> None:
    """With abort.latency, a succeeded execution is watched: the next batch
    waits for its verdict; a fine one lets the rollout go on, a rise over
    20 % aborts with the edge and both figures, cancelling the rest."""
    rollout = _rollout(3, rs.Strategy(batch_size=1), rs.AbortCriteria(latency=LATENCY))
    rollout.start(0.0)
    (first,) = rollout.step(0.0, lambda _: True)
    rollout.latency_read_before(first, 0.1)
    rollout.execution_ended(first, rs.SUCCEEDED, "", 1.0)
    assert rollout.watching == {first: 31.0} and rollout.step(2.0, lambda _: True) == []
    assert rollout.next_wake() == 31.0
    rollout.latency_judged(first, 0.1, 0.115, 3.0)
    (second,) = rollout.step(3.0, lambda _: True)
    rollout.execution_ended(second, rs.SUCCEEDED, "", 4.0)
    rollout.latency_judged(second, 0.1, 0.3, 5.0)
    assert rollout.state == rs.ABORTED and rollout.settled
    assert rollout.reason == (
        f"edge {second}: ttft_p95 rose from 100.0 ms to 300.0 ms (+200% > abort.latency.max_increase_percent 20%)"
    )
    assert rollout.counts[rs.CANCELLED] == 1 and not rollout.watching
    assert (rollout.executions[second].latency_before, rollout.executions[second].latency_after) == (0.1, 0.3)


def test_a_watch_without_a_verdict_passes_when_its_time_runs_out_or_no_figure_was_before() -> None:
    """Too few requests within watch_seconds, or no figure before, end the
    watch without a verdict (an event says so) and the rollout succeeds."""
    rollout = _rollout(2, rs.Strategy(), rs.AbortCriteria(latency=LATENCY))
    rollout.start(0.0)
    one, two = rollout.step(0.0, lambda _: True)
    rollout.execution_ended(one, rs.SUCCEEDED, "", 1.0)
    rollout.execution_ended(two, rs.SUCCEEDED, "", 1.0)
    rollout.latency_judged(two, None, 0.5, 2.0)
    assert rollout.state == rs.RUNNING and list(rollout.watching) == [one]
    rollout.take_notices()
    rollout.step(31.0, lambda _: True)
    assert rollout.state == rs.SUCCEEDED
    kinds = [n.kind for n in rollout.take_notices()]
    assert kinds.count("rollout.latency_unjudged") == 1 and "rollout.succeeded" in kinds


def test_a_rollout_with_a_latency_criterion_and_watches_round_trips_its_stored_form() -> None:
    """The stored form keeps the criterion, the watches and the figures; an
    older stored execution (without figures) still reads."""
    rollout = _rollout(2, rs.Strategy(), rs.AbortCriteria(latency=LATENCY))
    rollout.start(0.0)
    one, _ = rollout.step(0.0, lambda _: True)
    rollout.latency_read_before(one, 0.1)
    rollout.execution_ended(one, rs.SUCCEEDED, "", 1.0)
    value = stored_forms.rollout_dict(rollout)
    back = stored_forms.rollout_from(json.loads(json.dumps(value)))
    assert back.abort == rollout.abort and back.watching == rollout.watching
    assert back.executions[one].latency_before == 0.1
    value["executions"] = [row[:7] for row in value["executions"]]
    assert stored_forms.rollout_from(value).executions[one].latency_before is None
    value["abort"]["latency"]["metric"] = "p50"
    with pytest.raises(ValueError, match="bad latency metric"):
        stored_forms.rollout_from(value)
