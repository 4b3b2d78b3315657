"""Status asks: at most one ``EdgeStatusRequest`` in flight per edge, bound
to the connection (token) it was sent on, joined by everyone who wants
that edge's status.

* **Coalesced.** A single view, a fleet round's row and a routed ask
  (cluster mode) of one edge share one request; each waiter is a plain
  ``fn(arg, snapshot, error)`` call, no Deferred per edge and round.
* **Bound to a token.** When a newer connection supersedes the one an ask
  went out on, the ask moves to the new connection at once (its waiters do
  not wait for the old socket to close); a view issued after the takeover
  never joins the old connection's ask.
* **Checked before it is kept.** An answer over its bounds, or whose totals
  are wrong (checked against each other on every answer, recounted from
  the providers on one in :data:`RECOUNT_SHARE`), is refused and counted;
  the registry keeps what passes, if the token is still current.

:class:`StatusAsks` is one room of the
:class:`~twisted_iop.controlplane.requests.gateway.EdgeGateway`; the fleet rounds
(``fleet_rounds.py``) ask through it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Optional

import attrs
from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected, EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import SnapshotRefused, StatusSnapshot, checked_snapshot
from twisted_iop.controlplane.requests.errors import (
    EdgeDisconnected,
    EdgeErrorAnswer,
    EdgeTimeout,
    ShuttingDown,
    translated,
)
from twisted_iop.controlplane.wires.edge_peer import EdgePeer
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.wire import control_pb2 as pb

#: The share of status answers carrying totals that are also recounted
#: from their providers: the totals are the Edge's own figures, checked
#: against each other on every answer; a recount that differs refuses
#: the answer, so an Edge whose totals are wrong is found within a few
#: dozen answers while an honest one costs a sixteenth of a count.
RECOUNT_SHARE = 1 / 16

#: A status waiter: ``fn(arg, snapshot, error)`` with exactly one of the two set.
StatusWaiter = tuple[Callable[[Any, Optional[StatusSnapshot], Optional[Exception]], None], Any]
#: What a group ask calls once per edge: ``answered(index, snapshot, error)``.
GroupAnswered = Callable[[int, Optional[StatusSnapshot], Optional[Exception]], None]


@attrs.define(eq=False)
class _StatusAsk:
    """One ``EdgeStatusRequest`` in flight on one connection of one edge.

    It is the request's listener: the wire ends it with a plain call
    (:meth:`status_answered`), no Deferred per edge and round.
    """

    asks: StatusAsks
    edge_id: str
    token: int
    own_deadline: bool
    waiters: list[StatusWaiter]
    peer: Optional[EdgePeer] = None
    #: The request id on ``peer`` (0: not sent, or ended at once).
    request_id: int = 0
    #: Set when the ask was moved to a newer connection or settled otherwise.
    settled: bool = False

    def status_answered(self, response: Optional[pb.EdgeStatusResponse], error: Optional[Exception]) -> None:
        """The wire's answer to this ask (a snapshot, or why not)."""
        if error is None:
            assert response is not None
            self.asks._status_answered(response, self)
        else:
            self.asks._status_failed(error, self)

    def snapshot_answered(self, snapshot: StatusSnapshot) -> None:
        """An answer already checked and counted (a routed one: its owner did both)."""
        self.asks._snapshot_answered(snapshot, self)

    def cancel(self) -> None:
        """Stop waiting for the answer (it ends with CancelledError if still pending)."""
        if self.peer is not None and self.request_id:
            self.peer.cancel_status(self.request_id)


def _settle_deferred(
    d: Deferred[StatusSnapshot], snapshot: Optional[StatusSnapshot], error: Optional[Exception]
) -> None:
    if error is not None:
        d.errback(error)
    elif snapshot is not None:
        d.callback(snapshot)
    else:
        d.errback(RuntimeError("a status ask ended with neither a snapshot nor an error"))


