"""Rollouts: one command to many edges, staged. The pure state machine.

A :class:`Rollout` holds everything about one rollout in one object (so a
store could keep and load it whole): its request, its strategy and abort
criteria, one :class:`Execution` per target edge, the current batch, and
the notices (``rollout.*`` event kinds) it has not yet handed out. Its
methods are the only transitions; nothing here does I/O or reads a clock
(``now`` is passed in), so a Hypothesis state machine drives it
(``tests/controlplane/test_cp_rollout_states.py``).

* **Batches.** Targets are taken in order, a batch at a time. Batch ``n``
  has ``base * increase_factor ** (n - 1)`` targets (rounded down, at least
  one), ``base`` being ``batch_size`` or ``batch_percent`` of the targets
  (rounded up); with neither, one batch of every target. Within a batch at
  most ``max_in_flight`` executions are in flight at once. The next batch
  starts once every execution of this one has ended, ``pause_seconds``
  after the last of them ended.
* **Executions.** ``pending`` until its turn; then ``in_flight`` (its
  operations dispatched), or, when its edge is not connected, ``waiting``
  (at most ``wait_seconds``, then ``skipped``) or at once ``skipped``
  (``disconnected: skip``). It ends ``succeeded``, ``failed``,
  ``timed_out``, ``skipped`` or ``cancelled`` (never dispatched: the
  rollout was cancelled or aborted first).
* **Abort criteria.** After every end: with ``any_failure``, the first
  failed or timed-out execution aborts; with ``failure_percent``, the
  failed and timed-out share of the executed ones (succeeded, failed or
  timed out) above that percentage, once at least ``min_executed`` were
  executed. An abort cancels what was not yet dispatched. With ``latency``
  (:class:`LatencyCriterion`), each execution that succeeded is *watched*:
  its edge's figure (``ttft_p95`` ...) after the execution is compared with
  the one before (the runner reads both and calls :meth:`Rollout.latency_judged`
  once ``min_requests`` ended since); a rise of more than
  ``max_increase_percent`` aborts, naming the edge and both figures. A watch
  that gets no verdict within ``watch_seconds`` ends without one
  (:meth:`Rollout.latency_unjudged`). A batch is done, and the rollout ends,
  only once nothing of it is in flight or watched.
* **Rollout states.** ``pending`` -> ``running`` <-> ``paused``; it ends
  ``succeeded`` (every execution succeeded or was skipped), ``failed``
  (some failed or timed out without meeting the criteria), ``aborted``
  (criteria met, with the reason) or ``cancelled`` (on request). An ended
  rollout dispatches nothing more; what was in flight still ends and is
  recorded (``finished_at`` is set once nothing is in flight).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Optional

import attrs

# -- execution states ---------------------------------------------------------------

PENDING = "pending"
WAITING = "waiting"
IN_FLIGHT = "in_flight"
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
SKIPPED = "skipped"
CANCELLED = "cancelled"
#: Every execution state, in the order views show their counts.
EXECUTION_STATES = (PENDING, WAITING, IN_FLIGHT, SUCCEEDED, FAILED, TIMED_OUT, SKIPPED, CANCELLED)
EXECUTION_TERMINAL = frozenset({SUCCEEDED, FAILED, TIMED_OUT, SKIPPED, CANCELLED})
#: The outcomes an in-flight execution may end with.
EXECUTION_OUTCOMES = frozenset({SUCCEEDED, FAILED, TIMED_OUT})

# -- rollout states ---------------------------------------------------------------------

RUNNING = "running"
PAUSED = "paused"
ABORTED = "aborted"
#: (PENDING, SUCCEEDED, FAILED and CANCELLED are shared with executions.)
ROLLOUT_STATES = (PENDING, RUNNING, PAUSED, SUCCEEDED, FAILED, ABORTED, CANCELLED)
ROLLOUT_TERMINAL = frozenset({SUCCEEDED, FAILED, ABORTED, CANCELLED})
#: The moves a request may make, and the states each may start from.
REQUESTED_MOVES: dict[str, frozenset[str]] = {
    "pause": frozenset({PENDING, RUNNING}),
    "resume": frozenset({PAUSED}),
    "cancel": frozenset({PENDING, RUNNING, PAUSED}),
}

#: ``disconnected``: what an execution does when its edge is not connected.
WAIT = "wait"
SKIP = "skip"

WAITED_TOO_LONG = "edge not connected within wait_seconds"
NOT_CONNECTED = "edge not connected at its turn (disconnected: skip)"


class InvalidTransition(Exception):
    """A requested move the rollout's state does not allow."""

    def __init__(self, rollout_id: str, move: str, state: str) -> None:
        super().__init__(f"rollout {rollout_id} is {state}: it cannot {move}")
        self.state = state


