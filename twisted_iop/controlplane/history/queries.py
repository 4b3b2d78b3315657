"""Reading capacity history back: a view of one series (or of a selector's edges).

:class:`HistoryQueries` answers ``GET /fleet/history`` and
``GET /edges/{id}/history`` (``history_routes.py``):

* **the range**: ``from`` / ``to`` as ISO 8601 times, seconds since the
  epoch, ``now`` or relative to now (``-2h``, ``-30m``, ``-7d``);
  by default the last hour (:func:`parse_time`);
* **the tier**: ``step`` names one (``15``, ``15s``, ``1m``, ``10m``) of
  the series' tiers (the fleet's and the models' ``history.tiers``, or
  an edge's and its models' ``history.edge_tiers``); without it, the
  finest tier that keeps the range's start and gives at most
  :data:`MAX_POINTS` points, else the coarsest (:func:`choose_tier`);
* **the fields**: ``series=capacity,in_flight`` (default: all of the series');
* **the points**: the store's chunks of the range (:meth:`HistoryStore.history_read`)
  with the open chunks in memory laid over them (the same key: the
  newer bytes win) and, on a rolled-up tier, the bucket in progress as a
  partial point; two points of one bucket (a restart or a compaction in
  the middle of it) are combined into one (:func:`~.tiers.roll_rolled`:
  exact). An edge's series (and its models') are read out of its
  segment's column chunks (:mod:`.columns`: only the wanted keys are
  followed through the frames);
* **a selector** (fleet view): the matching edges' series added up per
  point time (a share, the KV cache, is their mean; a percentile, the
  latency p95s, their highest: :attr:`~.fields.Combine.MAX`). On a
  rolled-up tier the mean and last are the sums of the edges' means and
  lasts, and the max is the sum of their maxima: an upper bound of the
  fleet's max, not the max itself (the edges' peaks need not coincide);
* **older chunks**: a point stored before the latency fields existed
  reads as missing them (:func:`~.tiers.fitted`), so a view over a range
  that spans an upgrade shows them ``null`` before it.

Pure but for the store's read (a Deferred).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Optional

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from twisted_iop.controlplane.history import chunks, columns, tiers
from twisted_iop.controlplane.history.edge_sampler import EdgeSampler
from twisted_iop.controlplane.history.fields import MODEL_PREFIX, Combine, Field, fields_of, group_key, names, shown
from twisted_iop.controlplane.history.frames import SegmentRecorder, store_key
from twisted_iop.controlplane.history.recorder import HistoryRecorder
from twisted_iop.controlplane.history.settings import Tier
from twisted_iop.controlplane.store.interface import HistoryChunk, HistoryStore

#: A view without ``step`` gets at most about this many points.
MAX_POINTS = 500
#: The default range: the last hour.
DEFAULT_RANGE_SECONDS = 3600.0
#: The longest range a view may ask for (a year).
MAX_RANGE_SECONDS = 366 * 86400.0

#: The longest ``from`` / ``to``, ``step`` and ``series`` texts (the OpenAPI
#: document's ``maxLength``); a longer one is 400 like any bad value.
MAX_TIME_CHARS = 64
MAX_STEP_CHARS = 32
MAX_SERIES_CHARS = 1024

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
# ASCII digits only: the document's patterns say [0-9] (\d would take any
# script's digits, which float() reads too).
_RELATIVE = re.compile(r"^(?:now)?\s*-\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])$")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)\s*(ms|[smhd])?$")

_log = Logger()


class InvalidRange(ValueError):
    """``from`` / ``to`` that are not a time, or not in order (400 ``invalid_range``)."""


class InvalidStep(ValueError):
    """A ``step`` that is no tier's (400 ``invalid_step``)."""


class InvalidSeries(ValueError):
    """A field name in ``series`` the view does not have (400 ``invalid_series``)."""


