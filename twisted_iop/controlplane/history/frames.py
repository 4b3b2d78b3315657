"""Every edge (and every model on each edge) recorded column by column: history's speed trick.

A fleet of 10,000 edges has 30,000 per-edge series (each edge and the 2
models it serves). Kept one by one (a series object, an open chunk and
roll-ups per series, as :mod:`.recorder` keeps the fleet's), a sample
cost about 8 us a series, 85-93 % of a fleet round, and a day 136 KiB an
edge. Here the keys of a **group** (``edges``: each edge's
:data:`~.fields.FLEET_FIELDS`; ``edge-models``: each model on each edge,
:data:`~.fields.MODEL_FIELDS`) are split by a hash of the edge id into
:data:`SEGMENTS` segments, and a :class:`SegmentRecorder` keeps one
segment's keys together, as *slots* of columns (one list per field, one
value per slot):

* a sample hands it **whole columns** (the figures read from every
  edge's counts: the same list object when nothing changed, so an
  unchanged column costs one identity check) and **patches** (the few
  slots whose parsed figures changed, or that came or went);
* the finest tier's chunk takes the frame as differences
  (:mod:`.columns`: a column nothing changed in costs nothing);
* the next tier's point in progress is kept column-wise
  (:mod:`.buckets`): a whole
  column is added in C (``map``) only when it is a new list (an
  unchanged one just counts once more), a patched slot's run of a
  value is added when the value changes, and at the bucket's end every
  slot's point (count, and per field sum, max, last, n: :mod:`.tiers`)
  is made for the whole segment at once;
* the coarser tiers add those points column by column in the same way.

Measured with bench/history.py (10,000 edges of 2 models, 16 segments,
shared 2-core machine; docs/performance.md#capacity-history): a sample of
the edges costs about 17 ms in a steady fleet and 43 ms in a busy one
(250 snapshots parsed included) where one series object per key cost
about 8.4 us a series, 250 ms for the 30,000 series of the steady fleet;
a busy simulated day keeps 9.6-11.5 KiB an edge where it kept 136 KiB.
Everything here is checked against the plain roll-ups of :mod:`.tiers`
(tests/controlplane/test_cp_history_frames.py).

A slot stays until its segment is **compacted**: when enough slots have
been absent for :data:`IDLE_FRAMES` frames (edges gone, models no longer
served), every point in progress is written as a partial point and
every chunk closed, and the segment starts again with the slots present
(a view combines the two partial points of a bucket, as after a
restart). No I/O but the store's write methods, which return at once.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from operator import sub
from typing import Optional

import attrs
from twisted.logger import Logger

from twisted_iop.controlplane.history import tiers
from twisted_iop.controlplane.history.buckets import Column, GroupShape, RolledBucket, Row, SampledBucket
from twisted_iop.controlplane.history.columns import ColumnChunkWriter, stored_n, stored_rolled
from twisted_iop.controlplane.history.settings import Tier
from twisted_iop.controlplane.history.tiers import PER_FIELD
from twisted_iop.controlplane.store.interface import HistoryChunk, HistoryStore

#: Segments per group (part of the stored form: a key's segment is a hash of its edge id).
SEGMENTS = 16
#: A chunk closes after this many frames.
MAX_FRAMES = 40
#: zlib's level for the rolled-up tiers' chunks: their bytes are as small at 1 as
#: at 6 (within 1 %, bench/history.py), and compressing them costs a quarter less.
ROLLED_ZLIB_LEVEL = 1
#: The finest tier's open chunk is written every this many frames (a
#: crash loses at most as many intervals of it; a stop writes
#: everything); the coarser tiers' at each point.
WRITE_EVERY_FRAMES = 4
#: A slot absent for this many frames counts toward compaction ...
IDLE_FRAMES = 4
#: ... which happens when at least one in this many slots are such (and at least one).
COMPACT_SHARE = 8


_log = Logger()


def store_key(tier: Tier) -> int:
    """A tier's ``step`` in the store's keys of column chunks: its key negated,
    apart from the fleet's chunks of the same step (the edge tiers keep
    theirs for another time, and expiry goes by the key)."""
    return -tier.key


def segment_of(edge_id: str) -> int:
    """The segment of an edge's keys (its own and its models')."""
    return zlib.crc32(edge_id.encode("utf-8")) % SEGMENTS


@attrs.define(eq=False)
class FrameStats:
    """What a group's segments did, for /metrics and the bench."""

    points: int = 0
    chunk_writes: int = 0
    compactions: int = 0


