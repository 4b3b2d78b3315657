"""Counts in time buckets, bounded (pure, no I/O, no clock).

:class:`CountBuckets` keeps ``(bad, total)`` per bucket of ``step``
seconds: bucket ``i`` holds what was recorded at times in
``[i * step, (i + 1) * step)``. A sum over the last ``seconds`` ending at
``now`` takes the buckets that began at or after ``now - seconds`` (so it
covers between ``seconds - step`` and ``seconds`` of time, the current
bucket included). Buckets that began more than ``span`` seconds before
the newest time seen are forgotten, so at most ``span / step + 2`` are
kept whatever was recorded.

:class:`SketchSlices` does the same with one
:class:`~twisted_iop.latency.sketch.LatencySketch` per bucket, for the
percentile over a window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from twisted_iop.latency.sketch import LatencySketch, merged


def bucket_of(at: float, step: float) -> int:
    """The bucket a time falls in."""
    return math.floor(at / step)


def first_bucket(now: float, seconds: float, step: float) -> int:
    """The oldest bucket a sum over the last ``seconds`` ending at ``now`` takes."""
    return math.ceil((now - seconds) / step - 1e-9)


class CountBuckets:
    """``(bad, total)`` per bucket of ``step`` seconds, the last ``span`` seconds kept."""

    __slots__ = ("_counts", "_newest", "span", "step")

    def __init__(self, step: float, span: float) -> None:
        if not (step > 0 and span >= step):
            raise ValueError("step must be > 0 and span >= step")
        self.step = step
        self.span = span
        self._counts: dict[int, list[int]] = {}
        self._newest: int | None = None

    def __len__(self) -> int:
        return len(self._counts)

    @property
    def max_buckets(self) -> int:
        """The most buckets ever kept."""
        return math.ceil(self.span / self.step) + 2

    def add(self, at: float, bad: int, total: int) -> None:
        """Count ``bad`` of ``total`` requests at time ``at`` (counts are >= 0, bad <= total)."""
        self.add_to(bucket_of(at, self.step), bad, total)

    def add_to(self, index: int, bad: int, total: int) -> None:
        """Count ``bad`` of ``total`` requests in bucket ``index``."""
        if bad < 0 or total < bad:
            raise ValueError(f"bad {bad} of total {total}: need 0 <= bad <= total")
        oldest = self._oldest_kept()
        if oldest is not None and index < oldest:
            return  # older than what is kept
        counts = self._counts.get(index)
        if counts is None:
            counts = self._counts[index] = [0, 0]
        counts[0] += bad
        counts[1] += total
        if self._newest is None or index > self._newest:
            self._newest = index
            self._prune()

    def sums(self, now: float, seconds: float) -> tuple[int, int]:
        """``(bad, total)`` over the last ``seconds`` ending at ``now``."""
        first = first_bucket(now, seconds, self.step)
        last = bucket_of(now, self.step)
        bad = total = 0
        for index, (b, t) in self._counts.items():
            if first <= index <= last:
                bad += b
                total += t
        return bad, total

    def _oldest_kept(self) -> int | None:
        if self._newest is None:
            return None
        return self._newest - math.ceil(self.span / self.step) - 1

    def _prune(self) -> None:
        oldest = self._oldest_kept()
        assert oldest is not None
        for index in [i for i in self._counts if i < oldest]:
            del self._counts[index]

    def items(self) -> list[tuple[int, int, int]]:
        """``(bucket, bad, total)`` in order (the stored form)."""
        return [(index, b, t) for index, (b, t) in sorted(self._counts.items())]

    def as_json(self) -> dict[str, Any]:
        """The stored form."""
        return {"step": self.step, "span": self.span, "buckets": [list(row) for row in self.items()]}

    @classmethod
    def from_json(cls, value: Any) -> CountBuckets:
        """The buckets :meth:`as_json` made; ValueError when ``value`` is not that."""
        try:
            buckets = cls(float(value["step"]), float(value["span"]))
            rows: Iterable[Any] = value["buckets"]
            for index, bad, total in rows:
                if not all(type(v) is int for v in (index, bad, total)):
                    raise ValueError("bucket values must be whole numbers")
                buckets.add_to(index, bad, total)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not stored buckets: {e!r}") from None
        return buckets


class SketchSlices:
    """One latency sketch per bucket of ``step`` seconds, the last ``span`` seconds kept."""

    __slots__ = ("_newest", "_slices", "span", "step")

    def __init__(self, step: float, span: float) -> None:
        if not (step > 0 and span >= step):
            raise ValueError("step must be > 0 and span >= step")
        self.step = step
        self.span = span
        self._slices: dict[int, LatencySketch] = {}
        self._newest: int | None = None

    def __len__(self) -> int:
        return len(self._slices)

    def add(self, at: float, sketch: LatencySketch) -> None:
        """Merge ``sketch`` (observations that ended at ``at``) into its slice."""
        self.add_to(bucket_of(at, self.step), sketch)

    def add_to(self, index: int, sketch: LatencySketch) -> None:
        """Merge ``sketch`` into slice ``index``."""
        keep = math.ceil(self.span / self.step) + 1
        if self._newest is not None and index < self._newest - keep:
            return
        kept = self._slices.get(index)
        if kept is None:
            kept = self._slices[index] = LatencySketch()
        kept.merge(sketch)
        if self._newest is None or index > self._newest:
            self._newest = index
            for old in [i for i in self._slices if i < index - keep]:
                del self._slices[old]

    def merged(self, now: float, seconds: float) -> LatencySketch:
        """The observations of the last ``seconds`` ending at ``now`` (to a slice)."""
        first = first_bucket(now, seconds, self.step)
        last = bucket_of(now, self.step)
        return merged(s for i, s in self._slices.items() if first <= i <= last)

    def as_json(self) -> dict[str, Any]:
        """The stored form: per slice, its bucket indices, counts and sum."""
        rows = []
        for index, sketch in sorted(self._slices.items()):
            indices, counts = sketch.pairs()
            rows.append([index, indices, counts, sketch.total])
        return {"step": self.step, "span": self.span, "slices": rows}

    @classmethod
    def from_json(cls, value: Any) -> SketchSlices:
        """The slices :meth:`as_json` made; ValueError when ``value`` is not that."""
        try:
            slices = cls(float(value["step"]), float(value["span"]))
            for index, indices, counts, total in value["slices"]:
                if type(index) is not int:
                    raise ValueError("slice index must be a whole number")
                slices.add_to(index, LatencySketch.from_pairs(indices, counts, float(total)))
        except (KeyError, TypeError) as e:
            raise ValueError(f"not stored slices: {e!r}") from None
        return slices
