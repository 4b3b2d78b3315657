"""A launched engine's lifecycle rules (pure): unit tests and a Hypothesis state machine."""

from __future__ import annotations

import signal
from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from twisted_iop.node.launch.config import RestartPolicy
from twisted_iop.node.launch.lifecycle import RUNNING_STATES, Do, EngineLifecycle, EngineState, Exit

POLICY = RestartPolicy(policy="always", initial_seconds=1, max_seconds=8, max_restarts=3, window_seconds=60)


def ready(lifecycle: EngineLifecycle, now: float = 0.0) -> EngineLifecycle:
    """Start ``lifecycle`` and make it ready at ``now``."""
    assert lifecycle.start(now) == [Do.SPAWN]
    lifecycle.readiness(now, ready=True)
    assert lifecycle.state is EngineState.READY
    return lifecycle


def test_start_loading_ready() -> None:
    """A start spawns once; a not-ready answer is loading with its reason; a ready one is ready."""
    lifecycle = EngineLifecycle(POLICY, start_timeout=30, stop_timeout=5)
    assert lifecycle.state is EngineState.STOPPED
    assert lifecycle.start(0) == [Do.SPAWN]
    assert lifecycle.state is EngineState.STARTING and lifecycle.deadline == 30
    assert lifecycle.start(1) == []  # already running: never a second process
    lifecycle.readiness(2, ready=False, reason="loading model")
    assert (lifecycle.state, lifecycle.reason, lifecycle.deadline) == (EngineState.LOADING, "loading model", 30)
    lifecycle.readiness(3, ready=True)
    assert lifecycle.state is EngineState.READY and lifecycle.deadline is None and lifecycle.since == 3


def test_crash_backs_off_doubling_up_to_the_maximum() -> None:
    """Crashes in a row wait 1, 2, 4 s...; being ready starts the streak over."""
    lifecycle = ready(EngineLifecycle(attrs_policy(max_restarts=10), start_timeout=30, stop_timeout=5))
    delays = []
    now = 0.0
    for _ in range(5):
        lifecycle.exited(now, Exit(signal=signal.SIGKILL))
        assert lifecycle.state is EngineState.CRASHED
        assert lifecycle.reason == "killed by signal 9 (SIGKILL)"
        assert lifecycle.next_try_at is not None
        delays.append(lifecycle.next_try_at - now)
        now = lifecycle.next_try_at
        assert lifecycle.timer_due(now) == [Do.SPAWN]
    assert delays == [1, 2, 4, 8, 8]
    assert lifecycle.restarts == 5
    lifecycle.readiness(now, ready=True)
    lifecycle.exited(now + 1, Exit(code=1))
    assert lifecycle.next_try_at == now + 2  # the streak starts over


def attrs_policy(**changes: object) -> RestartPolicy:
    """:data:`POLICY` with ``changes``."""
    import attrs

    return attrs.evolve(POLICY, **changes)  # type: ignore[arg-type]  # keyword values of mixed types


def test_restart_limit_in_the_window_fails_until_told() -> None:
    """Past max_restarts restarts within the window it is failed, and a start clears the count."""
    lifecycle = EngineLifecycle(POLICY, start_timeout=30, stop_timeout=5)
    lifecycle.start(0)
    now = 0.0
    for _ in range(3):
        lifecycle.exited(now, Exit(code=1))
        assert lifecycle.state is EngineState.CRASHED
        now = lifecycle.next_try_at or now
        lifecycle.timer_due(now)
    lifecycle.exited(now, Exit(code=1))
    assert lifecycle.state is EngineState.FAILED
    assert lifecycle.reason == "exited with code 1; 3 restarts within 60s: the limit"
    assert lifecycle.timer_due(now + 1000) == [] and lifecycle.deadline is None
    assert lifecycle.start(now + 1) == [Do.SPAWN]
    assert lifecycle.restarts == 0


def test_restarts_older_than_the_window_do_not_count() -> None:
    """Crashes spread wider than the window never reach the limit."""
    lifecycle = EngineLifecycle(POLICY, start_timeout=30, stop_timeout=5)
    lifecycle.start(0)
    now = 0.0
    for _ in range(10):
        lifecycle.exited(now, Exit(code=1))
        assert lifecycle.state is EngineState.CRASHED
        now += 61
        lifecycle.timer_due(now)
        lifecycle.readiness(now, ready=True)


def test_policies_never_and_on_failure() -> None:
    """never: a crash is failed; on-failure: a clean exit is stopped, a failure restarts."""
    never = EngineLifecycle(attrs_policy(policy="never"), 30, 5)
    never.start(0)
    never.exited(1, Exit(code=2))
    assert never.state is EngineState.FAILED and never.reason == "exited with code 2; restart policy never"
    on_failure = EngineLifecycle(attrs_policy(policy="on-failure"), 30, 5)
    on_failure.start(0)
    on_failure.exited(1, Exit(code=0))
    assert on_failure.state is EngineState.STOPPED
    on_failure.start(2)
    on_failure.exited(3, Exit(code=1))
    assert on_failure.state is EngineState.CRASHED
    always = EngineLifecycle(POLICY, 30, 5)
    always.start(0)
    always.exited(1, Exit(code=0))
    assert always.state is EngineState.CRASHED


