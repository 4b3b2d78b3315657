"""Rolling finer points up into coarser ones (pure functions, no I/O).

A sampled point (the finest tier) is a row of values, one per field
(:mod:`.fields`), :data:`~.fields.MISSING` where nobody reported one. A
rolled-up point of a coarser tier holds, per field, the **sum**, the
**max**, the **last** value and **n**, how many values it holds (missing
ones are not counted), plus the **count** of sampled points it covers::

    (count, sum_1, max_1, last_1, n_1, sum_2, max_2, last_2, n_2, ...)

so the mean is exact (``sum / n``), and rolling up rolled-up points
(:func:`roll_rolled`) gives what rolling up their sampled points at once
(:func:`roll_sampled`) gives: a 10-minute point made from ten 1-minute
points equals the one made from their forty 15-second points. A field
nobody reported in the whole bucket has ``n == 0`` and the others
``MISSING``.

A point read back from a chunk of an older, narrower form (written before
the latency fields were added at the end) gains the fields it lacks as
nobody's (:func:`fitted`).

A point's time is the start of its bucket: ``t - t % step`` (all in
integer milliseconds since the epoch), so every series' buckets line up.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, repeat
from typing import Optional

from twisted_iop.controlplane.history.fields import MISSING

#: Values per field in a rolled-up point (sum, max, last, n).
PER_FIELD = 4
#: Where each part of a field is, from the field's first value.
SUM, MAX, LAST, N = range(PER_FIELD)
#: The rolled-up parts of a field nobody reported.
_NOTHING = (MISSING, MISSING, MISSING, 0)

Row = tuple[int, ...]


def bucket_of(t_ms: int, step_ms: int) -> int:
    """The start of the bucket of ``step_ms`` that holds ``t_ms``."""
    return t_ms - t_ms % step_ms


def rolled_width(fields: int) -> int:
    """Values in a rolled-up point of ``fields`` fields."""
    return 1 + PER_FIELD * fields


def roll_sampled(rows: Sequence[Row]) -> Row:
    """One rolled-up point of sampled ``rows`` (at least one, all as wide).

    The columns' sums, maxima and minima are taken in C (``map`` over
    ``zip``); only a column holding a missing value is walked in Python.
    """
    count = len(rows)
    columns = list(zip(*rows, strict=True))
    sums = list(map(sum, columns))
    maxima = list(map(max, columns))
    minima = list(map(min, columns))
    out = [count, *chain.from_iterable(zip(sums, maxima, rows[-1], repeat(count)))]
    for index, lowest in enumerate(minima):
        if lowest < 0:
            present = [v for v in columns[index] if v >= 0]
            at = 1 + PER_FIELD * index
            out[at : at + PER_FIELD] = (sum(present), max(present), present[-1], len(present)) if present else _NOTHING
    return tuple(out)


def as_rolled(row: Row) -> Row:
    """One sampled row as the rolled-up point of itself alone."""
    out: list[int] = [1]
    for value in row:
        out += (value, value, value, 1) if value >= 0 else _NOTHING
    return tuple(out)


def roll_rolled(points: Sequence[Row]) -> Row:
    """One rolled-up point of rolled-up ``points`` (at least one, in time order)."""
    if len(points) == 1:
        return tuple(points[0])
    out: list[int] = [sum(p[0] for p in points)]
    width = len(points[0])
    for at in range(1, width, PER_FIELD):
        parts = [p[at : at + PER_FIELD] for p in points if p[at + N] > 0]
        if not parts:
            out += _NOTHING
            continue
        out += (
            sum(p[SUM] for p in parts),
            max(p[MAX] for p in parts),
            parts[-1][LAST],
            sum(p[N] for p in parts),
        )
    return tuple(out)


def field_parts(point: Row, index: int) -> tuple[Optional[float], Optional[int], Optional[int]]:
    """The mean, max and last of field ``index`` of a rolled-up point (None: not reported)."""
    at = 1 + PER_FIELD * index
    n = point[at + N]
    if n == 0:
        return None, None, None
    return point[at + SUM] / n, point[at + MAX], point[at + LAST]


def fitted(values: Row, fields: int, rolled: bool) -> Row:
    """A stored point (a sampled row's values, or a rolled-up point) as one of
    ``fields`` fields: one of an older, narrower form gains the fields it
    lacks as nobody reported them (sampled: :data:`~.fields.MISSING`;
    rolled up: ``n`` 0); one of a newer, wider form loses the fields this
    release does not know."""
    width = rolled_width(fields) if rolled else fields
    have = len(values)
    if have == width:
        return values
    if have > width:
        return values[:width]
    if rolled:
        return values + _NOTHING * ((width - have) // PER_FIELD)
    return values + (MISSING,) * (width - have)
