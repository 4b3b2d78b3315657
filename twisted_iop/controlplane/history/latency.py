"""The latency figures of capacity history: a snapshot's sketches kept small, and merged totals.

The breakdown of a snapshot (:mod:`.breakdown`) reads every provider's
``ProviderLatency`` once, through
:func:`~twisted_iop.controlplane.http.latency_views.snapshot_latency` (checked;
merged exactly per model and for the edge), and keeps, for the edge and
for each model on it, a :class:`LatencyPart`: the stored values of
:data:`~.fields.LATENCY_FIELDS` and the recent TTFT and TPOT sketches as
:class:`Lanes`.

A :class:`LatencyTotal` is the merge of many parts (the fleet's, each
model's fleet-wide): the sampler adds an edge's parts when its breakdown
comes and takes them away when it changes or goes. Sketch counts are
integers, so taking away is as exact as adding, and the fleet's p95 is
the p95 of every edge's sketches merged without visiting every edge at
each sample (:meth:`LatencyTotal.values` reads the merged buckets: at most
:data:`~twisted_iop.latency.sketch.MAX_BUCKETS`).

The speed trick of this module, and only of it: a sketch is kept as
**lanes**, its bucket counts as the 64-bit lanes of one Python int (lane
``k`` the count of bucket ``low + k``), so that adding a part's sketch to a
total, or taking it back out, is one shift and one addition of big ints
in C, where a dict of buckets cost a Python step per bucket (about 25 us
a part against 1 us, for the 6 parts a changed snapshot moves: measured
with bench/history.py). A lane's count is capped at :data:`LANE_CAP` when
a part is made, so a total of up to 2^23 parts cannot carry from one lane
into the next (a window's requests are far fewer: the wire counts them in
32 bits). A part's lanes span its lowest to its highest bucket: 8 bytes a
bucket of the span, about what the buckets in use take as a dict's
pairs, and no Python object per bucket (a breakdown is kept per edge,
for 10,000 edges).
"""

from __future__ import annotations

from array import array
from itertools import compress
from typing import Optional

import attrs

from twisted_iop.controlplane.history.fields import HUNDREDTHS, MISSING, TENTHS_OF_MS
from twisted_iop.controlplane.http.latency_views import LatencyFigures
from twisted_iop.latency.sketch import MIN_INDEX, LatencySketch

#: The percentile the history keeps.
P95 = 0.95
#: The most requests per second a part says (a bound on a peer's counts, as stored).
MAX_REQUESTS_PER_SECOND = 1e9
#: The most a lane of a part counts (2^40: 2^23 parts of it stay below 2^63).
LANE_CAP = 1 << 40
_LANE_BITS = 64

#: Stored values of a part: ttft_p95, tpot_p95 (tenths of a millisecond), requests_per_second (hundredths).
Values = tuple[int, int, int]
NO_VALUES: Values = (MISSING, MISSING, MISSING)


@attrs.frozen
class Lanes:
    """A sketch's bucket counts as 64-bit lanes of one int, from bucket ``low`` (see the module docstring)."""

    low: int = MIN_INDEX
    counts: int = 0

    @classmethod
    def of(cls, sketch: LatencySketch) -> Lanes:
        """A sketch's lanes (each count capped at :data:`LANE_CAP`)."""
        buckets = sketch.buckets
        if not buckets:
            return NO_LANES
        low = min(buckets)
        flat = [0] * (max(buckets) - low + 1)
        for index, count in buckets.items():
            flat[index - low] = count
        if max(flat) > LANE_CAP:
            flat = [min(count, LANE_CAP) for count in flat]
        return cls(low, int.from_bytes(array("q", flat).tobytes(), "little"))

    def sketch(self) -> LatencySketch:
        """The sketch these lanes hold (its sum of durations is not kept)."""
        return _sketch(self.counts, self.low)


NO_LANES = Lanes()


def _sketch(counts: int, low: int) -> LatencySketch:
    """The sketch of lanes ``counts`` from bucket ``low``: its buckets in use, found in C."""
    sketch = LatencySketch()
    if counts:
        flat = array("q")
        flat.frombytes(counts.to_bytes((counts.bit_length() + _LANE_BITS - 1) // _LANE_BITS * 8, "little"))
        sketch.buckets = dict(zip(compress(range(low, low + len(flat)), flat), filter(None, flat), strict=True))
        sketch.count = sum(flat)
    return sketch


def stored_seconds(seconds: Optional[float]) -> int:
    """Seconds as stored: tenths of a millisecond (None: :data:`~.fields.MISSING`)."""
    return MISSING if seconds is None else round(seconds * TENTHS_OF_MS)


@attrs.frozen
class LatencyPart:
    """The latency of an edge (or a model on it) over its Edge's last window."""

    values: Values = NO_VALUES
    #: The recent TTFT and TPOT sketches (empty: no request of that kind ended).
    ttft: Lanes = NO_LANES
    tpot: Lanes = NO_LANES


NO_LATENCY = LatencyPart()


def part_of(figures: Optional[LatencyFigures]) -> LatencyPart:
    """The part of merged figures (None: nobody in scope reports any: every value missing)."""
    if figures is None:
        return NO_LATENCY
    rate = min(figures.requests / figures.window_seconds, MAX_REQUESTS_PER_SECOND)
    values = (
        stored_seconds(figures.ttft.quantile(P95)),
        stored_seconds(figures.tpot.quantile(P95)),
        round(rate * HUNDREDTHS),
    )
    return LatencyPart(values, Lanes.of(figures.ttft), Lanes.of(figures.tpot))


class LatencyTotal:
    """Many parts merged (see the module docstring); reactor thread only."""

    __slots__ = ("_rate", "_reporting", "_tpot", "_ttft")

    def __init__(self) -> None:
        #: The merged TTFT and TPOT sketches, as lanes from bucket MIN_INDEX.
        self._ttft = 0
        self._tpot = 0
        #: Requests per second (hundredths) of the parts that report it, and how many do.
        self._rate = 0
        self._reporting = 0

    def add(self, part: LatencyPart, sign: int = 1) -> None:
        """Merge a part in (``sign`` 1) or take it back out (-1: a part added before)."""
        if part is NO_LATENCY:
            return
        rate = part.values[2]
        if rate >= 0:
            self._rate += sign * rate
            self._reporting += sign
        ttft, tpot = part.ttft, part.tpot
        if ttft.counts:
            self._ttft += sign * (ttft.counts << (_LANE_BITS * (ttft.low - MIN_INDEX)))
        if tpot.counts:
            self._tpot += sign * (tpot.counts << (_LANE_BITS * (tpot.low - MIN_INDEX)))

    def values(self) -> Values:
        """The merged p95s (tenths of a millisecond) and the requests per second (hundredths) added up."""
        return (
            stored_seconds(_sketch(self._ttft, MIN_INDEX).quantile(P95)),
            stored_seconds(_sketch(self._tpot, MIN_INDEX).quantile(P95)),
            self._rate if self._reporting else MISSING,
        )

    def copy(self) -> LatencyTotal:
        """Another total holding the same parts."""
        other = LatencyTotal()
        other._ttft, other._tpot, other._rate, other._reporting = self._ttft, self._tpot, self._rate, self._reporting
        return other
