"""The history service: a sample of the fleet every interval, kept in tiers.

Every ``history.interval_seconds`` the :class:`HistoryService` samples:

* if a fleet round ended within the interval (the console, iopctl or a
  rollout asked for one anyway), the edges' kept snapshots are fresh and
  it samples them at once;
* otherwise it starts a round through the gateway (one round at a time:
  it joins one in progress) and samples when the round ends.

A sample reads each connected edge's kept snapshot: its counts (kept with
it, free to read) and its breakdown (per model, the engines' figures:
:mod:`.breakdown`, parsed only when the snapshot changed, within a
budget). It appends one point to the series of each edge
(``edge:<id>``), each model an edge serves (``edge:<id>/model:<name>``),
each model fleet-wide (``model:<name>``) and the fleet (``fleet``), in
slices of :data:`SAMPLE_SLICE` edges per reactor turn (so 10,000 edges
never hold the event loop in one turn). The
:class:`~.recorder.HistoryRecorder` rolls the points up into the coarser
tiers and writes the chunks to the store; every
:data:`EXPIRE_EVERY_SECONDS` the store forgets what is older than each
tier keeps. At stop, the open chunks and partial roll-ups are written.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import add
from typing import Any, Optional

import attrs
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.edge_record import EdgeRecord
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.history.breakdown import BreakdownCache, edge_row
from twisted_iop.controlplane.history.fields import FLEET, FLEET_FIELDS, MISSING, edge_series, model_series
from twisted_iop.controlplane.history.queries import HistoryQueries
from twisted_iop.controlplane.history.recorder import HistoryRecorder
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.registry import EdgeRegistry
from twisted_iop.controlplane.store.interface import HistoryStore

#: Edges sampled per reactor turn.
SAMPLE_SLICE = 1000
#: Seconds between asking the store to forget what each tier no longer keeps.
EXPIRE_EVERY_SECONDS = 300.0
#: Idle series are closed (and gone edges' breakdowns forgotten) every this many samples.
SWEEP_EVERY_SAMPLES = 4

_KV_AT = len(FLEET_FIELDS) - 1
assert FLEET_FIELDS[_KV_AT].name == "kv_cache_usage"


@attrs.define(eq=False)
class _Sampling:
    """A sample being taken, slice by slice."""

    t_ms: int
    records: list[EdgeRecord]
    rows: list[tuple[int, ...]] = attrs.field(factory=list)
    models: dict[str, tuple[int, ...]] = attrs.field(factory=dict)
    kv_sum: int = 0
    kv_reporting: int = 0
    parses: int = 0
    #: The index of the next record to sample.
    next: int = 0


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
        self.recorder = HistoryRecorder(settings, store)
        #: What the views read.
        self.queries = HistoryQueries(self.recorder, store)
        self.breakdowns = BreakdownCache()
        self._registry = registry
        self._gateway = gateway
        self._clock = clock
        self._interval_ms = round(settings.interval_seconds * 1000)
        self._loop: Optional[LoopingCall] = None
        self._sampling: Optional[_Sampling] = None
        self._waiting_for_round = False
        self._offset = 0
        self._last_expire = 0.0
        #: When the last sample was taken (a round that ended before it is not news).
        self._last_sample_at = 0.0
        #: For /metrics and tests.
        self.samples = 0
        self.samples_skipped = 0
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
        self.recorder.close_all()
        return super().stopService()

    def _loop_failed(self, failure: Failure) -> None:
        self._log.failure("history: the sampling timer stopped", failure)

    def tick(self) -> None:
        """One interval: sample now from a fresh round, or start one and sample when it ends."""
        if self._sampling is not None or self._waiting_for_round:
            self.samples_skipped += 1
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
        if self.running:
            self.sample(tick_at)

    def _round_failed(self, failure: Failure) -> None:
        self._waiting_for_round = False
        self.samples_skipped += 1
        self._log.warn("history: the fleet round of a sample failed: {error}", error=failure.getErrorMessage())

    # -- one sample -------------------------------------------------------------------------

    def sample(self, now: float) -> None:
        """Take a sample of every connected edge's kept snapshot at ``now`` (in slices)."""
        self._last_sample_at = self._clock.seconds()
        t_ms = round(now * 1000 / self._interval_ms) * self._interval_ms
        records = [r for r in self._registry.edges() if r.token is not None and r.snapshot is not None]
        if records:
            # A rotating start: the parse budget goes to other edges first next time.
            start = self._offset % len(records)
            records = records[start:] + records[:start]
        sampling = self._sampling = _Sampling(t_ms, records)
        self._step(sampling)

    def _step(self, sampling: _Sampling) -> None:
        if self._sampling is not sampling:
            return
        if self._slice(sampling):
            self._finish(sampling)
        else:
            self._clock.callLater(0, self._step, sampling)

    def _slice(self, sampling: _Sampling) -> bool:
        """Sample the next :data:`SAMPLE_SLICE` edges; True when none is left."""
        start = sampling.next
        end = sampling.next = start + SAMPLE_SLICE
        t_ms = sampling.t_ms
        append = self.recorder.append
        of = self.breakdowns.of
        budget = self.settings.parse_budget
        rows = sampling.rows
        models = sampling.models
        for record in sampling.records[start:end]:
            snapshot = record.snapshot
            if snapshot is None:
                continue
            edge_id = record.edge_id
            breakdown, parsed = of(edge_id, snapshot, sampling.parses < budget)
            if parsed:
                sampling.parses += 1
            row = edge_row(snapshot.counts, breakdown.extras)
            append(edge_series(edge_id), t_ms, row)
            rows.append(row)
            sampling.kv_sum += breakdown.kv_sum
            sampling.kv_reporting += breakdown.kv_reporting
            for model, model_row in breakdown.models:
                append(model_series(model, edge_id), t_ms, model_row)
                kept = models.get(model)
                models[model] = model_row if kept is None else tuple(map(add, kept, model_row))
        return end >= len(sampling.records)

    def _finish_now(self, sampling: _Sampling) -> None:
        """Take the rest of a sample in one go (at stop)."""
        while not self._slice(sampling):
            pass
        self._finish(sampling)

    def _finish(self, sampling: _Sampling) -> None:
        self._sampling = None
        t_ms = sampling.t_ms
        self.recorder.append(FLEET, t_ms, self._fleet_row(sampling))
        for model in sorted(sampling.models):
            self.recorder.append(model_series(model), t_ms, sampling.models[model])
        self.samples += 1
        self._offset += max(sampling.parses, 1)
        now = self._clock.seconds()
        if self.samples % SWEEP_EVERY_SAMPLES == 0:
            self.recorder.sweep(t_ms)
            self.breakdowns.forget_except({r.edge_id for r in self._registry.edges()})
        if now - self._last_expire >= EXPIRE_EVERY_SECONDS:
            self._last_expire = now
            for tier in self.settings.tiers:
                self.store.history_expire(tier.key, now - tier.keep_seconds)
        for listener in list(self.sampled):
            listener(t_ms)

    def _fleet_row(self, sampling: _Sampling) -> tuple[int, ...]:
        """The fleet's point: the edges' rows added up (missing values left
        out), the KV cache as the mean of every provider reporting it."""
        row: list[int] = [self._registry.connected_count]
        rows = sampling.rows
        if not rows:
            # Nothing connected: no capacity, no tokens; the engines said nothing.
            return (*row, *(0,) * (len(FLEET_FIELDS) - 4), MISSING, MISSING, MISSING)
        for column in list(zip(*rows, strict=True))[1:_KV_AT]:
            if min(column) >= 0:
                row.append(sum(column))
            else:
                present = [v for v in column if v >= 0]
                row.append(sum(present) if present else MISSING)
        row.append(sampling.kv_sum // sampling.kv_reporting if sampling.kv_reporting else MISSING)
        return tuple(row)

    # -- figures ----------------------------------------------------------------------------

    @property
    def series_kept(self) -> int:
        """Series open now."""
        return len(self.recorder)
