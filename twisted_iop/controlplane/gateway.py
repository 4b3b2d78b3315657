"""Requests to connected edges, and the one owner of everything in flight.

The :class:`EdgeGateway` is the only code that asks edges for anything and
the only code that sets an operation's state. It owns:

* **status asks**: at most one ``EdgeStatusRequest`` in flight per edge,
  bound to the connection (token) it was sent on; concurrent views and the
  fleet round share it. When a newer connection supersedes the old one,
  the ask moves to the new connection at once (its waiters do not wait for
  the old socket to close).
* **fleet rounds**: one round at a time over every known edge; callers
  arriving while it runs join it, and callers within the max age of the
  last round reuse its rows.
* **commands**: each dispatched command, the connection it was sent on,
  its deadline and the callers waiting for its end. A command's terminal
  state comes only from the answer to the gateway's own request on that
  connection (or from the gateway's own verdicts: timed out, disconnected,
  superseded). After its deadline the request keeps listening (bounded per
  connection) so that a late answer is kept as the operation's late
  outcome.

It works through the registry's peers, so it runs the same over a real TCP
connection or a test fake, and it turns wire failures into the domain
errors that the HTTP views map to status codes.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any, Optional

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane import bounds, operation_states
from twisted_iop.controlplane.operations import OperationRecord
from twisted_iop.controlplane.registry import (
    EdgeNotConnected,
    EdgePeer,
    EdgeRecord,
    EdgeRegistry,
    StatusSnapshot,
)
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.peer import PeerDisconnected, RemoteError, RequestTimeout
from twisted_iop.wire.status_totals import carried_counts, counts_problem, response_counts


class EdgeTimeout(Exception):
    """The edge did not answer within the deadline."""

    def __init__(self, edge_id: str, seconds: float) -> None:
        super().__init__(f"edge {edge_id!r} did not answer within {seconds:g}s")
        self.edge_id = edge_id


class EdgeDisconnected(Exception):
    """The edge's connection dropped while a request was in flight."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"edge {edge_id!r} disconnected before answering")
        self.edge_id = edge_id


class EdgeErrorAnswer(Exception):
    """The edge answered a request with an error."""

    def __init__(self, edge_id: str, detail: str) -> None:
        super().__init__(f"edge {edge_id!r} answered with an error: {detail}")
        self.edge_id = edge_id


class ShuttingDown(Exception):
    """The Control Plane is stopping: the request was refused or ended unanswered."""

    def __init__(self) -> None:
        super().__init__(SHUTTING_DOWN_REASON)


class UnknownCommand(Exception):
    """The command is not in the edge's announced catalog."""

    def __init__(self, edge_id: str, name: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f"edge {edge_id!r} does not offer command {name!r} (it offers: {listed})")
        self.edge_id = edge_id


class IdempotencyConflict(Exception):
    """The idempotency key already names a different command on this edge."""

    def __init__(self, operation: OperationRecord) -> None:
        super().__init__(
            f"idempotency key {operation.idempotency_key!r} was already used for a different command "
            f"(operation {operation.operation_id}: {operation.name} {operation.target!r})"
        )
        self.operation = operation


#: Status requests a fleet fan-out issues per reactor turn.
FANOUT_SLICE = 500

#: The share of status answers carrying totals that are also recounted
#: from their providers: the totals are the Edge's own figures, checked
#: against each other on every answer; a recount that differs refuses
#: the answer, so an Edge whose totals are wrong is found within a few
#: dozen answers while an honest one costs a sixteenth of a count.
RECOUNT_SHARE = 1 / 16
#: Commands past their deadline whose late answer one connection may still
#: deliver; beyond this the oldest stops listening.
LATE_ANSWERS_PER_CONNECTION = 64
#: Why a command ended when a newer connection took over.
SUPERSEDED_REASON = "a newer connection of this edge took over before the answer"
DISCONNECTED_REASON = "edge disconnected before answering"
#: Why a command ended (``failed``) when the Control Plane stopped before its answer.
SHUTTING_DOWN_REASON = "the Control Plane is shutting down"

