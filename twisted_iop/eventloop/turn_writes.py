"""Writes to a TCP socket at once, and one write per connection per reactor turn.

Twisted's TCP transport never sends from ``write``: it queues the bytes,
asks epoll to report the socket writable (an ``epoll_ctl``), sends when the
next poll says so, and asks epoll to stop (another ``epoll_ctl``). For a
streamed token that is two system calls and a trip through the reactor
around the one ``send`` that matters, on each hop, per token.

* :func:`write_now` sends straight from the caller when nothing is queued
  before the bytes (the usual case: the peer reads as fast as we write),
  as asyncio's transports do; only what the socket does not take is
  queued in the transport, as before, with its producer pausing at the
  transport's own bound. Any other transport (TLS, a test's
  ``StringTransport``, a connection closing) gets a plain ``write``.
* :class:`TurnBuffer` gathers one connection's writes of a reactor turn
  and gives them to :func:`write_now` as one ``send`` when the turn's I/O
  has been handled (``callLater(0)``), or at once past its bound in bytes.
  It engages only on a transport :func:`write_now` can write to; on any
  other its writes go straight to ``write``, so tests on in-memory
  transports see their bytes as before.

What it saves, measured with ``bench/stream_gateway.py`` (256 paced streams
through Edge + Node) and py-spy: see docs/performance.md, "Streamed tokens
against nginx".
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet import tcp
from twisted.internet.interfaces import IDelayedCall, IReactorTime

#: Bytes a :class:`TurnBuffer` holds before it writes without waiting for the turn's end.
MAX_TURN_BYTES = 256 * 1024


def can_write_now(transport: Any) -> bool:
    """Whether ``transport`` is a plain TCP connection with nothing queued and not closing."""
    return bool(
        isinstance(transport, tcp.Connection)
        and transport.connected
        and not transport.disconnecting
        and not transport.TLS
        and not transport._writeDisconnecting
        and not transport._tempDataLen
        and transport.offset == len(transport.dataBuffer)
    )


def write_now(transport: Any, data: bytes) -> None:
    """Write ``data``: straight to the socket when nothing is queued before it,
    else (and whatever the socket does not take) through ``transport.write``."""
    if data and can_write_now(transport):
        sent = transport.writeSomeData(data)
        if isinstance(sent, int):
            if sent >= len(data):
                return
            data = data[sent:]
        # A failed send (an exception returned): the transport's own write
        # queues it, and its next attempt reports the loss as it always does.
    transport.write(data)


class TurnBuffer:
    """One connection's writes of a reactor turn, sent together at the turn's end.

    Order is kept: everything written goes out in the order written, and
    :meth:`flush` sends what is held at once (call it before closing the
    connection). Bounded by ``max_bytes``: a write that reaches it sends
    at once.
    """

    __slots__ = ("_call", "_clock", "_parts", "_size", "_transport", "delay_seconds", "max_bytes")

    def __init__(
        self, transport: Any, clock: IReactorTime, max_bytes: int = MAX_TURN_BYTES, delay_seconds: float = 0.0
    ) -> None:
        self._transport = transport
        self._clock = clock
        self._parts: list[bytes] = []
        self._size = 0
        self._call: Optional[IDelayedCall] = None
        self.max_bytes = max_bytes
        #: How long the first write of a batch may wait for others (0: to the turn's end).
        self.delay_seconds = delay_seconds

    @property
    def held(self) -> int:
        """Bytes written and not yet sent."""
        return self._size

    def write(self, data: bytes) -> None:
        """Send ``data`` with the rest of this turn's writes."""
        if not self._parts and not isinstance(self._transport, tcp.Connection):
            self._transport.write(data)  # nothing to save: written as it comes
            return
        self._parts.append(data)
        self._size += len(data)
        if self._size >= self.max_bytes:
            self.flush()
        elif self._call is None:
            self._call = self._clock.callLater(self.delay_seconds, self._turn_ended)

    def _turn_ended(self) -> None:
        self._call = None
        self.flush()

    def flush(self) -> None:
        """Send what is held now, as one write."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        if not self._parts:
            return
        parts, self._parts, self._size = self._parts, [], 0
        write_now(self._transport, parts[0] if len(parts) == 1 else b"".join(parts))

    def discard(self) -> None:
        """Drop what is held (the connection is gone)."""
        call, self._call = self._call, None
        if call is not None and call.active():
            call.cancel()
        self._parts, self._size = [], 0
