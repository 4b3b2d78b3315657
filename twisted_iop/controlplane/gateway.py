"""Requests to connected edges: status (shared, fanned out) and commands.

The :class:`EdgeGateway` is the only code that asks edges for anything. It
works through the registry's peers, so it runs the same over a real TCP
connection or a test fake, and it turns wire failures into the domain
errors that the HTTP views map to status codes.
"""

from __future__ import annotations

import uuid
from typing import Optional

import attrs
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane import records
from twisted_iop.controlplane.records import OperationRecord
from twisted_iop.controlplane.registry import (
    EdgeNotConnected,
    EdgeRecord,
    EdgeRegistry,
    StatusSnapshot,
)
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.peer import PeerDisconnected, RemoteError, RequestTimeout


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


class UnknownCommand(Exception):
    """The command is not in the edge's announced catalog."""

    def __init__(self, edge_id: str, name: str, known: list[str]) -> None:
        listed = ", ".join(known) if known else "none"
        super().__init__(f"edge {edge_id!r} does not offer command {name!r} (it offers: {listed})")
        self.edge_id = edge_id


#: Status requests a fleet fan-out issues per reactor turn.
FANOUT_SLICE = 500


@attrs.frozen
class StatusRow:
    """One edge's line in a fleet status: a fresh snapshot or why not."""

    record: EdgeRecord
    state: str  # ok, timeout, error, disconnected
    snapshot: Optional[StatusSnapshot]
    error_code: str = ""
    error_message: str = ""


@attrs.define(eq=False)
class _FanOut:
    """One fleet status round in progress."""

    records: list[EdgeRecord]
    result: Deferred[list[StatusRow]]
    rows: list[Optional[StatusRow]] = attrs.field(init=False)
    pending: list[int] = attrs.field(factory=list)
    remaining: int = 0
    issued: int = 0
    done: bool = False
    deadline: Optional[IDelayedCall] = None

    def __attrs_post_init__(self) -> None:
        self.rows = [None] * len(self.records)

    def finished_rows(self) -> list[StatusRow]:
        return [row for row in self.rows if row is not None]


def _translate(edge_id: str, seconds: float, failure: Failure) -> Failure:
    if failure.check(RequestTimeout, CancelledError):
        return Failure(EdgeTimeout(edge_id, seconds))
    if failure.check(PeerDisconnected):
        return Failure(EdgeDisconnected(edge_id))
    if failure.check(RemoteError):
        return Failure(EdgeErrorAnswer(edge_id, str(failure.value)))
    return failure


