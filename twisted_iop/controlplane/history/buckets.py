"""The points in progress of a segment's slots, column by column: the part of
history's speed trick (:mod:`.frames`) that adds frames up for the next tier.

:class:`SampledBucket` adds the finest tier's frames (whole columns and
per-slot patches), :class:`RolledBucket` a finer tier's points; at a
bucket's end each makes every slot's point (count, and per field sum, max,
last, n: :mod:`.tiers`) for the whole segment at once. A whole column that
changed is added up in 64-bit lanes of one Python int (:func:`_pack`: a sum
is one addition, a lane-wise max a few whole-int operations) while no value
is missing. Checked against the plain roll-ups of :mod:`.tiers`
(tests/controlplane/test_cp_history_frames.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import repeat
from operator import add, mul
from typing import Optional

import attrs

from twisted_iop.controlplane.history import tiers
from twisted_iop.controlplane.history.fields import MISSING, Field
from twisted_iop.controlplane.history.tiers import PER_FIELD

Column = Sequence[int]
Row = tuple[int, ...]

#: A whole column is added up in 64-bit lanes (:func:`_pack`) while its values are below this
#: (2^40 each, summed over at most 2^23 frames of a bucket, stays below 2^63).
LANE_LIMIT = 1 << 40
_LANE_BITS = 64
_LANE_MASK = (1 << _LANE_BITS) - 1
_lane_constants: dict[int, tuple[int, int]] = {}


def _pack(values: Sequence[int]) -> int:
    """Non-negative values below :data:`LANE_LIMIT` as the 64-bit lanes of one int (the first lowest)."""
    return int.from_bytes(array("q", values).tobytes(), "little")


def _unpack(packed: int, count: int) -> list[int]:
    """The ``count`` lanes of a packed int."""
    out = array("q")
    out.frombytes(packed.to_bytes(8 * count, "little"))
    return out.tolist()


def _lane_max(a: int, b: int, count: int) -> int:
    """The lane-wise max of two packed ints (lanes below 2^63): a few operations on whole ints."""
    constants = _lane_constants.get(count)
    if constants is None:
        constants = _lane_constants[count] = (
            int.from_bytes(bytes(7) + b"\x80", "little") * sum(1 << (_LANE_BITS * i) for i in range(count)),
            (1 << (_LANE_BITS * count)) - 1,
        )
    tops, ones = constants
    # A lane of (a | top) - b keeps its top bit where a >= b (no lane borrows from the next).
    wins = (((a | tops) - b) & tops) >> (_LANE_BITS - 1)
    wins = (wins << _LANE_BITS) - wins  # 1 -> all ones, lane by lane
    return (a & wins) | (b & (ones ^ wins))


@attrs.frozen
class GroupShape:
    """What a group of keys holds: its fields and which columns come as patches."""

    name: str
    fields: tuple[Field, ...]
    #: Columns a sample gives as per-slot patches (the others as whole
    #: columns). The first column (a key is absent when it is missing)
    #: is always one.
    patch_columns: tuple[int, ...]

    def __attrs_post_init__(self) -> None:
        if not self.patch_columns or self.patch_columns[0] != 0:
            raise ValueError("the first column is a patch column")

    @property
    def width(self) -> int:
        """Values in a sampled row."""
        return len(self.fields)

    @property
    def whole_columns(self) -> tuple[int, ...]:
        """The columns given whole."""
        return tuple(c for c in range(self.width) if c not in self.patch_columns)

    def series(self, segment: int) -> str:
        """The store's series name of one segment (its chunks' key)."""
        return f"{self.name}/{segment:02d}"


class SampledBucket:
    """The next tier's point in progress of every slot, from sampled frames."""

    def __init__(self, shape: GroupShape, slots: int) -> None:
        self.shape = shape
        self.whole = shape.whole_columns
        self.patch = shape.patch_columns
        width = shape.width
        self.start = -1
        self.first_ms = 0
        self.last_ms = 0
        self.frames = 0
        self.born = [0] * slots
        # A whole column's lists are only ever replaced, never changed in place:
        # they start as one shared list of zeros and one of missing values.
        zeros, nothing = [0] * slots, [MISSING] * slots
        patch = set(self.patch)
        self.sum: list[list[int]] = [[0] * slots if c in patch else zeros for c in range(width)]
        self.max: list[list[int]] = [[MISSING] * slots if c in patch else nothing for c in range(width)]
        self.last: list[Column] = [[MISSING] * slots if c in patch else nothing for c in range(width)]
        self.n: list[list[int]] = [[0] * slots if c in patch else zeros for c in range(width)]
        #: Whole columns: frames missing per slot (n is the frames since born less these).
        self.missing: list[list[int]] = [zeros] * width
        #: Whole columns: the list not yet added and how many frames it holds.
        self.pending: list[Optional[Column]] = [None] * width
        self.times = [0] * width
        #: Patch columns: the frame from which each slot's value is not yet added.
        self.since = [0] * slots
        #: Whether a slot was patched or born in this bucket (else every slot's
        #: patch values were held all along: their point is made in C at once).
        self.moved = False
        #: Whole columns nothing was added to yet (their sums are 0, their max and last missing).
        self.fresh = [True] * width
        #: Whole columns added up in lanes (:func:`_pack`): their sums and maxima, packed
        #: (until a value is missing or a slot is born: then in the lists above).
        self.lanes: list[Optional[tuple[int, int]]] = [None] * width
        self._parts: Optional[list[tuple[list[int], list[int], list[int], list[int]]]] = None

    @property
    def has_data(self) -> bool:
        return self.frames > 0

    def grow(self, count: int) -> None:
        """``count`` new slots, born at this frame."""
        for column in self.whole:
            self._flush(column)
            self._unlane(column)
        frames = self.frames
        self.born = self.born + [frames] * count
        self.since = self.since + [frames] * count
        self.moved = True
        self._parts = None
        # New lists: a sum, max or last may be a whole column handed in, which is never changed.
        for column in range(self.shape.width):
            self.sum[column] = self.sum[column] + [0] * count
            self.max[column] = self.max[column] + [MISSING] * count
            self.last[column] = [*self.last[column], *[MISSING] * count]
            self.n[column] = self.n[column] + [0] * count
            self.missing[column] = self.missing[column] + [0] * count

    def add_whole(self, columns: Sequence[Column]) -> None:
        """The whole columns of this frame (a list seen at the frame before counts once more)."""
        pending = self.pending
        for column in self.whole:
            values = columns[column]
            if values is pending[column]:
                self.times[column] += 1
            else:
                self._flush(column)
                pending[column] = values
                self.times[column] = 1

    def _flush(self, column: int, final: bool = False) -> None:
        """Add the pending list (``final``: the last of the bucket, so a column
        held all along is not packed into lanes only to be unpacked)."""
        values = self.pending[column]
        if values is None:
            return
        times = self.times[column]
        self.pending[column] = None
        if not values:
            return
        lanes = self.lanes[column]
        if (lanes is not None or (self.fresh[column] and not final)) and min(values) >= 0 and max(values) < LANE_LIMIT:
            packed = _pack(values)
            if lanes is None:
                self.fresh[column] = False
                self.lanes[column] = (packed * times, packed)
            else:
                self.lanes[column] = (lanes[0] + packed * times, _lane_max(lanes[1], packed, len(values)))
            self.last[column] = values
            return
        self._unlane(column)
        if min(values) >= 0:
            added = values if times == 1 else list(map(mul, values, repeat(times)))
            self.last[column] = values
            if self.fresh[column]:  # the first list of the bucket: its values are the sums and maxima
                self.fresh[column] = False
                self.sum[column] = list(added)
                self.max[column] = list(values)
                return
            self.sum[column] = list(map(add, self.sum[column], added))
        else:
            self.fresh[column] = False
            self.sum[column] = [s + v * times if v >= 0 else s for s, v in zip(self.sum[column], values, strict=True)]
            self.missing[column] = [
                m + times if v < 0 else m for m, v in zip(self.missing[column], values, strict=True)
            ]
            self.last[column] = [v if v >= 0 else l for v, l in zip(values, self.last[column], strict=True)]
        self.max[column] = [v if v > m else m for v, m in zip(values, self.max[column], strict=True)]

    def _unlane(self, column: int) -> None:
        """A whole column's sums and maxima from its lanes into its lists."""
        lanes = self.lanes[column]
        if lanes is not None:
            count = len(self.born)
            self.sum[column] = _unpack(lanes[0], count)
            self.max[column] = _unpack(lanes[1], count)
            self.lanes[column] = None

    def patched(self, slot: int, old: Sequence[int]) -> None:
        """Slot ``slot``'s patch values (``old``, in patch column order) change at this frame: add their run so far."""
        runs = self.frames - self.since[slot]
        self.since[slot] = self.frames
        self.moved = True
        if runs <= 0:
            return
        for (sums, n, most, last), value in zip(self._patch_parts, old, strict=True):
            if value >= 0:
                sums[slot] += value * runs
                n[slot] += runs
                if value > most[slot]:
                    most[slot] = value
                last[slot] = value

    @property
    def _patch_parts(self) -> list[tuple[list[int], list[int], list[int], list[int]]]:
        """Per patch column, its sums, n, max and last lists (changed in place by :meth:`patched`)."""
        parts = self._parts
        if parts is None:
            parts = self._parts = [
                (self.sum[c], self.n[c], self.max[c], self.last[c])  # type: ignore[misc]  # the last values of a patch column are a list, typed as Sequence
                for c in self.patch
            ]
        return parts

    def roll(self, columns: Sequence[Column]) -> list[Column]:
        """Every slot's point (count, then sum, max, last, n per field), the values now held to the end."""
        frames = self.frames
        out: list[Column] = []
        # One list for every n of a slot present all along (the same object: compared at once later).
        full = [frames] * len(self.born)
        born_here = any(self.born)
        for column in self.whole:
            self._flush(column, final=True)
            self._unlane(column)
            missing = self.missing[column]
            if born_here or any(missing):
                self.n[column] = [frames - b - m for b, m in zip(self.born, missing, strict=True)]
            else:
                self.n[column] = full
        runs = [frames - s for s in self.since]
        for column in self.patch:
            values = columns[column]
            if not self.moved:  # every slot held its value all along
                self.last[column] = list(values)
                self.max[column] = list(values)
                if min(values, default=0) >= 0:
                    self.sum[column] = list(map(mul, values, repeat(frames)))
                    self.n[column] = full
                else:
                    self.sum[column] = [v * frames if v >= 0 else 0 for v in values]
                    self.n[column] = [frames if v >= 0 else 0 for v in values]
                continue
            if min(values, default=0) >= 0:
                self.sum[column] = list(map(add, self.sum[column], map(mul, values, runs)))
                self.n[column] = list(map(add, self.n[column], runs))
                self.last[column] = list(values)
            else:
                self.sum[column] = [
                    s + v * r if v >= 0 else s for s, v, r in zip(self.sum[column], values, runs, strict=True)
                ]
                self.n[column] = [n + r if v >= 0 else n for n, v, r in zip(self.n[column], values, runs, strict=True)]
                self.last[column] = [v if v >= 0 else l for v, l in zip(values, self.last[column], strict=True)]
            self.max[column] = [v if v > m else m for v, m in zip(values, self.max[column], strict=True)]
        out.append(self.n[0])
        for column in range(self.shape.width):
            n = self.n[column]
            sums = self.sum[column]
            if 0 in n:
                sums = [s if k else MISSING for s, k in zip(sums, n, strict=True)]
            out += (sums, self.max[column], self.last[column], n)
        return out

    def slot_point(self, slot: int, columns: Sequence[Column]) -> Optional[Row]:
        """One slot's point so far (None: it has none)."""
        if not self.frames or slot >= len(self.born):
            return None
        parts: list[int] = []
        count = 0
        for column in range(self.shape.width):
            total, most, last = self.sum[column][slot], self.max[column][slot], self.last[column][slot]
            if column in self.patch:
                n = self.n[column][slot]
                runs = self.frames - self.since[slot]
                value = columns[column][slot]
                if value >= 0 and runs > 0:
                    total, n, most, last = total + value * runs, n + runs, max(most, value), value
            else:
                lanes = self.lanes[column]
                if lanes is not None:
                    total = (lanes[0] >> (_LANE_BITS * slot)) & _LANE_MASK
                    most = (lanes[1] >> (_LANE_BITS * slot)) & _LANE_MASK
                missing = self.missing[column][slot]
                pending = self.pending[column]
                if pending is not None and slot < len(pending):
                    value, times = pending[slot], self.times[column]
                    if value >= 0:
                        total, most, last = total + value * times, max(most, value), value
                    else:
                        missing += times
                n = self.frames - self.born[slot] - missing
            if column == 0:
                count = n
            parts += (total if n else MISSING, most, last, n)
        if not count:
            return None
        return (count, *parts)


