"""SLOs without I/O: the spec parser, the bucket arithmetic, burn rates, alerts and restart diffs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.controlplane.slo.buckets import CountBuckets, SketchSlices, bucket_of, first_bucket
from twisted_iop.controlplane.slo.evaluator import FIRING, RESOLVED, SloState, burn_rate
from twisted_iop.controlplane.slo.readings import ProviderReadings
from twisted_iop.controlplane.slo.spec import SpecError, format_duration, parse_duration, parse_spec
from twisted_iop.testing.latency import LatencyFeed, latency_snapshot, sketch_of

CHAT_TTFT = {
    "metric": "ttft",
    "percentile": 95,
    "objective_seconds": 0.5,
    "model": "llama-3-8b",
    "edge_selector": "region=eu",
    "window": "30d",
}


# -- the spec -------------------------------------------------------------------------------


def test_the_issue_body_parses_with_its_target_and_window() -> None:
    """The body of the issue is an SLO: target 0.95, a 30-day window, the selector kept."""
    spec = parse_spec("chat-ttft", CHAT_TTFT)
    assert spec.target == pytest.approx(0.95)
    assert spec.window_seconds == 30 * 86400
    assert spec.edge_selector == "region=eu"
    assert spec.selector.matches({"region": "eu"}) and not spec.selector.matches({"region": "us"})
    assert parse_spec("chat-ttft", spec.as_json()) == spec


def test_error_ratio_takes_an_objective_ratio_and_defaults_its_window() -> None:
    """An error-ratio SLO of 1 % has target 0.99, a 30-day window and every edge."""
    spec = parse_spec("errors", {"metric": "error_ratio", "objective_ratio": 0.01, "model": "m"})
    assert spec.target == pytest.approx(0.99) and spec.window == "30d" and spec.edge_selector == ""


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"metric": "p99"}, "metric"),
        ({"percentile": 100}, "percentile"),
        ({"percentile": "95"}, "percentile"),
        ({"objective_seconds": 0}, "objective_seconds"),
        ({"model": ""}, "model"),
        ({"edge_selector": "region in (eu"}, "edge_selector"),
        ({"window": "30 days"}, "window"),
        ({"window": "1m"}, "window"),
        ({"objective_ratio": 0.1}, "objective_ratio"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_a_bad_field_is_named(change: dict[str, Any], field: str) -> None:
    """Each bad value raises SpecError naming its field."""
    body = dict(CHAT_TTFT)
    body.update(change)
    with pytest.raises(SpecError) as raised:
        parse_spec("chat-ttft", body)
    assert raised.value.field == field
    assert f"'{field}'" in str(raised.value)


def test_a_missing_model_and_a_bad_name_are_named() -> None:
    """The model is required; the name must be a short id."""
    body = {k: v for k, v in CHAT_TTFT.items() if k != "model"}
    with pytest.raises(SpecError, match="'model'"):
        parse_spec("chat-ttft", body)
    with pytest.raises(SpecError, match="'name'"):
        parse_spec("no spaces", CHAT_TTFT)


def test_durations_read_and_print_in_their_largest_unit() -> None:
    """5m, 6h and 30d read as seconds; seconds print back in the unit that divides them."""
    assert [parse_duration(t) for t in ("90s", "5m", "6h", "30d", "1.5h")] == [90, 300, 21600, 2592000, 5400]
    assert [format_duration(s) for s in (3600, 300, 21600, 1800, 0.4166)] == ["1h", "5m", "6h", "30m", "0.417s"]


# -- buckets (property tests) ----------------------------------------------------------------

events = st.lists(st.tuples(st.floats(0, 10_000, allow_nan=False), st.integers(0, 50), st.integers(0, 50)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events, st.floats(0.5, 100), st.floats(1, 3000), st.floats(0.5, 5000))
def test_bucket_sums_are_the_events_of_the_buckets_they_cover(
    recorded: list[tuple[float, int, int]], step: float, span: float, seconds: float
) -> None:
    """Whatever the order of additions, a sum over the last ``seconds`` is the
    sum of the kept events whose bucket began within it; at most
    ``max_buckets`` are kept and no count is negative."""
    span = max(span, step)
    buckets = CountBuckets(step, span)
    rows = [(at, min(bad, total), total) for at, bad, total in recorded]
    for at, bad, total in rows:
        buckets.add(at, bad, total)
    assert len(buckets) <= buckets.max_buckets
    if not rows:
        assert buckets.sums(0.0, seconds) == (0, 0)
        return
    now = max(at for at, _, _ in rows)
    newest = bucket_of(now, step)
    oldest_kept = newest - buckets.max_buckets + 1
    first = max(first_bucket(now, seconds, step), oldest_kept)
    # An event older than what was kept when it came is never counted.
    expected_bad = expected_total = 0
    seen_newest = None
    for at, bad, total in rows:
        index = bucket_of(at, step)
        kept_when_added = seen_newest is None or index >= seen_newest - buckets.max_buckets + 1
        seen_newest = index if seen_newest is None else max(seen_newest, index)
        if kept_when_added and first <= index <= newest:
            expected_bad += bad
            expected_total += total
    assert buckets.sums(now, seconds) == (expected_bad, expected_total)
    bad, total = buckets.sums(now, span)
    assert 0 <= bad <= total
    assert CountBuckets.from_json(buckets.as_json()).items() == buckets.items()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 30), st.integers(0, 30)), max_size=40))
def test_bucket_counts_do_not_depend_on_the_order_within_the_span(rows: list[tuple[int, int, int]]) -> None:
    """Events all within the span add to the same buckets in any order."""
    forward, backward = CountBuckets(10.0, 5000.0), CountBuckets(10.0, 5000.0)
    clean = [(float(at), min(b, t), t) for at, b, t in rows]
    for row in clean:
        forward.add(*row)
    for row in reversed(clean):
        backward.add(*row)
    assert forward.items() == backward.items()
    assert forward.sums(300.0, 5000.0) == (sum(b for _, b, _ in clean), sum(t for _, _, t in clean))


def test_bad_over_total_is_refused() -> None:
    """A bucket never holds more bad requests than requests."""
    with pytest.raises(ValueError, match="bad 3 of total 2"):
        CountBuckets(1.0, 10.0).add(0.0, 3, 2)


def test_sketch_slices_merge_the_window_and_forget_older_ones() -> None:
    """The percentile over a window merges the slices within it; older ones go."""
    slices = SketchSlices(10.0, 100.0)
    slices.add(5.0, sketch_of([9.0] * 10))
    slices.add(500.0, sketch_of([0.1] * 10))
    assert len(slices) == 1
    assert slices.merged(500.0, 100.0).quantile(0.95) == pytest.approx(0.1, rel=0.02)


# -- burn rates and alerts -------------------------------------------------------------------


def _state(window: str = "30d", **change: Any) -> SloState:
    body = dict(CHAT_TTFT, window=window)
    body.update(change)
    return SloState(parse_spec("chat-ttft", body), 0.0)


def test_burn_rate_is_the_error_ratio_over_the_allowed_one() -> None:
    """At a 95 % target, 5 % bad burns at 1.0 and 100 % at 20; no request burns nothing."""
    assert burn_rate(5, 100, 0.95) == pytest.approx(1.0)
    assert burn_rate(100, 100, 0.95) == pytest.approx(20.0)
    assert burn_rate(0, 0, 0.95) == 0.0


def test_the_windows_of_a_30_day_slo_are_the_workbooks() -> None:
    """A 30-day SLO pages on 1 h and 5 min, tickets on 6 h and 30 min."""
    state = _state()
    assert [r.window for r in state.figures(0.0).burn_rates] == ["1h", "5m", "6h", "30m"]


def test_a_fast_burn_pages_once_both_windows_burn_and_resolves_when_the_short_one_is_clean() -> None:
    """All bad after a little good traffic: the ticket (6x) fires at the first
    bad minute, the page (14.4x) only once the hour's ratio is past it too;
    a trickle of good traffic afterwards resolves the page once its 5-minute
    window is under 14.4, while the ticket's 30-minute window still burns."""
    state = _state()
    now = 10 * 86400.0
    for minute in range(6):
        state.record(now + minute * 60, 0, 10)  # 60 good requests first
    now += 6 * 60
    changes = []
    for minute in range(10):
        at = now + minute * 60
        state.record(at, 100, 100)
        changes.append([(c.alert, c.state) for c in state.evaluate(at)])
    # First minute: 100 bad of 160 over the hour burns 12.5 (< 14.4): ticket only.
    assert changes[0] == [("ticket", FIRING)]
    assert changes[1] == [("page", FIRING)]
    assert all(not moved for moved in changes[2:])
    page = state.alerts["page"]
    assert page.state == FIRING and page.since == now + 60
    now += 10 * 60
    resolved = []
    for minute in range(10):
        at = now + minute * 60
        state.record(at, 0, 10)
        resolved += [(c.alert, c.state, c.at - now) for c in state.evaluate(at)]
    # At +4 min the 5-minute window holds the last bad minute (100) and 50 good: 13.3 < 14.4.
    assert resolved == [("page", RESOLVED, 240.0)]
    assert state.alerts["ticket"].state == FIRING
    figures = state.figures(now + 540)
    assert figures.total == 60 + 1000 + 100 and figures.bad == 1000
    assert figures.error_budget_remaining == pytest.approx(1 - (1000 / 1160) / 0.05)


