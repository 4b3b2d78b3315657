"""The column-wise segment recorder against the plain roll-ups (Hypothesis).

Keys come and go, whole columns change or stay the same list, patch
columns change for a few slots, values go missing, segments are compacted
and flushed mid-bucket; every key's points read back from the chunks (in
the store and open in memory) and the points in progress must equal, at
every tier, what :mod:`twisted_iop.controlplane.history.tiers` makes of
that key's sampled rows.
"""

from __future__ import annotations

import zlib
from typing import Any, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.controlplane.history import columns, tiers
from twisted_iop.controlplane.history.chunks import ChunkError, _Packed
from twisted_iop.controlplane.history.fields import MISSING, Field
from twisted_iop.controlplane.history.frames import FrameStats, GroupShape, SegmentRecorder, store_key
from twisted_iop.controlplane.history.settings import Tier
from twisted_iop.controlplane.store.memory import MemoryStore

SHAPE = GroupShape("things", (Field("here", "x"), Field("whole", "x"), Field("patched", "x")), (0, 2))
TIERS = (Tier(1.0, 3600.0), Tier(4.0, 7200.0), Tier(12.0, 86400.0))
KEYS = ("a", "b", "c", "d", "e")

Row = tuple[int, ...]

value = st.one_of(st.just(MISSING), st.integers(0, 50), st.integers(0, 2**40))
#: One sample: for each key, absent (None) or its whole and patched values;
#: or (an empty dict) the sample before again, as a steady fleet answers.
sample = st.tuples(
    st.integers(1, 3),  # seconds since the last sample
    st.one_of(
        st.just({}),
        st.fixed_dictionaries({key: st.one_of(st.none(), st.tuples(st.integers(0, 9), value)) for key in KEYS}),
    ),
    st.sampled_from(["", "", "", "", "compact", "flush"]),
)


class Driver:
    """Feeds samples to a segment recorder as the history sampler does, and keeps each key's rows."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.recorder = SegmentRecorder(SHAPE, 0, TIERS, self.store, FrameStats())
        self.rows: dict[str, list[tuple[int, Row]]] = {key: [] for key in KEYS}
        self.whole: list[int] = []
        self.t_ms = 1_700_000_000_000 - 1_700_000_000_000 % 12_000
        self.before: dict[str, Optional[tuple[int, int]]] = dict.fromkeys(KEYS)

    def sample(self, step: int, present: dict[str, Optional[tuple[int, int]]], action: str) -> None:
        """One sample: new keys get slots, absent ones go missing."""
        self.t_ms += step * 1000
        present = present or self.before
        self.before = present
        recorder = self.recorder
        new_keys = [key for key in KEYS if present[key] is not None and key not in recorder.slot_of]
        keys = recorder.keys + new_keys
        whole = [present[k][0] if present[k] is not None else MISSING for k in keys]  # type: ignore[index]  # mypy does not narrow present[k] by the test beside it
        # The same list object when nothing changed (as a steady sample hands it).
        old = recorder.columns[1]
        if whole == list(old) and len(old) == len(keys):
            whole = old  # type: ignore[assignment]  # the kept row is a list, typed as Sequence
        patches = []
        for slot, key in enumerate(keys):
            got = present[key]
            patches.append((slot, (1, got[1]) if got is not None else (MISSING, MISSING)))
            if got is not None:
                self.rows[key].append((self.t_ms, (1, got[0], got[1])))
        assert recorder.append(self.t_ms, new_keys, [(1, whole)], patches)
        if action == "compact":
            absent = {slot for slot in range(len(recorder.keys)) if recorder.columns[0][slot] < 0}
            if absent:
                recorder.compact(absent)
        elif action == "flush":
            recorder.flush()

    def points(self, tier_index: int) -> dict[str, list[tuple[int, Row]]]:
        """Each key's points at a tier, read back as the views read them."""
        key = store_key(TIERS[tier_index])
        kept = {c.start: c.data for c in self.store.history.read([SHAPE.series(0)], key, 0, 1e12)}
        opened = self.recorder.open_chunk(tier_index)
        if opened is not None:
            kept[opened.start] = opened.data
        found: dict[str, dict[int, Row]] = {k: {} for k in KEYS}
        for _, data in sorted(kept.items()):
            _, decoded = columns.decode(data)
            for name, points in decoded.items():
                for t_ms, row in points:
                    merge(found[name], t_ms, row, tier_index > 0)
        if tier_index:
            for name in KEYS:
                partial = self.recorder.partial(name, tier_index)
                if partial is not None:
                    merge(found[name], partial[0], partial[1], True)
        return {name: sorted(points.items()) for name, points in found.items()}


