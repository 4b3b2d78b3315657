"""The open chunks and roll-ups of the fleet's series, and their writes to the store.

A :class:`HistoryRecorder` keeps the few series sampled as one row each
(``fleet`` and each model fleet-wide, ``model:<name>``; every edge's
series are kept column-wise by :mod:`.frames`). It takes sampled points
(:meth:`append`) and, per series, keeps:

* the open chunk of the finest tier (:class:`~.chunks.OpenChunk`), written
  to the store every :data:`WRITE_EVERY_POINTS` points (the store
  coalesces writes of one key; views read the open chunk from memory),
  and written compressed once it is full (a new chunk starts with the
  next point);
* for each coarser tier, the finer points of the bucket in progress;
  when a point of the next bucket arrives, they are rolled up
  (:mod:`.tiers`) into one point of that tier, appended to its open
  chunk and written.

A chunk's key in the store is ``(series, tier key, start)``, ``start``
its first point's time, so a restarted process simply starts new chunks;
the bucket it was in the middle of is kept as a partial point (its count
says how many sampled points it holds), and a view combines two points
of one bucket into one (:mod:`.queries`).

Bounded: at most ``max_series`` series are kept open, with the per-edge
keys (a series beyond it is not started; :attr:`series_refused` counts
the points refused, the first refusal is logged); a series that got no point for
:data:`IDLE_INTERVALS` intervals (a disconnected edge, a model no longer
served) is closed and forgotten (:meth:`sweep`). No I/O: the store's
write methods return at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import attrs
from twisted.logger import Logger

from twisted_iop.controlplane.history import chunks, tiers
from twisted_iop.controlplane.history.fields import fields_of
from twisted_iop.controlplane.history.settings import HistorySettings, Tier
from twisted_iop.controlplane.store.interface import HistoryChunk, HistoryStore

#: A series with no point for this many intervals is closed and forgotten.
IDLE_INTERVALS = 4
#: The finest tier's open chunk is written every this many points (and when
#: it closes): a crash loses at most this many intervals of the finest tier
#: (a stop writes everything; the coarser tiers are written at every point).
#: Writing it at every point cost about a third of a sample (bench/history.py).
WRITE_EVERY_POINTS = 4

Row = tuple[int, ...]


@attrs.define(eq=False)
class OpenSeries:
    """One series' open chunks (one per tier) and its buckets in progress."""

    name: str
    width: int
    #: One open chunk per tier, finest first.
    chunks: list[chunks.OpenChunk]
    #: Per coarser tier (index 0: the second tier), the start of the bucket
    #: in progress and the finer points it holds so far.
    buckets: list[int]
    pending: list[list[Row]]
    last_ms: int = -1


