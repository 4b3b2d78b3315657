"""The latency figures of capacity history: a snapshot's sketches kept small, and merged totals.

The breakdown of a snapshot (:mod:`.breakdown`) reads every provider's
``ProviderLatency`` once, through
:func:`~twisted_iop.controlplane.latency_views.snapshot_latency` (checked;
merged exactly per model and for the edge), and keeps, for the edge and
for each model on it, a :class:`LatencyPart`: the stored values of
:data:`~.fields.LATENCY_FIELDS` and the recent TTFT and TPOT sketches,
packed (:func:`pack`: 16 bytes a bucket in use, no Python object per
bucket: a breakdown is kept per edge, for 10,000 edges; made in C, about
2 us a sketch of 40 buckets).

A :class:`LatencyTotal` is the merge of many parts (the fleet's, each
model's fleet-wide): the sampler adds an edge's parts when its breakdown
comes and takes them away when it changes or goes. Sketch counts are
integers, so taking away is as exact as adding, and the fleet's p95 is
the p95 of every edge's sketches merged without visiting every edge at
each sample (:meth:`LatencyTotal.values` reads the merged buckets: at most
:data:`~twisted_iop.latency.sketch.MAX_BUCKETS`).
"""

from __future__ import annotations

from array import array
from typing import Optional

import attrs

from twisted_iop.controlplane.history.fields import HUNDREDTHS, MISSING, TENTHS_OF_MS
from twisted_iop.controlplane.latency_views import LatencyFigures
from twisted_iop.latency.sketch import LatencySketch

#: The percentile the history keeps.
P95 = 0.95
#: The most requests per second a part says (a bound on a peer's counts, as stored).
MAX_REQUESTS_PER_SECOND = 1e9

#: Stored values of a part: ttft_p95, tpot_p95 (tenths of a millisecond), requests_per_second (hundredths).
Values = tuple[int, int, int]
NO_VALUES: Values = (MISSING, MISSING, MISSING)


def pack(sketch: LatencySketch) -> bytes:
    """A sketch's buckets as bytes: its bucket indices ascending, then their counts, 64-bit ints (b"": empty)."""
    if not sketch.count:
        return b""
    buckets = sketch.buckets
    indices = array("q", sorted(buckets))
    return indices.tobytes() + array("q", map(buckets.__getitem__, indices)).tobytes()


def _halves(data: bytes) -> tuple[array[int], array[int]]:
    """The indices and counts of :func:`pack`'s bytes."""
    flat = array("q")
    flat.frombytes(data)
    half = len(flat) // 2
    return flat[:half], flat[half:]


def unpack(data: bytes) -> LatencySketch:
    """The sketch of :func:`pack`'s bytes."""
    sketch = LatencySketch()
    if data:
        indices, counts = _halves(data)
        sketch.buckets = dict(zip(indices, counts, strict=True))
        sketch.count = sum(counts)
    return sketch


def stored_seconds(seconds: Optional[float]) -> int:
    """Seconds as stored: tenths of a millisecond (None: :data:`~.fields.MISSING`)."""
    return MISSING if seconds is None else round(seconds * TENTHS_OF_MS)


@attrs.frozen
class LatencyPart:
    """The latency of an edge (or a model on it) over its Edge's last window."""

    values: Values = NO_VALUES
    #: The recent TTFT and TPOT sketches, packed (b"": no request of that kind ended).
    ttft: bytes = b""
    tpot: bytes = b""


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
    return LatencyPart(values, pack(figures.ttft), pack(figures.tpot))


class LatencyTotal:
    """Many parts merged (see the module docstring); reactor thread only."""

    __slots__ = ("_rate", "_reporting", "_tpot", "_ttft")

    def __init__(self) -> None:
        self._ttft = LatencySketch()
        self._tpot = LatencySketch()
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
        for sketch, data in ((self._ttft, part.ttft), (self._tpot, part.tpot)):
            if not data:
                continue
            indices, counts = _halves(data)
            buckets = sketch.buckets
            for index, count in zip(indices, counts, strict=True):
                left = buckets.get(index, 0) + sign * count
                if left:
                    buckets[index] = left
                else:
                    del buckets[index]
            sketch.count += sign * sum(counts)

    def values(self) -> Values:
        """The merged p95s (tenths of a millisecond) and the requests per second (hundredths) added up."""
        return (
            stored_seconds(self._ttft.quantile(P95)),
            stored_seconds(self._tpot.quantile(P95)),
            self._rate if self._reporting else MISSING,
        )

    def copy(self) -> LatencyTotal:
        """Another total holding the same parts."""
        other = LatencyTotal()
        for mine, theirs in ((self._ttft, other._ttft), (self._tpot, other._tpot)):
            theirs.merge(mine)
        other._rate, other._reporting = self._rate, self._reporting
        return other
