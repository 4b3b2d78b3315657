"""Capacity history's pure parts: roll-ups, chunk encoding, settings.

The roll-ups are checked against plain arithmetic on the sampled values
(Hypothesis): a 1-minute point is the mean, max and last of its 15-second
points, and a 10-minute point made from 1-minute points is the one made
from their 15-second points at once.
"""

from __future__ import annotations

import statistics
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.history import chunks, tiers
from twisted_iop.controlplane.history.fields import FLEET_FIELDS, MISSING, MODEL_FIELDS, fields_of, shown

values = st.one_of(st.just(MISSING), st.integers(min_value=0, max_value=2**40))
FIELDS = 3


def rows_of(count: int) -> st.SearchStrategy[list[tuple[int, ...]]]:
    """``count`` sampled rows of :data:`FIELDS` values, some missing."""
    return st.lists(st.tuples(*[values] * FIELDS), min_size=count, max_size=count)


@given(rows_of(4))
def test_a_rolled_point_is_the_mean_max_and_last_of_its_points(rows: list[tuple[int, ...]]) -> None:
    """A 1-minute point of four 15-second points: per field the exact mean, the max and the last reported value."""
    point = tiers.roll_sampled(rows)
    assert point[0] == 4
    for index in range(FIELDS):
        present = [row[index] for row in rows if row[index] != MISSING]
        mean, most, last = tiers.field_parts(point, index)
        if not present:
            assert (mean, most, last) == (None, None, None)
            continue
        assert mean == sum(present) / len(present)
        assert mean == pytest.approx(statistics.mean(present))
        assert most == max(present)
        assert last == present[-1]


@given(st.lists(rows_of(4), min_size=1, max_size=10))
@settings(max_examples=200)
def test_rolling_up_rolled_points_equals_rolling_up_their_samples(minutes: list[list[tuple[int, ...]]]) -> None:
    """15 s -> 1 min -> 10 min equals 15 s -> 10 min: sum, max, last, n and count are exact across tiers."""
    by_minute = [tiers.roll_sampled(rows) for rows in minutes]
    at_once = tiers.roll_sampled([row for rows in minutes for row in rows])
    assert tiers.roll_rolled(by_minute) == at_once
    # And in two levels of rolled points (e.g. halves), the same again.
    half = len(by_minute) // 2 or 1
    parts = [tiers.roll_rolled(by_minute[:half])] + ([tiers.roll_rolled(by_minute[half:])] if by_minute[half:] else [])
    assert tiers.roll_rolled(parts) == at_once


@given(st.tuples(*[values] * FIELDS))
def test_a_sampled_row_rolled_alone_is_itself(row: tuple[int, ...]) -> None:
    """One row as a rolled point is the roll-up of that row alone."""
    assert tiers.as_rolled(row) == tiers.roll_sampled([row])


def test_bucket_of_lines_every_series_up() -> None:
    """A bucket starts at a multiple of its step."""
    assert tiers.bucket_of(1_700_000_059_999, 60_000) == 1_700_000_040_000
    assert tiers.bucket_of(1_700_000_040_000, 60_000) == 1_700_000_040_000


@given(st.lists(st.tuples(st.integers(0, 2**50), *[values] * FIELDS), min_size=1, max_size=chunks.MAX_POINTS))
def test_a_chunk_decodes_to_the_rows_appended_open_or_closed(rows: list[tuple[int, ...]]) -> None:
    """Rows appended to an open chunk come back exactly, from the open bytes and from the compressed ones."""
    rows = sorted(rows)
    chunk = chunks.OpenChunk(chunks.SAMPLED, 1 + FIELDS)
    for row in rows:
        chunk.append(row[0], row[1:])
    assert chunk.start_ms == rows[0][0] and chunk.end_ms == rows[-1][0] and chunk.points == len(rows)
    assert chunks.decode(chunk.open_bytes()) == (chunks.SAMPLED, rows)
    closed = chunk.closed_bytes()
    assert closed[0] == chunks.CLOSED
    assert chunks.decode(closed) == (chunks.SAMPLED, rows)


def test_unchanged_values_cost_almost_nothing_once_closed() -> None:
    """60 rows of 21 columns where three values change: the closed chunk is a few hundred bytes."""
    chunk = chunks.OpenChunk(chunks.SAMPLED, 1 + len(FLEET_FIELDS))
    row = [5] * len(FLEET_FIELDS)
    for i in range(chunks.MAX_POINTS):
        row[10] = 10 + i % 7
        row[11] = i % 3
        row[15] = 123_400 + 37 * (i % 11)
        chunk.append(1_700_000_000_000 + 15_000 * i, tuple(row))
    assert chunk.full
    assert len(chunk.closed_bytes()) < len(chunk.open_bytes()) < 60 * 40
    assert len(chunk.closed_bytes()) < 400


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x09\x00\x03",
        b"\x01\x00\x00",
        b"\x01\x00\x02\x0a\x01\x02",  # one value in a chunk of rows of two
        b"\x02\x00\x02not zlib",
        b"\x01\x00\x02\x0a\xff",  # a truncated message
        bytes((chunks.CLOSED, 0, 2)) + zlib.compress(b"\x0a\x01"),
    ],
)
def test_what_is_not_a_chunk_is_refused_with_chunk_error(data: bytes) -> None:
    """Bytes a store hands back that are not a chunk raise ChunkError, never anything else."""
    with pytest.raises(chunks.ChunkError):
        chunks.decode(data)