class StatusAsks:
    """The status asks in flight, one per edge, and what was refused."""

    _log = Logger()

    def __init__(
        self,
        registry: EdgeRegistry,
        clock: IReactorTime,
        timeout_seconds: float,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._registry = registry
        self._clock = clock
        #: Draws which answers carrying totals are recounted (:data:`RECOUNT_SHARE`).
        self._draw = draw
        self.timeout_seconds = timeout_seconds
        #: Edge id -> its status ask in flight.
        self._asks: dict[str, _StatusAsk] = {}
        #: For /metrics: one observation per single-edge status request
        #: (never per edge of a round), and answers refused by reason
        #: ("bounds" or "totals").
        self.seconds = LatencyHistogram()
        self.refused: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._asks)

    def tokens(self) -> set[int]:
        """The connections an ask is in flight on."""
        return {ask.token for ask in self._asks.values()}

    def waiting(self, edge_id: str) -> int:
        """How many callers wait on the edge's ask in flight (0: none)."""
        ask = self._asks.get(edge_id)
        return 0 if ask is None else len(ask.waiters)

    # -- asking -----------------------------------------------------------------

    def status(self, edge_id: str) -> Deferred[StatusSnapshot]:
        """A fresh snapshot of ``edge_id`` from its current connection (joining
        the ask in flight, if any), under this ask's own deadline."""
        try:
            record = self._registry.get(edge_id)
        except Exception:
            return fail()
        if record.token is None or record.peer is None:
            return fail(EdgeNotConnected(edge_id))
        d: Deferred[StatusSnapshot] = Deferred()
        self.join(record, True, (self._settle_timed, (d, self._clock.seconds())))
        return d

    def _settle_timed(
        self,
        waiting: tuple[Deferred[StatusSnapshot], float],
        snapshot: Optional[StatusSnapshot],
        error: Optional[Exception],
    ) -> None:
        d, started = waiting
        self.seconds.observe(self._clock.seconds() - started)  # metrics: once per request
        _settle_deferred(d, snapshot, error)

    def group(self, edge_ids: list[str], answered: GroupAnswered) -> None:
        """Ask several edges at once, under one deadline for them all.

        ``answered(index, snapshot, error)`` is called exactly once per
        edge id (by its index). No Deferred and no timer per edge, and
        the single-status latency histogram is left alone.
        """
        pending: dict[int, str] = {}

        def one_answered(index: int, snapshot: Optional[StatusSnapshot], error: Optional[Exception]) -> None:
            if pending.pop(index, None) is None:
                return
            answered(index, snapshot, error)
            if not pending and timer.active():
                timer.cancel()

        def deadline() -> None:
            for index, edge_id in list(pending.items()):
                self.cancel(edge_id)  # ends its waiters (this one too) with a timeout
                if index in pending:
                    one_answered(index, None, EdgeTimeout(edge_id, self.timeout_seconds))

        timer = self._clock.callLater(self.timeout_seconds, deadline)
        for index, edge_id in enumerate(edge_ids):
            record = self._registry.find(edge_id)
            if record is None or record.token is None or record.peer is None:
                answered(index, None, EdgeNotConnected(edge_id))
            else:
                pending[index] = edge_id
                self.join(record, False, (one_answered, index))
        if not pending and timer.active():
            timer.cancel()

    def join(self, record: EdgeRecord, own_deadline: bool, waiter: StatusWaiter) -> None:
        """Add ``waiter`` to the edge's ask on its current connection, or start one.

        With ``own_deadline=False`` a new request has no timer of its own:
        the caller cancels it at its own deadline (:meth:`cancel`), which
        saves one timer per edge per round.
        """
        ask = self._asks.get(record.edge_id)
        if ask is not None and ask.token == record.token:
            ask.waiters.append(waiter)
            return
        self._issue(record, own_deadline, [waiter])

    def cancel(self, edge_id: str) -> None:
        """Stop waiting for the edge's ask in flight, if any: its waiters hear a timeout."""
        ask = self._asks.get(edge_id)
        if ask is not None:
            ask.cancel()

    def _issue(self, record: EdgeRecord, own_deadline: bool, waiters: list[StatusWaiter]) -> None:
        peer = record.peer
        assert record.token is not None and peer is not None
        ask = _StatusAsk(self, record.edge_id, record.token, own_deadline, waiters, peer)
        self._asks[record.edge_id] = ask
        # The answer may come at once (a closed connection): then the ask
        # is settled before its request id is known, and cancel is moot.
        ask.request_id = peer.ask_status(self.timeout_seconds, own_deadline, ask)

    # -- answers ------------------------------------------------------------------

    def _status_answered(self, response: pb.EdgeStatusResponse, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        try:
            snapshot = checked_snapshot(
                response, self._clock.seconds(), self._draw() < RECOUNT_SHARE, self._registry.shared.counts
            )
        except SnapshotRefused as refused:
            self._refuse(ask, refused.reason, refused.problem)
            return
        if self._registry.record_status(ask.edge_id, ask.token, snapshot):
            self._deliver(ask.waiters, snapshot, None)
        else:
            # The connection is no longer current (closed meanwhile).
            self._deliver(ask.waiters, None, EdgeDisconnected(ask.edge_id))

    def _refuse(self, ask: _StatusAsk, reason: str, problem: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1
        self._log.warn("edge {edge_id} sent a status snapshot refused: {problem}", edge_id=ask.edge_id, problem=problem)
        self._deliver(ask.waiters, None, EdgeErrorAnswer(ask.edge_id, problem))

    def _snapshot_answered(self, snapshot: StatusSnapshot, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        if self._registry.record_status(ask.edge_id, ask.token, snapshot):
            self._deliver(ask.waiters, snapshot, None)
        else:
            self._deliver(ask.waiters, None, EdgeDisconnected(ask.edge_id))

    def _status_failed(self, failure: Exception, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        self._deliver(ask.waiters, None, translated(ask.edge_id, self.timeout_seconds, failure))

    def _deliver(
        self, waiters: list[StatusWaiter], snapshot: Optional[StatusSnapshot], error: Optional[Exception]
    ) -> None:
        for fn, arg in waiters:
            try:
                fn(arg, snapshot, error)
            except Exception:
                self._log.failure("status waiter failed")

    # -- connections ending, and stopping ---------------------------------------------

    def connection_ended(self, edge_id: str, token: int) -> None:
        """The connection ``token`` was superseded or closed: its ask moves to
        the edge's current connection, or its waiters hear EdgeDisconnected."""
        ask = self._asks.get(edge_id)
        if ask is None or ask.token != token:
            return
        del self._asks[edge_id]
        ask.settled = True
        record = self._registry.find(edge_id)
        if record is not None and record.token is not None and record.peer is not None:
            self._issue(record, ask.own_deadline, ask.waiters)
        else:
            self._deliver(ask.waiters, None, EdgeDisconnected(edge_id))
        ask.cancel()

    def shut_down(self) -> None:
        """Every ask ends now: its waiters hear ShuttingDown."""
        asks, self._asks = list(self._asks.values()), {}
        for ask in asks:
            ask.settled = True
            self._deliver(ask.waiters, None, ShuttingDown())
            ask.cancel()