class EdgeGateway:
    """Status and command requests to edges, through the registry."""

    _log = Logger()

    def __init__(
        self,
        registry: EdgeRegistry,
        clock: IReactorTime,
        status_timeout_seconds: float = 5.0,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self.status_timeout_seconds = status_timeout_seconds
        self._operation_waiters: dict[str, tuple[OperationRecord, list[Deferred[OperationRecord]]]] = {}
        registry.add_listener(self._operation_changed)

    def _operation_changed(self, event: records.EventRecord) -> None:
        if not event.kind.startswith("operation.") or event.command_id not in self._operation_waiters:
            return
        if event.attributes.get("state") not in records.TERMINAL_STATES:
            return
        operation, waiters = self._operation_waiters.pop(event.command_id)
        for d in waiters:
            d.callback(operation)

    # -- status ---------------------------------------------------------------

    def status(self, edge_id: str) -> Deferred[StatusSnapshot]:
        """A fresh snapshot of ``edge_id``.

        Concurrent callers for one edge share a single in-flight request.
        Fails with UnknownEdge, EdgeNotConnected, EdgeTimeout,
        EdgeDisconnected or EdgeErrorAnswer.
        """
        try:
            record = self._registry.get(edge_id)
        except Exception:
            return fail()
        return self._status_of(record)

    def _status_of(self, record: EdgeRecord, own_deadline: bool = True) -> Deferred[StatusSnapshot]:
        """Join the edge's in-flight status request, or start one.

        With ``own_deadline=False`` the request has no timer of its own:
        the caller (a fleet fan-out) cancels it at its round's deadline,
        which saves one timer per edge per round.
        """
        if record.token is None or record.peer is None:
            return fail(EdgeNotConnected(record.edge_id))
        waiter: Deferred[StatusSnapshot] = Deferred()
        if record.status_waiters is not None:
            record.status_waiters.append(waiter)
            return waiter
        record.status_waiters = [waiter]
        request = record.peer.request_status(self.status_timeout_seconds, own_deadline)
        record.status_request = request
        request.addCallbacks(
            self._status_answered,
            self._status_failed,
            callbackArgs=(record, record.token),
            errbackArgs=(record,),
        )
        return waiter

    def _status_answered(self, response: pb.EdgeStatusResponse, record: EdgeRecord, token: int) -> None:
        snapshot = self._registry.record_status(record.edge_id, token, response)
        if snapshot is None:
            # The connection was superseded while we waited.
            self._deliver(record, Failure(EdgeDisconnected(record.edge_id)))
        else:
            self._deliver(record, snapshot)

    def _status_failed(self, failure: Failure, record: EdgeRecord) -> None:
        self._deliver(record, _translate(record.edge_id, self.status_timeout_seconds, failure))

    def _deliver(self, record: EdgeRecord, outcome: StatusSnapshot | Failure) -> None:
        waiters = record.status_waiters or []
        record.status_waiters = None
        record.status_request = None
        for waiter in waiters:
            if isinstance(outcome, Failure):
                waiter.errback(outcome)
            else:
                waiter.callback(outcome)

    def fleet_status(self) -> Deferred[list[StatusRow]]:
        """A status row for every known edge, asked of all at once.

        Requests go out in slices of :data:`FANOUT_SLICE` per reactor turn,
        so answers are read while later slices are still being sent and the
        reactor keeps serving everything else. One deadline covers the
        round; one slow or failing edge marks only its own row.
        """
        records_ = sorted(self._registry.edges(), key=lambda r: r.edge_id)
        fanout = _FanOut(records_, Deferred())
        for index, record in enumerate(records_):
            if record.token is None:
                fanout.rows[index] = StatusRow(record, "disconnected", record.snapshot)
            else:
                fanout.pending.append(index)
        if not fanout.pending:
            return succeed(fanout.finished_rows())
        fanout.remaining = len(fanout.pending)
        fanout.deadline = self._clock.callLater(self.status_timeout_seconds, self._fanout_deadline, fanout)
        self._issue_slice(fanout, 0)
        return fanout.result

    def _issue_slice(self, fanout: _FanOut, start: int) -> None:
        indices = fanout.pending[start : start + FANOUT_SLICE]
        for index in indices:
            if fanout.done:
                return
            d = self._status_of(fanout.records[index], own_deadline=False)
            d.addCallbacks(self._row_ok, self._row_failed, callbackArgs=(fanout, index), errbackArgs=(fanout, index))
        if start + FANOUT_SLICE < len(fanout.pending) and not fanout.done:
            fanout.issued = start + FANOUT_SLICE
            self._clock.callLater(0, self._issue_slice, fanout, start + FANOUT_SLICE)
        else:
            fanout.issued = len(fanout.pending)

    def _row_ok(self, snapshot: StatusSnapshot, fanout: _FanOut, index: int) -> None:
        fanout.rows[index] = StatusRow(fanout.records[index], "ok", snapshot)
        self._row_done(fanout)

    def _row_failed(self, failure: Failure, fanout: _FanOut, index: int) -> None:
        record = fanout.records[index]
        if failure.check(EdgeDisconnected, EdgeNotConnected):
            fanout.rows[index] = StatusRow(record, "disconnected", record.snapshot)
        elif failure.check(EdgeTimeout):
            fanout.rows[index] = StatusRow(record, "timeout", record.snapshot, "edge_timeout", str(failure.value))
        else:
            fanout.rows[index] = StatusRow(record, "error", record.snapshot, "edge_error", str(failure.value))
        self._row_done(fanout)

    def _row_done(self, fanout: _FanOut) -> None:
        fanout.remaining -= 1
        if fanout.remaining == 0 and not fanout.done:
            fanout.done = True
            if fanout.deadline is not None and fanout.deadline.active():
                fanout.deadline.cancel()
            fanout.result.callback(fanout.finished_rows())

    def _fanout_deadline(self, fanout: _FanOut) -> None:
        fanout.deadline = None
        for index in fanout.pending[: fanout.issued]:
            if fanout.done:
                return
            if fanout.rows[index] is None:
                request = fanout.records[index].status_request
                if request is not None:
                    request.cancel()
        # Slices not yet issued when the deadline hit (a reactor starved
        # for the whole timeout) are timeouts too.
        for index in fanout.pending[fanout.issued :]:
            if fanout.done:
                return
            if fanout.rows[index] is None:
                self._row_failed(
                    Failure(EdgeTimeout(fanout.records[index].edge_id, self.status_timeout_seconds)), fanout, index
                )

    # -- commands --------------------------------------------------------------

    def dispatch(
        self,
        edge_id: str,
        name: str,
        target: str,
        arguments: dict[str, str],
        timeout_seconds: float,
        idempotency_key: str = "",
    ) -> tuple[OperationRecord, Deferred[OperationRecord]]:
        """Send a command; return its operation and a Deferred of its end.

        The same idempotency key for the same edge returns the existing
        operation (and its end) without dispatching again. Raises
        UnknownEdge, EdgeNotConnected or UnknownCommand before anything is
        sent.
        """
        record = self._registry.get(edge_id)
        if idempotency_key:
            existing = record.operations.by_key(idempotency_key)
            if existing is not None:
                return existing, self.wait_for(existing)
        if record.token is None or record.peer is None:
            raise EdgeNotConnected(edge_id)
        if name not in record.command_names:
            raise UnknownCommand(edge_id, name, record.command_names)
        now = self._clock.seconds()
        operation = OperationRecord(
            operation_id=uuid.uuid4().hex,
            edge_id=edge_id,
            name=name,
            target=target,
            arguments=dict(arguments),
            idempotency_key=idempotency_key,
            created_at=now,
            deadline_at=now + timeout_seconds,
        )
        token = record.token
        self._registry.start_operation(operation, token)
        request = pb.EdgeCommandRequest(
            command_id=operation.operation_id,
            name=name,
            target=target,
            arguments=arguments,
            timeout_ms=int(timeout_seconds * 1000),
        )
        d = record.peer.request_command(request, timeout_seconds)
        advance = self._registry.advance_operation
        op_id = operation.operation_id

        def answered(response: pb.EdgeCommandResponse) -> None:
            state = {
                pb.COMMAND_OUTCOME_SUCCEEDED: records.SUCCEEDED,
                pb.COMMAND_OUTCOME_REJECTED: records.REJECTED,
            }.get(response.outcome, records.FAILED)
            reason = response.reason
            if state == records.FAILED and response.outcome != pb.COMMAND_OUTCOME_FAILED and not reason:
                reason = f"edge answered with outcome {enum_name(pb.CommandOutcome, response.outcome)}"
            advance(edge_id, token, op_id, state, reason, dict(response.result))

        def failed(failure: Failure) -> None:
            if failure.check(RequestTimeout):
                advance(edge_id, None, op_id, records.TIMED_OUT, f"no answer within {timeout_seconds:g}s")
            elif failure.check(PeerDisconnected):
                advance(edge_id, None, op_id, records.EDGE_DISCONNECTED, "edge disconnected before answering")
            elif failure.check(RemoteError):
                advance(edge_id, None, op_id, records.FAILED, f"edge error: {failure.value}")
            else:
                self._log.failure("command {name} to {edge_id} failed", failure, name=name, edge_id=edge_id)
                advance(edge_id, None, op_id, records.FAILED, "internal error")

        d.addCallbacks(answered, failed)
        return operation, self.wait_for(operation)

    def wait_for(self, operation: OperationRecord) -> Deferred[OperationRecord]:
        """Fire with ``operation`` once it is finished."""
        if operation.finished:
            return succeed(operation)
        d: Deferred[OperationRecord] = Deferred()
        self._operation_waiters.setdefault(operation.operation_id, (operation, []))[1].append(d)
        return d