def parse_time(text: Optional[str], now: float, default: float) -> float:
    """Seconds since the epoch of ``text`` (ISO 8601, epoch seconds, ``now``, ``-2h``)."""
    if text is not None and len(text) > MAX_TIME_CHARS:
        raise InvalidRange(f"a time is at most {MAX_TIME_CHARS} characters")
    if text is None or not text.strip():
        return default
    text = text.strip()
    if text == "now":
        return now
    relative = _RELATIVE.match(text)
    if relative:
        return now - float(relative.group(1)) * _UNITS[relative.group(2)]
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value < 0:
            raise InvalidRange(f"{text[:40]!r} is not a time")
        return value
    try:
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        raise InvalidRange(
            f"{text[:40]!r} is not a time: give ISO 8601 (2026-12-01T14:00:00Z), seconds since the epoch, "
            "now, or a time before now (-2h, -30m, -7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_range(start_text: Optional[str], end_text: Optional[str], now: float) -> tuple[float, float]:
    """The range a view asks for (default: the last hour)."""
    end = parse_time(end_text, now, now)
    start = parse_time(start_text, now, end - DEFAULT_RANGE_SECONDS)
    if start >= end:
        raise InvalidRange("'from' must be before 'to'")
    if end - start > MAX_RANGE_SECONDS:
        raise InvalidRange(f"a range is at most {MAX_RANGE_SECONDS / 86400:g} days")
    return start, end


def parse_step(text: Optional[str], tier_list: Sequence[Tier]) -> Optional[int]:
    """The index of the tier ``step`` names (None: not given)."""
    if text is not None and len(text) > MAX_STEP_CHARS:
        raise InvalidStep(f"step is at most {MAX_STEP_CHARS} characters")
    if text is None or not text.strip():
        return None
    match = _DURATION.match(text.strip())
    steps = ", ".join(f"{t.step_seconds:g}" for t in tier_list)
    if not match:
        raise InvalidStep(f"step {text[:40]!r} is not a duration (the tiers' steps are {steps} seconds)")
    unit = match.group(2) or "s"
    step_ms = round(float(match.group(1)) * (0.001 if unit == "ms" else _UNITS[unit]) * 1000)
    for index, tier in enumerate(tier_list):
        if tier.step_ms == step_ms:
            return index
    raise InvalidStep(f"step {text[:40]!r} is not the step of a tier (the tiers' steps are {steps} seconds)")


def parse_fields(text: Optional[str], available: Sequence[Field]) -> tuple[Field, ...]:
    """The fields ``series`` names, in the series' order (all when not given)."""
    if text is not None and len(text) > MAX_SERIES_CHARS:
        raise InvalidSeries(f"series is at most {MAX_SERIES_CHARS} characters")
    if text is None or not text.strip():
        return tuple(available)
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    known = {field.name for field in available}
    for name in wanted:
        if name not in known:
            raise InvalidSeries(
                f"{name[:60]!r} is not a field of this view (its fields: {', '.join(names(available))})"
            )
    chosen = set(wanted)
    return tuple(field for field in available if field.name in chosen)


def choose_tier(tier_list: Sequence[Tier], start: float, end: float, now: float) -> int:
    """The finest tier keeping ``start`` with at most :data:`MAX_POINTS` points in the range, else the coarsest."""
    for index, tier in enumerate(tier_list):
        if (end - start) / tier.step_seconds <= MAX_POINTS and start >= now - tier.keep_seconds:
            return index
    return len(tier_list) - 1


Point = tuple[int, tuple[int, ...]]


@attrs.frozen
class HistoryView:
    """What one view shows: its points, in the stored units, and how it was chosen."""

    series: str
    tier: Tier
    rolled: bool
    start: float
    end: float
    fields: tuple[Field, ...]
    #: Per point: its time (ms) and, per chosen field, its value (sampled
    #: tier) or its (mean, max, last) (rolled-up tier), in JSON's units.
    points: list[tuple[int, Optional[int], list[Any]]]
    #: The models with a series in this view's scope (for a model picker).
    models: tuple[str, ...] = ()
    #: A selector view: how many edges matched.
    edges: Optional[int] = None


class HistoryQueries:
    """Views of the kept history (see the module docstring)."""

    def __init__(self, recorder: HistoryRecorder, sampler: EdgeSampler, store: HistoryStore) -> None:
        self._recorder = recorder
        self._sampler = sampler
        self._groups = {sampler.edges.shape.name: sampler.edges, sampler.models.shape.name: sampler.models}
        self._store = store
        #: The fleet's and the models' tiers, and each edge's.
        self.tiers = recorder.tiers
        self.edge_tiers = sampler.edges.tiers
        #: Chunks a read found unreadable (and skipped).
        self.unreadable = 0

    def tiers_for(self, series: str) -> tuple[Tier, ...]:
        """The tiers a series is kept in (an edge's and its models' are the edge tiers)."""
        return self.edge_tiers if group_key(series) is not None else self.tiers

    def models(self, edge_id: str = "") -> tuple[str, ...]:
        """The models with a series, fleet-wide or on one edge."""
        if edge_id:
            return self._sampler.models_of(edge_id)
        prefix = MODEL_PREFIX
        return tuple(sorted(name[len(prefix) :] for name in self._recorder.names() if name.startswith(prefix)))

    def read(
        self, series: Sequence[str], tier_index: int, start: float, end: float
    ) -> Deferred[dict[str, list[Point]]]:
        """The points of each of ``series`` (all kept in the same tiers) at a tier within ``[start, end]``, by time."""
        if not series:
            return succeed({})
        tier_list = self.tiers_for(series[0])
        tier = tier_list[tier_index]
        reach = tier.step_seconds if tier_index > 0 else 0.0
        names: set[str] = set()
        grouped = False
        for name in series:
            where = group_key(name)
            if where is None:
                names.add(name)
            else:
                names.add(self._groups[where[0]].of(where[1]).series)
                grouped = True
        key = store_key(tier) if grouped else tier.key
        d = self._store.history_read(sorted(names), key, start - reach, end + reach)
        return d.addCallback(self._points, series, tier_list, tier_index, start, end)

    def _points(
        self,
        found: list[HistoryChunk],
        series: Sequence[str],
        tier_list: tuple[Tier, ...],
        tier_index: int,
        start: float,
        end: float,
    ) -> dict[str, list[Point]]:
        tier = tier_list[tier_index]
        rolled = tier_index > 0
        start_ms = math.ceil(start * 1000) - (tier.step_ms - 1 if rolled else 0)
        end_ms = math.floor(end * 1000)
        kept: dict[str, dict[float, bytes]] = {}
        for chunk in found:
            kept.setdefault(chunk.series, {})[chunk.start] = chunk.data
        out: dict[str, list[Point]] = {}
        #: Per segment series of a group: the segment and the keys wanted of it.
        segments: dict[str, tuple[SegmentRecorder, dict[str, str]]] = {}
        for name in series:
            where = group_key(name)
            if where is None:
                out[name] = self._series_points(name, kept.get(name, {}), tier_index, start_ms, end_ms)
            else:
                segment = self._groups[where[0]].of(where[1])
                segments.setdefault(segment.series, (segment, {}))[1][where[2]] = name
        for store_name, (segment, wanted) in segments.items():
            points = self._segment_points(segment, wanted, kept.get(store_name, {}), tier_index, start_ms, end_ms)
            out.update(points)
        return out

    def _series_points(
        self, name: str, kept: dict[float, bytes], tier_index: int, start_ms: int, end_ms: int
    ) -> list[Point]:
        """One series of its own (the fleet, a model fleet-wide): its chunks, the open one over them."""
        rolled = tier_index > 0
        opened = self._recorder.open_chunk(name, tier_index)
        if opened is not None:
            kept[opened.start] = opened.data
        points: dict[int, tuple[int, ...]] = {}
        width = len(fields_of(name))
        for _, data in sorted(kept.items()):
            try:
                _, rows = chunks.decode(data)
            except chunks.ChunkError as e:
                self._unreadable(name, e)
                continue
            for row in rows:
                t_ms = row[0]
                if start_ms <= t_ms <= end_ms:
                    _merge(points, t_ms, tiers.fitted(row[1:], width, rolled), rolled)
        if rolled:
            partial = self._recorder.partial(name, tier_index)
            if partial is not None and start_ms <= partial[0] <= end_ms:
                _merge(points, partial[0], partial[1], rolled)
        return sorted(points.items())

    def _segment_points(
        self,
        segment: SegmentRecorder,
        wanted: dict[str, str],
        kept: dict[float, bytes],
        tier_index: int,
        start_ms: int,
        end_ms: int,
    ) -> dict[str, list[Point]]:
        """Keys of one segment (``wanted``: key -> series name): read out of its column chunks."""
        rolled = tier_index > 0
        opened = segment.open_chunk(tier_index)
        if opened is not None:
            kept[opened.start] = opened.data
        points: dict[str, dict[int, tuple[int, ...]]] = {key: {} for key in wanted}
        width = segment.shape.width
        for _, data in sorted(kept.items()):
            try:
                _, decoded = columns.decode(data, wanted)
            except chunks.ChunkError as e:
                self._unreadable(segment.series, e)
                continue
            for key, rows in decoded.items():
                into = points[key]
                for t_ms, values in rows:
                    if start_ms <= t_ms <= end_ms:
                        _merge(into, t_ms, tiers.fitted(values, width, rolled), rolled)
        out: dict[str, list[Point]] = {}
        for key, into in points.items():
            if rolled:
                partial = segment.partial(key, tier_index)
                if partial is not None and start_ms <= partial[0] <= end_ms:
                    _merge(into, partial[0], partial[1], rolled)
            out[wanted[key]] = sorted(into.items())
        return out

    def _unreadable(self, series: str, error: Exception) -> None:
        self.unreadable += 1
        _log.warn("history: a chunk of {series} is unreadable, skipped: {error}", series=series, error=error)

    def view(
        self,
        series: str,
        chosen: tuple[Field, ...],
        tier_index: int,
        start: float,
        end: float,
        models: tuple[str, ...] = (),
    ) -> Deferred[HistoryView]:
        """One series' view."""
        rolled = tier_index > 0
        tier = self.tiers_for(series)[tier_index]

        def made(points: dict[str, list[Point]]) -> HistoryView:
            shown_points = _shown(points[series], fields_of(series), chosen, rolled)
            return HistoryView(series, tier, rolled, start, end, chosen, shown_points, models)

        return self.read([series], tier_index, start, end).addCallback(made)

    def aggregate_view(
        self,
        label: str,
        members: Sequence[str],
        chosen: tuple[Field, ...],
        tier_index: int,
        start: float,
        end: float,
        models: tuple[str, ...] = (),
    ) -> Deferred[HistoryView]:
        """The view of ``members`` (a selector's edges, or their model series) added up."""
        rolled = tier_index > 0
        available = fields_of(members[0]) if members else fields_of(label)
        tier = self.edge_tiers[tier_index]  # members are edges' series

        def made(points: dict[str, list[Point]]) -> HistoryView:
            combined = _combine(points.values(), available, chosen, rolled)
            return HistoryView(label, tier, rolled, start, end, chosen, combined, models, len(members))

        return self.read(members, tier_index, start, end).addCallback(made)


def _merge(points: dict[int, tuple[int, ...]], t_ms: int, values: tuple[int, ...], rolled: bool) -> None:
    """Keep a point; two of one rolled-up bucket are combined, a sampled one replaced."""
    kept = points.get(t_ms)
    if kept is not None and rolled:
        points[t_ms] = tiers.roll_rolled([kept, values])
    else:
        points[t_ms] = values


def _shown(
    points: list[Point], available: Sequence[Field], chosen: Sequence[Field], rolled: bool
) -> list[tuple[int, Optional[int], list[Any]]]:
    places = [available.index(field) for field in chosen]
    out: list[tuple[int, Optional[int], list[Any]]] = []
    for t_ms, values in points:
        if not rolled:
            out.append((t_ms, None, [shown(values[i], available[i]) for i in places]))
            continue
        parts: list[Any] = []
        for i in places:
            mean, most, last = tiers.field_parts(values, i)
            field = available[i]
            parts.append(
                (None, None, None)
                if mean is None or most is None or last is None
                else (shown(mean, field), shown(most, field), shown(last, field))
            )
        out.append((t_ms, values[0], parts))
    return out


def _combine(
    members: Iterable[list[Point]], available: Sequence[Field], chosen: Sequence[Field], rolled: bool
) -> list[tuple[int, Optional[int], list[Any]]]:
    """The members' points added up per time (a MEAN field: their mean; a MAX field: their highest)."""
    places = [available.index(field) for field in chosen]
    at: dict[int, list[tuple[int, ...]]] = {}
    for points in members:
        for t_ms, values in points:
            at.setdefault(t_ms, []).append(values)
    out: list[tuple[int, Optional[int], list[Any]]] = []
    for t_ms in sorted(at):
        rows = at[t_ms]
        parts: list[Any] = []
        for i in places:
            field = available[i]
            if not rolled:
                present = [row[i] for row in rows if row[i] >= 0]
                parts.append(shown(_together(present, field), field) if present else None)
                continue
            triples = [tiers.field_parts(row, i) for row in rows]
            got = [(m, x, l) for m, x, l in triples if m is not None and x is not None and l is not None]
            if not got:
                parts.append((None, None, None))
                continue
            parts.append(tuple(shown(_together([g[k] for g in got], field), field) for k in range(3)))
        out.append((t_ms, max(row[0] for row in rows) if rolled else None, parts))
    return out


def _together(values: Sequence[float], field: Field) -> float:
    if field.combine is Combine.MEAN:
        return sum(values) / len(values)
    if field.combine is Combine.MAX:
        return max(values)
    return sum(values)
