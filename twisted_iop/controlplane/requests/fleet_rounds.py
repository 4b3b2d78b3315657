"""Fleet rounds: a status row for every known edge, one round at a time.

* **One round at a time.** A caller arriving while a round runs joins it;
  a caller within ``max_age_seconds`` of the last round's start gets that
  round's rows.
* **Sliced fan-out.** A new round asks every connected edge through the
  status asks (``status_asks.py``, so a view of one edge in flight is
  shared), :data:`FANOUT_SLICE` per reactor turn, so answers are read while
  later slices are still being sent.
* **One deadline per round**, not one timer per edge: at the deadline the
  silent edges' asks are cancelled and their rows say ``timeout``; one slow
  or failing edge marks only its own row.
* **Filtered rounds ask only the matching edges.** A view with a filter
  (:class:`~twisted_iop.controlplane.fleet.edge_filters.EdgeFilter`) gets a round
  over the edges whose labels, id and connection match, shared by callers
  of an equal filter as the full round is, and reused within the same max
  age (at most :data:`FILTERED_ROUNDS_KEPT` filters kept). While a full
  round is young enough, a filtered view is cut from it and asks nobody.
  The rows' own states (ok, error, timeout) are matched after the round.

:class:`FleetRounds` is one room of the
:class:`~twisted_iop.controlplane.requests.gateway.EdgeGateway`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Optional

import attrs
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from twisted_iop.controlplane.fleet.edge_filters import EdgeFilter
from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected, EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests.errors import EdgeDisconnected, EdgeTimeout, ShuttingDown
from twisted_iop.controlplane.requests.status_asks import StatusAsks
from twisted_iop.metrics import LatencyHistogram

#: Status requests a fleet fan-out issues per reactor turn.
FANOUT_SLICE = 500
#: Filtered rounds (running or finished) kept for reuse, one per distinct filter.
FILTERED_ROUNDS_KEPT = 32
#: The filter of the full round: every known edge.
NO_FILTER = EdgeFilter()


@attrs.frozen
class StatusRow:
    """One edge's line in a fleet round: a fresh snapshot or why not."""

    record: EdgeRecord
    state: str  # ok, timeout, error, disconnected
    snapshot: Optional[StatusSnapshot]
    #: Whether the edge had a connection during the round.
    connected: bool
    error_code: str = ""
    error_message: str = ""


@attrs.define(eq=False)
class FleetRound:
    """A finished fleet round: one row per known edge, sorted by edge id."""

    round_at: float
    finished_at: float
    rows: list[StatusRow]
    edge_ids: list[str]


@attrs.define(eq=False)
class _Round:
    """A fleet round in progress."""

    round_at: float
    records: list[EdgeRecord]
    done: Callable[[_Round], None]
    rows: list[Optional[StatusRow]] = attrs.field(init=False)
    waiters: list[Deferred[FleetRound]] = attrs.field(factory=list)
    pending: list[int] = attrs.field(factory=list)
    remaining: int = 0
    issued: int = 0
    finished: bool = False
    deadline: Optional[IDelayedCall] = None

    def __attrs_post_init__(self) -> None:
        self.rows = [None] * len(self.records)

    def row_answered(self, index: int, snapshot: Optional[StatusSnapshot], error: Optional[Exception]) -> None:
        """The status waiter of one edge's row (a plain call, no Deferred)."""
        if self.rows[index] is not None:
            return
        record = self.records[index]
        if error is None:
            self.rows[index] = StatusRow(record, "ok", snapshot, True)
        elif isinstance(error, (EdgeDisconnected, EdgeNotConnected)):
            self.rows[index] = StatusRow(record, "disconnected", record.snapshot, record.connected)
        elif isinstance(error, EdgeTimeout):
            self.rows[index] = StatusRow(record, "timeout", record.snapshot, True, "edge_timeout", str(error))
        else:
            self.rows[index] = StatusRow(record, "error", record.snapshot, True, "edge_error", str(error))
        self.remaining -= 1
        if self.remaining == 0 and not self.finished:
            self.finished = True
            self.done(self)

    def stop_deadline(self) -> None:
        """Cancel the round's deadline, if it is still set."""
        if self.deadline is not None and self.deadline.active():
            self.deadline.cancel()
        self.deadline = None


