"""What the Control Plane remembers: events, operations and their bounded buffers."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from itertools import chain
from typing import Any, NamedTuple, Optional, Union, cast

import attrs

#: Operation states. ``sent``, ``accepted`` and ``running`` are in flight;
#: the others are terminal.
SENT = "sent"
ACCEPTED = "accepted"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REJECTED = "rejected"
TIMED_OUT = "timed_out"
EDGE_DISCONNECTED = "edge_disconnected"
#: A newer connection of the edge took over while the command was in flight.
SUPERSEDED = "superseded"

TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, REJECTED, TIMED_OUT, EDGE_DISCONNECTED, SUPERSEDED})
#: States an edge's answer can end a command in (also those of a late outcome).
ANSWER_STATES = frozenset({SUCCEEDED, FAILED, REJECTED})
_ORDER = {SENT: 0, ACCEPTED: 1, RUNNING: 2}

_getsizeof = sys.getsizeof
#: What a float or int field of a record costs at most (a boxed number).
_NUMBER_BYTES = 32
#: A history entry's tuple and its time.
_HISTORY_ENTRY_BYTES = 64 + _NUMBER_BYTES


def map_size(values: Mapping[str, str]) -> int:
    """Estimated bytes of a ``str -> str`` map: the dict and every key and value."""
    size = _getsizeof(values)
    for key, value in values.items():
        size += _getsizeof(key) + _getsizeof(value)
    return size


class _EventFields(NamedTuple):
    sequence: int
    fleet_sequence: int
    edge_id: str
    kind: str
    occurred_at: float
    recorded_at: float
    node_id: str
    provider_id: str
    command_id: str
    message: str
    attributes: dict[str, str]
    #: Estimated bytes this record holds (computed once, when it is made).
    size_bytes: int


_new_tuple = tuple.__new__
#: What an empty text, an empty map and the record itself take.
_EMPTY_TEXT_BYTES = _getsizeof("")
_EMPTY_MAP_BYTES = _getsizeof({})
_RECORD_BYTES = _getsizeof(tuple(range(len(_EventFields._fields))))
#: The part of :func:`event_size` that is the same for every event: the
#: record, its three numbers, and its optional texts and map when empty.
_FIXED_EVENT_BYTES = _RECORD_BYTES + 3 * _NUMBER_BYTES + 4 * _EMPTY_TEXT_BYTES + _EMPTY_MAP_BYTES


class EventRecord(_EventFields):
    """One recorded event of one edge.

    Immutable, and as cheap to make as a tuple (it is one: every relayed
    event makes one); its size estimate (:func:`event_size`) is computed
    once, when it is made.
    """

    __slots__ = ()

    def __new__(
        cls,
        sequence: int,
        fleet_sequence: int,
        edge_id: str,
        kind: str,
        occurred_at: float,
        recorded_at: float,
        node_id: str = "",
        provider_id: str = "",
        command_id: str = "",
        message: str = "",
        attributes: Optional[dict[str, str]] = None,
    ) -> EventRecord:
        # event_size, with what most events leave empty not asked for.
        size = _FIXED_EVENT_BYTES + _getsizeof(edge_id) + _getsizeof(kind)
        if node_id:
            size += _getsizeof(node_id) - _EMPTY_TEXT_BYTES
        if provider_id:
            size += _getsizeof(provider_id) - _EMPTY_TEXT_BYTES
        if command_id:
            size += _getsizeof(command_id) - _EMPTY_TEXT_BYTES
        if message:
            size += _getsizeof(message) - _EMPTY_TEXT_BYTES
        if attributes:
            size += map_size(attributes) - _EMPTY_MAP_BYTES
        elif attributes is None:
            attributes = {}
        return _new_tuple(
            cls,
            (
                sequence,
                fleet_sequence,
                edge_id,
                kind,
                occurred_at,
                recorded_at,
                node_id,
                provider_id,
                command_id,
                message,
                attributes,
                size,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"EventRecord(sequence={self.sequence}, fleet_sequence={self.fleet_sequence}, "
            f"edge_id={self.edge_id!r}, kind={self.kind!r})"
        )


def event_size(event: EventRecord) -> int:
    """Estimated bytes of ``event``: the record, its strings and its attributes
    (:attr:`EventRecord.size_bytes` holds it, computed when the record is made).

    Strings that events share (the edge id) are counted in every event, so
    the estimate errs on the high side.
    """
    return (
        _getsizeof(event)
        + 3 * _NUMBER_BYTES
        + _getsizeof(event.edge_id)
        + _getsizeof(event.kind)
        + _getsizeof(event.node_id)
        + _getsizeof(event.provider_id)
        + _getsizeof(event.command_id)
        + _getsizeof(event.message)
        + map_size(event.attributes)
    )


#: What an event buffer keeps of an event (:func:`kept_form`): one plain
#: tuple of its fields, its size, then its attributes' keys and values.
KeptEvent = tuple[Any, ...]
#: The index of the size in a kept event; the attributes follow it.
_KEPT_SIZE = 10
_KEPT_ATTRIBUTES = _KEPT_SIZE + 1


def kept_form(event: EventRecord) -> KeptEvent:
    """What a buffer keeps of ``event``: one plain tuple of its fields (but
    the attributes), its size, then ``key, value, key, value, ...``.

    A record is an instance of a class and holds a dict: the cyclic garbage
    collector walks both in every collection of the generation they are
    in, for as long as they live. A plain tuple of texts and numbers holds
    nothing it could walk, so the collector stops tracking it in its first
    young-generation collection: however many events the buffers keep (up
    to a million with the default limits and 1,000 edges), the older
    generations' collections no longer walk them (one walked 550,000 kept
    records for 265 ms). The attributes are in the same tuple, not one of
    their own: the collector may look at the outer tuple first.
    """
    attributes = event.attributes
    if attributes:
        return (*event[:_KEPT_SIZE], event.size_bytes, *chain.from_iterable(attributes.items()))
    return (*event[:_KEPT_SIZE], event.size_bytes)


def record_of(kept: KeptEvent) -> EventRecord:
    """The record a kept event (:func:`kept_form`) stands for."""
    attributes = (
        dict(zip(kept[_KEPT_ATTRIBUTES::2], kept[_KEPT_ATTRIBUTES + 1 :: 2], strict=True))
        if len(kept) > _KEPT_ATTRIBUTES
        else {}
    )
    return cast(EventRecord, _new_tuple(EventRecord, (*kept[:_KEPT_SIZE], attributes, kept[_KEPT_SIZE])))


#: Slots left empty at the head of an event buffer's list before they are
#: removed in one move (amortized O(1) per dropped event).
_COMPACT_AFTER = 64


class EventBuffer:
    """A bounded, sequence-numbered event buffer.

    Sequences start at 1 and never repeat. The buffer keeps at most
    ``capacity`` events and at most ``byte_budget`` estimated bytes of them
    (the newest event is always kept); beyond either the oldest leave it
    and ``dropped`` counts them (``dropped_by_bytes`` those that left for
    the byte budget).

    It keeps each event in its :func:`kept_form` (out of the garbage
    collector's sight), and :meth:`since` gives records back. Every edge
    has one, and most hold one event (``edge.connected``): the first event
    is kept as itself, and a plain list (not a deque, whose first block
    alone is about 600 bytes) holds them from the second on, oldest first
    from ``_head``.
    """

    __slots__ = ("_events", "_head", "byte_budget", "bytes", "capacity", "dropped", "dropped_by_bytes", "last_sequence")

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        #: None until the first event; then that event alone; from the
        #: second on, the kept events from index ``_head`` on (slots before
        #: it are empty).
        self._events: Union[KeptEvent, list[Optional[KeptEvent]], None] = None
        self._head = 0
        self.last_sequence = 0
        self.dropped = 0
        self.dropped_by_bytes = 0
        #: Estimated bytes of the kept events.
        self.bytes = 0

    def __len__(self) -> int:
        events = self._events
        if events is None:
            return 0
        if isinstance(events, list):
            return len(events) - self._head
        return 1

    @property
    def allocated(self) -> bool:
        """Whether the buffer has made room for more than one event yet (it does on the second)."""
        return type(self._events) is list

    def next_sequence(self) -> int:
        """The sequence the next appended event must carry."""
        return self.last_sequence + 1

    def append(self, event: EventRecord, sequence: int) -> None:
        """Add ``event`` whose sequence (edge or fleet) is ``sequence``."""
        self.append_kept(kept_form(event), sequence)

    def append_kept(self, event: KeptEvent, sequence: int) -> None:
        """Add an event in its :func:`kept_form` (one kept form can be in
        several buffers: an edge's and the fleet's)."""
        kept = self._events
        self.bytes += event[_KEPT_SIZE]
        self.last_sequence = sequence
        if kept is None:
            self._events = event
            if self.capacity < 1:
                self._drop_oldest()
            return
        if isinstance(kept, list):
            events = kept
        else:
            events = [kept]
            self._events = events
            self._head = 0
        events.append(event)
        if len(events) - self._head > self.capacity:
            self._drop_oldest()
        while self.bytes > self.byte_budget and len(events) - self._head > 1:
            self._drop_oldest()
            self.dropped_by_bytes += 1
        if self._head >= _COMPACT_AFTER and 2 * self._head >= len(events):
            del events[: self._head]
            self._head = 0

    def _drop_oldest(self) -> None:
        kept = self._events
        assert kept is not None
        if isinstance(kept, list):
            events = kept
            oldest = events[self._head]
            events[self._head] = None
            self._head += 1
        else:
            oldest = kept
            self._events = None
        assert oldest is not None
        self.bytes -= oldest[_KEPT_SIZE]
        self.dropped += 1

    @property
    def first_sequence(self) -> int:
        """The oldest sequence still kept (``last_sequence + 1`` when empty)."""
        return self.last_sequence - len(self) + 1

    def since(self, sequence: int, limit: int) -> list[EventRecord]:
        """Up to ``limit`` events with a sequence greater than ``sequence``."""
        events = self._events
        kept = len(self)
        first = self.first_sequence
        start = max(sequence + 1, first) - first
        if events is None or start >= kept or limit <= 0:
            return []
        if not isinstance(events, list):
            return [record_of(events)]
        begin = self._head + start
        # The slots from _head on are all set.
        return [record_of(cast(KeptEvent, event)) for event in events[begin : begin + min(limit, kept - start)]]


@attrs.frozen
class LateOutcome:
    """An edge's answer that arrived after its operation had already ended.

    The operation keeps its terminal state (the Control Plane already told
    its caller); the late answer is kept beside it so nobody is misled.
    """

    state: str  # one of ANSWER_STATES
    reason: str
    result: dict[str, str]
    received_at: float


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

    def advance(self, state: str, at: float, reason: str = "", result: Optional[dict[str, str]] = None) -> bool:
        """Move to ``state`` if that is forward; return whether it moved.

        Terminal states are final, and in-flight states only move forward
        (a late ``accepted`` after ``running`` changes nothing).
        """
        if self.finished:
            return False
        if state not in TERMINAL_STATES and _ORDER.get(state, -1) <= _ORDER[self.state]:
            return False
        self.state = state
        self.updated_at = at
        if reason:
            self.reason = reason
        if result:
            self.result = dict(result)
        if state in TERMINAL_STATES:
            self.finished_at = at
        self.history.append((state, at, reason))
        return True

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

    def note_late_outcome(self, outcome: LateOutcome) -> bool:
        """Keep the first answer that arrived after the end; False if not kept."""
        if not self.finished or self.late_outcome is not None or outcome.state not in ANSWER_STATES:
            return False
        self.late_outcome = outcome
        return True


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