@attrs.frozen
class Strategy:
    """How fast a rollout goes."""

    batch_size: Optional[int] = None
    batch_percent: Optional[float] = None
    max_in_flight: int = 50
    pause_seconds: float = 0.0
    increase_factor: float = 1.0

    def base_size(self, targets: int) -> int:
        """The first batch's size for ``targets`` targets."""
        if self.batch_size is not None:
            return max(1, self.batch_size)
        if self.batch_percent is not None:
            return max(1, math.ceil(targets * self.batch_percent / 100.0))
        return max(1, targets)

    def batch_size_of(self, number: int, targets: int) -> int:
        """The size of batch ``number`` (from 1), before what is left cuts it."""
        size = self.base_size(targets) * self.increase_factor ** (number - 1)
        # Past the target count the exact figure does not matter (and may overflow).
        return max(1, int(min(size, float(max(targets, 1)))))


#: The latency figures a rollout may abort on: the metric's sketch and its quantile.
LATENCY_FIGURES: dict[str, tuple[str, float]] = {
    "ttft_p95": ("ttft", 0.95),
    "tpot_p95": ("tpot", 0.95),
    "duration_p95": ("duration", 0.95),
}


@attrs.frozen
class LatencyCriterion:
    """Abort when an executed edge's latency figure rose by more than ``max_increase_percent``."""

    metric: str
    max_increase_percent: float
    min_requests: int = 50
    #: How long an executed edge is watched at most for ``min_requests`` (then it passes without a verdict).
    watch_seconds: float = 600.0

    def reason(self, edge_id: str, before: Optional[float], after: Optional[float]) -> Optional[str]:
        """Why the figures ``before`` and ``after`` the execution on ``edge_id`` abort (None: they do not)."""
        if before is None or after is None or before <= 0:
            return None
        increase = 100.0 * (after - before) / before
        if increase <= self.max_increase_percent:
            return None
        return (
            f"edge {edge_id}: {self.metric} rose from {before * 1000:.1f} ms to {after * 1000:.1f} ms "
            f"(+{increase:.0f}% > abort.latency.max_increase_percent {self.max_increase_percent:g}%)"
        )


@attrs.frozen
class AbortCriteria:
    """When a rollout stops by itself."""

    failure_percent: Optional[float] = None
    min_executed: int = 0
    any_failure: bool = False
    latency: Optional[LatencyCriterion] = None

    def reason(self, executed: int, failures: int) -> Optional[str]:
        """Why a rollout with these figures aborts (None: it goes on)."""
        if self.any_failure and failures:
            return f"{failures} execution(s) failed or timed out (abort.any_failure)"
        if self.failure_percent is None or executed < max(self.min_executed, 1):
            return None
        share = 100.0 * failures / executed
        if share > self.failure_percent:
            return (
                f"{failures} of {executed} executions failed or timed out ({share:.1f}% > "
                f"abort.failure_percent {self.failure_percent:g}%, min_executed {self.min_executed})"
            )
        return None


@attrs.frozen
class RolloutCommand:
    """The command each target edge runs: a node ``target``, or one per node matching ``node_selector``."""

    name: str
    target: str = ""
    node_selector: str = ""
    arguments: dict[str, str] = attrs.field(factory=dict)


@attrs.define(eq=False)
class Execution:
    """The command on one target edge."""

    edge_id: str
    state: str = PENDING
    operation_ids: list[str] = attrs.field(factory=list)
    reason: str = ""
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    #: When it began waiting for its edge (state ``waiting``).
    waiting_since: Optional[float] = None
    #: With a latency criterion: its edge's figure before and after the execution (seconds).
    latency_before: Optional[float] = None
    latency_after: Optional[float] = None

    def enter(self, state: str) -> None:
        """Take ``state`` (the rollout keeps the counts: only it calls this)."""
        self.state = state

    def close(self, reason: str, now: float) -> None:
        """Note why and when it ended (after :meth:`enter` of a terminal state)."""
        self.reason = reason
        self.finished_at = now
        self.waiting_since = None


