"""The lifecycle of one engine the Node launches: pure rules, no I/O.

:class:`EngineLifecycle` holds where one launched engine is (its
:class:`EngineState`, the reason, restarts so far, the next try) and
decides what happens on each input: asked to start, stop, restart or
drain; its process spawned, failed to spawn or exited; its readiness
check answered; its timer due. Each input returns what the supervisor
must do now (:class:`Do`: spawn the process, send its stop signal, kill
it); the one timer a state needs is :attr:`EngineLifecycle.deadline`
(the start timeout while starting or loading, the kill while stopping,
the next try while crashed). The supervisor
(:mod:`twisted_iop.node.launch.supervisor`) does the I/O; a Hypothesis state
machine drives these rules (``tests/node/test_engine_lifecycle.py``), as
:mod:`twisted_iop.edge.nodes.ownership` is driven.

The rules:

* At most one process at a time: ``spawn`` only when none runs; a
  restart asked while one runs stops it first and spawns once it exited.
* ``starting`` (spawned, not yet asked) -> ``loading`` (it answered, not
  ready) -> ``ready`` (its check passed). Not ready within the start
  timeout: stopped, and that counts as a crash.
* An exit nobody asked for is a crash. Policy ``never``, or
  ``on-failure`` after a clean exit (code 0), keeps it down (``failed``,
  or ``stopped`` when clean). Otherwise it is ``crashed`` and started again
  after a delay that doubles with each crash in a row, from
  ``initial_seconds`` up to ``max_seconds`` (the streak starts over once
  it was ready). A crash that would be the ``max_restarts + 1``-th restart
  within ``window_seconds`` makes it ``failed`` instead: down until an
  operator starts (or restarts) it, which clears the count.
* A ready engine that failed its liveness checks is stopped, and that
  counts as a crash.
* ``stop``: the stop signal, SIGKILL after the stop timeout, ``stopped``
  once it exited; it stays down until started.
* A copy of the engine that an earlier Node left running (its pidfile
  says so) is stopped first, as a running process of this engine
  (``stopping``), and then started.
* ``drain`` (``ready`` -> ``draining``) only marks it: no new leases; the
  supervisor waits for its requests, then asks for the restart or stop.
"""

from __future__ import annotations

import enum
import signal
from collections import deque
from typing import Optional

import attrs

from twisted_iop.node.launch.config import RestartPolicy


class EngineState(enum.Enum):
    """Where a launched engine is (the names are the wire's, lower-case)."""

    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    CRASHED = "crashed"
    STOPPED = "stopped"
    FAILED = "failed"


#: States in which the engine's process exists.
RUNNING_STATES = frozenset(
    {EngineState.STARTING, EngineState.LOADING, EngineState.READY, EngineState.DRAINING, EngineState.STOPPING}
)
#: States in which its readiness is asked.
STARTING_STATES = frozenset({EngineState.STARTING, EngineState.LOADING})


class Do(enum.Enum):
    """What the supervisor must do now."""

    SPAWN = "spawn"
    SIGNAL = "signal"
    KILL = "kill"


@attrs.frozen
class Exit:
    """How a process ended: its exit code, or the signal that killed it."""

    code: Optional[int] = None
    signal: Optional[int] = None

    @property
    def clean(self) -> bool:
        """Exited with code 0."""
        return self.code == 0 and self.signal is None

    @property
    def reason(self) -> str:
        """In words: ``exited with code 1``, ``killed by signal 9 (SIGKILL)``."""
        if self.signal is not None:
            try:
                name = f" ({signal.Signals(self.signal).name})"
            except ValueError:
                name = ""
            return f"killed by signal {self.signal}{name}"
        if self.code is not None:
            return f"exited with code {self.code}"
        return "exited"


class _AfterStop(enum.Enum):
    """What follows once a stopping process has exited."""

    STAY_DOWN = "stay down"
    START = "start"
    CRASH = "crash"


