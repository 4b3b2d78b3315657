"""Commands: every command dispatched to an edge, until it ends, and the one
code that decides an operation's state.

* **Dispatch and idempotency.** A command goes out on the edge's current
  connection as an ``EdgeCommandRequest`` named by its operation id; the
  same idempotency key with the same command is a replay of the existing
  operation, with a different command a conflict.
* **States.** An operation's terminal state comes only from the answer to
  this room's own request on the connection it was sent on, or from its
  own verdicts: ``timed_out`` (its deadline), ``edge_disconnected``,
  ``superseded`` (a newer connection took over), ``failed`` (the Control
  Plane stopped, or, in cluster mode, the replica that sent it died).
  ``command.accepted`` / ``command.started`` relayed on that connection
  move it forward. The rules of each move are the state machine's
  (``operation_states.py``); the registry's operation log records them.
* **Deadlines and late outcomes.** After its deadline a request keeps
  listening (at most :data:`LATE_ANSWERS_PER_CONNECTION` per connection) so
  that a late answer is kept as the operation's late outcome.
* **Routed commands** (cluster mode): a command another replica dispatched
  for an edge connected here is sent on the local connection by this room
  too (:meth:`CommandDispatch.run_routed`), so one room sends every command;
  its operation stays the dispatcher's.

:class:`CommandDispatch` is one room of the
:class:`~twisted_iop.controlplane.requests.gateway.EdgeGateway`.
"""

from __future__ import annotations

import uuid
from typing import Optional

import attrs
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests.errors import SHUTTING_DOWN_REASON, ShuttingDown
from twisted_iop.controlplane.requests.operation_states import (
    ACCEPTED,
    EDGE_DISCONNECTED,
    FAILED,
    REJECTED,
    RUNNING,
    SUCCEEDED,
    TIMED_OUT,
)
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_name
from twisted_iop.wire.peer import PeerDisconnected, RemoteError

#: Commands past their deadline whose late answer one connection may still
#: deliver; beyond this the oldest stops listening.
LATE_ANSWERS_PER_CONNECTION = 64
#: Why a command ended when a newer connection took over.
SUPERSEDED_REASON = "a newer connection of this edge took over before the answer"
DISCONNECTED_REASON = "edge disconnected before answering"
#: A routed command is run at most this long past its own deadline (so a
#: late answer still reaches the replica that sent it).
ROUTED_GRACE_SECONDS = 60.0

_OUTCOME_STATES = {
    pb.COMMAND_OUTCOME_SUCCEEDED: SUCCEEDED,
    pb.COMMAND_OUTCOME_REJECTED: REJECTED,
    pb.COMMAND_OUTCOME_FAILED: FAILED,
}
_EVENT_STATES = {"command.accepted": ACCEPTED, "command.started": RUNNING}


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


@attrs.frozen
class Dispatched:
    """What :meth:`CommandDispatch.dispatch` returns."""

    operation: OperationRecord
    #: Fires with the operation once it is finished.
    ended: Deferred[OperationRecord]
    #: True when the idempotency key named an existing operation.
    replayed: bool


@attrs.define(eq=False)
class _Command:
    """A dispatched command this room still listens for."""

    operation: OperationRecord
    token: int
    timeout_seconds: float
    request: Optional[Deferred[pb.EdgeCommandResponse]] = None
    timer: Optional[IDelayedCall] = None
    #: Set when this room itself stopped listening (cancelled the request).
    abandoned: bool = False


