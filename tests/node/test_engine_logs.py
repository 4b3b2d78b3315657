"""An engine's output as lines: splitting, the rate limit and the kept tail (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.node.launch.logs import CUT_MARK, Line, LineRateLimit, LineSplitter, LogTail


def lines_of(splitter: LineSplitter, *chunks: bytes) -> list[str]:
    """The texts of the lines ``chunks`` complete, then of the partial rest."""
    out = [line.text for chunk in chunks for line in splitter.feed(chunk)]
    return out + [line.text for line in splitter.flush()]


def test_newlines_carriage_returns_and_a_partial_last_line() -> None:
    """\\n, \\r\\n (also split between reads) and a lone \\r end lines; a partial line waits."""
    splitter = LineSplitter("stdout", 100)
    assert lines_of(splitter, b"one\ntwo\r", b"\nthree\rfour", b" five") == ["one", "two", "three", "four five"]


def test_a_long_line_is_cut_and_the_rest_counted() -> None:
    """A line past max_line_bytes keeps its first bytes, is marked, and its rest is dropped and counted."""
    splitter = LineSplitter("stderr", 256)
    lines = list(splitter.feed(b"x" * 300 + b"y" * 700)) + list(splitter.feed(b"\nnext\n"))
    assert [line.text for line in lines] == ["x" * 256 + CUT_MARK, "next"]
    assert lines[0].dropped == 744 and splitter.dropped_bytes == 744


def test_invalid_utf8_is_replaced() -> None:
    """Bytes that are not UTF-8 become replacement characters, never an error."""
    assert lines_of(LineSplitter("stdout", 100), b"ok \xff\xfe\n") == ["ok \ufffd\ufffd"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=600), max_size=12), st.integers(256, 512))
def test_no_line_exceeds_the_bound_however_the_bytes_arrive(chunks: list[bytes], bound: int) -> None:
    """Whatever the reads, every line is at most the bound (plus the cut mark), and the bytes
    that are not newlines are either in a line or counted as dropped."""
    splitter = LineSplitter("stdout", bound)
    lines = [line for chunk in chunks for line in splitter.feed(chunk)] + list(splitter.flush())
    kept = 0
    for line in lines:
        raw = line.text.removesuffix(CUT_MARK) if line.dropped else line.text
        assert len(raw.encode("utf-8", errors="replace")) <= bound * 3  # a replaced byte may be 3 bytes
        kept += line.dropped
    data = b"".join(chunks)
    assert splitter.dropped_bytes == kept
    assert kept <= len(data)


def test_rate_limit_admits_a_burst_then_the_rate() -> None:
    """100 lines/s: a burst of 100 passes, then 100 a second; the rest are counted."""
    limit = LineRateLimit(100, now=0.0)
    assert sum(limit.admit(0.0) for _ in range(150)) == 100
    assert limit.suppressed == 50
    assert limit.take_suppressed() == 50 and limit.suppressed == 0
    # After a quiet second the bucket is full again: 100 at once, then 100 over the next second.
    admitted = sum(limit.admit(1.0 + i / 1000) for i in range(1000))
    assert 198 <= admitted <= 200
    assert limit.suppressed_total == 50 + 1000 - admitted


def test_tail_keeps_the_newest_lines_within_its_bytes() -> None:
    """The tail drops the oldest lines past its bound; last() returns the newest that fit, in order."""
    tail = LogTail(max_bytes=30)
    for i in range(10):
        tail.add(Line("stdout", f"line {i}"))  # 7 bytes each with its newline
    assert tail.bytes <= 30 and len(tail) == 4
    assert [line.text for line in tail.last(30)] == ["line 6", "line 7", "line 8", "line 9"]
    assert tail.text(15) == "line 8\nline 9\n"
    assert tail.lines_total == 10
    tail.add(Line("stdout", "z" * 100))  # larger than the whole bound: not kept
    assert tail.text(30).endswith("line 9\n")