def test_stop_signals_then_kills_and_stays_down() -> None:
    """stop: the signal, SIGKILL at the stop timeout, stopped once it exits; no restart follows."""
    lifecycle = ready(EngineLifecycle(POLICY, 30, 5))
    assert lifecycle.stop(10, "stop asked by provider.stop") == [Do.SIGNAL]
    assert lifecycle.state is EngineState.STOPPING and lifecycle.deadline == 15
    assert lifecycle.timer_due(14) == []
    assert lifecycle.timer_due(15) == [Do.KILL]
    assert lifecycle.deadline is None
    lifecycle.exited(16, Exit(signal=signal.SIGKILL))
    assert lifecycle.state is EngineState.STOPPED
    assert lifecycle.reason == "stop asked by provider.stop; killed by signal 9 (SIGKILL)"
    assert lifecycle.restarts == 0


def test_restart_stops_then_spawns_once_exited() -> None:
    """restart of a running engine: signal, then one spawn after its exit, not a crash."""
    lifecycle = ready(EngineLifecycle(POLICY, 30, 5))
    assert lifecycle.drain(1)
    assert lifecycle.state is EngineState.DRAINING
    assert lifecycle.restart(2) == [Do.SIGNAL]
    assert lifecycle.restart(3) == []
    assert lifecycle.exited(4, Exit(code=0)) == [Do.SPAWN]
    assert lifecycle.state is EngineState.STARTING and lifecycle.restarts == 0


def test_start_timeout_stops_it_as_a_crash() -> None:
    """Not ready within the start timeout: stopped, then crashed with that reason (restarted later)."""
    lifecycle = EngineLifecycle(POLICY, start_timeout=30, stop_timeout=5)
    lifecycle.start(0)
    lifecycle.readiness(1, ready=False, reason="loading model")
    assert lifecycle.timer_due(30) == [Do.SIGNAL]
    lifecycle.exited(31, Exit(signal=signal.SIGTERM))
    assert lifecycle.state is EngineState.CRASHED
    assert lifecycle.reason == "not ready within 30s of its start"


def test_a_ready_engine_that_stopped_answering_is_stopped_as_a_crash() -> None:
    """unresponsive: a ready engine gets its stop signal, then crashed with that reason; only when ready."""
    lifecycle = ready(EngineLifecycle(POLICY, 30, 5))
    reason = "not alive: 3 health checks failed (engine loop dead)"
    assert lifecycle.unresponsive(1, reason) == [Do.SIGNAL]
    assert lifecycle.unresponsive(1, reason) == []  # already stopping
    lifecycle.exited(2, Exit(signal=signal.SIGTERM))
    assert lifecycle.state is EngineState.CRASHED and lifecycle.reason == reason and lifecycle.crashes == 1


def test_spawn_failure_is_a_crash() -> None:
    """An executable that cannot run at all counts as a crash (and reaches failed at the limit)."""
    lifecycle = EngineLifecycle(attrs_policy(max_restarts=0), 30, 5)
    lifecycle.start(0)
    lifecycle.spawn_failed(0, "permission denied")
    assert lifecycle.state is EngineState.FAILED
    assert lifecycle.reason.startswith("cannot be started: permission denied")


def test_leftover_is_stopped_then_started() -> None:
    """A copy an earlier Node left is stopped (signal, kill at the timeout), then one engine starts."""
    lifecycle = EngineLifecycle(POLICY, 30, 5)
    assert lifecycle.leftover(0, "stopping the engine an earlier Node left running (pid 42)") == [Do.SIGNAL]
    assert lifecycle.state is EngineState.STOPPING
    assert lifecycle.start(0) == []  # the Node's own start waits for it
    assert lifecycle.timer_due(5) == [Do.KILL]
    assert lifecycle.exited(6, Exit()) == [Do.SPAWN]
    assert lifecycle.state is EngineState.STARTING


def test_stop_of_a_crashed_engine_cancels_its_restart() -> None:
    """stop while crashed: stopped at once, no timer left."""
    lifecycle = ready(EngineLifecycle(POLICY, 30, 5))
    lifecycle.exited(1, Exit(code=1))
    assert lifecycle.stop(2) == []
    assert lifecycle.state is EngineState.STOPPED and lifecycle.deadline is None