#: A status waiter: ``fn(arg, snapshot, error)`` with exactly one of the two set.
StatusWaiter = tuple[Callable[[Any, Optional[StatusSnapshot], Optional[Exception]], None], Any]


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
class _StatusAsk:
    """One ``EdgeStatusRequest`` in flight on one connection of one edge.

    It is the request's listener: the wire ends it with a plain call
    (:meth:`status_answered`), no Deferred per edge and round.
    """

    gateway: EdgeGateway
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
            self.gateway._status_answered(response, self)
        else:
            self.gateway._status_failed(error, self)

    def snapshot_answered(self, snapshot: StatusSnapshot) -> None:
        """An answer already checked and counted (a routed one: its owner did both)."""
        self.gateway._snapshot_answered(snapshot, self)

    def cancel(self) -> None:
        """Stop waiting for the answer (it ends with CancelledError if still pending)."""
        if self.peer is not None and self.request_id:
            self.peer.cancel_status(self.request_id)


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


@attrs.define(eq=False)
class _Command:
    """A dispatched command the gateway still listens for."""

    operation: OperationRecord
    token: int
    timeout_seconds: float
    request: Optional[Deferred[pb.EdgeCommandResponse]] = None
    timer: Optional[IDelayedCall] = None
    #: Set when the gateway itself stopped listening (cancelled the request).
    abandoned: bool = False


def _translate(edge_id: str, seconds: float, error: Exception) -> Exception:
    if isinstance(error, (RequestTimeout, CancelledError)):
        return EdgeTimeout(edge_id, seconds)
    if isinstance(error, PeerDisconnected):
        return EdgeDisconnected(edge_id)
    if isinstance(error, RemoteError):
        return EdgeErrorAnswer(edge_id, str(error))
    return error


def _settle_deferred(
    d: Deferred[StatusSnapshot], snapshot: Optional[StatusSnapshot], error: Optional[Exception]
) -> None:
    if error is not None:
        d.errback(error)
    else:
        d.callback(snapshot)  # type: ignore[arg-type]


_OUTCOME_STATES = {
    pb.COMMAND_OUTCOME_SUCCEEDED: operation_states.SUCCEEDED,
    pb.COMMAND_OUTCOME_REJECTED: operation_states.REJECTED,
    pb.COMMAND_OUTCOME_FAILED: operation_states.FAILED,
}
_EVENT_STATES = {"command.accepted": operation_states.ACCEPTED, "command.started": operation_states.RUNNING}


@attrs.frozen
class Dispatched:
    """What :meth:`EdgeGateway.dispatch` returns."""

    operation: OperationRecord
    #: Fires with the operation once it is finished.
    ended: Deferred[OperationRecord]
    #: True when the idempotency key named an existing operation.
    replayed: bool