def merge(points: dict[int, Row], t_ms: int, row: Row, rolled: bool) -> None:
    """Two points of one rolled-up bucket make one (as views combine them)."""
    kept = points.get(t_ms)
    points[t_ms] = tiers.roll_rolled([kept, row]) if kept is not None and rolled else row


def expected(rows: list[tuple[int, Row]], tier_index: int) -> list[tuple[int, Row]]:
    """A key's points at a tier, from its sampled rows by the plain roll-ups."""
    if tier_index == 0:
        return rows
    step = TIERS[tier_index].step_ms
    buckets: dict[int, list[Row]] = {}
    for t_ms, row in rows:
        buckets.setdefault(t_ms - t_ms % step, []).append(row)
    return sorted((start, tiers.roll_sampled(bucket)) for start, bucket in buckets.items())


@given(st.lists(sample, min_size=1, max_size=60))
@settings(max_examples=150, deadline=None)
def test_every_key_at_every_tier_is_what_the_plain_roll_ups_make(samples: list[Any]) -> None:
    """Points read back (kept, open and in progress) equal the roll-ups of each key's own rows."""
    driver = Driver()
    for step, present, action in samples:
        driver.sample(step, present, action)
    for tier_index in range(len(TIERS)):
        got = driver.points(tier_index)
        for key in KEYS:
            assert got[key] == expected(driver.rows[key], tier_index), (key, tier_index)


def test_a_steady_segment_writes_almost_nothing_per_frame() -> None:
    """Frames whose columns did not change cost a few bytes however many slots there are."""
    store = MemoryStore()
    recorder = SegmentRecorder(SHAPE, 0, TIERS[:1], store, FrameStats())
    keys = [f"edge-{n}" for n in range(300)]
    whole = list(range(300))
    recorder.append(1_000, keys, [(1, whole)], [(slot, (1, 7)) for slot in range(300)])
    first = recorder.open_chunk(0)
    assert first is not None
    for second in range(2, 34):
        recorder.append(second * 1000, [], [(1, whole)], [])
    later = recorder.open_chunk(0)
    assert later is not None
    assert len(later.data) - len(first.data) < 33 * 12


def test_a_view_of_one_key_decodes_only_that_key() -> None:
    """decode(wanted) gives the wanted keys' points only, the same as a full decode gives them."""
    driver = Driver()
    for n in range(10):
        driver.sample(1, {k: (n, n * 3 if k != "c" else MISSING) for k in KEYS}, "")
    data = driver.recorder.open_chunk(0)
    assert data is not None
    _, everything = columns.decode(data.data)
    _, one = columns.decode(data.data, {"c"})
    assert list(one) == ["c"] and one["c"] == everything["c"]
    assert one["c"][-1] == (driver.t_ms, (1, 9, MISSING))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x03\x00",
        bytes((columns.COLUMNS, 0, 3, 1, 0)) + b"not zlib",
        bytes((columns.COLUMNS, 0, 3, 4, 0, 1, 2, 3)),
        bytes((columns.COLUMNS, 9, 3, 1, 0)),
    ],
)
def test_bytes_that_are_not_a_column_chunk_raise_chunk_error(data: bytes) -> None:
    """A corrupt header or stream is a ChunkError, never anything else."""
    with pytest.raises(ChunkError):
        columns.decode(data)


@given(st.lists(st.integers(-3, 300), max_size=40))
@settings(max_examples=300)
def test_any_values_in_a_column_chunk_are_read_or_refused_with_chunk_error(values: list[int]) -> None:
    """Whatever values a stream holds, decode gives well-formed points (the
    header's kind, each key's rows of the header's three columns) or a
    ChunkError that says what is wrong."""
    message = _Packed()
    message.v.extend(values)
    data = columns.header(0, 3, (0, 2)) + zlib.compress(message.SerializeToString())
    try:
        kind, points = columns.decode(data)
    except ChunkError as e:
        refusal = str(e)
        points, kind = {}, 0
    else:
        refusal = "decoded"
    assert refusal and kind == 0
    for key, rows in points.items():
        assert isinstance(key, str)
        for t_ms, row in rows:
            assert isinstance(t_ms, int) and len(row) == 3
