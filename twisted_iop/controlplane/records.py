"""What the Control Plane remembers: events and their bounded buffers (operations: operations.py)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from itertools import chain
from typing import Any, NamedTuple, Optional, Union, cast

_getsizeof = sys.getsizeof
#: What a float or int field of a record costs at most (a boxed number).
_NUMBER_BYTES = 32


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