@attrs.frozen
class Notice:
    """Something to record as a ``rollout.*`` event."""

    kind: str
    message: str
    attributes: dict[str, str] = attrs.field(factory=dict)


@attrs.define(eq=False)
class Rollout:
    """One rollout, whole: request, executions, batch, state and notices."""

    rollout_id: str
    command: RolloutCommand
    selector: str
    strategy: Strategy
    abort: AbortCriteria
    timeout_seconds: float
    disconnected: str
    wait_seconds: float
    created_at: float
    #: Target edge ids, in dispatch order.
    targets: list[str]
    idempotency_key: str = ""
    requested_by: str = ""
    state: str = PENDING
    reason: Optional[str] = None
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    executions: dict[str, Execution] = attrs.field(factory=dict)
    counts: dict[str, int] = attrs.field(factory=dict)
    #: The current batch: its number (0: none yet), its size, and where it
    #: starts and ends in ``targets``.
    batch_number: int = 0
    batch_start: int = 0
    batch_end: int = 0
    #: Executions of the current batch not yet dispatched (pending or waiting), in order.
    open: dict[str, None] = attrs.field(factory=dict)
    #: Executions of the current batch not yet ended.
    unfinished: int = 0
    #: When the next batch may start (the pause after the last one).
    next_batch_at: Optional[float] = None
    notices: list[Notice] = attrs.field(factory=list)
    #: Executions that succeeded and are watched for a latency verdict: edge id -> until when.
    watching: dict[str, float] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if not self.executions:
            self.executions = {edge_id: Execution(edge_id) for edge_id in self.targets}
        if not self.counts:
            self.counts = dict.fromkeys(EXECUTION_STATES, 0)
            self.counts[PENDING] = len(self.targets)
        self._notice("rollout.created", f"rollout of {self.command.name} to {len(self.targets)} edge(s) created")

    # -- figures ----------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        """Whether the rollout reached a terminal state (in-flight executions may still end)."""
        return self.state in ROLLOUT_TERMINAL

    @property
    def settled(self) -> bool:
        """Whether it ended and nothing is in flight any more."""
        return self.ended and self.counts[IN_FLIGHT] == 0

    @property
    def progress(self) -> float:
        """Ended executions over targets (1.0 for a rollout without targets)."""
        if not self.targets:
            return 1.0
        ended = sum(self.counts[state] for state in EXECUTION_TERMINAL)
        return ended / len(self.targets)

    @property
    def quiet(self) -> bool:
        """Whether nothing of the current batch is in flight, open or watched."""
        return self.unfinished == 0 and not self.watching

    @property
    def batch_size(self) -> int:
        """The current batch's size (0: none yet)."""
        return self.batch_end - self.batch_start

    def take_notices(self) -> list[Notice]:
        """The notices not yet handed out, oldest first (then forgotten)."""
        notices, self.notices = self.notices, []
        return notices

    # -- requested moves ----------------------------------------------------------------

    def start(self, now: float) -> None:
        """pending -> running (the first batch starts at the next :meth:`step`)."""
        if self.state != PENDING:
            raise InvalidTransition(self.rollout_id, "start", self.state)
        self.state = RUNNING
        self.started_at = now
        self.next_batch_at = now
        self._notice("rollout.started", "rollout started")
        self._end_if_done(now)

    def pause(self, now: float) -> None:
        """running (or pending) -> paused: nothing new is dispatched; in flight goes on."""
        self._check("pause")
        self.state = PAUSED
        self._notice("rollout.paused", "rollout paused")

    def resume(self, now: float) -> None:
        """paused -> running (pending, if it had not started)."""
        self._check("resume")
        self.state = RUNNING if self.started_at is not None else PENDING
        self._notice("rollout.resumed", "rollout resumed")
        self._end_if_done(now)

    def cancel(self, now: float) -> None:
        """-> cancelled: what was not dispatched is cancelled; in flight ends and is recorded."""
        self._check("cancel")
        self._stop(CANCELLED, None, "rollout cancelled", now)

    def _check(self, move: str) -> None:
        if self.state not in REQUESTED_MOVES[move]:
            raise InvalidTransition(self.rollout_id, move, self.state)

    # -- the clock's moves -----------------------------------------------------------------

    def step(self, now: float, connected: Callable[[str], bool], limit: Optional[int] = None) -> list[str]:
        """What to dispatch now: the edges whose executions just went in flight (at most ``limit``).

        Waiting executions past ``wait_seconds`` are skipped; when the batch
        is done and its pause over, the next one starts; then, in order,
        open executions go in flight (connected edges) while fewer than
        ``max_in_flight`` are, or wait or are skipped (edges not connected).
        """
        if self.state != RUNNING:
            return []
        self._expire_waiting(now)
        self._expire_watching(now)
        if self.state != RUNNING:
            return []
        if self.quiet:
            self._batch_done(now)
            self._end_if_done(now)
            if self.next_batch_at is None or now < self.next_batch_at or self.batch_end >= len(self.targets):
                return []
            self._next_batch()
        chosen: list[str] = []
        room = self.strategy.max_in_flight - self.counts[IN_FLIGHT]
        if limit is not None:
            room = min(room, limit)
        # ``open`` is the waiting executions (their turn came), then the
        # pending ones in order: each window is what is waiting and as many
        # pending ones as there is room for.
        kept = 0
        while room > 0:
            window = list(islice(self.open, kept, kept + room))
            if not window:
                break
            for edge_id in window:
                execution = self.executions[edge_id]
                if connected(edge_id):
                    room -= 1
                    del self.open[edge_id]
                    execution.started_at = now
                    execution.waiting_since = None
                    self._move(execution, IN_FLIGHT)
                    chosen.append(edge_id)
                elif execution.state == WAITING:
                    kept += 1
                elif self.disconnected == SKIP:
                    self._finish(execution, SKIPPED, NOT_CONNECTED, now)
                else:
                    execution.waiting_since = now
                    self._move(execution, WAITING)
                    kept += 1
        if self.quiet:
            self._batch_done(now)
            self._end_if_done(now)
        return chosen

    def next_wake(self) -> Optional[float]:
        """When :meth:`step` may next have something to do by the clock alone
        (a pause ending, a wait running out); None: only when told."""
        if self.state != RUNNING:
            return None
        times = [self.executions[i].waiting_since or 0.0 for i in islice(self.open, self.counts[WAITING])]
        times = [since + self.wait_seconds for since in times]
        if self.quiet and self.next_batch_at is not None and self.batch_end < len(self.targets):
            times.append(self.next_batch_at)
        times.extend(self.watching.values())
        return min(times, default=None)

    def dispatched(self, edge_id: str, operation_ids: Iterable[str]) -> None:
        """Note the operations an in-flight execution was dispatched as."""
        self.executions[edge_id].operation_ids.extend(operation_ids)

    def execution_ended(self, edge_id: str, outcome: str, reason: str, now: float) -> None:
        """An in-flight execution ended ``outcome`` (succeeded, failed, timed_out,
        or skipped when there turned out to be nothing to run); then the abort
        criteria and the rollout's end are checked."""
        if outcome not in EXECUTION_OUTCOMES and outcome != SKIPPED:
            raise ValueError(f"not an execution outcome: {outcome!r}")
        execution = self.executions[edge_id]
        if execution.state != IN_FLIGHT:
            raise ValueError(f"execution of {edge_id} is {execution.state}, not in flight")
        self._finish(execution, outcome, reason, now)
        if self.state in (RUNNING, PAUSED):
            executed = self.counts[SUCCEEDED] + self.counts[FAILED] + self.counts[TIMED_OUT]
            why = self.abort.reason(executed, self.counts[FAILED] + self.counts[TIMED_OUT])
            if why is not None:
                self._stop(ABORTED, why, f"rollout aborted: {why}", now)
                return
            if outcome == SUCCEEDED and self.abort.latency is not None:
                self.watching[edge_id] = now + self.abort.latency.watch_seconds
            if self.quiet:
                self._batch_done(now)
        self._end_if_done(now)

    def latency_read_before(self, edge_id: str, before: Optional[float]) -> None:
        """Note an execution's edge figure before it ran (its recent window at dispatch)."""
        self.executions[edge_id].latency_before = before

    def latency_judged(self, edge_id: str, before: Optional[float], after: Optional[float], now: float) -> None:
        """A watched execution's figures before and after it: the watch ends,
        and the rollout aborts when the rise is over the criterion's."""
        if edge_id not in self.watching:
            return
        execution = self.executions[edge_id]
        execution.latency_before, execution.latency_after = before, after
        if before is None or after is None:
            self.latency_unjudged(edge_id, "no figure before the execution (no recent requests)", now)
            return
        del self.watching[edge_id]
        criterion = self.abort.latency
        why = None if criterion is None else criterion.reason(edge_id, before, after)
        if why is not None and self.state in (RUNNING, PAUSED):
            self._stop(ABORTED, why, f"rollout aborted: {why}", now)
            return
        self._watch_ended(now)

    def latency_unjudged(self, edge_id: str, reason: str, now: float) -> None:
        """A watched execution ends without a verdict (too few requests in time, no figures)."""
        if self.watching.pop(edge_id, None) is None:
            return
        self._notice("rollout.latency_unjudged", f"edge {edge_id}: no latency verdict: {reason}", edge_id=edge_id)
        self._watch_ended(now)

    def _watch_ended(self, now: float) -> None:
        if self.state in (RUNNING, PAUSED) and self.quiet:
            self._batch_done(now)
        self._end_if_done(now)

    # -- inside -------------------------------------------------------------------------------

    def _notice(self, kind: str, message: str, **attributes: str) -> None:
        attributes.setdefault("state", self.state)
        self.notices.append(Notice(kind, message, attributes))

    def _move(self, execution: Execution, state: str) -> None:
        self.counts[execution.state] -= 1
        self.counts[state] += 1
        execution.enter(state)

    def _finish(self, execution: Execution, state: str, reason: str, now: float) -> None:
        if execution.state != IN_FLIGHT:
            self.open.pop(execution.edge_id, None)
        self._move(execution, state)
        execution.close(reason, now)
        # Only the current batch's executions end this way (the next batch
        # starts once all of them ended; stopping cancels the rest).
        self.unfinished -= 1

    def _expire_waiting(self, now: float) -> None:
        # The waiting executions are the first of ``open``.
        for edge_id in list(islice(self.open, self.counts[WAITING])):
            execution = self.executions[edge_id]
            if execution.waiting_since is not None and now - execution.waiting_since >= self.wait_seconds:
                self._finish(execution, SKIPPED, WAITED_TOO_LONG, now)

    def _expire_watching(self, now: float) -> None:
        for edge_id, until in list(self.watching.items()):
            if now >= until:
                self.latency_unjudged(edge_id, "fewer than min_requests ended within watch_seconds", now)

    def _next_batch(self) -> None:
        self.batch_number += 1
        size = self.strategy.batch_size_of(self.batch_number, len(self.targets))
        self.batch_start = self.batch_end
        self.batch_end = min(len(self.targets), self.batch_start + size)
        self.open = dict.fromkeys(self.targets[self.batch_start : self.batch_end])
        self.unfinished = self.batch_end - self.batch_start
        self.next_batch_at = None
        self._notice(
            "rollout.batch_started",
            f"batch {self.batch_number} of {self.batch_size} edge(s) started",
            batch=str(self.batch_number),
            size=str(self.batch_size),
        )

    def _batch_done(self, now: float) -> None:
        if self.next_batch_at is None:
            self.next_batch_at = now + self.strategy.pause_seconds

    def _end_if_done(self, now: float) -> None:
        if self.state in (RUNNING, PAUSED) and self.quiet and self.batch_end >= len(self.targets):
            if self.counts[FAILED] or self.counts[TIMED_OUT]:
                why = f"{self.counts[FAILED]} execution(s) failed and {self.counts[TIMED_OUT]} timed out"
                self._stop(FAILED, why, f"rollout failed: {why}", now)
            else:
                self._stop(SUCCEEDED, None, "rollout succeeded", now)
        elif self.ended and self.finished_at is None and self.counts[IN_FLIGHT] == 0:
            self.finished_at = now

    def _stop(self, state: str, reason: Optional[str], message: str, now: float) -> None:
        """End the rollout ``state``: whatever was not dispatched is cancelled."""
        self.state = state
        self.reason = reason
        for edge_id in self.targets[self.batch_start :]:
            execution = self.executions[edge_id]
            if execution.state in (PENDING, WAITING):
                self._move(execution, CANCELLED)
                execution.close(message, now)
        self.open = {}
        self.watching = {}
        self.unfinished = self.counts[IN_FLIGHT]
        self.next_batch_at = None
        if self.counts[IN_FLIGHT] == 0:
            self.finished_at = now
        self._notice("rollout." + state, message, **({"reason": reason} if reason else {}))