def test_a_short_spike_alone_does_not_page() -> None:
    """Five bad minutes after an hour of good traffic burn the short window
    but not the long one: no page (the point of two windows)."""
    state = _state()
    for minute in range(55):
        state.record(minute * 60.0, 0, 10)
    for minute in range(55, 60):
        state.record(minute * 60.0, 20, 20)
    assert state.evaluate(59 * 60.0) == []
    assert state.burn(59 * 60.0, 3600).burn_rate < 14.4
    assert state.burn(59 * 60.0, 300).burn_rate >= 14.4


def test_the_value_is_the_percentile_over_the_window() -> None:
    """The value of a latency SLO is its pN over the window, within the sketch's error."""
    state = _state()
    durations = [0.1 * (i + 1) for i in range(100)]
    sketch = sketch_of(durations)
    state.record(100.0, sketch.count_above(0.5), sketch.count, sketch)
    figures = state.figures(100.0)
    assert figures.value == pytest.approx(9.5, rel=0.03)
    assert figures.bad == 95 and figures.good_ratio == pytest.approx(0.05)


def test_the_stored_form_round_trips() -> None:
    """An SLO read back from its stored form has the same figures and alerts."""
    state = _state(window="1h")
    for second in range(20):
        state.record(second * 0.2, 10, 10, sketch_of([2.0] * 10))
        state.evaluate(second * 0.2)
    back = SloState.from_json(state.spec, state.as_json())
    assert back.figures(4.0) == state.figures(4.0)
    assert {n: (a.state, a.since) for n, a in back.alerts.items()} == {
        n: (a.state, a.since) for n, a in state.alerts.items()
    }