def test_series_names_choose_their_fields_and_values_show_in_their_units() -> None:
    """Model series have the model fields; fixed point and missing values show as JSON numbers and null."""
    assert fields_of("fleet") == FLEET_FIELDS and fields_of("edge:a") == FLEET_FIELDS
    assert fields_of("model:llama") == MODEL_FIELDS and fields_of("edge:a/model:llama") == MODEL_FIELDS
    tokens = next(f for f in FLEET_FIELDS if f.name == "tokens_per_second")
    kv = next(f for f in FLEET_FIELDS if f.name == "kv_cache_usage")
    assert shown(12345, tokens) == 12345 and shown(420, kv) == 0.42
    assert shown(MISSING, kv) is None and shown(0, kv) == 0
    assert shown(7, FLEET_FIELDS[0]) == 7


def test_history_settings_defaults_and_a_short_interval() -> None:
    """The fleet's tiers are 15 s / 6 h, 1 min / 48 h, 10 min / 30 d, the edges' 30 s / 1 h, 10 min / 48 h,
    1 h / 30 d; tests may sample every half second, and the edges at a whole multiple of the interval."""
    default = config_from_text("").history
    assert default.enabled and default.interval_seconds == 15.0
    assert [(t.step_seconds, t.keep_seconds) for t in default.tiers] == [
        (15.0, 6 * 3600.0),
        (60.0, 48 * 3600.0),
        (600.0, 30 * 86400.0),
    ]
    assert [t.key for t in default.tiers] == [15, 60, 600]
    assert [(t.step_seconds, t.keep_seconds) for t in default.edge_tiers] == [
        (30.0, 3600.0),
        (600.0, 48 * 3600.0),
        (3600.0, 30 * 86400.0),
    ]
    short = config_from_text(
        "history:\n  interval_seconds: 0.5\n  tiers:\n  - {keep_hours: 1}\n  - {step_seconds: 2, keep_days: 1}\n"
    ).history
    assert [(t.step_ms, t.key) for t in short.tiers] == [(500, 500), (2000, 2)]
    assert short.edge_tiers == short.tiers  # another interval: the edges keep the fleet's tiers
    edges_every_second = config_from_text(
        "history:\n  interval_seconds: 0.5\n  tiers:\n  - {keep_hours: 1}\n"
        "  edge_tiers:\n  - {step_seconds: 1, keep_hours: 1}\n  - {step_seconds: 10, keep_days: 2}\n"
    ).history
    assert [t.step_ms for t in edges_every_second.edge_tiers] == [1000, 10_000]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("history:\n  nope: 1\n", "history.nope: unknown setting"),
        ("history:\n  interval_seconds: 0\n", "history.interval_seconds: must be greater than 0"),
        ("history:\n  interval_seconds: 5\n", "history.tiers: required when interval_seconds is not 15"),
        ("history:\n  tiers: []\n", "history.tiers: must be a list"),
        ("history:\n  tiers: [{step_seconds: 15}]\n", "history.tiers[0].keep_hours: give exactly one"),
        ("history:\n  tiers: [{step_seconds: 10, keep_hours: 1}]\n", "history.tiers[0].step_seconds: the first"),
        (
            "history:\n  tiers: [{keep_hours: 1}, {step_seconds: 40, keep_hours: 2}]\n",
            "history.tiers[1].step_seconds: must be a whole multiple",
        ),
        ("history:\n  tiers: [{keep_hours: 0.001}]\n", "history.tiers[0].keep_hours: must keep at least two steps"),
        ("history:\n  max_series: 0\n", "history.max_series: must be between 1"),
        (
            "history:\n  edge_tiers: [{step_seconds: 20, keep_hours: 1}]\n",
            "history.edge_tiers[0].step_seconds: the first tier's step is the interval .* or a whole multiple",
        ),
        (
            "history:\n  edge_tiers: [{step_seconds: 30, keep_hours: 1}, {step_seconds: 45, keep_hours: 2}]\n",
            "history.edge_tiers[1].step_seconds: must be a whole multiple",
        ),
        ("history:\n  edge_tiers: {step_seconds: 30}\n", "history.edge_tiers: must be a list"),
        ("history:\n  enabled: maybe\n", "history.enabled: must be true or false"),
    ],
)
def test_bad_history_settings_name_their_field(text: str, message: str) -> None:
    """Every bad ``history`` value is refused with the dotted path of its field."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config_from_text(text)
