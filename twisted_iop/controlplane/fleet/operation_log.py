"""Every edge's operations as the Control Plane keeps them: each dispatch and
each change the gateway's command room decides, kept in the edge's buffer,
stored, and recorded as an ``operation.*`` event filed under the node it
targets. No I/O.

The records and their buffers are :mod:`~twisted_iop.controlplane.fleet.operations`;
how an operation's state may change is the state machine's
(:mod:`~twisted_iop.controlplane.requests.operation_states`). The edges
themselves are the :class:`~twisted_iop.controlplane.fleet.registry.EdgeRegistry`'s,
which owns this log (``registry.operations``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional, Protocol

from twisted.internet.interfaces import IReactorTime

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.event_log import EventLog
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.requests.operation_states import LateOutcome


class KeptOperations(Protocol):
    """Where a changed operation is kept across restarts: the store
    (:class:`~twisted_iop.controlplane.store.interface.Store`)."""

    def operation_changed(self, operation: OperationRecord) -> None:
        """An operation was created or changed."""


class KnownEdges(Protocol):
    """The edges whose operations are kept (the registry)."""

    def get(self, edge_id: str) -> EdgeRecord:
        """The record of ``edge_id``; raises :class:`UnknownEdge`."""

    def find(self, edge_id: str) -> Optional[EdgeRecord]:
        """The record of ``edge_id``, or None."""

    def edges(self) -> Iterable[EdgeRecord]:
        """Every known edge."""

    def operation_ended(self, record: EdgeRecord) -> None:
        """An operation of ``record`` reached a terminal state."""


class OperationLog:
    """The operations of every edge: kept, moved as decided, stored and recorded as events."""

    def __init__(self, clock: IReactorTime, event_log: EventLog, edges: KnownEdges) -> None:
        self._clock = clock
        self._event_log = event_log
        self._edges = edges
        #: The store that keeps operations across restarts (None: none).
        self.store: Optional[KeptOperations] = None

    def start_operation(self, operation: OperationRecord) -> None:
        """Keep a just-dispatched operation (state ``sent``); raises
        :class:`~twisted_iop.controlplane.fleet.edge_record.UnknownEdge`."""
        record = self._edges.get(operation.edge_id)
        operation_states.begin(operation)
        record.operations.add(operation)
        self._operation_event(record, operation)

    def get(self, edge_id: str, operation_id: str) -> Optional[OperationRecord]:
        """The kept operation ``operation_id`` of ``edge_id``, or None."""
        record = self._edges.find(edge_id)
        return None if record is None else record.operations.get(operation_id)

    def advance_operation(
        self,
        edge_id: str,
        operation_id: str,
        state: str,
        reason: str = "",
        result: Optional[dict[str, str]] = None,
    ) -> bool:
        """Move an operation forward; False if it is unknown or did not move.

        Operation states are the Control Plane's own record: only the
        gateway calls this, from its own requests' outcomes.
        """
        record = self._edges.find(edge_id)
        if record is None:
            return False
        operation = record.operations.get(operation_id)
        if operation is None:
            return False
        kept_result = None if result is None else bounds.clip_result(result)
        if not operation.advance(state, self._clock.seconds(), bounds.clip_reason(reason), kept_result):
            return False
        self._operation_event(record, operation)
        record.operations.operation_changed(operation)
        if operation.finished:
            self._edges.operation_ended(record)
        return True

    def record_late_outcome(
        self, edge_id: str, operation_id: str, state: str, reason: str, result: dict[str, str]
    ) -> bool:
        """Keep an edge's answer that came after the operation ended."""
        record = self._edges.find(edge_id)
        operation = None if record is None else record.operations.get(operation_id)
        if record is None or operation is None:
            return False
        now = self._clock.seconds()
        reason = bounds.clip_reason(reason)
        if not operation.note_late_outcome(LateOutcome(state, reason, bounds.clip_result(result), now)):
            return False
        record.operations.operation_changed(operation)
        if self.store is not None:
            self.store.operation_changed(operation)
        self._event_log.record(
            edge_id,
            record.events,
            "operation.late_outcome",
            operation=operation,
            node_id=_node_of(record, operation),
            command_id=operation_id,
            message=f"{operation.name} answered {state} after it ended {operation.state}"
            + (f": {reason}" if reason else ""),
            attributes={
                "name": operation.name,
                "target": operation.target,
                "state": operation.state,
                "late_state": state,
            },
        )
        return True

    def _operation_event(self, record: EdgeRecord, operation: OperationRecord) -> None:
        if self.store is not None:
            self.store.operation_changed(operation)
        self._event_log.record(
            operation.edge_id,
            record.events,
            "operation." + operation.state,
            node_id=_node_of(record, operation),
            command_id=operation.operation_id,
            message=f"{operation.name} {operation.state}" + (f": {operation.reason}" if operation.reason else ""),
            attributes={"name": operation.name, "target": operation.target, "state": operation.state},
            operation=operation,
        )

    def fleet_operations(self) -> list[OperationRecord]:
        """Every kept operation of every edge, newest first."""
        ops = [op for record in self._edges.edges() for op in record.operations_kept or ()]
        ops.sort(key=lambda op: (op.created_at, op.operation_id), reverse=True)
        return ops


def _node_of(record: EdgeRecord, operation: OperationRecord) -> str:
    """The node an operation of ``record`` targets ("" if its command does not target a node).

    A command aimed at a node (or at a provider, ``node_id/provider_id``)
    is filed under that node too, so views and subscribers filtering by
    node see what was done to it.
    """
    kind = next((spec.target_kind for spec in record.hello.commands if spec.name == operation.name), "")
    if kind == "node":
        return operation.target
    if kind == "provider":  # node_id/provider_id: filed under its node
        return operation.target.partition("/")[0]
    return ""
