"""Which edge hellos the Control Plane admits now: as many as its event loop keeps up with.

A restarted Control Plane is dialed by its whole fleet at once. A fixed
rate (the old 500 hellos per second) made 10,000 edges take 21 s and
44,000 ``retry_later`` answers, where the loop could take them in about
a second. Instead the rule here watches the loop itself:

* :class:`LoopLagProbe` runs every ``probe_interval_ms`` and notes how
  late it ran (the reactor's lag). While it is overdue *now* (a long
  reactor turn is under way) that counts as lag too, so a burst read in
  one turn is judged before the turn ends.
* :class:`HelloAdmission` admits a hello unless the lag is over
  ``max_loop_lag_ms``, or ``max_pending_hellos`` were already admitted
  since the probe last ran (work the loop has not been seen to absorb
  yet), or an optional fixed cap (``max_per_second``, off by default) is
  exceeded. A refused hello is told when to come back: the hints are
  spread one slot apart at the rate the loop was seen to admit, so a
  refused herd does not come back as one herd.

Both are pure apart from the injected clock (``callLater`` for the probe,
``seconds`` for both), and are driven with ``twisted.internet.task.Clock``
in the tests.
"""

from __future__ import annotations

from typing import Optional

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from twisted_iop.wire.limits import HelloRateLimit

#: The hint never points further out than this (a herd of 100,000 at a slow loop).
MAX_RETRY_SECONDS = 30.0
#: The admitted rate assumed before the loop has been seen admitting (hellos per second).
INITIAL_RATE = 2000.0
#: The slowest rate the hints are spread at, whatever was measured.
MIN_RATE = 100.0


@attrs.frozen
class HelloAdmissionSettings:
    """``edge_wire.hello_admission``: when a hello is admitted or told ``retry_later``."""

    #: Refuse while the loop runs later than this (ms).
    max_loop_lag_ms: float = 50.0
    #: Refuse once this many hellos were admitted since the lag probe last ran.
    max_pending_hellos: int = 1000
    #: A fixed cap of admitted hellos per second (burst twice as many); 0: none.
    max_per_second: float = 0.0
    #: How often the lag probe runs (ms).
    probe_interval_ms: float = 20.0


class LoopLagProbe:
    """Notes how late the reactor runs a call scheduled every ``interval`` seconds."""

    def __init__(self, clock: IReactorTime, interval: float) -> None:
        self._clock = clock
        self.interval = interval
        #: How late the last run was (seconds).
        self.last_lag = 0.0
        #: The largest lag seen since start (or since :meth:`reset_max`).
        self.max_lag = 0.0
        #: Runs so far (each one ends a window of pending work).
        self.runs = 0
        self._due: Optional[float] = None
        self._call: Optional[IDelayedCall] = None

    @property
    def running(self) -> bool:
        """Whether the probe is scheduled."""
        return self._call is not None

    def start(self) -> None:
        """Schedule the first run."""
        if self._call is None:
            self._schedule()

    def stop(self) -> None:
        """Cancel the next run."""
        if self._call is not None:
            if self._call.active():
                self._call.cancel()
            self._call = None
        self._due = None

    def lag_now(self, now: float) -> float:
        """The lag as of ``now``: the last run's, or longer while the next run is overdue."""
        due = self._due
        if due is not None and now > due:
            return max(self.last_lag, now - due)
        return self.last_lag

    def reset_max(self) -> float:
        """The largest lag seen, and start a new maximum."""
        seen, self.max_lag = self.max_lag, self.last_lag
        return seen

    def _schedule(self) -> None:
        self._due = self._clock.seconds() + self.interval
        self._call = self._clock.callLater(self.interval, self._run)

    def _run(self) -> None:
        assert self._due is not None
        lag = max(0.0, self._clock.seconds() - self._due)
        self.last_lag = lag
        if lag > self.max_lag:
            self.max_lag = lag
        self.runs += 1
        self._schedule()


class HelloAdmission:
    """Admit a hello while the loop keeps up; otherwise say how long to wait.

    :meth:`admit` is called once per hello that passed every other check.
    """

    def __init__(self, clock: IReactorTime, settings: HelloAdmissionSettings = HelloAdmissionSettings()) -> None:
        self._clock = clock
        self.settings = settings
        self.probe = LoopLagProbe(clock, settings.probe_interval_ms / 1000.0)
        self._max_lag = settings.max_loop_lag_ms / 1000.0
        self._fixed = HelloRateLimit(clock, settings.max_per_second) if settings.max_per_second > 0 else None
        #: Hellos admitted since the probe last ran, and that run's number.
        self._pending = 0
        self._window_run = 0
        self._window_started: Optional[float] = None
        self._window_admitted = 0
        self._window_refused = 0
        #: The rate the loop was seen admitting at (hellos per second), for the hints.
        self.rate = INITIAL_RATE
        self._next_slot = 0.0
        #: Hellos admitted, and refused by reason (``loop_lag``, ``pending``, ``fixed_rate``), since start.
        self.admitted_total = 0
        self.refused: dict[str, int] = {"loop_lag": 0, "pending": 0, "fixed_rate": 0}

    def start(self) -> None:
        """Start watching the loop (the factory starts)."""
        self.probe.start()
        self._new_window(self._clock.seconds(), self.probe.runs)

    def stop(self) -> None:
        """Stop watching the loop (the factory stops)."""
        self.probe.stop()

    @property
    def refused_total(self) -> int:
        """Hellos told ``retry_later`` by this rule, since start."""
        return sum(self.refused.values())

    def admit(self) -> Optional[float]:
        """None if the hello may pass now, else the seconds the edge should wait first."""
        now = self._clock.seconds()
        probe = self.probe
        if probe.runs != self._window_run:
            self._new_window(now, probe.runs)
        # Without the probe (a factory never started, as in unit tests)
        # there is no loop to watch: only the fixed cap applies.
        if probe.running:
            if probe.lag_now(now) > self._max_lag:
                return self._refuse("loop_lag", now)
            if self._pending >= self.settings.max_pending_hellos:
                return self._refuse("pending", now)
        if self._fixed is not None:
            wait = self._fixed.take()
            if wait is not None:
                self.refused["fixed_rate"] += 1
                return wait
        self._pending += 1
        self._window_admitted += 1
        self.admitted_total += 1
        return None

    def _new_window(self, now: float, run: int) -> None:
        """The probe ran since the last hello: the pending work was absorbed; learn the rate."""
        started = self._window_started
        busy = self._window_refused > 0 or self._window_admitted >= self.settings.max_pending_hellos
        if started is not None and busy and now > started:
            # Only a busy window (full, or with hellos refused) says how
            # fast the loop admits; a quiet one says only that few dialed.
            self.rate = max(MIN_RATE, self._window_admitted / (now - started))
        self._window_run = run
        self._window_started = now
        self._window_admitted = 0
        self._window_refused = 0
        self._pending = 0

    def _refuse(self, reason: str, now: float) -> float:
        self.refused[reason] += 1
        self._window_refused += 1
        slot = 1.0 / self.rate
        # After the current lag (or one probe interval) the loop is free
        # again; from there, one refused edge per slot.
        earliest = now + max(self.probe.lag_now(now), self.probe.interval)
        self._next_slot = min(max(self._next_slot, earliest) + slot, now + MAX_RETRY_SECONDS)
        return self._next_slot - now
