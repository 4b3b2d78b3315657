"""A mergeable sketch of durations with a stated relative error (pure, no I/O).

A :class:`LatencySketch` counts durations in logarithmic buckets (the
DDSketch idea): bucket ``i`` holds the values in ``(GAMMA**(i-1),
GAMMA**i]`` seconds, so any quantile it answers is within
:data:`RELATIVE_ERROR` (2 %) of a value really observed at that rank. Two
sketches merge **exactly** by adding their counts: the Control Plane merges
providers into models, edges and the fleet without losing accuracy, which
averaging percentiles cannot do.

Bounded: values are clamped to ``[MIN_SECONDS, MAX_SECONDS]`` (0.1 ms to
one hour), so a sketch has at most :data:`MAX_BUCKETS` buckets (about 430)
whatever it was fed, and its wire form (:meth:`LatencySketch.pairs`) is a
few bytes a bucket in use. :meth:`LatencySketch.from_pairs` checks a peer's
buckets before taking them.

:class:`SlidingSketch` keeps the last ``window`` seconds as a ring of
slices, for "p95 over the last minute" without keeping every request.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from itertools import accumulate

#: The bound on a quantile's relative error.
RELATIVE_ERROR = 0.02
#: The ratio between consecutive bucket bounds.
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
#: Durations below this count in the lowest bucket.
MIN_SECONDS = 1e-4
#: Durations above this count in the highest bucket.
MAX_SECONDS = 3600.0
MIN_INDEX = math.ceil(math.log(MIN_SECONDS) / _LOG_GAMMA)
MAX_INDEX = math.ceil(math.log(MAX_SECONDS) / _LOG_GAMMA)
#: The most buckets a sketch can hold.
MAX_BUCKETS = MAX_INDEX - MIN_INDEX + 1
#: The most observations one bucket may claim from a peer (2**53: exact in a float).
MAX_BUCKET_COUNT = 2**53


def bucket_index(seconds: float) -> int:
    """The bucket a duration counts in (clamped to the sketch's range)."""
    if not seconds > MIN_SECONDS:  # also NaN
        return MIN_INDEX
    if seconds >= MAX_SECONDS:
        return MAX_INDEX
    return math.ceil(math.log(seconds) / _LOG_GAMMA)


def bucket_value(index: int) -> float:
    """The value a bucket stands for: within RELATIVE_ERROR of any value in it."""
    return 2 * GAMMA**index / (GAMMA + 1)


class LatencySketch:
    """Counts of durations in log buckets; mergeable exactly (reactor thread only)."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        #: Observations per bucket index.
        self.buckets: dict[int, int] = {}
        self.count = 0
        #: The sum of the observed durations (exact within the sketch's range).
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        """Count one duration."""
        index = bucket_index(seconds)
        buckets = self.buckets
        buckets[index] = buckets.get(index, 0) + 1
        self.count += 1
        if seconds > 0:  # not NaN; clamped like the buckets, so the sum stays finite
            self.total += min(seconds, MAX_SECONDS)

    def merge(self, other: LatencySketch) -> None:
        """Add another sketch's observations to this one (exact)."""
        buckets = self.buckets
        if not buckets:
            buckets.update(other.buckets)
        else:
            get = buckets.get
            for index, count in other.buckets.items():
                buckets[index] = get(index, 0) + count
        self.count += other.count
        self.total += other.total

    def quantile(self, q: float) -> float | None:
        """The duration at quantile ``q`` (0..1), within RELATIVE_ERROR; None when empty."""
        if self.count == 0:
            return None
        q = min(max(q, 0.0), 1.0)
        rank = q * (self.count - 1)
        indices = sorted(self.buckets)
        # The first bucket whose running count is above the rank (summed and searched in C).
        seen = list(accumulate(map(self.buckets.__getitem__, indices)))
        return bucket_value(indices[min(bisect_right(seen, rank), len(indices) - 1)])

    def count_above(self, seconds: float) -> int:
        """Observations over ``seconds``: those in buckets wholly above its bucket.

        Values in the threshold's own bucket count as at or below it, so the
        answer can be short by the observations within RELATIVE_ERROR of the
        threshold.
        """
        limit = bucket_index(seconds)
        return sum(count for index, count in self.buckets.items() if index > limit)

    def pairs(self) -> tuple[list[int], list[int]]:
        """The wire form: bucket indices in ascending order and their counts."""
        indices = sorted(self.buckets)
        return indices, [self.buckets[index] for index in indices]

    @classmethod
    def from_pairs(cls, indices: Sequence[int], counts: Sequence[int], total: float = 0.0) -> LatencySketch:
        """A sketch from a peer's wire form; ValueError names what is wrong with it."""
        if len(indices) != len(counts):
            raise ValueError(f"{len(indices)} bucket indices for {len(counts)} counts")
        if len(indices) > MAX_BUCKETS:
            raise ValueError(f"{len(indices)} buckets, at most {MAX_BUCKETS}")
        if not (math.isfinite(total) and total >= 0):
            raise ValueError("the sum of durations must be a finite number >= 0")
        sketch = cls()
        indices, counts = list(indices), list(counts)  # a protobuf container converts its values at every pass
        if indices and min(indices) >= MIN_INDEX and max(indices) <= MAX_INDEX:
            # The checks below in C (min, max, len of a dict): a peer's sketch is
            # read once per snapshot by the views and the history; only a bad one
            # takes the loop, which names what is wrong.
            buckets = dict(zip(indices, counts, strict=True))
            if len(buckets) == len(indices) and min(counts) >= 0 and max(counts) <= MAX_BUCKET_COUNT:
                if 0 in buckets.values():
                    buckets = {index: count for index, count in buckets.items() if count}
                sketch.buckets = buckets
                sketch.count = sum(counts)
                sketch.total = total
                return sketch
        for index, count in zip(indices, counts, strict=True):
            if not MIN_INDEX <= index <= MAX_INDEX:
                raise ValueError(f"bucket index {index} outside {MIN_INDEX}..{MAX_INDEX}")
            if not 0 <= count <= MAX_BUCKET_COUNT:
                raise ValueError(f"bucket count {count} outside 0..{MAX_BUCKET_COUNT}")
            if index in sketch.buckets:
                raise ValueError(f"bucket index {index} given twice")
            if count:
                sketch.buckets[index] = count
                sketch.count += count
        sketch.total = total
        return sketch

    def minus(self, earlier: LatencySketch) -> LatencySketch | None:
        """What was observed since ``earlier`` (a previous reading of this
        cumulative sketch); None when ``earlier`` is not contained in it (the
        counter restarted)."""
        delta = LatencySketch()
        for index, count in earlier.buckets.items():
            if self.buckets.get(index, 0) < count:
                return None
        for index, count in self.buckets.items():
            left = count - earlier.buckets.get(index, 0)
            if left:
                delta.buckets[index] = left
                delta.count += left
        delta.total = max(self.total - earlier.total, 0.0)
        return delta


def merged(sketches: Iterable[LatencySketch]) -> LatencySketch:
    """One sketch holding every observation of ``sketches``."""
    result = LatencySketch()
    for sketch in sketches:
        result.merge(sketch)
    return result


class SlidingSketch:
    """The observations of the last ``window`` seconds, as a ring of slices.

    Each slice covers ``window / slices`` seconds; a reading merges the
    slices that began within the window, so it covers between
    ``window - window / slices`` and ``window`` seconds of observations.
    """

    __slots__ = ("_slice_seconds", "_slices", "window")

    def __init__(self, window: float = 60.0, slices: int = 6) -> None:
        if window <= 0 or slices < 1:
            raise ValueError("window must be > 0 and slices >= 1")
        self.window = window
        self._slice_seconds = window / slices
        #: (slice number, sketch), oldest first, at most ``slices``.
        self._slices: list[tuple[int, LatencySketch]] = []

    def observe(self, seconds: float, now: float) -> None:
        """Count one duration that ended at ``now``."""
        self._current(now).observe(seconds)

    def reading(self, now: float) -> LatencySketch:
        """The merged observations of the window ending at ``now``."""
        self._expire(now)
        return merged(sketch for _, sketch in self._slices)

    def _current(self, now: float) -> LatencySketch:
        number = int(now // self._slice_seconds)
        slices = self._slices
        if slices and slices[-1][0] == number:
            return slices[-1][1]
        self._expire(now)
        sketch = LatencySketch()
        slices.append((number, sketch))
        return sketch

    def _expire(self, now: float) -> None:
        oldest = int(now // self._slice_seconds) - round(self.window / self._slice_seconds) + 1
        slices = self._slices
        while slices and slices[0][0] < oldest:
            slices.pop(0)
