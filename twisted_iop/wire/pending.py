"""Requests waiting for their answers, shared by every wire.

The framed TCP peer (Envelope) and the WebSocket client (ClientEnvelope)
both number their requests, match answers by ``request_id``, give each
request a deadline and fail everything at once when the connection drops;
:class:`PendingRequests` is that bookkeeping, with the errors left to the
caller.

A request is answered either through a Deferred (:meth:`PendingRequests.add`)
or through a plain call (:meth:`PendingRequests.add_call`): the second
costs no Deferred and no callback chain, for requests sent to thousands of
peers per second (the fleet round's status asks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Optional, TypeVar, Union

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

T = TypeVar("T")

#: A plain answer: ``answered(arg, result, error)``, exactly one of
#: ``result`` and ``error`` set, called once per request.
AnswerCall = Callable[[Any, Optional[T], Optional[Exception]], None]


#: The table of every PendingRequests with nothing pending (never written to).
_NONE_PENDING: dict[Any, Any] = {}


class PendingRequests(Generic[T]):
    """Outstanding requests by request id (ids start at 1)."""

    __slots__ = ("_next_id", "_pending")

    def __init__(self) -> None:
        #: Request id -> (Deferred or plain call, the call's argument, deadline
        #: timer); while none waits, the one shared empty table (never
        #: changed: most connections are idle between requests, 20,000 of them).
        self._pending: dict[int, tuple[Union[Deferred[T], AnswerCall[T]], Any, Optional[IDelayedCall]]] = _NONE_PENDING
        self._next_id = 1

    def _table(self) -> dict[int, tuple[Union[Deferred[T], AnswerCall[T]], Any, Optional[IDelayedCall]]]:
        """The table to add to (a new one in place of the shared empty one)."""
        if self._pending is _NONE_PENDING:
            self._pending = {}
        return self._pending

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
        self._table()[request_id] = (d, None, timer)
        return request_id, d

    def add_call(
        self,
        clock: Optional[IReactorTime],
        timeout: float,
        timed_out: Callable[[], Exception],
        answered: AnswerCall[T],
        arg: Any,
    ) -> int:
        """A new request id whose end is the plain call ``answered(arg, result, error)``.

        Deadline as for :meth:`add`; without a ``clock`` the caller ends the
        request with :meth:`cancel` when it stops waiting.
        """
        request_id = self._next_id
        self._next_id += 1
        timer = None if clock is None else clock.callLater(timeout, self._expire, request_id, timed_out)
        self._table()[request_id] = (answered, arg, timer)
        return request_id

    def answer(self, request_id: int, result: T) -> None:
        """End the request with ``result``."""
        entry = self._forget(request_id)
        if entry is None:
            return
        target, arg = entry
        if isinstance(target, Deferred):
            target.callback(result)
        else:
            target(arg, result, None)

    def fail(self, request_id: int, error: Exception) -> None:
        """Fail the request with ``error``."""
        entry = self._forget(request_id)
        if entry is None:
            return
        target, arg = entry
        if isinstance(target, Deferred):
            target.errback(error)
        else:
            target(arg, None, error)

    def cancel(self, request_id: int) -> None:
        """Stop waiting for ``request_id``: it fails with CancelledError (if still pending)."""
        entry = self._pending.get(request_id)
        if entry is None:
            return
        if isinstance(entry[0], Deferred):
            entry[0].cancel()
        else:
            self.fail(request_id, CancelledError())

    def fail_all(self, error: Callable[[], Exception]) -> None:
        """Fail every outstanding request (the connection is gone)."""
        for request_id in list(self._pending):
            self.fail(request_id, error())

    def _cancelled(self, request_id: int) -> None:
        # The caller stopped waiting; the Deferred fails with CancelledError.
        self._forget(request_id)

    def _expire(self, request_id: int, timed_out: Callable[[], Exception]) -> None:
        entry = self._pending.pop(request_id, None)
        if entry is None:
            return
        if not self._pending:
            self._pending = _NONE_PENDING
        target, arg, _ = entry
        if isinstance(target, Deferred):
            target.errback(timed_out())
        else:
            target(arg, None, timed_out())

    def _forget(self, request_id: int) -> Optional[tuple[Union[Deferred[T], AnswerCall[T]], Any]]:
        pending = self._pending
        entry = pending.pop(request_id, None)
        if entry is None:
            return None
        if not pending:
            # An emptied dict keeps its table: back to the shared empty one.
            self._pending = _NONE_PENDING
        target, arg, timer = entry
        if timer is not None and timer.active():
            timer.cancel()
        return target, arg
