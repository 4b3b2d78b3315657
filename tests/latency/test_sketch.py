"""The latency sketch: its stated error, exact merges, a peer's bad buckets, the sliding window."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.latency.sketch import (
    MAX_BUCKET_COUNT,
    MAX_BUCKETS,
    MAX_INDEX,
    MAX_SECONDS,
    MIN_INDEX,
    MIN_SECONDS,
    RELATIVE_ERROR,
    LatencySketch,
    SlidingSketch,
    bucket_value,
    merged,
)

durations = st.lists(st.floats(min_value=MIN_SECONDS * 1.01, max_value=MAX_SECONDS * 0.99), min_size=1, max_size=300)


def sketch_of(values: list[float]) -> LatencySketch:
    """A sketch fed ``values``."""
    sketch = LatencySketch()
    for value in values:
        sketch.observe(value)
    return sketch


@given(durations, st.floats(min_value=0.0, max_value=1.0))
def test_a_quantile_is_within_the_stated_error_of_the_value_at_its_rank(values: list[float], q: float) -> None:
    """The answer is within 2 % of the observed value at rank q * (n - 1)."""
    answer = sketch_of(values).quantile(q)
    expected = sorted(values)[math.floor(q * (len(values) - 1))]
    assert answer is not None
    assert abs(answer - expected) <= RELATIVE_ERROR * expected * 1.0000001


@given(durations, durations)
def test_merging_two_sketches_equals_one_sketch_of_both(left: list[float], right: list[float]) -> None:
    """A merge is exact: the same buckets as a sketch fed every value."""
    both = merged([sketch_of(left), sketch_of(right)])
    alone = sketch_of(left + right)
    assert both.buckets == alone.buckets
    assert both.count == len(left) + len(right)
    assert both.total == pytest.approx(sum(left) + sum(right))


@given(durations)
def test_the_wire_form_round_trips(values: list[float]) -> None:
    """pairs() and from_pairs() give back the same sketch."""
    sketch = sketch_of(values)
    indices, counts = sketch.pairs()
    again = LatencySketch.from_pairs(indices, counts, sketch.total)
    assert again.buckets == sketch.buckets and again.count == sketch.count


def read_bucket_by_bucket(indices: list[int], counts: list[int]) -> LatencySketch:
    """A peer's buckets checked and taken one at a time (the rules of from_pairs, plainly)."""
    sketch = LatencySketch()
    for index, count in zip(indices, counts, strict=True):
        if not MIN_INDEX <= index <= MAX_INDEX or not 0 <= count <= MAX_BUCKET_COUNT or index in sketch.buckets:
            raise ValueError("bad")
        if count:
            sketch.buckets[index] = count
            sketch.count += count
    return sketch


@given(
    st.lists(
        st.tuples(
            st.integers(MIN_INDEX - 2, MAX_INDEX + 2),
            st.one_of(st.integers(-2, 3), st.integers(MAX_BUCKET_COUNT - 1, MAX_BUCKET_COUNT + 1)),
        ),
        max_size=12,
    )
)
def test_from_pairs_takes_exactly_what_a_bucket_by_bucket_reading_takes(pairs: list[tuple[int, int]]) -> None:
    """Any peer's buckets (out of range, negative, too large, repeated, zero counts): from_pairs
    refuses what the plain reading refuses and otherwise keeps the same buckets and count."""
    indices, counts = [i for i, _ in pairs], [c for _, c in pairs]
    try:
        expected = read_bucket_by_bucket(indices, counts)
    except ValueError:
        with pytest.raises(ValueError, match=r"outside|given twice"):
            LatencySketch.from_pairs(indices, counts)
        return
    got = LatencySketch.from_pairs(indices, counts)
    assert got.buckets == expected.buckets and got.count == expected.count


