"""Which edge hellos the Control Plane takes now: all it can hold, worked off as the loop allows.

A restarted Control Plane is dialed by its whole fleet at once. Refusing
hellos with ``retry_later`` (a fixed 500 per second, or while the loop
lags) makes edges dial again after a hint, and a refusal costs the loop
almost as much as an admission. So hellos are queued, not refused:

* :class:`HelloAdmission` parks each hello in a FIFO bounded in count
  (``max_pending_hellos``) and bytes (``max_pending_bytes``), and works
  it off cooperatively: each reactor turn processes hellos until
  ``slice_ms`` of the clock is used or the queue is empty, then yields
  (``callLater(0)``), so the loop's lag stays near one slice plus the I/O
  of one turn, and a hello waits only for the hellos ahead of it. A hello
  arriving at an empty queue is processed at once while the turn's slice
  lasts.
* A hello is told ``retry_later`` only when refusing it helps: when the
  queue is full, or when its expected wait (the hellos ahead of it at the
  drain rate: the rate the slices were measured processing hellos at, of
  which the queue is expected to get half the loop) is over
  ``max_queue_wait_ms`` (the Edge waits ``request_timeout_seconds``, 10 s
  by default, for the answer). The hint is the queue's drain time at the
  measured rate, spread one slot apart per refused edge and capped.
* A loop lagging more than ``max_loop_lag_ms`` for ``lag_grace_ms``
  (measured by :class:`LoopLagProbe`; on a contended CPU the loop lags
  because the machine is busy, not because of the hellos) sends no edge
  away: a refused edge dials again with another connection and another
  hello, which makes the storm longer and the loop busier. Instead the
  admission takes fewer hellos into each turn: no hello is processed at
  once on arrival (it queues behind the others), and each turn's slice
  shrinks to ``lagging_slice_ms``, so reads and status rounds of the edges
  already enrolled keep their share of the loop. The slices measured while
  lagging still move the drain rate, so the expected-wait rule stays
  honest about what the queue can hold.
* An optional fixed cap (``max_per_second``, 0: none) paces the drain.

Both classes are pure apart from the injected clock (``callLater`` and
``seconds``), and are driven with ``twisted.internet.task.Clock`` in the
tests.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Protocol

import attrs
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from twisted_iop.token_bucket import TokenBucket

#: The hint never points further out than this (a herd of 100,000 at a slow loop).
MAX_RETRY_SECONDS = 30.0
#: The slices' rate assumed before one was measured (hellos per second).
INITIAL_RATE = 2000.0
#: The slowest rate the hints and the expected waits are computed at.
MIN_RATE = 50.0
#: The share of the loop the queue is expected to get while it has a backlog.
LOOP_SHARE = 0.5
#: The weight of each new drain-rate sample in the moving average.
RATE_WEIGHT = 0.3
#: Slices that processed fewer hellos than this do not move the rate.
MIN_SAMPLE_HELLOS = 4


@attrs.frozen
class HelloAdmissionSettings:
    """``edge_wire.hello_admission``: how hellos are queued, worked off, or told ``retry_later``."""

    #: Hellos waiting to be processed, at most (more: ``retry_later``).
    max_pending_hellos: int = 20_000
    #: Bytes of waiting hello frames, at most (more: ``retry_later``).
    max_pending_bytes: int = 64 * 1024 * 1024
    #: Reactor time one turn may spend processing queued hellos (ms).
    slice_ms: float = 10.0
    #: A hello whose expected wait in the queue is longer is told ``retry_later`` (ms).
    max_queue_wait_ms: float = 5000.0
    #: Once the loop has lagged more than this (ms) ...
    max_loop_lag_ms: float = 100.0
    #: ... for this long (ms), hellos queue instead of being processed on arrival ...
    lag_grace_ms: float = 500.0
    #: ... and each turn processes queued hellos for this long at most (ms), not ``slice_ms``.
    lagging_slice_ms: float = 2.0
    #: A fixed cap of processed hellos per second (burst twice as many); 0: none.
    max_per_second: float = 0.0
    #: How often the lag probe runs (ms).
    probe_interval_ms: float = 20.0


class WaitingHello(Protocol):
    """A hello in the queue: its connection, told when its turn comes."""

    def hello_turn(self) -> None:
        """Process the hello now (its connection may have closed meanwhile: then nothing)."""


class LoopLagProbe:
    """Notes how late the reactor runs a call scheduled every ``interval`` seconds."""

    def __init__(self, clock: IReactorTime, interval: float, threshold: float = float("inf")) -> None:
        self._clock = clock
        self.interval = interval
        #: Lag above this counts towards :meth:`lagging_for`.
        self.threshold = threshold
        #: When the lag last went above ``threshold`` (None: it is not above now).
        self._over_since: Optional[float] = None
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
        self._over_since = None

    def lag_now(self, now: float) -> float:
        """The lag as of ``now``: the last run's, or longer while the next run is overdue."""
        due = self._due
        if due is not None and now > due:
            return max(self.last_lag, now - due)
        return self.last_lag

    def lagging_for(self, now: float) -> Optional[float]:
        """How long the lag has been above ``threshold`` as of ``now``; None if it is not."""
        if self._over_since is not None:
            return now - self._over_since
        due = self._due
        if due is not None and now - due > self.threshold:
            # Overdue right now: the turn under way is the lag.
            return now - (due + self.threshold)
        return None

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
        if lag <= self.threshold:
            self._over_since = None
        elif self._over_since is None:
            self._over_since = self._due + self.threshold
        if lag > self.max_lag:
            self.max_lag = lag
        self.runs += 1
        self._schedule()