# -- restart diffs --------------------------------------------------------------------------


def test_readings_diff_count_restarts_from_zero_and_baseline_new_streams() -> None:
    """The first reading of a stream counts nothing; the next counts the
    difference; a new counting_since_ms counts the new reading whole."""
    feed = LatencyFeed()
    readings = ProviderReadings()
    feed.requests(ttft=[0.1] * 7)
    assert readings.take("edge-1", latency_snapshot("edge-1", {"mock-1": feed}), 1.0) == []
    feed.requests(ttft=[0.9] * 3, errors=1)
    (delta,) = readings.take("edge-1", latency_snapshot("edge-1", {"mock-1": feed}), 2.0)
    assert delta.sketches["ttft"].count == 3 and delta.sketches["ttft"].count_above(0.5) == 3
    assert (delta.requests, delta.errors, delta.models, delta.at) == (4, 1, ("llama-3-8b",), 2.0)
    feed.restart(1_700_000_999_000)
    feed.requests(ttft=[0.2] * 2)
    (delta,) = readings.take("edge-1", latency_snapshot("edge-1", {"mock-1": feed}), 3.0)
    assert delta.sketches["ttft"].count == 2 and delta.requests == 2
    assert readings.forget_except({"edge-2"}) == 1 and len(readings) == 0


def test_a_reading_that_does_not_check_is_left_out() -> None:
    """A provider whose sketch is malformed (an index out of range) is counted refused."""
    feed = LatencyFeed()
    response = latency_snapshot("edge-1", {"mock-1": feed})
    response.nodes[0].providers[0].latency.ttft_total.index.append(100_000)
    readings = ProviderReadings()
    assert readings.take("edge-1", response, 1.0) == [] and readings.refused == 1
