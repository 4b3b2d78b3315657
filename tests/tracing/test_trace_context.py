"""W3C Trace Context: strict ``traceparent`` parsing, bounded ``tracestate``, ids and sampling."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.tracing.context import (
    MAX_TRACESTATE_CHARS,
    IdSource,
    format_traceparent,
    parse_traceparent,
    parse_traceparent_headers,
    parse_tracestate,
    sampled_by_ratio,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{SPAN}-01"


def test_a_valid_traceparent_is_read() -> None:
    """The specification's example parses into its trace id, parent id and sampled flag."""
    parent = parse_traceparent(VALID.encode())
    assert parent is not None
    assert (parent.trace_id, parent.span_id, parent.flags, parent.sampled) == (TRACE, SPAN, 1, True)
    assert parent.header() == VALID
    unsampled = parse_traceparent(f"00-{TRACE}-{SPAN}-00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize(
    "value",
    [
        "",
        "00",
        f"00-{'0' * 32}-{SPAN}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"00-{TRACE.upper()}-{SPAN}-01",  # upper case
        f"ff-{TRACE}-{SPAN}-01",  # version ff is invalid
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has nothing after the flags
        f"00-{TRACE[:-1]}-{SPAN}-01",  # short trace id
        f"00-{TRACE}-{SPAN}0-01",  # long parent id
        f"00_{TRACE}_{SPAN}_01",  # wrong separators
        f"0g-{TRACE}-{SPAN}-01",  # not hex
        f"00-{TRACE}-{SPAN}-1",  # one flag digit
        f"00-{TRACE}-{SPAN}-0x",
        "00-" + "é" * 32 + f"-{SPAN}-01",
        "00-" + TRACE + "-" + SPAN + "-01" + " " * 300,  # over the length bound
    ],
)
def test_an_invalid_traceparent_is_none(value: str) -> None:
    """Each way the specification calls a traceparent invalid gives None (a new trace is started)."""
    assert parse_traceparent(value) is None


def test_a_later_version_is_read_forward_compatibly() -> None:
    """A higher version with more fields after a dash is read for its first four fields."""
    parent = parse_traceparent(f"cc-{TRACE}-{SPAN}-01-what-the-future-holds")
    assert parent is not None and parent.trace_id == TRACE and parent.header() == VALID
    assert parse_traceparent(f"cc-{TRACE}-{SPAN}-01x") is None


def test_two_traceparent_lines_are_invalid() -> None:
    """A request with two traceparent headers has none that counts."""
    assert parse_traceparent_headers([VALID.encode()]) is not None
    assert parse_traceparent_headers([VALID.encode(), VALID.encode()]) is None
    assert parse_traceparent_headers(None) is None


@given(st.text(max_size=80) | st.binary(max_size=80))
def test_any_input_parses_or_is_none(value: str | bytes) -> None:
    """No input makes the parser raise; what parses writes back as a valid header."""
    parent = parse_traceparent(value)
    if parent is not None:
        assert parse_traceparent(parent.header()) == parent


def test_tracestate_is_kept_joined_and_checked() -> None:
    """Lines are joined, blanks dropped; a member that does not parse drops the whole header."""
    assert parse_tracestate([b"rojo=00f067aa0ba902b7", b" congo=t61rcWkgMzE,,"]) == (
        "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    )
    assert parse_tracestate([b"tenant@vendor=x"]) == "tenant@vendor=x"
    assert parse_tracestate([b"Upper=1"]) == ""
    assert parse_tracestate([b"a=1,a=2"]) == ""  # a key twice
    assert parse_tracestate([b"novalue"]) == ""
    assert parse_tracestate([b"a=b,c"]) == ""
    assert parse_tracestate(None) == ""
    assert parse_tracestate([",".join(f"k{i}=v" for i in range(33)).encode()]) == ""  # over 32 members


def test_tracestate_is_bounded_long_members_first() -> None:
    """Over 512 characters: members over 128 characters go first, then members from the right."""
    long_member = "big=" + "x" * 200
    small = [f"k{i}=" + "v" * 30 for i in range(20)]  # 20 x 34 characters, with commas 699
    state = parse_tracestate([",".join([long_member, *small]).encode()])
    assert "big=" not in state
    assert len(state) <= MAX_TRACESTATE_CHARS
    assert state.startswith("k0=") and "k19=" not in state


def test_ids_are_random_hex_and_never_zero() -> None:
    """Trace ids are 32 hex digits, span ids 16; a block of zero bytes is skipped, not used."""
    blocks = [b"\x00" * 24, bytes(range(1, 25))]
    ids = IdSource(lambda n: blocks.pop(0) if blocks else os.urandom(n), block_bytes=24)
    trace_id = ids.trace_id()
    span_id = ids.span_id()
    assert trace_id == bytes(range(1, 17)).hex() and span_id == bytes(range(17, 25)).hex()
    many = {IdSource().trace_id() for _ in range(100)}
    assert len(many) == 100 and all(len(t) == 32 and int(t, 16) for t in many)


def test_ids_read_urandom_a_block_at_a_time() -> None:
    """Hundreds of ids cost one system call."""
    calls = []

    def counting(n: int) -> bytes:
        calls.append(n)
        return os.urandom(n)

    ids = IdSource(counting, block_bytes=4096)
    for _ in range(100):
        ids.trace_id()
        ids.span_id()
        ids.span_id()
    assert calls == [4096]


def test_sampling_by_ratio_follows_the_trace_id() -> None:
    """The low 64 bits of the trace id decide, as OpenTelemetry's TraceIdRatioBased does."""
    low = "f" * 16 + "0" * 15 + "1"
    high = "0" * 16 + "f" * 16
    assert sampled_by_ratio(low, 0.5) and not sampled_by_ratio(high, 0.5)
    assert sampled_by_ratio(high, 1.0) and not sampled_by_ratio(low, 0.0)
    assert format_traceparent(TRACE, SPAN, False) == f"00-{TRACE}-{SPAN}-00"