class CommandDispatch:
    """The commands in flight, who waits for them, and their operations' states."""

    _log = Logger()

    def __init__(self, registry: EdgeRegistry, clock: IReactorTime) -> None:
        self._registry = registry
        #: Where each decided move is applied and recorded.
        self._operations = registry.operations
        self._clock = clock
        #: Operation id -> the command still listened for.
        self._commands: dict[str, _Command] = {}
        #: Connection token -> operation ids listened for on it (in dispatch order).
        self._by_token: dict[int, dict[str, None]] = {}
        #: Connection token -> operation ids past their deadline, oldest first.
        self._late_by_token: dict[int, dict[str, None]] = {}
        #: Operation id -> callers waiting for its end.
        self._waiters: dict[str, list[Deferred[OperationRecord]]] = {}
        #: For /metrics: one observation per command this room dispatched,
        #: and those operations by terminal state.
        self.seconds = LatencyHistogram()
        self.ended: dict[str, int] = {}

    def in_flight(self) -> int:
        """Commands not yet ended (not counting those only listened for past their deadline)."""
        return len(self._commands) - sum(len(ids) for ids in self._late_by_token.values())

    def waiting_callers(self) -> int:
        """Operations some caller waits for."""
        return len(self._waiters)

    def tokens(self) -> set[int]:
        """The connections something is tracked for: a command listened for, in time or late."""
        return (
            {command.token for command in self._commands.values()} | self._by_token.keys() | self._late_by_token.keys()
        )

    # -- dispatching -------------------------------------------------------------

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
        """Send a command; return its operation and a Deferred of its end
        (see :meth:`~twisted_iop.controlplane.requests.gateway.EdgeGateway.dispatch`)."""
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
        self._operations.start_operation(operation)
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

    def run_routed(self, edge_id: str, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command another replica dispatched on this replica's
        connection of ``edge_id``; fire with the edge's answer.

        Its operation is the dispatcher's (which decides its state from
        this answer): nothing here changes it. The request is given up
        :data:`ROUTED_GRACE_SECONDS` after its own deadline. Fails with
        EdgeNotConnected if the edge has no connection here.
        """
        record = self._registry.find(edge_id)
        if record is None or record.peer is None:
            return fail(EdgeNotConnected(edge_id))
        d = record.peer.request_command(request)
        d.addTimeout(request.timeout_ms / 1000.0 + ROUTED_GRACE_SECONDS, self._clock)
        return d

    # -- answers, failures, deadlines ---------------------------------------------------

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
        state = _OUTCOME_STATES.get(response.outcome, FAILED)
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
                self._finish(operation, EDGE_DISCONNECTED, DISCONNECTED_REASON)
        elif failure.check(RemoteError):
            self._settle(operation, FAILED, f"edge error: {failure.value}", {})
        else:
            self._log.failure(
                "command {name} to {edge_id} failed", failure, name=operation.name, edge_id=operation.edge_id
            )
            if not operation.finished:
                self._finish(operation, FAILED, "internal error")

    def _settle(self, operation: OperationRecord, state: str, reason: str, result: dict[str, str]) -> None:
        """The edge's own answer: the end, or the late outcome of an ended operation."""
        if operation.finished:
            self._operations.record_late_outcome(operation.edge_id, operation.operation_id, state, reason, result)
        else:
            self._finish(operation, state, reason, result)

    def _command_deadline(self, command: _Command) -> None:
        command.timer = None
        operation = command.operation
        if operation.finished:
            return
        self._finish(operation, TIMED_OUT, f"no answer within {command.timeout_seconds:g}s")
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
        """End one of this room's own operations: recorded, counted, its callers told."""
        self._operations.advance_operation(operation.edge_id, operation.operation_id, state, reason, result)
        self.ended[state] = self.ended.get(state, 0) + 1  # metrics
        self.seconds.observe(self._clock.seconds() - operation.created_at)  # metrics
        self._wake(operation)

    def _wake(self, operation: OperationRecord) -> None:
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

    # -- what the registry and the cluster tell this room ------------------------------------

    def connection_ended(self, token: int, state: str, reason: str) -> None:
        """The connection ``token`` was superseded or closed: what is still
        in flight on it ends ``state`` (superseded, edge_disconnected)."""
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
        """``command.accepted`` / ``command.started`` advance their own command:
        only on the connection it was sent on, only for an operation of the
        relaying edge, and never to a terminal state."""
        state = _EVENT_STATES.get(event.kind)
        if state is None:
            return
        command = self._commands.get(event.command_id)
        if command is None or command.token != token or command.operation.edge_id != edge_id:
            return
        if not command.operation.finished:
            self._operations.advance_operation(edge_id, command.operation.operation_id, state)

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
            self._wake(operation)

    def end_orphaned(self, replica: str, reason: str) -> int:
        """Operations ``replica`` dispatched and never saw end (it died): each
        ends ``failed`` with ``reason``; return how many ended.

        Their answers went to the dead replica; no one else could ever
        record them. The one case where this room ends an operation it did
        not dispatch: its dispatcher is gone. Callers here waiting for one
        (a replayed idempotency key) get its end; the metrics, which count
        this replica's own commands, do not.
        """
        ended = 0
        for record in list(self._registry.edges()):
            for operation in list(record.operations_kept or ()):
                if (
                    operation.replica == replica
                    and not operation.finished
                    and self._operations.advance_operation(record.edge_id, operation.operation_id, FAILED, reason)
                ):
                    ended += 1
                    self._wake(operation)
        return ended

    def shut_down(self) -> None:
        """End every command now: ``failed`` with :data:`SHUTTING_DOWN_REASON`
        (a late answer can no longer arrive); callers still waiting for an
        operation that is not this room's hear ShuttingDown."""
        for command in list(self._commands.values()):
            self._forget(command)
            if not command.operation.finished:
                self._finish(command.operation, FAILED, SHUTTING_DOWN_REASON)
            self._abandon(command)
        waiters, self._waiters = list(self._waiters.values()), {}
        for ds in waiters:
            for d in ds:
                d.errback(ShuttingDown())
