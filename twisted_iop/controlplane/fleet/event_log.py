"""The event log: what happened to every edge, numbered and bounded.

:class:`EventLog` owns the fleet's event buffer, the numbering of events
(per edge and for the fleet), the listeners that hear every event as it
is recorded, the events an edge relays (checked: its own sequence, the
kinds only the Control Plane may record), and in cluster mode the hand-off
of each event to the shared store, which numbers it instead.

Each edge's buffer (:class:`EdgeEvents`) lives on its record in the
registry and carries what the log knows of that edge's own numbering.
No I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Optional, Protocol, Union, Unpack

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.event_record import (
    EVENT_FIELDS,
    NO_ATTRIBUTES,
    EventRecord,
    EventTexts,
    FieldKind,
    fields_of,
    new_record,
)
from twisted_iop.controlplane.fleet.memory import KEPT_SIZE_INDEX, KeptEvent, RegistryLimits, kept_form, record_of
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.wire import control_pb2 as pb

#: 9999-12-31T23:59:59.999Z, the last instant ISO 8601 views can show.
MAX_TIME_MS = 253_402_300_799_999

#: Event kind prefixes only the Control Plane records; an edge may not send them.
RESERVED_KIND_PREFIXES = ("operation.", "edge.", "rollout.")
#: At most one ``edge.protocol_violation`` event per edge in this many seconds.
PROTOCOL_VIOLATION_INTERVAL_SECONDS = 60.0
#: How much of an offending event kind is quoted in events and logs.
QUOTED_KIND_CHARS = 80

#: Slots left empty at the head of an event buffer's list before they are
#: removed in one move (amortized O(1) per dropped event).
_COMPACT_AFTER = 64

#: Hears every event recorded, with its estimated bytes (:func:`memory.event_size`,
#: computed once, when the event is kept).
EventListener = Callable[[EventRecord, int], None]


class EventBuffer:
    """A bounded, sequence-numbered event buffer.

    Sequences start at 1 and never repeat. The buffer keeps at most
    ``capacity`` events and at most ``byte_budget`` estimated bytes of them
    (the newest event is always kept); beyond either the oldest leave it
    and ``dropped`` counts them (``dropped_by_bytes`` those that left for
    the byte budget). Events are kept in their kept form
    (:func:`memory.kept_form`) and read back as records.

    Until its second event the buffer holds a tuple (empty, or of the one
    event), from then on a list. Most edges keep one event
    (``edge.connected``), and a tuple of kept events leaves the garbage
    collector's sight as they do, where a list is one more object it walks
    in every collection, for every edge: with lists, a 10,000-edge Control
    Plane tracks 154,000 objects instead of 144,000, and its full
    collections take 27 ms instead of 24 (``bench/gateway_inprocess.py``);
    a tuple of one is also 16 bytes smaller than a list of one.
    """

    __slots__ = ("_events", "_head", "byte_budget", "bytes", "capacity", "dropped", "dropped_by_bytes", "last_sequence")

    def __init__(self, capacity: int, byte_budget: int) -> None:
        self.capacity = capacity
        self.byte_budget = byte_budget
        #: The kept events from index ``_head`` on, oldest first (the slots
        #: before it are empty): a tuple of at most one event, then a list.
        self._events: Union[tuple[KeptEvent, ...], list[Optional[KeptEvent]]] = ()
        self._head = 0
        self.last_sequence = 0
        self.dropped = 0
        self.dropped_by_bytes = 0
        #: Estimated bytes of the kept events.
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._events) - self._head

    def append(self, event: EventRecord, sequence: int) -> None:
        """Add ``event`` whose sequence (edge or fleet) is ``sequence``."""
        self.append_kept(kept_form(event), sequence)

    def append_kept(self, kept: KeptEvent, sequence: int) -> None:
        """Add an event in its kept form (one kept form can be in several
        buffers: an edge's and the fleet's)."""
        self.bytes += kept[KEPT_SIZE_INDEX]
        self.last_sequence = sequence
        held = self._events
        if isinstance(held, tuple):
            if not held and self.capacity >= 1:
                self._events = (kept,)
                return
            events: list[Optional[KeptEvent]] = [*held, kept]
            self._events = events
        else:
            events = held
            events.append(kept)
        if len(events) - self._head > self.capacity:
            self._drop_oldest(events)
        while self.bytes > self.byte_budget and len(events) - self._head > 1:
            self._drop_oldest(events)
            self.dropped_by_bytes += 1
        if self._head >= _COMPACT_AFTER and 2 * self._head >= len(events):
            del events[: self._head]
            self._head = 0

    def _drop_oldest(self, events: list[Optional[KeptEvent]]) -> None:
        oldest = events[self._head]
        assert oldest is not None
        events[self._head] = None
        self._head += 1
        self.bytes -= oldest[KEPT_SIZE_INDEX]
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
        if start >= kept or limit <= 0:
            return []
        begin = self._head + start
        # The slots from _head on are all set.
        return [record_of(event) for event in events[begin : begin + min(limit, kept - start)] if event is not None]


class EdgeEvents(EventBuffer):
    """One edge's events, and what the log knows of the edge's own numbering."""

    __slots__ = ("last_edge_sequence", "violation_logged_token", "violation_reported_at", "violations_unreported")

    def __init__(self, capacity: int, byte_budget: int) -> None:
        super().__init__(capacity, byte_budget)
        #: The newest ``edge_sequence`` relayed by this edge (0: none yet).
        self.last_edge_sequence = 0
        #: Events dropped for a reserved kind since the last protocol_violation event.
        self.violations_unreported = 0
        self.violation_reported_at: Optional[float] = None
        #: The connection whose violation was logged (one warning per connection).
        self.violation_logged_token: Optional[int] = None


class EventSink(Protocol):
    """Where every numbered event goes besides the buffers: the store
    (:class:`~twisted_iop.controlplane.store.interface.Store`)."""

    def event_kept(self, event: EventRecord, size: int) -> None:
        """An event was numbered and kept; ``size`` is its estimated bytes."""


class EventJournal(Protocol):
    """Where the log sends events in cluster mode: the shared store numbers
    them, and they come back to every replica through :meth:`EventLog.apply`."""

    def append(
        self,
        event: EventRecord,
        token: Optional[int],
        change: dict[str, object],
        operation: Optional[OperationRecord],
    ) -> None:
        """Record ``event`` (fenced by ``token`` when a connection caused it)."""


#: The texts an edge's ``EdgeEvent`` carries into the record: every text
#: of the declaration that ``EdgeEvent`` has too (but the edge id, which
#: is the connection's), read in one call.
_EDGE_ID = EventRecord._fields.index("edge_id")
_RELAYED_TEXTS = tuple(
    (i, name)
    for i, name in fields_of(FieldKind.TEXT, FieldKind.OPTIONAL_TEXT)
    if name in pb.EdgeEvent.DESCRIPTOR.fields_by_name and i != _EDGE_ID
)
_read_relayed = attrgetter(*(name for _, name in _RELAYED_TEXTS))
_RELAYED_LIMITS = tuple(bounds.EVENT_TEXT_LIMITS.get(name, bounds.MAX_EVENT_ID) for _, name in _RELAYED_TEXTS)


def _relayed_plan() -> tuple[int, ...]:
    """Where each field of a relayed record comes from, in the tuple
    ``(sequence, fleet_sequence, "", edge_id, occurred_at, recorded_at,
    attributes, *texts)``."""
    sources = {"sequence": 0, "fleet_sequence": 1, "edge_id": 3, "occurred_at": 4, "recorded_at": 5, "attributes": 6}
    sources.update({name: 7 + n for n, (_, name) in enumerate(_RELAYED_TEXTS)})
    plan = []
    for name, kind in EVENT_FIELDS:
        if name in sources:
            plan.append(sources[name])
        else:
            # Neither the connection nor the EdgeEvent has it: left empty.
            assert kind in (FieldKind.TEXT, FieldKind.OPTIONAL_TEXT), name
            plan.append(2)
    return tuple(plan)


#: Builds a relayed record's fields in one call (``operator.itemgetter``).
_assemble_relayed = itemgetter(*_relayed_plan())


Clip = Callable[[pb.EdgeEvent, tuple[str, ...], tuple[int, ...]], tuple[tuple[str, ...], dict[str, str]]]


def relayed_record(
    edge_id: str,
    event: pb.EdgeEvent,
    now: float,
    sequence: int = 0,
    fleet_sequence: int = 0,
    clip: Clip = bounds.clip_event,
) -> EventRecord:
    """The record of an event ``edge_id`` relayed at ``now``, with the
    sequences given (0: numbered later).

    Never stored whole: over-long texts are cut, extra attributes dropped,
    and the event says so (attribute ``truncated: "true"``). An Edge's
    clock is its own: a time outside the calendar (or none) is recorded as
    the time the event arrived.
    """
    texts, attributes = clip(event, _read_relayed(event), _RELAYED_LIMITS)
    occurred_ms = event.occurred_at_ms
    occurred_at = occurred_ms / 1000.0 if 0 < occurred_ms < MAX_TIME_MS else now
    # record_from, inline: this runs for every relayed event.
    return new_record(
        EventRecord,
        _assemble_relayed(
            (sequence, fleet_sequence, "", edge_id, occurred_at, now, attributes or NO_ATTRIBUTES, *texts)
        ),
    )


class EventLog:
    """Every event recorded: the fleet's buffer, numbering and listeners."""

    _log = Logger()

    def __init__(self, clock: IReactorTime, limits: RegistryLimits) -> None:
        self._clock = clock
        self._limits = limits
        self.fleet = EventBuffer(limits.fleet_events, limits.fleet_event_bytes)
        self._listeners: list[EventListener] = []
        #: Cluster mode: the shared store that numbers and keeps the events.
        self.journal: Optional[EventJournal] = None
        #: The store that keeps every numbered event across restarts (None: none).
        self.sink: Optional[EventSink] = None

    def edge_buffer(self) -> EdgeEvents:
        """A new edge's event buffer, at the limits."""
        return EdgeEvents(self._limits.events_per_edge, self._limits.event_bytes_per_edge)

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` with every event recorded from now on."""
        self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        """Stop calling ``listener``."""
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _notify(self, event: EventRecord, size: int) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(event, size)
            except Exception:
                self._log.failure("event listener failed")

    def record(
        self,
        edge_id: str,
        events: EdgeEvents,
        kind: str,
        *,
        occurred_at: Optional[float] = None,
        token: Optional[int] = None,
        change: Optional[dict[str, object]] = None,
        operation: Optional[OperationRecord] = None,
        **texts: Unpack[EventTexts],
    ) -> EventRecord:
        """Append an event of the Control Plane's own to the edge's buffer and the fleet's.

        In cluster mode the event goes to the journal instead (fenced by
        ``token`` when a connection caused it, with the ``change`` or the
        ``operation`` it stands for) and is appended when the fleet stream
        brings it back numbered; the record returned has sequence 0.
        """
        now = self._clock.seconds()
        if occurred_at is None:
            occurred_at = now
        journal = self.journal
        if journal is not None:
            event = EventRecord(0, 0, edge_id, kind, occurred_at, now, **texts)
            journal.append(event, token, change or {"kind": "event"}, operation)
            return event
        # Numbered as it is made.
        event = EventRecord(
            events.last_sequence + 1, self.fleet.last_sequence + 1, edge_id, kind, occurred_at, now, **texts
        )
        self._keep(event, events)
        return event

    def _keep(self, event: EventRecord, events: EdgeEvents) -> None:
        """Append a numbered event to both buffers (one kept form) and tell the listeners."""
        kept = kept_form(event)
        events.append_kept(kept, event.sequence)
        self.fleet.append_kept(kept, event.fleet_sequence)
        size = kept[KEPT_SIZE_INDEX]
        sink = self.sink
        if sink is not None:
            sink.event_kept(event, size)
        self._notify(event, size)

    def relayed(self, edge_id: str, events: EdgeEvents, token: int, event: pb.EdgeEvent) -> Optional[EventRecord]:
        """Record an event an edge relayed on its current connection ``token``
        (:func:`relayed_record`); None if refused (a kind only the Control
        Plane records)."""
        now = self._clock.seconds()
        self._check_edge_sequence(edge_id, events, event.edge_sequence, token)
        journal = self.journal
        # Numbered as it is made (the store numbers it in cluster mode).
        record = (
            relayed_record(edge_id, event, now, events.last_sequence + 1, self.fleet.last_sequence + 1)
            if journal is None
            else relayed_record(edge_id, event, now)
        )
        if record.kind.startswith(RESERVED_KIND_PREFIXES):
            # The kind as sent (the clipped one may end in "...").
            self._protocol_violation(edge_id, events, token, event.kind, now)
            return None
        if journal is not None:
            journal.append(record, token, {"kind": "relayed", "edge_sequence": event.edge_sequence}, None)
        else:
            self._keep(record, events)
        return record

    def apply(self, event: EventRecord, events: Optional[EdgeEvents], fleet: bool = True, notify: bool = True) -> bool:
        """Append an event numbered by the shared store (cluster mode); True
        if it was new to the fleet buffer (listeners then hear it).

        Events already kept (by sequence) are skipped, so reading a stretch
        of the stream twice changes nothing.
        """
        kept = kept_form(event)
        if events is not None and event.sequence > events.last_sequence:
            events.append_kept(kept, event.sequence)
        if not fleet or event.fleet_sequence <= self.fleet.last_sequence:
            return False
        self.fleet.append_kept(kept, event.fleet_sequence)
        if notify:
            self._notify(event, kept[KEPT_SIZE_INDEX])
        return True

    def _protocol_violation(self, edge_id: str, events: EdgeEvents, token: int, kind: str, now: float) -> None:
        """Count a refused event; say so in one rate-limited event and one warning."""
        quoted = kind[:QUOTED_KIND_CHARS]
        events.violations_unreported += 1
        if events.violation_logged_token != token:
            events.violation_logged_token = token
            self._log.warn(
                "edge {edge_id} sent an event of kind {kind!r}, which only the Control Plane records; "
                "dropped (further ones are counted, not logged)",
                edge_id=edge_id,
                kind=quoted,
            )
        last = events.violation_reported_at
        if last is not None and now - last < PROTOCOL_VIOLATION_INTERVAL_SECONDS:
            return
        dropped, events.violations_unreported = events.violations_unreported, 0
        events.violation_reported_at = now
        self.record(
            edge_id,
            events,
            "edge.protocol_violation",
            message=f"dropped {dropped} event(s) of kinds reserved for the Control Plane (operation.*, edge.*, rollout.*)",
            attributes={"kind": quoted, "dropped": str(dropped)},
            token=token,
        )

    def _check_edge_sequence(self, edge_id: str, events: EdgeEvents, sequence: int, token: int) -> None:
        """Record ``edge.events_lost`` when the edge's own sequence skips.

        Events written to a connection that dies before they are read are
        lost on the wire; the Edge numbers its events, so the gap shows here
        (also across reconnects). A lower number means the Edge restarted.
        """
        last = events.last_edge_sequence
        if sequence <= 0:
            return
        events.last_edge_sequence = sequence
        if last and sequence > last + 1:
            missing = sequence - last - 1
            self.record(
                edge_id,
                events,
                "edge.events_lost",
                message=f"{missing} events from the edge never arrived (edge sequences {last + 1}-{sequence - 1})",
                attributes={
                    "count": str(missing),
                    "first_edge_sequence": str(last + 1),
                    "last_edge_sequence": str(sequence - 1),
                },
                token=token,
            )