@attrs.define(eq=False)
class _TierChunk:
    """A tier's open chunk of a segment, and its last point's columns (raw and as stored)."""

    writer: Optional[ColumnChunkWriter] = None
    first_ms: int = 0
    last_ms: int = 0
    raw: Optional[list[Column]] = None
    stored: Optional[list[Column]] = None


class SegmentRecorder:
    """One segment of a group: its slots, current values, points in progress and open chunks."""

    def __init__(
        self, shape: GroupShape, segment: int, tier_list: Sequence[Tier], store: HistoryStore, stats: FrameStats
    ) -> None:
        self.shape = shape
        self.segment = segment
        self.series = shape.series(segment)
        self.tiers = tuple(tier_list)
        self._steps = [tier.step_ms for tier in self.tiers[1:]]
        self._patch_set = frozenset(shape.patch_columns)
        self._store = store
        self.stats = stats
        self.keys: list[str] = []
        self.slot_of: dict[str, int] = {}
        #: The values now, one list per column (whole columns are replaced, patch columns changed in place).
        self.columns: list[Column] = [[] for _ in range(shape.width)]
        #: Slots absent now, and since which frame time.
        self.absent_since: dict[int, int] = {}
        self.last_ms = -1
        self._chunks = [_TierChunk() for _ in self.tiers]
        self._buckets: list[SampledBucket | RolledBucket] = []
        self._reset_buckets()

    def _reset_buckets(self) -> None:
        slots = len(self.keys)
        made: list[SampledBucket | RolledBucket] = []
        if len(self.tiers) > 1:
            made.append(SampledBucket(self.shape, slots))
            made += [RolledBucket(self.shape, slots) for _ in self.tiers[2:]]
        for old, new in zip(self._buckets, made, strict=False):
            new.start = old.start
        self._buckets = made

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def present(self) -> int:
        """Slots present now."""
        return len(self.keys) - len(self.absent_since)

    # -- a frame -----------------------------------------------------------------------

    def append(
        self,
        t_ms: int,
        new_keys: Sequence[str],
        whole: Sequence[tuple[int, Column]],
        patches: Sequence[tuple[int, Sequence[int]]],
    ) -> bool:
        """One frame: ``new_keys`` get the next slots (each must be patched in
        this frame), ``whole`` gives whole columns ``(column, values of
        every slot)`` (a list the caller no longer changes), ``patches``
        ``(slot, values of the patch columns)``. An absent slot's values
        are all :data:`~.fields.MISSING`. False if ``t_ms`` is not after
        the last frame."""
        if t_ms <= self.last_ms:
            return False
        self.last_ms = t_ms
        self._advance(t_ms)
        first_new = len(self.keys)
        if new_keys:
            self._grow(new_keys)
        slots = len(self.keys)
        columns = self.columns
        changes: list[tuple[int, list[int]]] = []
        for column, values in whole:
            if column in self._patch_set:
                raise ValueError(f"{self.series}: column {column} comes as patches")
            current = columns[column]
            if values is current:
                continue
            if len(values) != slots:
                raise ValueError(f"{self.series}: column {column} has {len(values)} values for {slots} slots")
            if values != current:  # an equal list leaves the current one (its sums are counted by identity)
                changes.append((column, list(map(sub, values, current))))
                columns[column] = values
        bucket = self._buckets[0] if self._buckets else None
        sampled = bucket if isinstance(bucket, SampledBucket) else None
        patched: list[tuple[int, list[int]]] = []
        new_patched = 0
        if patches:
            # The patch columns' lists, changed in place.
            held: list[list[int]] = [columns[c] for c in self.shape.patch_columns]  # type: ignore[misc]  # the patch columns are lists, typed as Sequence
            width = len(held)
            absent_since = self.absent_since
            for slot, row in sorted(patches):
                if len(row) != width:
                    raise ValueError(f"{self.series}: a patch of {len(row)} values for {width} patch columns")
                if slot >= first_new:
                    new_patched += 1
                old = [values[slot] for values in held]
                if old == list(row):
                    continue
                if sampled is not None:
                    sampled.patched(slot, old)
                patched.append((slot, list(map(sub, row, old))))
                for values, value in zip(held, row, strict=True):
                    values[slot] = value
                if row[0] < 0:
                    absent_since.setdefault(slot, t_ms)
                else:
                    absent_since.pop(slot, None)
        if new_patched != slots - first_new:
            raise ValueError(f"{self.series}: every new slot is patched in its first frame")
        self._write_frame(t_ms, changes, patched)
        if sampled is not None:
            sampled.add_whole(columns)
            if not sampled.frames:
                sampled.first_ms = t_ms
            sampled.last_ms = t_ms
            sampled.frames += 1
        return True

    def _grow(self, new_keys: Sequence[str]) -> None:
        at = len(self.keys)
        for offset, key in enumerate(new_keys):
            if key in self.slot_of:
                raise ValueError(f"{self.series}: {key!r} has a slot already")
            self.slot_of[key] = at + offset
        self.keys += new_keys
        count = len(new_keys)
        # New slots start at 0 (what a chunk's differences start from); their first frame patches them.
        self.columns = [[*values, *[0] * count] for values in self.columns]
        for bucket in self._buckets:
            bucket.grow(count)
        for chunk in self._chunks:
            if chunk.writer is not None:
                chunk.writer.add_keys(new_keys)

    def _write_frame(
        self, t_ms: int, changes: list[tuple[int, list[int]]], patched: list[tuple[int, list[int]]]
    ) -> None:
        chunk = self._chunks[0]
        writer = chunk.writer
        if writer is None:
            writer = chunk.writer = self._new_writer(0)
            chunk.first_ms = t_ms
            writer.add_frame(t_ms, list(enumerate(self.columns)), [])
        else:
            writer.add_frame(t_ms, changes, patched)
        chunk.last_ms = t_ms
        self.stats.points += len(self.keys)
        if writer.frames >= MAX_FRAMES:
            self._write(0, closed=True)
        elif writer.frames % WRITE_EVERY_FRAMES == 0:
            self._write(0, closed=False)

    def _new_writer(self, tier_index: int) -> ColumnChunkWriter:
        if tier_index == 0:
            writer = ColumnChunkWriter(0, self.shape.width, self.shape.patch_columns)
        else:
            writer = ColumnChunkWriter(1, tiers.rolled_width(self.shape.width), (), ROLLED_ZLIB_LEVEL)
        writer.add_keys(self.keys)
        return writer

    def _write(self, tier_index: int, closed: bool) -> None:
        chunk = self._chunks[tier_index]
        writer = chunk.writer
        if writer is None or not writer.frames:
            return
        data = writer.closed_bytes() if closed else writer.open_bytes()
        key = store_key(self.tiers[tier_index])
        self._store.history_write(HistoryChunk(self.series, key, chunk.first_ms / 1000, chunk.last_ms / 1000, data))
        self.stats.chunk_writes += 1
        if closed:
            chunk.writer = None
            chunk.raw = chunk.stored = None

    # -- the coarser tiers ------------------------------------------------------------

    def _advance(self, t_ms: int) -> None:
        for index, step_ms in enumerate(self._steps):
            bucket = self._buckets[index]
            start = t_ms - t_ms % step_ms
            if bucket.start != start:
                if bucket.has_data:
                    self._roll(index)
                self._buckets[index] = self._fresh(index)
                self._buckets[index].start = start

    def _fresh(self, index: int) -> SampledBucket | RolledBucket:
        if index == 0:
            return SampledBucket(self.shape, len(self.keys))
        return RolledBucket(self.shape, len(self.keys))

    def _roll(self, index: int) -> None:
        """The point of bucket ``index`` (of tier ``index + 1``) is done: write it, hand it on."""
        bucket = self._buckets[index]
        made = bucket.roll(self.columns) if isinstance(bucket, SampledBucket) else bucket.roll()
        tier_index = index + 1
        chunk = self._chunks[tier_index]
        slots = len(self.keys)
        if chunk.raw is not None and len(chunk.raw[0]) == slots:
            made = [old if new == old else new for new, old in zip(made, chunk.raw, strict=True)]
        stored = self._stored(made, chunk)
        writer = chunk.writer
        if writer is None:
            writer = chunk.writer = self._new_writer(tier_index)
            chunk.first_ms = bucket.first_ms
            writer.add_frame(bucket.start, list(enumerate(stored)), [])
        else:
            previous = chunk.stored or []
            changes = []
            for column, (new, old) in enumerate(zip(stored, previous, strict=True)):
                if new is old:
                    continue
                if len(old) < slots:
                    old = [*old, *[0] * (slots - len(old))]
                if new != old:
                    changes.append((column, list(map(sub, new, old))))
            writer.add_frame(bucket.start, changes, [])
        chunk.last_ms = max(chunk.last_ms, bucket.last_ms)
        chunk.raw, chunk.stored = made, stored
        self.stats.points += slots
        self._write(tier_index, closed=writer.frames >= MAX_FRAMES)
        if index + 1 < len(self._buckets):
            following = self._buckets[index + 1]
            assert isinstance(following, RolledBucket)
            if not following.points:
                following.first_ms = bucket.first_ms
            following.last_ms = bucket.last_ms
            following.add(made)

    @staticmethod
    def _stored(made: list[Column], chunk: _TierChunk) -> list[Column]:
        """``made`` as the chunk stores it, keeping the stored lists of unchanged columns."""
        raw, stored = chunk.raw, chunk.stored
        if raw is None or stored is None or len(raw[0]) != len(made[0]):
            return stored_rolled(made)
        out = list(made)
        count_same = made[0] is raw[0]
        zeros: list[int] = [0] * len(made[0])
        for at in range(PER_FIELD, len(made), PER_FIELD):
            if count_same and made[at] is raw[at]:
                out[at] = stored[at]
            else:
                out[at] = stored_n(made[0], made[at], zeros)
        return out

    # -- closing and compaction --------------------------------------------------------

    def flush(self) -> None:
        """Write every point in progress (partial) and close every chunk."""
        for index, bucket in enumerate(self._buckets):
            if bucket.has_data:
                self._roll(index)
            self._buckets[index] = self._fresh(index)
            self._buckets[index].start = bucket.start
        for tier_index in range(len(self.tiers)):
            self._write(tier_index, closed=True)
            self._chunks[tier_index] = _TierChunk()

    def compact_if_idle(self, now_ms: int, idle_ms: int) -> bool:
        """Compact when enough slots have been absent for ``idle_ms``; True if it did."""
        if not self.absent_since:
            return False
        idle = [slot for slot, since in self.absent_since.items() if since <= now_ms - idle_ms]
        if not idle or len(idle) < max(1, len(self.keys) // COMPACT_SHARE):
            return False
        self.compact(set(idle))
        return True

    def compact(self, gone: set[int]) -> None:
        """Forget slots ``gone`` (absent ones): everything in progress is written first."""
        self.flush()
        kept = [slot for slot in range(len(self.keys)) if slot not in gone]
        self.keys = [self.keys[slot] for slot in kept]
        self.slot_of = {key: slot for slot, key in enumerate(self.keys)}
        self.columns = [[values[slot] for slot in kept] for values in self.columns]
        renumbered = {old: new for new, old in enumerate(kept)}
        self.absent_since = {renumbered[s]: t for s, t in self.absent_since.items() if s in renumbered}
        self._reset_buckets()
        self.stats.compactions += 1

    # -- what views read ----------------------------------------------------------------

    def open_chunk(self, tier_index: int) -> Optional[HistoryChunk]:
        """The open chunk of a tier, as the store would hold it (None: none open)."""
        chunk = self._chunks[tier_index]
        writer = chunk.writer
        if writer is None or not writer.frames:
            return None
        key = store_key(self.tiers[tier_index])
        return HistoryChunk(self.series, key, chunk.first_ms / 1000, chunk.last_ms / 1000, writer.open_bytes())

    def partial(self, key: str, tier_index: int) -> Optional[tuple[int, Row]]:
        """The point in progress of ``key`` at a coarser tier: its bucket's time and values, or None."""
        slot = self.slot_of.get(key)
        if slot is None or tier_index < 1 or tier_index > len(self._buckets):
            return None
        point: Optional[Row] = None
        for level in range(tier_index):
            bucket = self._buckets[level]
            if isinstance(bucket, SampledBucket):
                point = bucket.slot_point(slot, self.columns)
            else:
                parts = [p for p in (bucket.slot_point(slot), point) if p is not None]
                point = tiers.roll_rolled(parts) if parts else None
        if point is None:
            return None
        return self._buckets[tier_index - 1].start, point


class FrameGroup:
    """A group's :data:`SEGMENTS` segments; a key's segment is its edge's."""

    def __init__(self, shape: GroupShape, tier_list: Sequence[Tier], store: HistoryStore) -> None:
        self.shape = shape
        self.tiers = tuple(tier_list)
        self.stats = FrameStats()
        self.segments = [SegmentRecorder(shape, s, self.tiers, store, self.stats) for s in range(SEGMENTS)]

    def of(self, edge_id: str) -> SegmentRecorder:
        """The segment of an edge's keys."""
        return self.segments[segment_of(edge_id)]

    def flush(self) -> None:
        """Write every point in progress and close every chunk (at stop)."""
        for segment in self.segments:
            segment.flush()
