"""A sample of every edge, as one frame per segment of each per-edge group.

:class:`EdgeSampler` keeps, per segment (:mod:`.frames`), the record behind
each edge slot (none while the edge is away) and the breakdown
(:mod:`.breakdown`: per model, the engines) each slot's figures come from,
and turns a sample of the registry into a frame per segment and group:

* ``edges``: the counts of every edge's kept snapshot as whole columns (cut
  from the segment's counts at once; none when no count changed) and, as
  patches, the edges that came, went or whose breakdown changed
  (``edges_connected`` and the engines' figures);
* ``edge-models``: the models of those edges, as patches.

Changed snapshots are parsed in a rotating order, at most ``parse_budget``
per sample; the others keep their last breakdown until their turn. The
fleet's point is the segments' columns added up (a whole column's total is
kept while it is the same list), each model's fleet-wide point the running
total of its edges' rows, changed only by the edges that came, went or
changed; their latency p95s are those of the running merge of the edges'
sketches (:class:`~.latency.LatencyTotal`), changed the same way. The
work of a sample is split by segment (:meth:`EdgeSampler.step`) so that
the service can spread it over reactor turns.

``history.max_series`` bounds the keys (both groups and the service's own
series): an edge or a model on an edge beyond it gets no slot (its points
are counted as refused; an edge's counts still add to the fleet's point).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress
from operator import add, attrgetter, is_not, sub
from typing import Optional

import attrs
from twisted.logger import Logger

from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.history.breakdown import COUNT_COLUMNS, EMPTY, Breakdown, BreakdownCache
from twisted_iop.controlplane.history.fields import (
    EDGE_MODELS_GROUP,
    EDGES_GROUP,
    FLEET_FIELDS,
    LATENCY_FIELDS,
    MISSING,
    MODEL_FIELDS,
    index_of,
)
from twisted_iop.controlplane.history.frames import (
    IDLE_FRAMES,
    SEGMENTS,
    FrameGroup,
    GroupShape,
    SegmentRecorder,
    segment_of,
)
from twisted_iop.controlplane.history.latency import NO_LATENCY, LatencyTotal
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.store.interface import HistoryStore
from twisted_iop.wire.status_totals import COUNTS_LEN

_FIRST_EXTRA = 1 + len(COUNT_COLUMNS)
_KV_AT = index_of(FLEET_FIELDS)["kv_cache_usage"]
#: Where the latency fields start in the fleet's row, and in a model's (the additive figures before them).
_LATENCY_AT = index_of(FLEET_FIELDS)[LATENCY_FIELDS[0].name]
_MODEL_LATENCY_AT = index_of(MODEL_FIELDS)[LATENCY_FIELDS[0].name]
#: The fleet's figures when no edge is connected: no capacity, no tokens; the engines and latency said nothing.
_NOTHING_CONNECTED = (
    *(0,) * (index_of(FLEET_FIELDS)["engine_running"] - 1),
    *(MISSING,) * (len(FLEET_FIELDS) - index_of(FLEET_FIELDS)["engine_running"]),
)

#: Each edge's row: edges_connected and the engines' figures come as patches, the counts as whole columns.
EDGES = GroupShape(EDGES_GROUP, FLEET_FIELDS, (0, *range(_FIRST_EXTRA, len(FLEET_FIELDS))))
#: Each model's row on an edge: patches only (they change when a snapshot is parsed).
EDGE_MODELS = GroupShape(EDGE_MODELS_GROUP, MODEL_FIELDS, tuple(range(len(MODEL_FIELDS))))

#: What an absent edge slot reads.
_AWAY = StatusSnapshot(b"", 0.0, (MISSING,) * COUNTS_LEN)


@attrs.frozen
class _Away:
    """The record behind an edge slot whose edge is away."""

    snapshot: StatusSnapshot = _AWAY
    token: Optional[int] = None


_AWAY_EDGE = _Away()
#: New snapshots looked at per sample, per snapshot parsed (``parse_budget``).
LOOKS_PER_PARSE = 4
_EDGE_AWAY = (MISSING,) * len(EDGES.patch_columns)
_MODEL_AWAY = (MISSING,) * len(MODEL_FIELDS)

_get_counts = attrgetter("counts")
_get_snapshot = attrgetter("snapshot")
_get_token = attrgetter("token")

ModelRows = dict[str, tuple[int, ...]]


@attrs.define(eq=False)
class _Segment:
    """The sampler's side of one segment: what is behind each edge slot, and this sample's changes."""

    index: int
    edges: SegmentRecorder
    models: SegmentRecorder
    #: Per edge slot (and the new ones of this sample): its record (away: an
    #: edge with the away snapshot), the snapshot last looked at, the bytes its
    #: breakdown was made from (or found the same as), the breakdown in use.
    records: list[EdgeRecord | _Away] = attrs.Factory(list)
    seen: list[StatusSnapshot] = attrs.Factory(list)
    kept: list[bytes] = attrs.Factory(list)
    breakdowns: list[Breakdown] = attrs.Factory(list)
    #: This sample's snapshots, and the counts handed last.
    snapshots: list[StatusSnapshot] = attrs.Factory(list)
    counts: Optional[list[tuple[int, ...]]] = None
    #: The connection token of each slot's record when last looked at (away: None).
    tokens: list[Optional[int]] = attrs.Factory(list)
    #: This sample's changes.
    new_edges: list[str] = attrs.Factory(list)
    edge_patches: dict[int, tuple[int, ...]] = attrs.Factory(dict)
    model_moves: dict[str, tuple[ModelRows, ModelRows]] = attrs.Factory(dict)
    parse: list[int] = attrs.Factory(list)
    #: Per whole column: the list a total was taken of, the total of its present values and how many.
    totals: dict[int, tuple[object, int, int]] = attrs.Factory(dict)


class EdgeSampler:
    """Every edge's sample, as frames of its segment (see the module docstring)."""

    _log = Logger()

    def __init__(
        self,
        settings: HistorySettings,
        store: HistoryStore,
        breakdowns: BreakdownCache,
        other_series: Callable[[], int] = lambda: 0,
    ) -> None:
        self.settings = settings
        self.breakdowns = breakdowns
        self.edges = FrameGroup(EDGES, settings.edge_tiers, store)
        self.models = FrameGroup(EDGE_MODELS, settings.edge_tiers, store)
        self._segments = [_Segment(s, self.edges.segments[s], self.models.segments[s]) for s in range(SEGMENTS)]
        self._other_series = other_series
        self._idle_ms = IDLE_FRAMES * settings.edge_tiers[0].step_ms
        #: The present edges by id (with a slot or refused one), and how many have a slot.
        self._by_id: dict[str, EdgeRecord] = {}
        self._present = 0
        #: Present edges without a slot (``max_series``).
        self._refused: dict[str, EdgeRecord] = {}
        self._slots = 0
        self._cursor = (0, 0)
        #: Per model served: how many edges serve it, and their rows' figures before the latency added up.
        self._model_totals: dict[str, tuple[int, tuple[int, ...]]] = {}
        #: Per model served, and for the fleet: the edges' latency merged.
        self._model_latency: dict[str, LatencyTotal] = {}
        self._latency = LatencyTotal()
        #: The KV-cache shares reported, added up, and how many providers reported one.
        self._kv = [0, 0]
        #: Per engine figure of the edges (:data:`~.breakdown.EXTRA_FIELDS`): the present values added up, and how many.
        self._extras = [[0, 0] for _ in range(len(FLEET_FIELDS) - _FIRST_EXTRA)]
        self._t_ms = 0
        self._todo: list[int] = []
        #: Points not recorded for ``max_series`` (an edge's or a model's, per sample).
        self.refused = 0
        self._refusal_logged = False

    # -- a sample ---------------------------------------------------------------------

    def begin(self, t_ms: int, edges: Callable[[], Iterable[EdgeRecord]], connected: int) -> None:
        """Start a sample at ``t_ms`` of the connected edges with a snapshot among
        ``edges()`` (the registry's), ``connected`` of them connected."""
        self._t_ms = t_ms
        if not self._same_members(connected):
            self._membership([r for r in edges() if r.token is not None and r.snapshot is not None])
        elif self._refused:
            self._place_refused()
        self.refused += len(self._refused)
        fresh = 0
        for segment in self._segments:
            if segment.records:
                segment.snapshots = list(map(_get_snapshot, segment.records))
                # New snapshot objects (compared by identity: no bytes read; summed in C).
                fresh += sum(map(is_not, segment.snapshots, segment.seen))
        self.breakdowns.deferred += fresh - self._examine() if fresh else 0
        self._todo = [s.index for s in self._segments if s.records]

    def step(self, segments: int) -> bool:
        """Take the next ``segments`` segments' frames; True when none is left."""
        todo = self._todo
        for index in todo[:segments]:
            self._frame(self._segments[index])
        del todo[:segments]
        return not todo

    def _frame(self, segment: _Segment) -> None:
        t_ms = self._t_ms
        for slot in segment.parse:
            self._parse(segment, slot)
        segment.parse = []
        counts = list(map(_get_counts, segment.snapshots))
        whole: list[tuple[int, Sequence[int]]] = []
        if segment.new_edges or counts != segment.counts:
            flat = list(chain.from_iterable(counts))
            whole = [(column, flat[at::COUNTS_LEN]) for column, at in COUNT_COLUMNS]
            segment.counts = counts
        segment.edges.append(t_ms, segment.new_edges, whole, list(segment.edge_patches.items()))
        new_keys, patches = self._model_patches(segment)
        if new_keys or patches or len(segment.models):
            segment.models.append(t_ms, new_keys, [], patches)
        segment.new_edges = []
        segment.edge_patches = {}
        segment.model_moves = {}
        if segment.edges.absent_since:
            old_keys = list(segment.edges.keys)
            if segment.edges.compact_if_idle(t_ms, self._idle_ms):
                self._realign(segment, old_keys)
        if segment.models.absent_since:
            before = len(segment.models)
            if segment.models.compact_if_idle(t_ms, self._idle_ms):
                self._slots -= before - len(segment.models)

    # -- who has a slot ---------------------------------------------------------------

    def _same_members(self, connected: int) -> bool:
        """Whether the edges sampled last time are all still connected on the
        same connections and no other edge is (without building the list)."""
        if connected != self._present + len(self._refused):
            return False
        for segment in self._segments:
            if segment.records and list(map(_get_token, segment.records)) != segment.tokens:
                return False
        return True

    def _membership(self, records: list[EdgeRecord]) -> None:
        by_id = {record.edge_id: record for record in records}
        old = self._by_id
        for edge_id in old.keys() - by_id.keys():
            if self._refused.pop(edge_id, None) is not None:
                continue
            segment = self._segments[segment_of(edge_id)]
            slot = segment.edges.slot_of.get(edge_id)
            if slot is not None:
                self._leave(segment, slot, edge_id)
        for edge_id, record in by_id.items():
            before = old.get(edge_id)
            if before is record:
                continue
            segment = self._segments[segment_of(edge_id)]
            slot = segment.edges.slot_of.get(edge_id)
            if before is not None:  # the same edge, a new record object
                if slot is not None:
                    segment.records[slot] = record
                elif edge_id in self._refused:
                    self._refused[edge_id] = record
                continue
            if slot is not None:
                self._join(segment, slot, record)
            else:
                self._refused[edge_id] = record
        self._by_id = by_id
        self._place_refused()
        for segment in self._segments:
            segment.tokens = list(map(_get_token, segment.records))

    def _place_refused(self) -> None:
        for edge_id in sorted(self._refused):
            if not self._room(edge_id):
                return
            record = self._refused.pop(edge_id)
            segment = self._segments[segment_of(edge_id)]
            slot = len(segment.records)
            segment.records.append(_AWAY_EDGE)
            segment.seen.append(_AWAY)
            segment.kept.append(b"")
            segment.breakdowns.append(EMPTY)
            segment.new_edges.append(edge_id)
            self._slots += 1
            self._join(segment, slot, record)
            segment.tokens.append(record.token)

    def _room(self, key: str) -> bool:
        if self._slots + self._other_series() < self.settings.max_series:
            return True
        if not self._refusal_logged:
            self._refusal_logged = True
            self._log.warn(
                "history: {max_series} series are kept (history.max_series); {key} and any further ones are "
                "not sampled (counted in iop_history_samples_skipped_total)",
                max_series=self.settings.max_series,
                key=key,
            )
        return False

    def _join(self, segment: _Segment, slot: int, record: EdgeRecord) -> None:
        self._present += 1
        data, breakdown = self.breakdowns.kept(record.edge_id)
        segment.records[slot] = record
        segment.kept[slot] = data
        segment.breakdowns[slot] = breakdown
        segment.edge_patches[slot] = (1, *breakdown.extras)
        self._move(segment, record.edge_id, (), breakdown.models)
        self._count(breakdown, 1)

    def _leave(self, segment: _Segment, slot: int, edge_id: str) -> None:
        self._present -= 1
        breakdown = segment.breakdowns[slot]
        segment.records[slot] = _AWAY_EDGE
        segment.seen[slot] = _AWAY
        segment.kept[slot] = b""
        segment.breakdowns[slot] = EMPTY
        segment.edge_patches[slot] = _EDGE_AWAY
        self._move(segment, edge_id, breakdown.models, ())
        self._count(breakdown, -1)

    def _realign(self, segment: _Segment, old_keys: list[str]) -> None:
        """The edges' segment was compacted: its slots are renumbered."""
        place = {key: slot for slot, key in enumerate(old_keys)}
        order = [place[key] for key in segment.edges.keys]
        self._slots -= len(old_keys) - len(order)
        segment.records = [segment.records[slot] for slot in order]
        segment.tokens = [segment.tokens[slot] for slot in order]
        segment.seen = [segment.seen[slot] for slot in order]
        segment.kept = [segment.kept[slot] for slot in order]
        segment.breakdowns = [segment.breakdowns[slot] for slot in order]
        segment.counts = None
        segment.totals = {}

    # -- breakdowns ---------------------------------------------------------------------

    def _examine(self) -> int:
        """Look at the new snapshots in turn, from where the last sample stopped:
        those whose bytes changed are parsed (in their segment's step), up to
        ``parse_budget`` of them, and at most :data:`LOOKS_PER_PARSE` times as
        many are looked at (a round gives every edge a new snapshot, mostly
        with the same bytes in a steady fleet); the others wait for their
        turn. How many were looked at."""
        budget = self.settings.parse_budget
        looks = budget * LOOKS_PER_PARSE
        start_segment, start_slot = self._cursor
        picked = looked = 0
        for turn in range(SEGMENTS + 1):
            index = (start_segment + turn) % SEGMENTS
            segment = self._segments[index]
            snapshots, seen, kept = segment.snapshots, segment.seen, segment.kept
            if not segment.records:
                continue
            first, end = 0, len(snapshots)
            if turn == 0:
                first = min(start_slot, end)
            elif turn == SEGMENTS:
                end = min(start_slot, end)
            for slot in compress(range(first, end), map(is_not, snapshots[first:end], seen[first:end])):
                snapshot = snapshots[slot]
                looked += 1
                data = snapshot.data
                if data is not kept[slot] and data != kept[slot]:
                    segment.parse.append(slot)
                    picked += 1
                seen[slot] = snapshot
                self._cursor = (index, slot + 1)
                if picked >= budget or looked >= looks:
                    return looked
        return looked

    def _parse(self, segment: _Segment, slot: int) -> None:
        record = segment.records[slot]
        if record is _AWAY_EDGE:
            return
        assert isinstance(record, EdgeRecord)
        snapshot = segment.snapshots[slot]
        made = self.breakdowns.parse(record.edge_id, snapshot)
        segment.kept[slot] = snapshot.data
        old = segment.breakdowns[slot]
        if made == old:
            return
        segment.breakdowns[slot] = made
        if made.extras != old.extras:
            segment.edge_patches[slot] = (1, *made.extras)
        if made.models != old.models:
            self._move(segment, record.edge_id, old.models, made.models)
        self._count(old, -1)
        self._count(made, 1)

    def _move(
        self,
        segment: _Segment,
        edge_id: str,
        before: Sequence[tuple[str, tuple[int, ...]]],
        after: Sequence[tuple[str, tuple[int, ...]]],
    ) -> None:
        kept = segment.model_moves.get(edge_id)
        segment.model_moves[edge_id] = (kept[0] if kept is not None else dict(before), dict(after))

    def _count(self, breakdown: Breakdown, sign: int) -> None:
        """Add (1) or take away (-1) an edge's breakdown from the fleet's totals."""
        kv = self._kv
        totals = self._model_totals
        extras = self._extras
        for at, value in enumerate(breakdown.extras):
            if value >= 0:
                extras[at][0] += sign * value
                extras[at][1] += sign
        self._latency.add(breakdown.latency, sign)
        latency = self._model_latency
        cut = _MODEL_LATENCY_AT
        if sign > 0:
            kv[0] += breakdown.kv_sum
            kv[1] += breakdown.kv_reporting
            for (model, row), part in zip(breakdown.models, breakdown.model_latency, strict=True):
                kept = totals.get(model)
                if kept is None:
                    totals[model] = (1, row[:cut])
                    latency[model] = LatencyTotal()
                else:
                    totals[model] = (kept[0] + 1, tuple(map(add, kept[1], row[:cut])))
                latency[model].add(part)
            return
        kv[0] -= breakdown.kv_sum
        kv[1] -= breakdown.kv_reporting
        for (model, row), part in zip(breakdown.models, breakdown.model_latency, strict=True):
            edges, total = totals[model]
            if edges == 1:
                del totals[model]
                del latency[model]
            else:
                totals[model] = (edges - 1, tuple(map(sub, total, row[:cut])))
                latency[model].add(part, -1)

    def _model_patches(self, segment: _Segment) -> tuple[list[str], list[tuple[int, tuple[int, ...]]]]:
        models = segment.models
        new_keys: list[str] = []
        patches: list[tuple[int, tuple[int, ...]]] = []
        for edge_id, (before, after) in segment.model_moves.items():
            for model in sorted(before.keys() | after.keys()):
                key = f"{edge_id}/{model}"
                row = after.get(model)
                slot = models.slot_of.get(key)
                if slot is None:
                    if row is None:
                        continue
                    if not self._room(key):
                        self.refused += 1
                        continue
                    slot = len(models.keys) + len(new_keys)
                    new_keys.append(key)
                    self._slots += 1
                patches.append((slot, row if row is not None else _MODEL_AWAY))
        return new_keys, patches

    # -- what the sample adds up to ------------------------------------------------------

    def fleet_row(self, connected: int) -> tuple[int, ...]:
        """The fleet's point: the edges' values added up (missing ones left
        out), the KV cache as the mean of every provider reporting it."""
        width = len(FLEET_FIELDS)
        totals = [0] * width
        present = [0] * width
        for segment in self._segments:
            if not segment.edges.present:
                continue
            columns = segment.edges.columns
            cache = segment.totals
            for column, _ in COUNT_COLUMNS:
                values = columns[column]
                kept = cache.get(column)
                if kept is not None and kept[0] is values:
                    total, count = kept[1], kept[2]
                else:
                    missing = values.count(MISSING)
                    total, count = sum(values) + missing, len(values) - missing
                    cache[column] = (values, total, count)
                totals[column] += total
                present[column] += count
        for at, (total, count) in enumerate(self._extras, start=_FIRST_EXTRA):
            totals[at], present[at] = total, count
        sampled = self._present > 0
        latency = self._latency
        for record in self._refused.values():
            snapshot = record.snapshot
            if snapshot is None:
                continue
            sampled = True
            row = [0] * width
            for column, at in COUNT_COLUMNS:
                row[column] = snapshot.counts[at]
            breakdown = self.breakdowns.kept(record.edge_id)[1]
            row[_FIRST_EXTRA:] = breakdown.extras
            for column in range(1, width):
                if row[column] >= 0:
                    totals[column] += row[column]
                    present[column] += 1
            if breakdown.latency is not NO_LATENCY:
                if latency is self._latency:
                    latency = latency.copy()
                latency.add(breakdown.latency)
        if not sampled:
            return (connected, *_NOTHING_CONNECTED)
        row = [connected]
        row += [totals[c] if present[c] else MISSING for c in range(1, _KV_AT)]
        kv_sum, kv_reporting = self._kv
        row.append(kv_sum // kv_reporting if kv_reporting else MISSING)
        row += latency.values()
        return tuple(row)

    def fleet_row_between(self, edges: Iterable[EdgeRecord], connected: int) -> tuple[int, ...]:
        """The fleet's point between two samples of the edges: the counts of
        the connected edges' snapshots added up now, the engines' figures as
        at the last sample of the edges."""
        counts = [r.snapshot.counts for r in edges if r.token is not None and r.snapshot is not None]
        width = len(FLEET_FIELDS)
        if not counts:
            return (connected, *_NOTHING_CONNECTED)
        flat = list(chain.from_iterable(counts))
        row = [connected] + [0] * (width - 1)
        for column, at in COUNT_COLUMNS:
            row[column] = sum(flat[at::COUNTS_LEN])
        for at, (total, count) in enumerate(self._extras, start=_FIRST_EXTRA):
            row[at] = total if count else MISSING
        kv_sum, kv_reporting = self._kv
        row[_KV_AT] = kv_sum // kv_reporting if kv_reporting else MISSING
        row[_LATENCY_AT:] = self._latency.values()
        return tuple(row)

    def model_rows(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each model served now, fleet-wide: its edges' rows added up, its
        latency p95s of their sketches merged."""
        latency = self._model_latency
        return [(model, (*kept[1], *latency[model].values())) for model, kept in sorted(self._model_totals.items())]

    # -- views and closing -------------------------------------------------------------

    @property
    def slots(self) -> int:
        """Keys with a slot, in both groups."""
        return self._slots

    def models_of(self, edge_id: str) -> tuple[str, ...]:
        """The models an edge has a series of."""
        prefix = edge_id + "/"
        return tuple(sorted(k[len(prefix) :] for k in self.models.of(edge_id).keys if k.startswith(prefix)))

    def flush(self) -> None:
        """Write every point in progress and close every chunk (at stop, or when another replica samples)."""
        self.edges.flush()
        self.models.flush()