class LifecycleMachine(RuleBasedStateMachine):
    """Any interleaving of asks, exits, readiness answers and time keeps the rules."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = RestartPolicy(
            policy="always", initial_seconds=1, max_seconds=16, max_restarts=4, window_seconds=50
        )
        self.lifecycle = EngineLifecycle(self.policy, start_timeout=20, stop_timeout=3)
        self.now = 0.0
        self.processes = 0
        #: Times of crash restarts decided (for the window check).
        self.crash_restarts: list[float] = []

    def _do(self, call: Callable[..., list[Do]], *args: object) -> None:
        """Give the lifecycle one input at ``now``; check and carry out what it says to do."""
        restarts_before = self.lifecycle.restarts
        for action in call(self.now, *args):
            if action is Do.SPAWN:
                assert self.processes == 0, "a second process"
                self.processes = 1
            else:
                assert self.processes == 1, f"{action} without a process"
        if self.lifecycle.restarts == restarts_before + 1:
            self.crash_restarts.append(self.now)
        elif self.lifecycle.restarts == 0:
            self.crash_restarts.clear()

    @rule()
    def start(self) -> None:
        """An operator or the Node asks it to run."""
        self._do(self.lifecycle.start)

    @rule()
    def restart(self) -> None:
        """An operator asks for a restart."""
        self._do(self.lifecycle.restart)

    @rule()
    def stop(self) -> None:
        """An operator (or the Node's stop) asks it to stop."""
        self._do(self.lifecycle.stop)

    @rule()
    def drain(self) -> None:
        """A restart with drain begins."""
        self.lifecycle.drain(self.now)

    @precondition(lambda self: self.processes == 1)
    @rule(code=st.sampled_from([0, 1, 137, None]))
    def exits(self, code: int | None) -> None:
        """Its process ends (a code, or killed by a signal)."""
        how = Exit(code=code) if code is not None else Exit(signal=signal.SIGKILL)
        self.processes = 0
        self._do(self.lifecycle.exited, how)

    @rule(ready=st.booleans())
    def readiness(self, ready: bool) -> None:
        """Its readiness check answers."""
        self._do(self.lifecycle.readiness, ready, "loading model")

    @rule()
    def spawn_fails(self) -> None:
        """The spawn itself fails (the process never existed)."""
        if self.lifecycle.state is EngineState.STARTING and self.processes == 1:
            self.processes = 0
            self._do(self.lifecycle.spawn_failed, "no such file")

    @precondition(lambda self: self.processes == 0)
    @rule()
    def leftover_found(self) -> None:
        """A copy left by an earlier Node is found (it becomes the process being stopped)."""
        if self.lifecycle.state is not EngineState.STOPPED:
            return
        actions = self.lifecycle.leftover(self.now, "stopping a leftover")
        assert actions == [Do.SIGNAL]
        self.processes = 1
        self.crash_restarts.clear()

    @rule()
    def unresponsive(self) -> None:
        """Its liveness checks failed (counts only while ready)."""
        self._do(self.lifecycle.unresponsive, "not alive")

    @rule(seconds=st.sampled_from([0.5, 1, 3, 8, 30, 60]))
    def time_passes(self, seconds: float) -> None:
        """The clock moves on; a due timer fires."""
        self.now += seconds
        deadline = self.lifecycle.deadline
        if deadline is not None and deadline <= self.now:
            self._do(self.lifecycle.timer_due)

    @invariant()
    def one_process_exactly_while_running(self) -> None:
        """A process exists exactly in the running states."""
        assert (self.processes == 1) == (self.lifecycle.state in RUNNING_STATES), (
            self.processes,
            self.lifecycle.state,
        )

    @invariant()
    def a_timer_only_where_one_belongs(self) -> None:
        """Starting, loading and crashed always have a timer; ready, draining, stopped and failed never."""
        state = self.lifecycle.state
        if state in (EngineState.STARTING, EngineState.LOADING, EngineState.CRASHED):
            assert self.lifecycle.deadline is not None
        if state in (EngineState.READY, EngineState.DRAINING, EngineState.STOPPED, EngineState.FAILED):
            assert self.lifecycle.deadline is None

    @invariant()
    def crashed_waits_within_the_backoff(self) -> None:
        """A crashed engine's next try is between the initial and the maximum delay away."""
        lifecycle = self.lifecycle
        if lifecycle.state is EngineState.CRASHED:
            assert lifecycle.next_try_at is not None
            wait = lifecycle.next_try_at - lifecycle.since
            assert self.policy.initial_seconds <= wait <= self.policy.max_seconds

    @invariant()
    def never_more_restarts_in_a_window_than_allowed(self) -> None:
        """No window of window_seconds holds more than max_restarts crash restarts."""
        times = self.crash_restarts
        for i, start in enumerate(times):
            inside = [t for t in times[i:] if t < start + self.policy.window_seconds]
            assert len(inside) <= self.policy.max_restarts, times


TestLifecycleMachine = LifecycleMachine.TestCase
TestLifecycleMachine.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