class EngineLifecycle:
    """One launched engine's state and restart policy (see the module docstring).

    Times are the caller's clock in seconds. ``start_timeout`` bounds
    starting plus loading; ``stop_timeout`` is how long the stop signal
    may take before SIGKILL.
    """

    def __init__(self, policy: RestartPolicy, start_timeout: float, stop_timeout: float, now: float = 0.0) -> None:
        self.policy = policy
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.state = EngineState.STOPPED
        self.reason = "not started yet"
        #: When it entered its state.
        self.since = now
        #: Restarts after crashes since an operator (or the Node) last started it.
        self.restarts = 0
        #: Crashes in a row since it was last ready (the backoff's exponent).
        self.streak = 0
        #: When the next start of a crashed engine is due.
        self.next_try_at: Optional[float] = None
        #: When the state's one timer is due (see :meth:`timer_due`), or None.
        self.deadline: Optional[float] = None
        #: The last exit of its process, if any.
        self.last_exit: Optional[Exit] = None
        #: Crashes in all (exits nobody asked for, failed starts), never reset.
        self.crashes = 0
        self._recent: deque[float] = deque()
        self._after_stop = _AfterStop.STAY_DOWN
        self._crash_reason = ""
        self.killed = False

    @property
    def running(self) -> bool:
        """Whether its process exists (spawned and not yet exited)."""
        return self.state in RUNNING_STATES

    # -- asked by the Node or an operator ------------------------------------------

    def start(self, now: float, reason: str = "started") -> list[Do]:
        """Run it (a fresh start: the restart count and limit start over); nothing if it runs."""
        self._forget_crashes()
        if self.state is EngineState.STOPPING:
            self._after_stop = _AfterStop.START
            return []
        if self.running:
            return []
        return self._spawn(now, reason)

    def restart(self, now: float, reason: str = "restart asked") -> list[Do]:
        """Stop it if it runs, then start it (a fresh start, as :meth:`start`)."""
        self._forget_crashes()
        if self.state is EngineState.STOPPING:
            self._after_stop = _AfterStop.START
            return []
        if self.running:
            return self._stopping(now, reason, _AfterStop.START)
        return self._spawn(now, reason)

    def stop(self, now: float, reason: str = "stop asked") -> list[Do]:
        """Stop it and keep it down until started (a pending restart is cancelled)."""
        if self.state is EngineState.STOPPING:
            self._after_stop = _AfterStop.STAY_DOWN
            return []
        if self.running:
            return self._stopping(now, reason, _AfterStop.STAY_DOWN)
        if self.state is not EngineState.STOPPED:
            self._enter(EngineState.STOPPED, now, reason)
        return []

    def leftover(self, now: float, reason: str) -> list[Do]:
        """Before its first start: a copy an earlier Node left running is stopped, then it starts.

        That copy counts as its process (stopping: its stop signal, SIGKILL
        after the timeout, its exit reported with :meth:`exited`).
        """
        if self.running:
            return []
        self._forget_crashes()
        return self._stopping(now, reason, _AfterStop.START)

    def unresponsive(self, now: float, reason: str) -> list[Do]:
        """A ready engine failed its liveness checks: it is stopped, and that counts as a crash."""
        if self.state is not EngineState.READY:
            return []
        self._crash_reason = reason
        return self._stopping(now, reason, _AfterStop.CRASH)

    def drain(self, now: float, reason: str = "draining") -> bool:
        """Mark a ready engine as draining (no new leases); whether it was ready."""
        if self.state is not EngineState.READY:
            return False
        self._enter(EngineState.DRAINING, now, reason)
        return True

    # -- what its process does ------------------------------------------------------

    def spawn_failed(self, now: float, error: str) -> list[Do]:
        """The process could not be started at all: a crash with ``error`` as its reason."""
        if self.state is not EngineState.STARTING:
            return []
        return self._crashed(now, f"cannot be started: {error}", clean=False)

    def readiness(self, now: float, ready: bool, reason: str = "") -> list[Do]:
        """Its readiness check answered; counts only while starting or loading."""
        if self.state not in STARTING_STATES:
            return []
        if ready:
            self.streak = 0
            self._enter(EngineState.READY, now, "")
        else:
            # Loading keeps its start deadline (the time allowed since the spawn).
            deadline = self.deadline
            self._enter(EngineState.LOADING, now, reason or "not ready yet")
            self.deadline = deadline
        return []

    def exited(self, now: float, how: Exit) -> list[Do]:
        """Its process ended (asked for or not)."""
        if not self.running:
            return []
        self.last_exit = how
        if self.state is EngineState.STOPPING:
            after, self._after_stop = self._after_stop, _AfterStop.STAY_DOWN
            if after is _AfterStop.START:
                return self._spawn(now, "restarted")
            if after is _AfterStop.CRASH:
                return self._crashed(now, self._crash_reason, clean=False)
            self._enter(EngineState.STOPPED, now, f"{self.reason}; {how.reason}")
            return []
        return self._crashed(now, how.reason, clean=how.clean)

    def timer_due(self, now: float) -> list[Do]:
        """The state's :attr:`deadline` has come (the caller checks the time)."""
        if self.deadline is None or now < self.deadline:
            return []
        if self.state in STARTING_STATES:
            reason = f"not ready within {self.start_timeout:g}s of its start"
            self._crash_reason = reason
            return self._stopping(now, reason, _AfterStop.CRASH)
        if self.state is EngineState.STOPPING:
            self.deadline = None
            self.killed = True
            return [Do.KILL]
        if self.state is EngineState.CRASHED:
            return self._spawn(now, f"restarted after a crash (restart {self.restarts})")
        return []

    # -- the rules --------------------------------------------------------------------

    def _forget_crashes(self) -> None:
        self.restarts = 0
        self.streak = 0
        self._recent.clear()

    def _enter(self, state: EngineState, now: float, reason: str) -> None:
        self.state = state
        self.reason = reason
        self.since = now
        self.deadline = None
        self.next_try_at = None

    def _spawn(self, now: float, reason: str) -> list[Do]:
        self._enter(EngineState.STARTING, now, reason)
        self.deadline = now + self.start_timeout
        self.killed = False
        return [Do.SPAWN]

    def _stopping(self, now: float, reason: str, after: _AfterStop) -> list[Do]:
        self._enter(EngineState.STOPPING, now, reason)
        self._after_stop = after
        self.deadline = now + self.stop_timeout
        self.killed = False
        return [Do.SIGNAL]

    def _crashed(self, now: float, reason: str, clean: bool) -> list[Do]:
        self.crashes += 1
        policy = self.policy
        if policy.policy == "never" or (policy.policy == "on-failure" and clean):
            state = EngineState.STOPPED if clean else EngineState.FAILED
            self._enter(state, now, f"{reason}; restart policy {policy.policy}")
            return []
        while self._recent and self._recent[0] <= now - policy.window_seconds:
            self._recent.popleft()
        if len(self._recent) >= policy.max_restarts:
            self._enter(
                EngineState.FAILED,
                now,
                f"{reason}; {len(self._recent)} restarts within {policy.window_seconds:g}s: the limit",
            )
            return []
        self.streak += 1
        delay = min(policy.max_seconds, policy.initial_seconds * 2 ** min(self.streak - 1, 62))
        self._recent.append(now)
        self.restarts += 1
        self._enter(EngineState.CRASHED, now, reason)
        self.next_try_at = self.deadline = now + delay
        return []
