"""Requests waiting for their answers, shared by every wire.

The framed TCP peer (Envelope) and the WebSocket client (ClientEnvelope)
both number their requests, match answers by ``request_id``, give each
request a deadline and fail everything at once when the connection drops;
:class:`PendingRequests` is that bookkeeping, with the errors left to the
caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Optional, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

T = TypeVar("T")


class PendingRequests(Generic[T]):
    """Deferreds of outstanding requests by request id (ids start at 1)."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[Deferred[T], Optional[IDelayedCall]]] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._pending

    def issued(self, request_id: int) -> bool:
        """Whether ``request_id`` was ever handed out (answered or not)."""
        return 0 < request_id < self._next_id

    def add(
        self, clock: Optional[IReactorTime], timeout: float, timed_out: Callable[[], Exception]
    ) -> tuple[int, Deferred[T]]:
        """A new request id and the Deferred its answer fires.

        With a ``clock``, the request fails with ``timed_out()`` after
        ``timeout`` seconds; without one the caller owns the deadline and
        cancels the Deferred when it stops waiting.
        """
        request_id = self._next_id
        self._next_id += 1
        d: Deferred[T] = Deferred(lambda _: self._cancelled(request_id))
        timer = None if clock is None else clock.callLater(timeout, self._expire, request_id, timed_out)
        self._pending[request_id] = (d, timer)
        return request_id, d

    def answer(self, request_id: int, result: T) -> None:
        """Fire the request's Deferred with ``result``."""
        d = self._forget(request_id)
        if d is not None:
            d.callback(result)

    def fail(self, request_id: int, error: Exception) -> None:
        """Fail the request with ``error``."""
        d = self._forget(request_id)
        if d is not None:
            d.errback(error)

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Fail every outstanding request (the connection is gone)."""
        for request_id in list(self._pending):
            self.fail(request_id, error())

    def _cancelled(self, request_id: int) -> None:
        # The caller stopped waiting; the Deferred fails with CancelledError.
        self._forget(request_id)

    def _expire(self, request_id: int, timed_out: Callable[[], Exception]) -> None:
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            entry[0].errback(timed_out())

    def _forget(self, request_id: int) -> Optional[Deferred[T]]:
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return None
        d, timer = entry
        if timer is not None and timer.active():
            timer.cancel()
        return d