@given(st.dictionaries(st.integers(MIN_INDEX, MAX_INDEX), st.integers(1, 50), min_size=1), st.floats(0.0, 1.0))
def test_a_quantile_is_the_first_bucket_whose_running_count_passes_its_rank(buckets: dict[int, int], q: float) -> None:
    """quantile() answers the bucket a walk in index order reaches past rank q * (count - 1)."""
    sketch = LatencySketch()
    sketch.buckets, sketch.count = dict(buckets), sum(buckets.values())
    rank, seen = q * (sketch.count - 1), 0
    for index in sorted(buckets):
        seen += buckets[index]
        if seen > rank:
            break
    assert sketch.quantile(q) == bucket_value(index)


def test_out_of_range_values_are_clamped_so_the_sketch_stays_bounded() -> None:
    """Zero, negative, NaN, huge and infinite durations land in the end buckets."""
    sketch = sketch_of([0.0, -1.0, float("nan"), 1e9, float("inf"), 0.5])
    assert len(sketch.buckets) == 3
    assert sketch.count == 6
    assert min(sketch.buckets) == MIN_INDEX and sketch.buckets[MIN_INDEX] == 3
    assert max(sketch.buckets) == MAX_INDEX and sketch.buckets[MAX_INDEX] == 2
    assert math.isfinite(sketch.total)


@pytest.mark.parametrize(
    ("indices", "counts", "total", "message"),
    [
        ([1, 2], [1], 0.0, "2 bucket indices for 1 counts"),
        ([MAX_INDEX + 1], [1], 0.0, "outside"),
        ([0], [-1], 0.0, "outside 0.."),
        ([0, 0], [1, 1], 0.0, "given twice"),
        ([0], [1], float("nan"), "finite"),
        (list(range(MAX_BUCKETS + 1)), [1] * (MAX_BUCKETS + 1), 0.0, "at most"),
    ],
)
def test_a_peers_bad_buckets_are_refused_with_a_reason(
    indices: list[int], counts: list[int], total: float, message: str
) -> None:
    """from_pairs names what is wrong instead of taking it."""
    with pytest.raises(ValueError, match=message):
        LatencySketch.from_pairs(indices, counts, total)


def test_count_above_counts_what_is_clearly_over_the_threshold() -> None:
    """Values well over the threshold count; values under it do not."""
    sketch = sketch_of([0.1] * 90 + [1.0] * 10)
    assert sketch.count_above(0.5) == 10
    assert sketch.count_above(2.0) == 0
    assert sketch.count_above(0.01) == 100


def test_minus_gives_what_a_cumulative_sketch_gained_or_none_after_a_restart() -> None:
    """The difference of two readings of one counter; None when it went back."""
    before = sketch_of([0.1, 0.2])
    after = sketch_of([0.1, 0.2, 0.2, 3.0])
    delta = after.minus(before)
    assert delta is not None and delta.count == 2
    assert delta.buckets == sketch_of([0.2, 3.0]).buckets
    assert before.minus(after) is None


def test_an_empty_sketch_has_no_quantile() -> None:
    """No observation, no answer."""
    assert LatencySketch().quantile(0.95) is None


def test_the_sliding_sketch_forgets_what_left_its_window() -> None:
    """Observations older than the window drop out slice by slice."""
    window = SlidingSketch(window=60.0, slices=6)
    window.observe(1.0, now=0.0)
    window.observe(2.0, now=35.0)
    assert window.reading(now=50.0).count == 2
    assert window.reading(now=65.0).count == 1
    assert window.reading(now=100.0).count == 0
    window.observe(0.5, now=1000.0)
    assert window.reading(now=1000.0).count == 1
    assert len(window._slices) == 1


def test_the_sliding_sketch_refuses_a_nonsense_shape() -> None:
    """A window of no time or no slices is a programming error, said at once."""
    with pytest.raises(ValueError, match="window must be > 0"):
        SlidingSketch(window=0.0)
    with pytest.raises(ValueError, match="slices >= 1"):
        SlidingSketch(slices=0)
