"""An engine's output as lines: split and bounded, rate-limited for the log, its tail kept.

Three pure pieces (no I/O, the clock passed in), used by the engine's
process protocol (:mod:`twisted_iop.node.launch.process`):

* :class:`LineSplitter` turns the bytes of one stream (stdout or stderr)
  into lines: ``\\n``, ``\\r\\n`` and a lone ``\\r`` (progress bars) end a
  line; a line longer than ``max_line_bytes`` is cut there, and the rest
  of it up to its end is dropped and counted, so an engine that never
  writes a newline cannot grow the Node's memory.
* :class:`LineRateLimit` is a token bucket: at most ``lines_per_second``
  lines a second (a burst of one second's worth) reach the Node's log; the
  rest are counted, and the protocol writes one "N lines suppressed" line
  for them, so a chatty engine cannot flood the disk.
* :class:`LogTail` keeps the last lines of both streams (every line, also
  those the rate limit kept out of the log) within ``max_bytes``; it is
  what ``provider.logs`` returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import attrs

#: What ends a line that was cut at ``max_line_bytes``.
CUT_MARK = " [line cut]"
NEWLINE = ord("\n")
CARRIAGE_RETURN = ord("\r")


@attrs.frozen
class Line:
    """One line of an engine's output."""

    stream: str
    text: str
    #: Bytes of it that were dropped (it was longer than the bound).
    dropped: int = 0


class LineSplitter:
    """Bytes of one stream to lines, each at most ``max_line_bytes`` bytes."""

    def __init__(self, stream: str, max_line_bytes: int) -> None:
        self.stream = stream
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        #: Bytes dropped from the line being read (it is past the bound).
        self._dropping = 0
        #: Bytes dropped in all (the parts of lines past the bound).
        self.dropped_bytes = 0
        self._after_carriage_return = False

    def feed(self, data: bytes) -> Iterator[Line]:
        """The lines ``data`` completes (a partial last line waits for more)."""
        start = 0
        size = len(data)
        if self._after_carriage_return and data[:1] == b"\n":
            start = 1  # the \n of a \r\n split between two reads
        self._after_carriage_return = False
        while start < size:
            end = _line_end(data, start)
            if end < 0:
                self._take(data[start:])
                return
            self._take(data[start:end])
            yield self._line()
            start = end + 1
            if data[end] == CARRIAGE_RETURN:
                if start == size:
                    self._after_carriage_return = True
                elif data[start] == NEWLINE:
                    start += 1

    def flush(self) -> Iterator[Line]:
        """The partial last line, if any (the stream ended)."""
        if self._buffer or self._dropping:
            yield self._line()

    def _take(self, part: bytes) -> None:
        room = self.max_line_bytes - len(self._buffer)
        if len(part) <= room:
            self._buffer += part
            return
        if room > 0:
            self._buffer += part[:room]
        self._dropping += len(part) - max(room, 0)

    def _line(self) -> Line:
        text = self._buffer.decode("utf-8", errors="replace")
        dropped = self._dropping
        if dropped:
            text += CUT_MARK
            self.dropped_bytes += dropped
        self._buffer = bytearray()
        self._dropping = 0
        return Line(self.stream, text, dropped)


def _line_end(data: bytes, start: int) -> int:
    """The index of the first ``\\n`` or ``\\r`` at or after ``start``, or -1."""
    newline = data.find(b"\n", start)
    carriage = data.find(b"\r", start, newline if newline >= 0 else len(data))
    return carriage if carriage >= 0 else newline


class LineRateLimit:
    """A token bucket of log lines: ``lines_per_second``, bursts of one second's worth."""

    def __init__(self, lines_per_second: int, now: float) -> None:
        self.lines_per_second = lines_per_second
        self._tokens = float(lines_per_second)
        self._at = now
        #: Lines kept out since the last :meth:`take_suppressed`.
        self.suppressed = 0
        #: Lines kept out in all.
        self.suppressed_total = 0

    def admit(self, now: float) -> bool:
        """Whether one more line may be logged now (if not, it is counted)."""
        elapsed = max(0.0, now - self._at)
        self._at = now
        self._tokens = min(float(self.lines_per_second), self._tokens + elapsed * self.lines_per_second)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        self.suppressed_total += 1
        return False

    def take_suppressed(self) -> int:
        """Lines kept out since the last call (and start counting again)."""
        count, self.suppressed = self.suppressed, 0
        return count


class LogTail:
    """The last lines of an engine's output, at most ``max_bytes`` bytes of text in all.

    A line's size is its UTF-8 length plus one (its newline); the oldest
    lines leave first. A single line larger than the bound is not kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lines: deque[tuple[Line, int]] = deque()
        self.bytes = 0
        #: Lines that entered in all.
        self.lines_total = 0

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line: Line) -> None:
        """Keep ``line`` (the oldest lines leave to make room)."""
        self.lines_total += 1
        size = len(line.text.encode("utf-8", errors="replace")) + 1
        if size > self.max_bytes:
            return
        self._lines.append((line, size))
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, gone = self._lines.popleft()
            self.bytes -= gone

    def last(self, max_bytes: int) -> list[Line]:
        """The newest lines that fit in ``max_bytes`` (text and newlines), oldest first."""
        chosen: list[Line] = []
        used = 0
        for line, size in reversed(self._lines):
            if used + size > max_bytes:
                break
            chosen.append(line)
            used += size
        chosen.reverse()
        return chosen

    def text(self, max_bytes: int) -> str:
        """:meth:`last` as text, one line each."""
        return "".join(line.text + "\n" for line in self.last(max_bytes))