class HistoryRecorder:
    """Every open series, appended to as samples come (see the module docstring)."""

    _log = Logger()

    def __init__(
        self, settings: HistorySettings, store: HistoryStore, other_series: Callable[[], int] = lambda: 0
    ) -> None:
        self.settings = settings
        self._other_series = other_series
        self.tiers: tuple[Tier, ...] = settings.tiers
        #: The coarser tiers' steps and every tier's key, computed once (read per point).
        self._coarser_steps = [tier.step_ms for tier in settings.tiers[1:]]
        self._keys = [tier.key for tier in settings.tiers]
        self._store = store
        self._series: dict[str, OpenSeries] = {}
        #: Points not recorded because ``max_series`` series were open.
        self.series_refused = 0
        #: Points written (every tier).
        self.points_written = 0
        #: Chunks written to the store (open ones again as they grow).
        self.chunk_writes = 0
        self._refusal_logged = False

    def __len__(self) -> int:
        return len(self._series)

    def __contains__(self, name: str) -> bool:
        return name in self._series

    def names(self) -> list[str]:
        """The series kept open now."""
        return list(self._series)

    def append(self, name: str, t_ms: int, values: Row) -> bool:
        """Record a sampled point of series ``name``; False if it was not
        (``max_series`` reached, or not after the series' last point)."""
        series = self._series.get(name)
        if series is None:
            series = self._start(name)
            if series is None:
                return False
        if t_ms <= series.last_ms:
            return False
        series.last_ms = t_ms
        buckets = series.buckets
        pending = series.pending
        for index, step_ms in enumerate(self._coarser_steps):
            bucket = t_ms - t_ms % step_ms
            if buckets[index] != bucket:
                if pending[index]:
                    self._roll(series, index)
                buckets[index] = bucket
        if pending:
            pending[0].append(values)
        self._append(series, 0, t_ms, values)
        return True

    def _start(self, name: str) -> Optional[OpenSeries]:
        if len(self._series) + self._other_series() >= self.settings.max_series:
            self.series_refused += 1
            if not self._refusal_logged:
                self._refusal_logged = True
                self._log.warn(
                    "history: {max_series} series are kept (history.max_series); series {name} and any "
                    "further ones are not sampled (counted in iop_history_samples_skipped_total)",
                    max_series=self.settings.max_series,
                    name=name,
                )
            return None
        width = len(fields_of(name))
        open_chunks = [chunks.OpenChunk(chunks.SAMPLED, 1 + width)]
        open_chunks += [chunks.OpenChunk(chunks.ROLLED, 1 + tiers.rolled_width(width)) for _ in self.tiers[1:]]
        coarser = len(self.tiers) - 1
        series = OpenSeries(name, width, open_chunks, [-1] * coarser, [[] for _ in range(coarser)])
        self._series[name] = series
        return series

    def _roll(self, series: OpenSeries, index: int) -> None:
        """Close the bucket in progress of coarser tier ``index``: its point
        is appended to that tier's chunk and handed to the next tier."""
        points = series.pending[index]
        point = tiers.roll_sampled(points) if index == 0 else tiers.roll_rolled(points)
        series.pending[index] = []
        if index + 1 < len(series.pending):
            series.pending[index + 1].append(point)
        self._append(series, index + 1, series.buckets[index], point)

    def _append(self, series: OpenSeries, tier_index: int, t_ms: int, values: Row) -> None:
        chunk = series.chunks[tier_index]
        chunk.append(t_ms, values)
        self.points_written += 1
        if chunk.full:
            self._write(series.name, tier_index, chunk, closed=True)
            series.chunks[tier_index] = chunks.OpenChunk(chunk.kind, chunk.columns)
        elif tier_index or chunk.points % WRITE_EVERY_POINTS == 0:
            self._write(series.name, tier_index, chunk, closed=False)

    def _write(self, name: str, tier_index: int, chunk: chunks.OpenChunk, closed: bool) -> None:
        data = chunk.closed_bytes() if closed else chunk.open_bytes()
        key = self._keys[tier_index]
        self._store.history_write(HistoryChunk(name, key, chunk.start_ms / 1000, chunk.end_ms / 1000, data))
        self.chunk_writes += 1

    # -- what views read of the open series --------------------------------------------

    def open_chunk(self, name: str, tier_index: int) -> Optional[HistoryChunk]:
        """The open chunk of a series at a tier, as the store would hold it (None: none open)."""
        series = self._series.get(name)
        if series is None:
            return None
        chunk = series.chunks[tier_index]
        if not chunk.points:
            return None
        tier = self.tiers[tier_index]
        return HistoryChunk(name, tier.key, chunk.start_ms / 1000, chunk.end_ms / 1000, chunk.open_bytes())

    def partial(self, name: str, tier_index: int) -> Optional[tuple[int, Row]]:
        """The point in progress of a coarser tier (its bucket's time and the
        rolled-up values of what it holds so far), or None."""
        series = self._series.get(name)
        if series is None or tier_index < 1:
            return None
        point: Optional[Row] = None
        for level in range(tier_index):
            finer = series.pending[level]
            if level == 0:
                point = tiers.roll_sampled(finer) if finer else None
            else:
                parts = list(finer) if point is None else [*finer, point]
                point = tiers.roll_rolled(parts) if parts else None
        if point is None:
            return None
        return series.buckets[tier_index - 1], point

    # -- closing ---------------------------------------------------------------------------

    def sweep(self, now_ms: int) -> int:
        """Close and forget the series idle for :data:`IDLE_INTERVALS` intervals; how many."""
        idle_ms = round(self.settings.interval_seconds * 1000) * IDLE_INTERVALS
        idle = [name for name, series in self._series.items() if series.last_ms < now_ms - idle_ms]
        for name in idle:
            self._close(self._series.pop(name))
        return len(idle)

    def close_all(self) -> None:
        """Write every series' partial points and chunks, compressed (at stop)."""
        for series in self._series.values():
            self._close(series)
        self._series.clear()

    def _close(self, series: OpenSeries) -> None:
        for index in range(len(series.pending)):
            if series.pending[index]:
                self._roll(series, index)
        for tier_index, chunk in enumerate(series.chunks):
            if chunk.points:
                self._write(series.name, tier_index, chunk, closed=True)