class FleetRounds:
    """The fleet round in progress, and the last one finished."""

    def __init__(self, registry: EdgeRegistry, clock: IReactorTime, asks: StatusAsks, max_age_seconds: float) -> None:
        self._registry = registry
        self._clock = clock
        self._asks = asks
        self.max_age_seconds = max_age_seconds
        self._round: Optional[_Round] = None
        self._last_round: Optional[FleetRound] = None
        #: Filtered rounds in progress, by filter key.
        self._filtered_rounds: dict[str, _Round] = {}
        #: The last finished round of each filter, by key (oldest first).
        self._filtered_last: OrderedDict[str, FleetRound] = OrderedDict()
        #: For /metrics: one observation per round (never per edge).
        self.seconds = LatencyHistogram()

    @property
    def running(self) -> bool:
        """Whether a round (full or filtered) is in progress."""
        return self._round is not None or bool(self._filtered_rounds)

    @property
    def last_round(self) -> Optional[FleetRound]:
        """The newest finished fleet round, if any."""
        return self._last_round

    def fleet_status(self, filter_: EdgeFilter = NO_FILTER) -> Deferred[FleetRound]:
        """A fleet round: the one running, the last one if it is young
        enough, or a new one over every known edge; with a filter, the same
        over the matching edges only."""
        if not filter_.empty:
            return self._filtered_status(filter_)
        if self._round is not None:
            d: Deferred[FleetRound] = Deferred()
            self._round.waiters.append(d)
            return d
        now = self._clock.seconds()
        last = self._last_round
        if last is not None and now - last.round_at < self.max_age_seconds:
            return succeed(last)
        records_ = sorted(self._registry.edges(), key=lambda r: r.edge_id)
        return self._start(_Round(now, records_, self._round_done), self._full_started)

    def _full_started(self, round_: _Round) -> None:
        self._round = round_

    def _start(self, round_: _Round, started: Callable[[_Round], None]) -> Deferred[FleetRound]:
        """Write the disconnected edges' rows and ask the others; ``started``
        records the round as running first (answers may come at once)."""
        for index, record in enumerate(round_.records):
            if record.token is None:
                round_.rows[index] = StatusRow(record, "disconnected", record.snapshot, False)
            else:
                round_.pending.append(index)
        d: Deferred[FleetRound] = Deferred()
        round_.waiters.append(d)
        if not round_.pending:
            round_.done(round_)
            return d
        started(round_)
        round_.remaining = len(round_.pending)
        round_.deadline = self._clock.callLater(self._asks.timeout_seconds, self._round_deadline, round_)
        self._issue_slice(round_, 0)
        return d

    def _filtered_status(self, filter_: EdgeFilter) -> Deferred[FleetRound]:
        key = filter_.key
        running = self._filtered_rounds.get(key)
        if running is not None:
            d: Deferred[FleetRound] = Deferred()
            running.waiters.append(d)
            return d
        now = self._clock.seconds()
        last = self._filtered_last.get(key)
        if last is not None and now - last.round_at < self.max_age_seconds:
            return succeed(last)
        full = self._last_round
        if full is not None and now - full.round_at < self.max_age_seconds:
            # A young full round holds every row this view needs.
            cut = filter_.rows(full.rows)
            return succeed(self._keep_filtered(key, FleetRound(full.round_at, full.finished_at, cut, _ids(cut))))
        round_ = _Round(now, filter_.records(self._registry.edges()), partial(self._filtered_done, key, filter_))
        return self._start(round_, partial(self._filtered_rounds.__setitem__, key))

    def _filtered_done(self, key: str, filter_: EdgeFilter, round_: _Round) -> None:
        round_.finished = True
        round_.stop_deadline()
        if self._filtered_rounds.get(key) is round_:
            del self._filtered_rounds[key]
        rows = filter_.rows(row for row in round_.rows if row is not None)
        finished = self._keep_filtered(key, FleetRound(round_.round_at, self._clock.seconds(), rows, _ids(rows)))
        for d in round_.waiters:
            d.callback(finished)

    def _keep_filtered(self, key: str, round_: FleetRound) -> FleetRound:
        kept = self._filtered_last
        kept.pop(key, None)
        kept[key] = round_
        while len(kept) > FILTERED_ROUNDS_KEPT:
            kept.popitem(last=False)
        return round_

    def _issue_slice(self, round_: _Round, start: int) -> None:
        indices = round_.pending[start : start + FANOUT_SLICE]
        row_answered = round_.row_answered
        join = self._asks.join
        for index in indices:
            if round_.finished:
                return
            record = round_.records[index]
            if record.token is None or record.peer is None:
                row_answered(index, None, EdgeNotConnected(record.edge_id))
            else:
                join(record, False, (row_answered, index))
        if start + FANOUT_SLICE < len(round_.pending) and not round_.finished:
            round_.issued = start + FANOUT_SLICE
            self._clock.callLater(0, self._issue_slice, round_, start + FANOUT_SLICE)
        else:
            round_.issued = len(round_.pending)

    def _round_deadline(self, round_: _Round) -> None:
        round_.deadline = None
        timeout = self._asks.timeout_seconds
        for index in round_.pending[: round_.issued]:
            if round_.finished:
                return
            if round_.rows[index] is None:
                self._asks.cancel(round_.records[index].edge_id)
                if round_.rows[index] is None:
                    # No ask carried this row (it cannot happen, but a row
                    # must never hold the round open).
                    round_.row_answered(index, None, EdgeTimeout(round_.records[index].edge_id, timeout))
        # Slices not yet issued when the deadline hit (a reactor starved
        # for the whole timeout) are timeouts too.
        for index in round_.pending[round_.issued :]:
            if round_.finished:
                return
            round_.row_answered(index, None, EdgeTimeout(round_.records[index].edge_id, timeout))

    def _round_done(self, round_: _Round) -> None:
        round_.finished = True
        round_.stop_deadline()
        if self._round is round_:
            self._round = None
        rows = [row for row in round_.rows if row is not None]
        finished = FleetRound(round_.round_at, self._clock.seconds(), rows, [row.record.edge_id for row in rows])
        self.seconds.observe(finished.finished_at - finished.round_at)  # metrics: once per round
        self._last_round = finished
        for d in round_.waiters:
            d.callback(finished)

    def shut_down(self) -> None:
        """The rounds in progress end now: their callers hear ShuttingDown."""
        round_, self._round = self._round, None
        rounds = list(self._filtered_rounds.values())
        self._filtered_rounds.clear()
        if round_ is not None:
            rounds.append(round_)
        for each in rounds:
            each.finished = True
            each.stop_deadline()
            for d in each.waiters:
                d.errback(ShuttingDown())


def _ids(rows: list[StatusRow]) -> list[str]:
    return [row.record.edge_id for row in rows]
