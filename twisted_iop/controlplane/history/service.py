"""The history service: a sample of the fleet every interval, kept in tiers.

Every ``history.interval_seconds`` the :class:`HistoryService` samples:

* if a fleet round ended within the interval (the console, iopctl or a
  rollout asked for one anyway), the edges' kept snapshots are fresh and
  it samples them at once;
* otherwise it starts a round through the gateway (one round at a time:
  it joins one in progress) and samples when the round ends.

The edges are sampled at the first step of ``history.edge_tiers`` (by
default every 30 s, every other sample): such a sample reads each
connected edge's kept snapshot: its counts (kept with it, free to read)
and its breakdown (per model, the engines' figures: :mod:`.breakdown`,
parsed only when the snapshot changed, within a budget). The
:class:`~.edge_sampler.EdgeSampler` records every edge
(``edge:<id>``) and each model it serves (``edge:<id>/model:<name>``)
column-wise, one segment of edges at a time, :data:`SEGMENTS_PER_TURN`
segments per reactor turn (so 10,000 edges never hold the event loop in
one turn); then, at every sample, the :class:`~.recorder.HistoryRecorder` takes the
point of each model fleet-wide (``model:<name>``) and of the fleet
(``fleet``; between the samples of the edges, its counts are added up
from the connected edges' snapshots, its engines' figures and the
models' are those of the last sample of the edges).
Both roll the points up into the coarser tiers and write the chunks to
the store; every :data:`EXPIRE_EVERY_SECONDS` the store forgets what is
older than each tier keeps. At stop, the open chunks and partial
roll-ups are written.

In cluster mode one replica samples: a store with ``history_leader()``
(the Redis store: the replica holding the sampling lease) is asked at
each interval, and a replica that does not lead takes no sample (and,
if it led before, writes what it had open); every replica serves the
views from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import attrs
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.breakdown import BreakdownCache
from twisted_iop.controlplane.history.edge_sampler import EdgeSampler
from twisted_iop.controlplane.history.fields import EDGES_GROUP, FLEET, group_key, model_series
from twisted_iop.controlplane.history.frames import SEGMENTS, store_key
from twisted_iop.controlplane.history.queries import HistoryQueries
from twisted_iop.controlplane.history.recorder import HistoryRecorder
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.interface import HistoryStore

#: Segments of edges sampled per reactor turn (of :data:`~.frames.SEGMENTS`).
SEGMENTS_PER_TURN = SEGMENTS // 8
#: Seconds between asking the store to forget what each tier no longer keeps.
EXPIRE_EVERY_SECONDS = 300.0
#: Idle series are closed (and gone edges' breakdowns forgotten) every this many samples.
SWEEP_EVERY_SAMPLES = 4


@attrs.define(eq=False)
class _Sampling:
    """A sample being taken, segment by segment."""

    t_ms: int
    #: Whether it samples the edges too (the first sample of an edge step).
    edges: bool


class HistoryService(Service):
    """Samples the fleet on its interval (see the module docstring)."""

    _log = Logger()
    name = "history"

    def __init__(
        self,
        settings: HistorySettings,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        store: HistoryStore,
        clock: IReactorTime,
    ) -> None:
        self.settings = settings
        self.store = store
        self.breakdowns = BreakdownCache()
        #: Every edge and each model on it (column-wise), and the fleet's own series.
        self.edges = EdgeSampler(settings, store, self.breakdowns, lambda: len(self.recorder))
        self.recorder = HistoryRecorder(settings, store, lambda: self.edges.slots)
        #: What the views read.
        self.queries = HistoryQueries(self.recorder, self.edges, store)
        self._registry = registry
        self._gateway = gateway
        self._clock = clock
        self._interval_ms = round(settings.interval_seconds * 1000)
        self._edge_step_ms = settings.edge_tiers[0].step_ms
        #: The edge step of the last sample of the edges.
        self._last_edge_bucket = -1
        self._loop: Optional[LoopingCall] = None
        self._sampling: Optional[_Sampling] = None
        self._waiting_for_round = False
        #: Whether this process has chunks open (it sampled and did not stand down since).
        self._open = False
        self._last_expire = 0.0
        #: When the last sample was taken (a round that ended before it is not news).
        self._last_sample_at = 0.0
        #: For /metrics and tests.
        self.samples = 0
        #: Samples that sampled the edges too.
        self.edge_samples = 0
        self.samples_skipped = 0
        #: Intervals this replica did not sample because another one does (cluster mode).
        self.intervals_elsewhere = 0
        self.rounds_started = 0
        #: Called after each sample with its time in ms (tests wait on it).
        self.sampled: list[Callable[[int], None]] = []

    # -- the timer ------------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        if not self.settings.enabled:
            return
        # With a reactor, once it runs (at once if it does: a wiring test's
        # MemoryReactor never runs and has no clock); a bare clock, now.
        when_running = getattr(self._clock, "callWhenRunning", None)
        if when_running is not None:
            when_running(self._start_timer)
        else:
            self._start_timer()

    def _start_timer(self) -> None:
        if not self.running or self._loop is not None:
            return
        loop = self._loop = LoopingCall(self.tick)
        loop.clock = self._clock
        loop.start(self.settings.interval_seconds, now=False).addErrback(self._loop_failed)

    def stopService(self) -> Any:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._sampling is not None:
            self._finish_now(self._sampling)
        self._stand_down()
        return super().stopService()

    def _stand_down(self) -> None:
        """Write every open chunk and point in progress (this process samples no more for now)."""
        if self._open:
            self._open = False
            self.recorder.close_all()
            self.edges.flush()

    @property
    def leading(self) -> bool:
        """Whether this process samples: always, but in cluster mode only the
        replica holding the store's sampling lease (``history_leader``)."""
        leader = getattr(self.store, "history_leader", None)
        return leader is None or bool(leader())

    def _loop_failed(self, failure: Failure) -> None:
        self._log.failure("history: the sampling timer stopped", failure)

    def tick(self) -> None:
        """One interval: sample now from a fresh round, or start one and sample when it ends."""
        if self._sampling is not None or self._waiting_for_round:
            self.samples_skipped += 1
            return
        if not self.leading:
            self.intervals_elsewhere += 1
            self._stand_down()
            return
        now = self._clock.seconds()
        last = self._gateway.last_round
        if (
            last is not None
            and last.finished_at > self._last_sample_at
            and now - last.finished_at <= self.settings.interval_seconds
        ):
            self.sample(now)
            return
        if self._gateway.stopping:
            return
        self._waiting_for_round = True
        self.rounds_started += 1
        # The sample is of this tick's time (its round's answers arrive after it).
        self._gateway.fleet_status().addCallbacks(self._round_ended, self._round_failed, callbackArgs=(now,))

    def _round_ended(self, _: object, tick_at: float) -> None:
        self._waiting_for_round = False
        if self.running and self.leading:
            self.sample(tick_at)

    def _round_failed(self, failure: Failure) -> None:
        self._waiting_for_round = False
        self.samples_skipped += 1
        self._log.warn("history: the fleet round of a sample failed: {error}", error=failure.getErrorMessage())

    # -- one sample -------------------------------------------------------------------------

    def sample(self, now: float) -> None:
        """Take a sample at ``now``: of the fleet, and, at the first sample of
        each edge step (``history.edge_tiers``' first), of every connected
        edge's kept snapshot (segment by segment)."""
        self._last_sample_at = self._clock.seconds()
        self._open = True
        t_ms = round(now * 1000 / self._interval_ms) * self._interval_ms
        edge_bucket = t_ms - t_ms % self._edge_step_ms
        sampling = self._sampling = _Sampling(t_ms, edge_bucket > self._last_edge_bucket)
        if sampling.edges:
            self._last_edge_bucket = edge_bucket
            self.edge_samples += 1
            self.edges.begin(t_ms, self._registry.edges, self._registry.connected_count)
        self._step(sampling)

    def _step(self, sampling: _Sampling) -> None:
        if self._sampling is not sampling:
            return
        if not sampling.edges or self.edges.step(SEGMENTS_PER_TURN):
            self._finish(sampling)
        else:
            self._clock.callLater(0, self._step, sampling)

    def _finish_now(self, sampling: _Sampling) -> None:
        """Take the rest of a sample in one go (at stop)."""
        while sampling.edges and not self.edges.step(SEGMENTS):
            pass
        self._finish(sampling)

    def _finish(self, sampling: _Sampling) -> None:
        self._sampling = None
        t_ms = sampling.t_ms
        connected = self._registry.connected_count
        if sampling.edges:
            fleet = self.edges.fleet_row(connected)
        else:
            fleet = self.edges.fleet_row_between(self._registry.edges(), connected)
        self.recorder.append(FLEET, t_ms, fleet)
        for model, row in self.edges.model_rows():
            self.recorder.append(model_series(model), t_ms, row)
        self.samples += 1
        now = self._clock.seconds()
        if self.samples % SWEEP_EVERY_SAMPLES == 0:
            self.recorder.sweep(t_ms)
            self.breakdowns.forget_except({r.edge_id for r in self._registry.edges()})
        if now - self._last_expire >= EXPIRE_EVERY_SECONDS:
            self._last_expire = now
            for tier in self.settings.tiers:
                self.store.history_expire(tier.key, now - tier.keep_seconds)
            for tier in self.settings.edge_tiers:
                self.store.history_expire(store_key(tier), now - tier.keep_seconds)
        for listener in list(self.sampled):
            listener(t_ms)

    # -- figures ----------------------------------------------------------------------------

    def keeps(self, series: str) -> bool:
        """Whether ``series`` is sampled now (an edge gone for a while is not)."""
        where = group_key(series)
        if where is None:
            return series in self.recorder
        group = self.edges.edges if where[0] == EDGES_GROUP else self.edges.models
        return where[2] in group.of(where[1]).slot_of

    @property
    def series_kept(self) -> int:
        """Series kept now: the fleet's own and every per-edge key with a slot."""
        return len(self.recorder) + self.edges.slots

    @property
    def series_refused(self) -> int:
        """Points not recorded for ``history.max_series``."""
        return self.recorder.series_refused + self.edges.refused

    @property
    def points_written(self) -> int:
        """Points appended, every tier (a per-edge frame counts one per slot)."""
        return self.recorder.points_written + self.edges.edges.stats.points + self.edges.models.stats.points

    @property
    def chunk_writes(self) -> int:
        """Chunks handed to the store (open ones again as they grow)."""
        return self.recorder.chunk_writes + self.edges.edges.stats.chunk_writes + self.edges.models.stats.chunk_writes