class HelloAdmission:
    """Queue hellos and work them off in slices of the loop; refuse only what cannot be held.

    :meth:`offer` is called once per hello; the hello's connection is told
    through :meth:`WaitingHello.hello_turn` when to process it (at once, or
    from a later reactor turn), and :meth:`withdraw` drops it if its
    connection closes first.
    """

    _log = Logger()

    def __init__(self, clock: IReactorTime, settings: HelloAdmissionSettings = HelloAdmissionSettings()) -> None:
        self._clock = clock
        self.settings = settings
        self._max_lag = settings.max_loop_lag_ms / 1000.0
        self.probe = LoopLagProbe(clock, settings.probe_interval_ms / 1000.0, self._max_lag)
        self._slice = settings.slice_ms / 1000.0
        self._max_wait = settings.max_queue_wait_ms / 1000.0
        self._grace = settings.lag_grace_ms / 1000.0
        self._lagging_slice = min(settings.lagging_slice_ms, settings.slice_ms) / 1000.0
        #: The fixed cap (``max_per_second``), burst twice as many hellos (at least one).
        self._fixed = (
            TokenBucket(settings.max_per_second, max(1.0, 2.0 * settings.max_per_second))
            if settings.max_per_second > 0
            else None
        )
        #: Waiting hellos, oldest first: each one's frame size and when it was queued.
        self._queue: OrderedDict[WaitingHello, tuple[int, float]] = OrderedDict()
        self._bytes = 0
        self._turn: Optional[IDelayedCall] = None
        #: When this reactor turn's slice began (None: no hello processed since the last turn).
        self._slice_started: Optional[float] = None
        #: Hellos processed per second of a turn's slice (a moving average of the turns).
        self.rate = INITIAL_RATE
        self._next_slot = 0.0
        #: Hellos processed (at once or from the queue), and queued first, since start.
        self.processed_total = 0
        self.queued_total = 0
        #: Queued hellos dropped because their connection closed first.
        self.withdrawn_total = 0
        #: The longest a hello waited in the queue (seconds) since :meth:`reset_longest_wait`.
        self.longest_wait = 0.0
        #: Hellos told ``retry_later`` by reason, since start.
        self.refused: dict[str, int] = {"queue_full": 0, "queue_wait": 0}
        #: Turns worked off with the lagging loop's smaller slice, since start.
        self.lagging_turns = 0
        #: Hellos queued on arrival (not processed at once) because the loop lagged, since start.
        self.lag_queued_total = 0

    def start(self) -> None:
        """Start watching the loop (the factory starts)."""
        self.probe.start()

    def stop(self) -> None:
        """Stop watching the loop and working off the queue (the factory stops)."""
        self.probe.stop()
        if self._turn is not None and self._turn.active():
            self._turn.cancel()
        self._turn = None
        self._slice_started = None
        self._queue.clear()
        self._bytes = 0

    @property
    def pending(self) -> int:
        """Hellos waiting in the queue now."""
        return len(self._queue)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the hello frames waiting in the queue now."""
        return self._bytes

    @property
    def refused_total(self) -> int:
        """Hellos told ``retry_later`` by this rule, since start."""
        return sum(self.refused.values())

    def drain_rate(self) -> float:
        """The hellos per second the queue is expected to be worked off at.

        The rate of the slices times :data:`LOOP_SHARE`: the queue is
        expected to get at least that share of the loop. Measured over
        whole turns instead, the rate would be that of a storm's arrival
        (every turn reading thousands of new connections), well below what
        the queue gets once they are in, and edges would be sent away from
        a loop about to be idle. Too optimistic, a hello waits past its
        edge's patience: the edge closes, its hello leaves the queue
        unprocessed, and it dials again.
        """
        rate = max(MIN_RATE, self.rate * LOOP_SHARE)
        if self._fixed is not None:
            rate = min(rate, self.settings.max_per_second)
        return rate

    def reset_longest_wait(self) -> float:
        """The longest queue wait seen, and start a new maximum."""
        seen, self.longest_wait = self.longest_wait, 0.0
        return seen

    def lagging(self, now: float) -> bool:
        """Whether the loop has lagged more than ``max_loop_lag_ms`` for ``lag_grace_ms`` as of ``now``."""
        if not self.probe.running:
            return False
        lagging = self.probe.lagging_for(now)
        return lagging is not None and lagging >= self._grace

    def offer(self, hello: WaitingHello, size: int) -> Optional[float]:
        """Take ``hello`` (a frame of ``size`` bytes): None if processed or queued, else the seconds to wait first."""
        now = self._clock.seconds()
        queue = self._queue
        lagging = self.lagging(now)
        if not lagging and not queue and self._fixed is None:
            started = self._slice_started
            if started is None:
                # The next turn ends this slice (and works off what it left).
                started = self._slice_started = now
                if self._turn is None:
                    self._schedule(0.0)
            if now - started < self._slice:
                self.processed_total += 1
                self._process(hello)
                return None
        if len(queue) >= self.settings.max_pending_hellos or self._bytes + size > self.settings.max_pending_bytes:
            return self._refuse("queue_full", now)
        # The hellos to be worked off before this one is (itself included),
        # less those a fixed pace's bucket lets through at once.
        ahead = len(queue) + 1 - (self._fixed.available(self._clock.seconds()) if self._fixed is not None else 0.0)
        if ahead / self.drain_rate() > self._max_wait:
            return self._refuse("queue_wait", now)
        queue[hello] = (size, now)
        self._bytes += size
        self.queued_total += 1
        if lagging:
            self.lag_queued_total += 1
        if self._turn is None:
            self._schedule(0.0)
        return None

    def withdraw(self, hello: WaitingHello) -> None:
        """``hello``'s connection closed: drop it from the queue, if it is there."""
        entry = self._queue.pop(hello, None)
        if entry is not None:
            self._bytes -= entry[0]
            self.withdrawn_total += 1

    def _schedule(self, delay: float) -> None:
        self._turn = self._clock.callLater(delay, self._work)

    def _work(self) -> None:
        """One reactor turn's slice: process queued hellos until it is used or the queue is empty."""
        self._turn = None
        clock = self._clock
        start = now = clock.seconds()
        self._slice_started = start
        if self.lagging(start):
            self.lagging_turns += 1
            deadline = start + self._lagging_slice
        else:
            deadline = start + self._slice
        queue = self._queue
        fixed = self._fixed
        done = 0
        while queue:
            if fixed is not None:
                wait = fixed.take(now)
                if wait is not None:
                    self._schedule(wait)
                    break
            hello, (size, queued_at) = queue.popitem(last=False)
            self._bytes -= size
            if now - queued_at > self.longest_wait:
                self.longest_wait = now - queued_at
            done += 1
            self._process(hello)
            now = clock.seconds()
            if now >= deadline:
                break
        self.processed_total += done
        used = now - start
        if done >= MIN_SAMPLE_HELLOS and used > 0:
            # Every sample moves the average, the first one too: a slice the
            # machine preempted (another process, a collection) measures a
            # rate far below the loop's, and alone it would send edges away.
            # A slice of a few hellos says little, and is not counted.
            sample = done / used
            self.rate = self.rate + RATE_WEIGHT * (sample - self.rate)
        if queue:
            if self._turn is None:
                self._schedule(0.0)
        else:
            self._slice_started = None

    def _process(self, hello: WaitingHello) -> None:
        try:
            hello.hello_turn()
        except Exception:
            # One hello's failure must not stop the others' turn.
            self._log.failure("processing a queued edge hello failed")

    def _refuse(self, reason: str, now: float) -> float:
        self.refused[reason] += 1
        rate = self.drain_rate()
        # Back once half the queue ahead is worked off,
        # one refused edge per slot of the drain rate, so a refused herd
        # comes back as fast as the queue takes it, not as one herd.
        probe = self.probe
        earliest = now + max(len(self._queue) / rate / 2, probe.lag_now(now), probe.interval)
        self._next_slot = min(max(self._next_slot, earliest) + 1.0 / rate, now + MAX_RETRY_SECONDS)
        return self._next_slot - now
