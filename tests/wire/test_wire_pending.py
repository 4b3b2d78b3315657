"""PendingRequests: answers, errors, deadlines, cancellation, fail-all."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from twisted_iop.wire.pending import PendingRequests


def outcomes(d: Any) -> list[Any]:
    """Whatever the Deferred fired with (errors kept as Failures)."""
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def test_answer_error_timeout_and_fail_all() -> None:
    """Each request ends exactly once, in the way that came first; timers never outlive it."""
    clock = Clock()
    pending: PendingRequests[str] = PendingRequests()
    ids_and_results = [pending.add(clock, 5, lambda: TimeoutError("late")) for _ in range(4)]
    (a, da), (b, db), (c, dc), (d_, dd) = ids_and_results
    assert [a, b, c, d_] == [1, 2, 3, 4] and len(pending) == 4
    ra, rb, rc, rd = (outcomes(x) for x in (da, db, dc, dd))
    pending.answer(a, "ok")
    pending.fail(b, ValueError("refused"))
    pending.answer(a, "again")  # a late duplicate answer changes nothing
    clock.advance(5)
    assert ra == ["ok"] and isinstance(rb[0], Failure) and rb[0].check(ValueError)
    assert rc[0].check(TimeoutError) and rd[0].check(TimeoutError)
    assert len(pending) == 0 and clock.getDelayedCalls() == []
    _, de = pending.add(None, 0, lambda: TimeoutError())
    re_ = outcomes(de)
    pending.fail_all(lambda: ConnectionError("gone"))
    assert isinstance(re_[0], Failure) and re_[0].check(ConnectionError)


def test_cancel_forgets_the_request_and_its_timer() -> None:
    """Cancelling a request removes it and its deadline; a later answer is ignored."""
    clock = Clock()
    pending: PendingRequests[str] = PendingRequests()
    request_id, d = pending.add(clock, 5, lambda: TimeoutError())
    result = outcomes(d)
    d.cancel()
    assert isinstance(result[0], Failure) and result[0].check(CancelledError)
    assert request_id not in pending and clock.getDelayedCalls() == []
    pending.answer(request_id, "late")
    assert len(result) == 1


class Ends:
    """A completion that keeps how each of its requests ended."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, object]] = []

    def answered(self, result: str) -> None:
        """Keep the answer."""
        self.ends.append(("answered", result))

    def failed(self, error: Exception) -> None:
        """Keep the error's type."""
        self.ends.append(("failed", type(error)))


def test_a_completion_ends_once_in_the_way_that_came_first() -> None:
    """Requests ended through a completion: answer, error, deadline, cancel and
    fail-all each end theirs once; later answers and timers change nothing."""
    clock = Clock()
    pending: PendingRequests[str] = PendingRequests()
    ends = Ends()
    answered, refused, late, cancelled, dropped = (
        pending.add_completion(ends, clock if timed else None, 5, lambda: TimeoutError("late"))
        for timed in (True, False, True, False, False)
    )
    assert [answered, refused, late, cancelled, dropped] == [1, 2, 3, 4, 5] and len(pending) == 5
    pending.answer(answered, "ok")
    pending.fail(refused, ValueError("refused"))
    clock.advance(5)
    pending.cancel(cancelled)
    pending.cancel(cancelled)
    pending.fail_all(lambda: ConnectionError("gone"))
    pending.answer(answered, "again")
    pending.answer(late, "too late")
    assert ends.ends == [
        ("answered", "ok"),
        ("failed", ValueError),
        ("failed", TimeoutError),
        ("failed", CancelledError),
        ("failed", ConnectionError),
    ]
    assert len(pending) == 0 and clock.getDelayedCalls() == []
    assert pending.issued(late) and not pending.issued(6)


def test_cancel_fails_a_deferred_request_with_cancelled_error() -> None:
    """PendingRequests.cancel ends a Deferred request like a completion's: CancelledError, timer gone."""
    clock = Clock()
    pending: PendingRequests[str] = PendingRequests()
    request_id, d = pending.add(clock, 5, lambda: TimeoutError())
    result = outcomes(d)
    pending.cancel(request_id)
    assert isinstance(result[0], Failure) and result[0].check(CancelledError)
    assert request_id not in pending and clock.getDelayedCalls() == []
