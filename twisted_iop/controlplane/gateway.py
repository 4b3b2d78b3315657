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
from twisted.internet.defer import Deferred, DeferredList, fail, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane import records
from twisted_iop.controlplane.records import Operation
from twisted_iop.controlplane.registry import (
    EdgeNotConnected,
    EdgeRecord,
    EdgeRegistry,
    StatusSnapshot,
)
from twisted_iop.wire import control_pb2 as pb
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


@attrs.frozen
class StatusRow:
    """One edge's line in a fleet status: a fresh snapshot or why not."""

    record: EdgeRecord
    state: str  # ok, timeout, error, disconnected
    snapshot: Optional[StatusSnapshot]
    error_code: str = ""
    error_message: str = ""


def _translate(edge_id: str, seconds: float, failure: Failure) -> Failure:
    if failure.check(RequestTimeout):
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
        self._operation_waiters: dict[str, tuple[Operation, list[Deferred[Operation]]]] = {}
        registry.add_listener(self._operation_changed)

    def _operation_changed(self, event: records.Event) -> None:
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

    def _status_of(self, record: EdgeRecord) -> Deferred[StatusSnapshot]:
        if record.token is None or record.peer is None:
            return fail(EdgeNotConnected(record.edge_id))
        waiter: Deferred[StatusSnapshot] = Deferred()
        if record.status_waiters is not None:
            record.status_waiters.append(waiter)
            return waiter
        waiters = record.status_waiters = [waiter]
        token = record.token
        seconds = self.status_timeout_seconds
        edge_id = record.edge_id

        def answered(response: pb.EdgeStatusResponse) -> None:
            snapshot = self._registry.record_status(edge_id, token, response)
            if snapshot is None:
                # The connection was superseded while we waited.
                deliver(Failure(EdgeDisconnected(edge_id)))
            else:
                deliver(snapshot)

        def deliver(outcome: StatusSnapshot | Failure) -> None:
            if record.status_waiters is waiters:
                record.status_waiters = None
            for w in waiters:
                if isinstance(outcome, Failure):
                    w.errback(outcome)
                else:
                    w.callback(outcome)

        d = record.peer.request_status(seconds)
        d.addCallbacks(answered, lambda f: deliver(_translate(edge_id, seconds, f)))
        return waiter

    def fleet_status(self) -> Deferred[list[StatusRow]]:
        """A status row for every known edge, asked of all at once.

        One slow or failing edge marks only its own row.
        """
        records_ = sorted(self._registry.edges(), key=lambda r: r.edge_id)
        rows: list[Optional[StatusRow]] = [None] * len(records_)
        waits: list[Deferred[None]] = []
        for index, record in enumerate(records_):
            if record.token is None:
                rows[index] = StatusRow(record, "disconnected", record.snapshot)
                continue

            def ok(snapshot: StatusSnapshot, index: int = index, record: EdgeRecord = record) -> None:
                rows[index] = StatusRow(record, "ok", snapshot)

            def bad(failure: Failure, index: int = index, record: EdgeRecord = record) -> None:
                if failure.check(EdgeTimeout):
                    code = "edge_timeout"
                elif failure.check(EdgeDisconnected, EdgeNotConnected):
                    rows[index] = StatusRow(record, "disconnected", record.snapshot)
                    return
                else:
                    code = "edge_error"
                rows[index] = StatusRow(
                    record,
                    "timeout" if code == "edge_timeout" else "error",
                    record.snapshot,
                    code,
                    str(failure.value),
                )

            waits.append(self._status_of(record).addCallbacks(ok, bad))
        if not waits:
            return succeed([r for r in rows if r is not None])
        done = DeferredList(waits, consumeErrors=True)
        return done.addCallback(lambda _: [r for r in rows if r is not None])

    # -- commands --------------------------------------------------------------

    def dispatch(
        self,
        edge_id: str,
        name: str,
        target: str,
        arguments: dict[str, str],
        timeout_seconds: float,
        idempotency_key: str = "",
    ) -> tuple[Operation, Deferred[Operation]]:
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
        operation = Operation(
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
            if response.outcome == pb.COMMAND_OUTCOME_UNSPECIFIED and not reason:
                reason = "edge answered without an outcome"
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

    def wait_for(self, operation: Operation) -> Deferred[Operation]:
        """Fire with ``operation`` once it is finished."""
        if operation.finished:
            return succeed(operation)
        d: Deferred[Operation] = Deferred()
        self._operation_waiters.setdefault(operation.operation_id, (operation, []))[1].append(d)
        return d
