"""What the Control Plane remembers of the commands it sent: each
operation (:class:`OperationRecord`), the answer that came after its end
(:class:`LateOutcome`), and every edge's bounded buffer of them.

The records hold the facts; how an operation's state may change is the
state machine's (``operation_states.py``): :meth:`OperationRecord.advance`
and :meth:`OperationRecord.note_late_outcome` go through it, and nothing
else writes an operation's state.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Optional

import attrs

from twisted_iop.controlplane.fleet.memory import map_size
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.requests.operation_states import SENT, TERMINAL_STATES, LateOutcome

_getsizeof = sys.getsizeof
#: What a float or int field of a record costs at most (a boxed number; the
#: same estimate as an event's numbers in records.py).
_NUMBER_BYTES = 32
#: A history entry's tuple and its time.
_HISTORY_ENTRY_BYTES = 64 + _NUMBER_BYTES


@attrs.define(eq=False)
class OperationRecord:
    """One command dispatch and everything that happened to it."""

    operation_id: str
    edge_id: str
    name: str
    target: str
    arguments: dict[str, str]
    idempotency_key: str
    created_at: float
    deadline_at: float
    state: str = SENT
    reason: str = ""
    result: dict[str, str] = attrs.field(factory=dict)
    updated_at: float = 0.0
    finished_at: Optional[float] = None
    history: list[tuple[str, float, str]] = attrs.field(factory=list)
    late_outcome: Optional[LateOutcome] = None
    #: The name of the API token that sent the command ("" when access is open).
    requested_by: str = ""
    #: Cluster mode: the replica that dispatched it (the only one that sets
    #: its state, unless that replica dies; "" in memory mode).
    replica: str = ""

    @property
    def finished(self) -> bool:
        """Whether the operation reached a terminal state."""
        return self.state in TERMINAL_STATES

    #: Move to a state if the state machine allows it; whether it moved
    #: (:func:`~twisted_iop.controlplane.requests.operation_states.advance`, the
    #: function itself: no call in between).
    advance = operation_states.advance

    def same_request(self, name: str, target: str, arguments: dict[str, str]) -> bool:
        """Whether a dispatch of ``name``/``target``/``arguments`` repeats this one."""
        return self.name == name and self.target == target and self.arguments == arguments

    def size(self) -> int:
        """Estimated bytes of this operation: its strings, maps, history and late outcome."""
        size = (
            _getsizeof(self)
            + 3 * _NUMBER_BYTES
            + _getsizeof(self.operation_id)
            + _getsizeof(self.edge_id)
            + _getsizeof(self.name)
            + _getsizeof(self.target)
            + _getsizeof(self.idempotency_key)
            + _getsizeof(self.requested_by)
            + _getsizeof(self.replica)
            + _getsizeof(self.state)
            + _getsizeof(self.reason)
            + map_size(self.arguments)
            + map_size(self.result)
            + _getsizeof(self.history)
        )
        for state, _, reason in self.history:
            size += _HISTORY_ENTRY_BYTES + _getsizeof(state) + _getsizeof(reason)
        late = self.late_outcome
        if late is not None:
            size += _getsizeof(late) + _NUMBER_BYTES + _getsizeof(late.state) + _getsizeof(late.reason)
            size += map_size(late.result)
        return size

    #: Keep the first answer that arrived after the end; whether it was kept
    #: (:func:`~twisted_iop.controlplane.requests.operation_states.keep_late_outcome`).
    note_late_outcome = operation_states.keep_late_outcome


class OperationBuffer:
    """A bounded buffer of operations, newest last, with an idempotency index.

    It keeps at most ``capacity`` operations and at most ``byte_budget``
    estimated bytes of them. An operation leaves the buffer (and its
    idempotency key is forgotten) only once it is finished; in-flight
    operations are never evicted, so the buffer may briefly exceed either
    bound by what is in flight. An operation's size is estimated when it is
    added and again when it changes (finished, late outcome).

    Every edge has one and most edges never run a command: its tables are
    created on the first :meth:`add`.
    """

    __slots__ = ("_by_key", "_operations", "_sizes", "byte_budget", "bytes", "capacity", "dropped", "dropped_by_bytes")

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        #: Operations by id (oldest first), their estimated sizes and the
        #: idempotency index; None until the first operation.
        self._operations: Optional[dict[str, OperationRecord]] = None
        self._sizes: Optional[dict[str, int]] = None
        self._by_key: Optional[dict[str, str]] = None
        self.dropped = 0
        self.dropped_by_bytes = 0
        #: Estimated bytes of the kept operations.
        self.bytes = 0

    def __len__(self) -> int:
        return 0 if self._operations is None else len(self._operations)

    def __iter__(self) -> Iterator[OperationRecord]:
        return iter(() if self._operations is None else self._operations.values())

    @property
    def allocated(self) -> bool:
        """Whether the buffer has made room for operations yet (it does on the first)."""
        return self._operations is not None

    def newest_first(self) -> list[OperationRecord]:
        """All kept operations, newest first."""
        return [] if self._operations is None else list(reversed(self._operations.values()))

    def get(self, operation_id: str) -> Optional[OperationRecord]:
        """The operation with ``operation_id``, if kept."""
        return None if self._operations is None else self._operations.get(operation_id)

    def by_key(self, key: str) -> Optional[OperationRecord]:
        """The operation dispatched with idempotency key ``key``, if kept."""
        if self._by_key is None or self._operations is None:
            return None
        operation_id = self._by_key.get(key)
        return None if operation_id is None else self._operations.get(operation_id)

    def add(self, operation: OperationRecord) -> None:
        """Keep ``operation``, evicting the oldest finished ones if over a bound."""
        if self._operations is None:
            self._operations, self._sizes, self._by_key = {}, {}, {}
        assert self._by_key is not None
        self._operations[operation.operation_id] = operation
        if operation.idempotency_key:
            self._by_key[operation.idempotency_key] = operation.operation_id
        self._resize(operation)
        self._evict()

    def _resize(self, operation: OperationRecord) -> None:
        sizes = self._sizes
        assert sizes is not None
        size = operation.size()
        self.bytes += size - sizes.get(operation.operation_id, 0)
        sizes[operation.operation_id] = size

    def _over(self) -> Optional[bool]:
        """None when within bounds, else whether the byte budget is what is exceeded."""
        if len(self) > self.capacity:
            return False
        if self.bytes > self.byte_budget:
            return True
        return None

    def _evict(self) -> None:
        operations, sizes, by_key = self._operations, self._sizes, self._by_key
        if operations is None or sizes is None or by_key is None or self._over() is None:
            return
        for operation_id in list(operations):
            over = self._over()
            if over is None:
                break
            operation = operations[operation_id]
            if not operation.finished:
                continue
            del operations[operation_id]
            self.bytes -= sizes.pop(operation_id)
            if operation.idempotency_key:
                by_key.pop(operation.idempotency_key, None)
            self.dropped += 1
            if over:
                self.dropped_by_bytes += 1

    def operation_changed(self, operation: OperationRecord) -> None:
        """Estimate ``operation`` again (it finished or got a late outcome) and
        evict what was kept only because it was in flight."""
        if self._sizes is not None and operation.operation_id in self._sizes:
            self._resize(operation)
        self._evict()