class RolledBucket:
    """A coarser tier's point in progress of every slot, from the finer tier's points."""

    def __init__(self, shape: GroupShape, slots: int) -> None:
        self.width = tiers.rolled_width(shape.width)
        self.start = -1
        self.first_ms = 0
        self.last_ms = 0
        self.points = 0
        # Lists are only ever replaced, never changed in place: shared where they can be.
        zeros, nothing = [0] * slots, [MISSING] * slots
        self.acc: list[Column] = [nothing if self._taken_once(at) else zeros for at in range(self.width)]
        #: Columns added up (count, sums, n): the list not yet added, and how many times.
        self.pending: list[Optional[Column]] = [None] * self.width
        self.times = [0] * self.width
        #: Columns taken once (max, last): the list last taken.
        self.seen: list[Optional[Column]] = [None] * self.width
        #: Columns nothing was added to or taken in yet.
        self.fresh = [True] * self.width

    @staticmethod
    def _taken_once(at: int) -> bool:
        """Whether column ``at`` of a point is a max or a last (else it is added up)."""
        return at > 0 and (at - 1) % PER_FIELD in (tiers.MAX, tiers.LAST)

    @classmethod
    def _empty(cls, at: int, slots: int) -> list[int]:
        return [MISSING] * slots if cls._taken_once(at) else [0] * slots

    @staticmethod
    def _additive(at: int) -> bool:
        return at == 0 or (at - 1) % PER_FIELD in (tiers.SUM, tiers.N)

    @property
    def has_data(self) -> bool:
        return self.points > 0

    def grow(self, count: int) -> None:
        for at in range(self.width):
            self._flush(at)
            self.acc[at] = [*self.acc[at], *self._empty(at, count)]
            self.seen[at] = None
            self.fresh[at] = False

    def add(self, columns: Sequence[Column]) -> None:
        """A point of every slot (a list seen at the point before counts once more)."""
        self.points += 1
        for at, values in enumerate(columns):
            if self._additive(at):
                if values is self.pending[at]:
                    self.times[at] += 1
                else:
                    self._flush(at)
                    self.pending[at] = values
                    self.times[at] = 1
            elif values is not self.seen[at]:
                self.seen[at] = values
                kept = self.acc[at]
                if self.fresh[at]:  # the first point: its max and last are the point's
                    self.fresh[at] = False
                    self.acc[at] = values
                elif (at - 1) % PER_FIELD == tiers.MAX:
                    self.acc[at] = [v if v > k else k for v, k in zip(values, kept, strict=True)]
                elif min(values, default=0) >= 0:
                    self.acc[at] = values
                else:
                    self.acc[at] = [v if v >= 0 else k for v, k in zip(values, kept, strict=True)]

    def _flush(self, at: int) -> None:
        values = self.pending[at]
        if values is None:
            return
        times = self.times[at]
        self.pending[at] = None
        if min(values, default=0) < 0:  # a sum of a field nobody reported: nothing to add
            values = [v if v >= 0 else 0 for v in values]
        added = values if times == 1 else list(map(mul, values, repeat(times)))
        if self.fresh[at]:
            self.fresh[at] = False
            self.acc[at] = added
        else:
            self.acc[at] = list(map(add, self.acc[at], added))

    def roll(self) -> list[Column]:
        """Every slot's point."""
        for at in range(self.width):
            self._flush(at)
        out: list[Column] = [self.acc[0]]
        for at in range(1, self.width, PER_FIELD):
            sums, n = self.acc[at + tiers.SUM], self.acc[at + tiers.N]
            if 0 in n:
                sums = [s if k else MISSING for s, k in zip(sums, n, strict=True)]
            out += (sums, self.acc[at + tiers.MAX], self.acc[at + tiers.LAST], n)
        return out

    def slot_point(self, slot: int) -> Optional[Row]:
        """One slot's point so far (None: it has none)."""
        if not self.points or slot >= len(self.acc[0]):
            return None
        row = [self.acc[at][slot] for at in range(self.width)]
        for at in range(self.width):
            pending = self.pending[at]
            if pending is not None and pending[slot] > 0:
                row[at] += pending[slot] * self.times[at]
        if not row[0]:
            return None
        for at in range(1, self.width, PER_FIELD):
            if not row[at + tiers.N]:
                row[at + tiers.SUM] = MISSING
        return tuple(row)