class EdgeGateway:
    """Status and command requests to edges; owner of what is in flight."""

    _log = Logger()

    def __init__(
        self,
        registry: EdgeRegistry,
        clock: IReactorTime,
        status_timeout_seconds: float = 5.0,
        fleet_max_age_seconds: float = 1.0,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._registry = registry
        self._clock = clock
        #: Draws which answers carrying totals are recounted (:data:`RECOUNT_SHARE`).
        self._draw = draw
        self.status_timeout_seconds = status_timeout_seconds
        self.fleet_max_age_seconds = fleet_max_age_seconds
        #: Edge id -> its status ask in flight.
        self._asks: dict[str, _StatusAsk] = {}
        self._round: Optional[_Round] = None
        self._last_round: Optional[FleetRound] = None
        #: Operation id -> the command still listened for.
        self._commands: dict[str, _Command] = {}
        #: Connection token -> operation ids listened for on it (in dispatch order).
        self._by_token: dict[int, dict[str, None]] = {}
        #: Connection token -> operation ids past their deadline, oldest first.
        self._late_by_token: dict[int, dict[str, None]] = {}
        #: Operation id -> callers waiting for its end.
        self._waiters: dict[str, list[Deferred[OperationRecord]]] = {}
        #: Set by :meth:`shut_down`: new requests fail with ShuttingDown.
        self.stopping = False
        #: For /metrics: one observation per status request, command and
        #: fleet round (never per edge), and operations by terminal state.
        self.status_seconds = LatencyHistogram()
        self.command_seconds = LatencyHistogram()
        self.round_seconds = LatencyHistogram()
        self.operations_ended: dict[str, int] = {}
        #: Status answers refused, by reason: "bounds" or "totals".
        self.status_refused: dict[str, int] = {}
        registry.add_observer(self)

    # -- stopping ---------------------------------------------------------------

    def waiting_callers(self) -> int:
        """Callers still waiting: for commands, status asks and a fleet round (a stop drains these)."""
        return len(self._waiters) + len(self._asks) + (0 if self._round is None else 1)

    def refuse_new(self) -> None:
        """From now on status, fleet and command requests fail with ShuttingDown."""
        self.stopping = True

    def shut_down(self) -> None:
        """End everything in flight now; every waiting caller gets its answer.

        Commands still waiting for their edge end ``failed`` with
        :data:`SHUTTING_DOWN_REASON` (a late answer can no longer arrive);
        status and fleet callers fail with :class:`ShuttingDown`.
        """
        self.stopping = True
        round_, self._round = self._round, None
        if round_ is not None:
            round_.finished = True
            if round_.deadline is not None and round_.deadline.active():
                round_.deadline.cancel()
            round_.deadline = None
            for d in round_.waiters:
                d.errback(ShuttingDown())
        asks, self._asks = list(self._asks.values()), {}
        for ask in asks:
            ask.settled = True
            self._deliver(ask.waiters, None, ShuttingDown())
            ask.cancel()
        for command in list(self._commands.values()):
            self._forget(command)
            if not command.operation.finished:
                self._finish(command.operation, operation_states.FAILED, SHUTTING_DOWN_REASON)
            self._abandon(command)
        for waiters in list(self._waiters.values()):
            for waiter in waiters:
                waiter.errback(ShuttingDown())
        self._waiters.clear()

    # -- what the registry tells us ---------------------------------------------

    def connection_superseded(self, edge_id: str, old_token: int) -> None:
        """Settle what was in flight on the old connection, now.

        The status ask moves to the new connection (its callers then get
        the new connection's answer); commands end ``superseded``.
        """
        self._end_connection(edge_id, old_token, operation_states.SUPERSEDED, SUPERSEDED_REASON)

    def connection_closed(self, edge_id: str, token: int) -> None:
        """Settle what is still tracked for a connection that closed.

        The wire fails its pending requests as it closes, so this finds
        only what no request carries any more (a command whose request was
        answered with a foreign command id), or what a peer without that
        courtesy left behind.
        """
        self._end_connection(edge_id, token, operation_states.EDGE_DISCONNECTED, DISCONNECTED_REASON)

    def _end_connection(self, edge_id: str, token: int, state: str, reason: str) -> None:
        ask = self._asks.get(edge_id)
        if ask is not None and ask.token == token:
            del self._asks[edge_id]
            ask.settled = True
            record = self._registry.find(edge_id)
            if record is not None and record.token is not None and record.peer is not None:
                self._issue(record, ask.own_deadline, ask.waiters)
            else:
                self._deliver(ask.waiters, None, EdgeDisconnected(edge_id))
            ask.cancel()
        for operation_id in list(self._by_token.pop(token, {})):
            command = self._commands.pop(operation_id, None)
            if command is None:
                continue
            self._stop_timer(command)
            if not command.operation.finished:
                self._finish(command.operation, state, reason)
            self._abandon(command)
        self._late_by_token.pop(token, None)

    def command_event_relayed(self, edge_id: str, token: int, event: pb.EdgeEvent) -> None:
        """``command.accepted`` / ``command.started`` advance their own command.

        Only on the connection the command was sent on, only for an
        operation of the relaying edge, and never to a terminal state.
        """
        state = _EVENT_STATES.get(event.kind)
        if state is None:
            return
        command = self._commands.get(event.command_id)
        if command is None or command.token != token or command.operation.edge_id != edge_id:
            return
        if not command.operation.finished:
            self._registry.advance_operation(edge_id, command.operation.operation_id, state)

    def operation_updated(self, operation: OperationRecord) -> None:
        """Another replica changed an operation (cluster mode): callers here
        waiting for it (a replayed idempotency key) get its end."""
        if operation.finished:
            command = self._commands.get(operation.operation_id)
            if command is not None:
                # Ours, ended by the replica that reaped us while we were
                # cut off: stop listening for it.
                self._forget(command)
                self._abandon(command)
            for d in self._waiters.pop(operation.operation_id, []):
                d.callback(operation)

    # -- status -------------------------------------------------------------------

    def status(self, edge_id: str) -> Deferred[StatusSnapshot]:
        """A fresh snapshot of ``edge_id`` from its current connection.

        Concurrent callers for one edge share a single in-flight request.
        Fails with UnknownEdge, EdgeNotConnected, EdgeTimeout,
        EdgeDisconnected or EdgeErrorAnswer.
        """
        if self.stopping:
            return fail(ShuttingDown())
        try:
            record = self._registry.get(edge_id)
        except Exception:
            return fail()
        if record.token is None or record.peer is None:
            return fail(EdgeNotConnected(edge_id))
        d: Deferred[StatusSnapshot] = Deferred()
        self._join(record, True, (self._settle_timed, (d, self._clock.seconds())))
        return d

    def _settle_timed(
        self,
        waiting: tuple[Deferred[StatusSnapshot], float],
        snapshot: Optional[StatusSnapshot],
        error: Optional[Exception],
    ) -> None:
        d, started = waiting
        self.status_seconds.observe(self._clock.seconds() - started)  # metrics: once per request
        _settle_deferred(d, snapshot, error)

    def in_flight(self) -> dict[str, int]:
        """Status requests on the wire and commands not yet ended (for /metrics)."""
        late = sum(len(ids) for ids in self._late_by_token.values())
        return {"status": len(self._asks), "command": len(self._commands) - late}

    def status_group(
        self,
        edge_ids: list[str],
        answered: Callable[[int, Optional[StatusSnapshot], Optional[Exception]], None],
    ) -> None:
        """Ask several edges at once, under one deadline for them all.

        ``answered(index, snapshot, error)`` is called exactly once per
        edge id (by its index). This is a fleet round's way of asking,
        for callers that are not a round (cluster mode: the asks another
        replica routed here for its round): no Deferred and no timer per
        edge, and the single-status latency histogram is left alone.
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
                ask = self._asks.get(edge_id)
                if ask is not None:
                    ask.cancel()  # ends its waiters (this one too) with a timeout
                if index in pending:
                    one_answered(index, None, EdgeTimeout(edge_id, self.status_timeout_seconds))

        timer = self._clock.callLater(self.status_timeout_seconds, deadline)
        for index, edge_id in enumerate(edge_ids):
            record = self._registry.find(edge_id)
            if self.stopping:
                answered(index, None, ShuttingDown())
            elif record is None or record.token is None or record.peer is None:
                answered(index, None, EdgeNotConnected(edge_id))
            else:
                pending[index] = edge_id
                self._join(record, False, (one_answered, index))
        if not pending and timer.active():
            timer.cancel()

    def status_waiters(self, edge_id: str) -> int:
        """How many callers wait on the edge's status request in flight (0: none)."""
        ask = self._asks.get(edge_id)
        return 0 if ask is None else len(ask.waiters)

    def _join(self, record: EdgeRecord, own_deadline: bool, waiter: StatusWaiter) -> None:
        """Add ``waiter`` to the edge's ask on its current connection, or start one.

        With ``own_deadline=False`` a new request has no timer of its own:
        the fleet round cancels it at the round's deadline, which saves one
        timer per edge per round.
        """
        ask = self._asks.get(record.edge_id)
        if ask is not None and ask.token == record.token:
            ask.waiters.append(waiter)
            return
        self._issue(record, own_deadline, [waiter])

    def _issue(self, record: EdgeRecord, own_deadline: bool, waiters: list[StatusWaiter]) -> None:
        peer = record.peer
        assert record.token is not None and peer is not None
        ask = _StatusAsk(self, record.edge_id, record.token, own_deadline, waiters, peer)
        self._asks[record.edge_id] = ask
        # The answer may come at once (a closed connection): then the ask
        # is settled before its request id is known, and cancel is moot.
        ask.request_id = peer.ask_status(self.status_timeout_seconds, own_deadline, ask)

    def _status_answered(self, response: pb.EdgeStatusResponse, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        counts = carried_counts(response)
        if counts is not None:
            # Kept as counts: the kept bytes need not carry them too.
            response.ClearField("totals")
        # Serialized once: its length is the size the bounds check needs,
        # and the bytes are what the registry keeps.
        data = response.SerializeToString()
        problem = bounds.status_problem(response, len(data))
        if problem is not None:
            self._refuse_status(ask, "bounds", problem)
            return
        if counts is None:
            counts = response_counts(response)
        else:
            problem = counts_problem(counts, len(response.nodes))
            if problem is None and self._draw() < RECOUNT_SHARE and response_counts(response) != counts:
                problem = "status totals differ from the counts of its providers"
            if problem is not None:
                self._refuse_status(ask, "totals", problem)
                return
        snapshot = self._registry.record_status(ask.edge_id, ask.token, response, data, counts)
        if snapshot is None:
            # The connection is no longer current (closed meanwhile).
            self._deliver(ask.waiters, None, EdgeDisconnected(ask.edge_id))
        else:
            self._deliver(ask.waiters, snapshot, None)

    def _refuse_status(self, ask: _StatusAsk, reason: str, problem: str) -> None:
        self.status_refused[reason] = self.status_refused.get(reason, 0) + 1
        self._log.warn("edge {edge_id} sent a status snapshot refused: {problem}", edge_id=ask.edge_id, problem=problem)
        self._deliver(ask.waiters, None, EdgeErrorAnswer(ask.edge_id, problem))

    def _snapshot_answered(self, snapshot: StatusSnapshot, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        if self._registry.keep_snapshot(ask.edge_id, ask.token, snapshot):
            self._deliver(ask.waiters, snapshot, None)
        else:
            self._deliver(ask.waiters, None, EdgeDisconnected(ask.edge_id))

    def _status_failed(self, failure: Exception, ask: _StatusAsk) -> None:
        if self._asks.get(ask.edge_id) is ask:
            del self._asks[ask.edge_id]
        if ask.settled:
            return
        ask.settled = True
        self._deliver(ask.waiters, None, _translate(ask.edge_id, self.status_timeout_seconds, failure))

    def _deliver(
        self, waiters: list[StatusWaiter], snapshot: Optional[StatusSnapshot], error: Optional[Exception]
    ) -> None:
        for fn, arg in waiters:
            try:
                fn(arg, snapshot, error)
            except Exception:
                self._log.failure("status waiter failed")

    # -- fleet rounds ---------------------------------------------------------------

    @property
    def last_round(self) -> Optional[FleetRound]:
        """The newest finished fleet round, if any."""
        return self._last_round

    def fleet_status(self) -> Deferred[FleetRound]:
        """A fleet round: a status row for every known edge.

        One round runs at a time: a caller arriving while one runs joins
        it, and a caller within ``fleet_max_age_seconds`` of the last
        round's start gets that round. Otherwise a new round asks every
        connected edge at once, in slices of :data:`FANOUT_SLICE` per
        reactor turn, so answers are read while later slices are still
        being sent. One deadline covers the round; one slow or failing edge
        marks only its own row.
        """
        if self.stopping:
            return fail(ShuttingDown())
        if self._round is not None:
            d: Deferred[FleetRound] = Deferred()
            self._round.waiters.append(d)
            return d
        now = self._clock.seconds()
        last = self._last_round
        if last is not None and now - last.round_at < self.fleet_max_age_seconds:
            return succeed(last)
        records_ = sorted(self._registry.edges(), key=lambda r: r.edge_id)
        round_ = _Round(now, records_, self._round_done)
        for index, record in enumerate(records_):
            if record.token is None:
                round_.rows[index] = StatusRow(record, "disconnected", record.snapshot, False)
            else:
                round_.pending.append(index)
        d = Deferred()
        round_.waiters.append(d)
        if not round_.pending:
            self._round_done(round_)
            return d
        self._round = round_
        round_.remaining = len(round_.pending)
        round_.deadline = self._clock.callLater(self.status_timeout_seconds, self._round_deadline, round_)
        self._issue_slice(round_, 0)
        return d

    def _issue_slice(self, round_: _Round, start: int) -> None:
        indices = round_.pending[start : start + FANOUT_SLICE]
        row_answered = round_.row_answered
        for index in indices:
            if round_.finished:
                return
            record = round_.records[index]
            if record.token is None or record.peer is None:
                row_answered(index, None, EdgeNotConnected(record.edge_id))
            else:
                self._join(record, False, (row_answered, index))
        if start + FANOUT_SLICE < len(round_.pending) and not round_.finished:
            round_.issued = start + FANOUT_SLICE
            self._clock.callLater(0, self._issue_slice, round_, start + FANOUT_SLICE)
        else:
            round_.issued = len(round_.pending)

    def _round_deadline(self, round_: _Round) -> None:
        round_.deadline = None
        for index in round_.pending[: round_.issued]:
            if round_.finished:
                return
            if round_.rows[index] is None:
                ask = self._asks.get(round_.records[index].edge_id)
                if ask is not None:
                    ask.cancel()
                if round_.rows[index] is None:
                    # No ask carried this row (it cannot happen, but a row
                    # must never hold the round open).
                    round_.row_answered(
                        index, None, EdgeTimeout(round_.records[index].edge_id, self.status_timeout_seconds)
                    )
        # Slices not yet issued when the deadline hit (a reactor starved
        # for the whole timeout) are timeouts too.
        for index in round_.pending[round_.issued :]:
            if round_.finished:
                return
            round_.row_answered(index, None, EdgeTimeout(round_.records[index].edge_id, self.status_timeout_seconds))

    def _round_done(self, round_: _Round) -> None:
        round_.finished = True
        if round_.deadline is not None and round_.deadline.active():
            round_.deadline.cancel()
        round_.deadline = None
        if self._round is round_:
            self._round = None
        rows = [row for row in round_.rows if row is not None]
        finished = FleetRound(round_.round_at, self._clock.seconds(), rows, [row.record.edge_id for row in rows])
        self.round_seconds.observe(finished.finished_at - finished.round_at)  # metrics: once per round
        self._last_round = finished
        for d in round_.waiters:
            d.callback(finished)

    # -- commands ---------------------------------------------------------------------

    def dispatch(
        self,
        edge_id: str,
        name: str,
        target: str,
        arguments: dict[str, str],
        timeout_seconds: float,
        idempotency_key: str = "",
        requested_by: str = "",
        operation_id: str = "",
    ) -> Dispatched:
        """Send a command; return its operation and a Deferred of its end.

        The same idempotency key for the same edge and the same command
        (name, target, arguments) returns the existing operation (and its
        end) without dispatching again; the key with a different command
        raises IdempotencyConflict. Raises UnknownEdge, EdgeNotConnected or
        UnknownCommand before anything is sent. ``operation_id`` names the
        new operation (cluster mode reserves the idempotency key under it
        first); by default a fresh one is made.
        """
        if self.stopping:
            raise ShuttingDown()
        record = self._registry.get(edge_id)
        if idempotency_key:
            existing = record.operations.by_key(idempotency_key)
            if existing is not None:
                if not existing.same_request(name, target, arguments):
                    raise IdempotencyConflict(existing)
                return Dispatched(existing, self.wait_for(existing), True)
        if record.token is None or record.peer is None:
            raise EdgeNotConnected(edge_id)
        if name not in record.command_names:
            raise UnknownCommand(edge_id, name, record.command_names)
        now = self._clock.seconds()
        operation = OperationRecord(
            operation_id=operation_id or uuid.uuid4().hex,
            edge_id=edge_id,
            name=name,
            target=target,
            arguments=dict(arguments),
            idempotency_key=idempotency_key,
            created_at=now,
            deadline_at=now + timeout_seconds,
            requested_by=requested_by,
        )
        self._registry.start_operation(operation)
        command = _Command(operation, record.token, timeout_seconds)
        operation_id = operation.operation_id
        self._commands[operation_id] = command
        self._by_token.setdefault(record.token, {})[operation_id] = None
        command.timer = self._clock.callLater(timeout_seconds, self._command_deadline, command)
        request = pb.EdgeCommandRequest(
            command_id=operation_id,
            name=name,
            target=target,
            arguments=arguments,
            timeout_ms=int(timeout_seconds * 1000),
        )
        d = record.peer.request_command(request)
        command.request = d
        d.addCallbacks(self._command_answered, self._command_failed, callbackArgs=(command,), errbackArgs=(command,))
        return Dispatched(operation, self.wait_for(operation), False)

    def wait_for(self, operation: OperationRecord) -> Deferred[OperationRecord]:
        """Fire with ``operation`` once it is finished."""
        if operation.finished:
            return succeed(operation)
        d: Deferred[OperationRecord] = Deferred()
        self._waiters.setdefault(operation.operation_id, []).append(d)
        return d

    def _command_answered(self, response: pb.EdgeCommandResponse, command: _Command) -> None:
        operation = command.operation
        if response.command_id != operation.operation_id:
            # The answer to our request names another command: never a
            # success. The operation keeps waiting and ends at its deadline.
            self._log.warn(
                "edge {edge_id} answered command {operation_id} with command_id {other!r}; ignored",
                edge_id=operation.edge_id,
                operation_id=operation.operation_id,
                other=response.command_id[:80],
            )
            command.request = None
            if operation.finished:
                self._forget(command)
            return
        self._forget(command)
        state = _OUTCOME_STATES.get(response.outcome, operation_states.FAILED)
        reason = response.reason
        if response.outcome not in _OUTCOME_STATES and not reason:
            reason = f"edge answered with outcome {enum_name(pb.CommandOutcome, response.outcome)}"
        self._settle(operation, state, reason, dict(response.result))

    def _command_failed(self, failure: Failure, command: _Command) -> None:
        if command.abandoned:
            return
        self._forget(command)
        operation = command.operation
        if failure.check(PeerDisconnected):
            if not operation.finished:
                self._finish(operation, operation_states.EDGE_DISCONNECTED, DISCONNECTED_REASON)
        elif failure.check(RemoteError):
            self._settle(operation, operation_states.FAILED, f"edge error: {failure.value}", {})
        else:
            self._log.failure(
                "command {name} to {edge_id} failed", failure, name=operation.name, edge_id=operation.edge_id
            )
            if not operation.finished:
                self._finish(operation, operation_states.FAILED, "internal error")

    def _settle(self, operation: OperationRecord, state: str, reason: str, result: dict[str, str]) -> None:
        """The edge's own answer: the end, or the late outcome of an ended operation."""
        if operation.finished:
            self._registry.record_late_outcome(operation.edge_id, operation.operation_id, state, reason, result)
        else:
            self._finish(operation, state, reason, result)

    def _command_deadline(self, command: _Command) -> None:
        command.timer = None
        operation = command.operation
        if operation.finished:
            return
        self._finish(operation, operation_states.TIMED_OUT, f"no answer within {command.timeout_seconds:g}s")
        if command.request is None:
            # Its request was already answered (wrongly): nothing to wait for.
            self._forget(command)
            return
        late = self._late_by_token.setdefault(command.token, {})
        late[operation.operation_id] = None
        while len(late) > LATE_ANSWERS_PER_CONNECTION:
            oldest = next(iter(late))
            del late[oldest]
            evicted = self._commands.get(oldest)
            if evicted is not None:
                self._forget(evicted)
                self._abandon(evicted)

    def _finish(
        self, operation: OperationRecord, state: str, reason: str, result: Optional[dict[str, str]] = None
    ) -> None:
        self._registry.advance_operation(operation.edge_id, operation.operation_id, state, reason, result)
        self.operations_ended[state] = self.operations_ended.get(state, 0) + 1  # metrics
        self.command_seconds.observe(self._clock.seconds() - operation.created_at)  # metrics
        for d in self._waiters.pop(operation.operation_id, []):
            d.callback(operation)

    def _forget(self, command: _Command) -> None:
        """Stop tracking ``command`` (answered, failed or abandoned)."""
        operation_id = command.operation.operation_id
        self._commands.pop(operation_id, None)
        for index in (self._by_token, self._late_by_token):
            ids = index.get(command.token)
            if ids is not None:
                ids.pop(operation_id, None)
                if not ids:
                    del index[command.token]
        self._stop_timer(command)

    @staticmethod
    def _stop_timer(command: _Command) -> None:
        if command.timer is not None and command.timer.active():
            command.timer.cancel()
        command.timer = None

    @staticmethod
    def _abandon(command: _Command) -> None:
        """Stop listening for ``command``'s answer."""
        command.abandoned = True
        if command.request is not None:
            command.request.cancel()
            command.request = None
