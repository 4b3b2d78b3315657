"""What the Control Plane keeps in memory, and the tricks that keep it small.

Every trick that trades plain code for memory lives here, behind plain
names the rest of the code calls; each says what it saves, measured
(docs/performance.md has the runs):

* **Byte budgets and the worst case** (:class:`RegistryLimits`,
  :class:`MemoryBound`, the ``*_size`` estimates): what each edge, its
  events and operations may hold, counted in estimated bytes as they are
  kept; docs/security.md ("Memory") quotes :meth:`RegistryLimits.worst_case`.
* **Kept events** (:func:`kept_form`, :data:`KEPT_SIZE_INDEX`,
  :func:`record_of`): an event buffer keeps each event as one plain tuple
  of texts and numbers, which the cyclic garbage collector stops tracking
  in its first young collection. Kept as records (a class instance and a
  dict each), one older-generation collection walked 550,000 of them for
  265 ms; as plain tuples the collections no longer walk them.
* **Shared values** (:class:`SharedValues`, :class:`SharedTables`): one
  copy of the label maps, hellos, snapshot counts and ``edge.connected``
  attributes that thousands of edges repeat (with the other two tricks,
  2,079 -> 1,982 bytes per edge at 10,000 edges; a label map alone is
  about 1 KiB per edge when each keeps its own).
* **Shared catalogs** (:class:`CatalogCache`): one detached copy of each
  announced command catalog (about 0.6 KiB per command) for every edge
  that announces it.

Nothing here does I/O; shared values are never changed once kept.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import chain
from typing import Any, TypeVar, cast

import attrs

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.event_record import (
    ATTRIBUTES_INDEX,
    EVENT_FIELDS,
    NO_ATTRIBUTES,
    EventRecord,
    FieldKind,
    fields_of,
    record_from,
    values_getter,
)
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import (
    MAX_CATALOG_ARGUMENTS,
    MAX_COMMAND_ARGUMENTS,
    MAX_COMMANDS,
    MAX_LABELS,
    MAX_TEXT,
)
from twisted_iop.wire.settings import PeerSettings

T = TypeVar("T")

_getsizeof = sys.getsizeof

# -- size estimates -------------------------------------------------------------------

#: What a float or int field of a record costs at most (a boxed number).
NUMBER_BYTES = 32


def text_bytes(characters: int) -> int:
    """The most a Python string of ``characters`` characters takes (4 bytes each)."""
    return 80 + 4 * characters


def map_bytes(entries: int, key: int, value: int) -> int:
    """The most a ``str -> str`` map of ``entries`` entries takes."""
    return 64 * entries + 256 + entries * (text_bytes(key) + text_bytes(value))


def map_size(values: Mapping[str, str]) -> int:
    """Estimated bytes of a ``str -> str`` map: the dict and every key and value."""
    size = _getsizeof(values)
    for key, value in values.items():
        size += _getsizeof(key) + _getsizeof(value)
    return size


#: The texts of an event (their sizes are counted one by one) and how many
#: numbers it holds.
_EVENT_TEXTS = tuple(i for i, _ in fields_of(FieldKind.TEXT, FieldKind.OPTIONAL_TEXT))
_event_texts = values_getter(_EVENT_TEXTS)
_EVENT_NUMBERS = len(fields_of(FieldKind.SEQUENCE, FieldKind.TIME))
_EMPTY_MAP_BYTES = _getsizeof({})
#: What every event takes besides its texts and attributes: the record and its numbers.
_FIXED_EVENT_BYTES = _getsizeof(tuple(range(len(EVENT_FIELDS)))) + _EVENT_NUMBERS * NUMBER_BYTES
_EMPTY_TEXT_BYTES = _getsizeof("")
#: An event whose texts are all empty, without its attributes.
_ALL_EMPTY_EVENT_BYTES = _FIXED_EVENT_BYTES + len(_EVENT_TEXTS) * _EMPTY_TEXT_BYTES


def _text_over_empty(text: object) -> int:
    return _getsizeof(text) - _EMPTY_TEXT_BYTES


def event_size(event: EventRecord) -> int:
    """Estimated bytes of ``event``: the record, its numbers, texts and attributes.

    Strings that events share (the edge id) are counted in every event, so
    the estimate errs on the high side.
    """
    attributes = event.attributes
    # Most texts are empty: only the others are measured.
    return (
        _ALL_EMPTY_EVENT_BYTES
        + sum(map(_text_over_empty, filter(None, _event_texts(event))))
        + (map_size(attributes) if attributes else _EMPTY_MAP_BYTES)
    )


#: The most one hello's labels take.
HELLO_LABELS_BYTES = map_bytes(MAX_LABELS, MAX_TEXT, MAX_TEXT)
#: The most one recorded event takes (see :func:`event_size`): every text
#: at its bound, the attributes at theirs.
MAX_EVENT_RECORD_BYTES = (
    256
    + _EVENT_NUMBERS * NUMBER_BYTES
    + (len(_EVENT_TEXTS) - 1) * text_bytes(bounds.MAX_EVENT_ID)
    + text_bytes(bounds.MAX_EVENT_MESSAGE)
    + map_bytes(bounds.MAX_EVENT_ATTRIBUTES + 1, bounds.MAX_KEY, bounds.MAX_ATTRIBUTE_VALUE)
)
_RESULT_BYTES = map_bytes(bounds.MAX_RESULT_ENTRIES + 1, bounds.MAX_KEY, bounds.MAX_RESULT_VALUE)
#: The most one finished operation takes: its texts (arguments as the HTTP
#: view admits them), a history of at most five entries, a result and a
#: late outcome.
MAX_OPERATION_RECORD_BYTES = (
    512
    + 3 * NUMBER_BYTES
    + text_bytes(32)
    + text_bytes(64)
    + 3 * text_bytes(MAX_TEXT)
    + text_bytes(16)
    + text_bytes(64)
    + text_bytes(bounds.MAX_REASON)
    + map_bytes(MAX_COMMAND_ARGUMENTS, MAX_TEXT, bounds.MAX_ARGUMENT_VALUE)
    + _RESULT_BYTES
    + 5 * (256 + text_bytes(16) + text_bytes(bounds.MAX_REASON))
    + 256
    + text_bytes(16)
    + text_bytes(bounds.MAX_REASON)
    + _RESULT_BYTES
)

#: Estimated bytes of one protobuf message (or map entry) in memory,
#: besides its text (measured: about 250 with the upb runtime).
MESSAGE_BYTES = 320
#: Estimated bytes of one element of a repeated string field, besides its text.
REPEATED_BYTES = 32


def catalog_size(commands: Iterable[pb.CommandSpec]) -> int:
    """Estimated bytes of a kept catalog: its messages and twice their wire size."""
    size = 0
    for spec in commands:
        size += MESSAGE_BYTES * (1 + len(spec.arguments)) + 2 * spec.ByteSize()
    return size


def hello_size(hello: EdgeHello) -> int:
    """Estimated bytes of what an edge said (labels, versions, catalog)."""
    return (
        map_size(hello.labels)
        + _getsizeof(hello.software_version)
        + _getsizeof(hello.protocol_version)
        + catalog_size(hello.commands)
    )


#: The largest estimate of :func:`catalog_size` (a hello frame is at most
#: 64 KiB) that the bounds allow, and what the largest snapshot would hold
#: parsed: an upper bound of a kept snapshot, which the registry keeps as
#: its serialized bytes (at most MAX_STATUS_BYTES) and its counts.
MAX_HELLO_FRAME_BYTES = PeerSettings().max_hello_frame_bytes
MAX_CATALOG_BYTES = MESSAGE_BYTES * (MAX_COMMANDS + MAX_CATALOG_ARGUMENTS) + 2 * MAX_HELLO_FRAME_BYTES
MAX_SNAPSHOT_BYTES = (
    MESSAGE_BYTES * (1 + bounds.MAX_STATUS_NODES + bounds.MAX_STATUS_PROVIDERS + bounds.MAX_STATUS_LABELS)
    + REPEATED_BYTES * bounds.MAX_STATUS_MODELS
    + 2 * bounds.MAX_STATUS_BYTES
)


# -- the registry's limits and its worst case --------------------------------------------


@attrs.frozen
class RegistryLimits:
    """Bounds on what the registry keeps in memory (counts and estimated bytes).

    docs/security.md ("Memory") derives the worst case from these.
    """

    events_per_edge: int = 1000
    fleet_events: int = 10000
    operations_per_edge: int = 500
    disconnected_edges: int = 10000
    event_bytes_per_edge: int = 1024 * 1024
    fleet_event_bytes: int = 16 * 1024 * 1024
    operation_bytes_per_edge: int = 1024 * 1024
    #: Estimated bytes of everything kept of disconnected edges together;
    #: beyond it the edge that went away first is forgotten.
    disconnected_bytes: int = 256 * 1024 * 1024

    def worst_case(self) -> MemoryBound:
        """The most estimated bytes the registry keeps under these limits
        (docs/security.md, "Memory", quotes these at the defaults)."""
        per_edge = (
            HELLO_LABELS_BYTES
            + 2 * text_bytes(MAX_TEXT)
            + MAX_CATALOG_BYTES
            + MAX_SNAPSHOT_BYTES
            + max(self.event_bytes_per_edge, MAX_EVENT_RECORD_BYTES)
            + max(self.operation_bytes_per_edge, MAX_OPERATION_RECORD_BYTES)
        )
        return MemoryBound(
            per_connected_edge=per_edge,
            per_disconnected_edge=per_edge,
            disconnected_total=self.disconnected_bytes + per_edge,
            fleet_events=max(self.fleet_event_bytes, MAX_EVENT_RECORD_BYTES),
        )


@attrs.frozen
class MemoryBound:
    """The most estimated bytes the registry keeps, by part."""

    per_connected_edge: int
    per_disconnected_edge: int
    #: Every disconnected edge together (the budget plus the one edge that
    #: may go past it before the oldest is forgotten).
    disconnected_total: int
    fleet_events: int

    def total(self, connected_edges: int) -> int:
        """The whole registry with ``connected_edges`` edges connected."""
        return self.fleet_events + connected_edges * self.per_connected_edge + self.disconnected_total


# -- kept events ----------------------------------------------------------------------

#: What an event buffer keeps of an event (:func:`kept_form`): one plain
#: tuple of its fields but the attributes, its size, then the attributes'
#: keys and values.
KeptEvent = tuple[Any, ...]
#: Where the size is in a kept event; the attributes follow it.
KEPT_SIZE_INDEX = ATTRIBUTES_INDEX
_KEPT_ATTRIBUTES = KEPT_SIZE_INDEX + 1


def kept_form(event: EventRecord) -> KeptEvent:
    """What a buffer keeps of ``event`` (out of the garbage collector's
    sight, see the module docstring), with its :func:`event_size`.

    The attributes are in the same tuple, not one of their own: the
    collector may look at the outer tuple first, and would keep tracking
    it while an inner tuple is still tracked.
    """
    # event_size, inline: this runs for every event recorded.
    attributes = event.attributes
    size = _ALL_EMPTY_EVENT_BYTES + sum(map(_text_over_empty, filter(None, _event_texts(event))))
    if attributes:
        size += map_size(attributes)
        return (*event[:ATTRIBUTES_INDEX], size, *chain.from_iterable(attributes.items()))
    return (*event[:ATTRIBUTES_INDEX], size + _EMPTY_MAP_BYTES)


def record_of(kept: KeptEvent) -> EventRecord:
    """The record a kept event (:func:`kept_form`) stands for."""
    if len(kept) > _KEPT_ATTRIBUTES:
        attributes: Mapping[str, str] = dict(
            zip(kept[_KEPT_ATTRIBUTES::2], kept[_KEPT_ATTRIBUTES + 1 :: 2], strict=True)
        )
    else:
        attributes = NO_ATTRIBUTES
    return record_from((*kept[:KEPT_SIZE_INDEX], attributes))


# -- shared values --------------------------------------------------------------------

#: Distinct values one :class:`SharedValues` table keeps at most by
#: default: a table of snapshot counts (about 180 bytes each) holds about
#: 0.7 MiB.
SHARED_VALUES = 4096
#: Distinct label maps shared, and the largest (estimated bytes,
#: :func:`map_size`) that edges share (a larger one stays the edge's own):
#: the table holds at most 1 MiB of maps, and as much again of their keys.
SHARED_LABEL_MAPS = 1024
SHARED_LABELS_BYTES = 1024
#: Distinct ``edge.connected`` attribute maps (one per software version) shared.
SHARED_ATTRIBUTES = 256
#: Announced catalogs one :class:`CatalogCache` shares at most, and the
#: largest (serialized) it shares: so the cache holds at most 4 MiB of them.
SHARED_CATALOGS = 256
SHARED_CATALOG_BYTES = 16 * 1024


class SharedValues:
    """One copy of each value that many edges repeat, up to a capacity.

    A table hands out the first copy of an equal value (keyed by ``key``,
    the value itself when hashable) and forgets the oldest beyond its
    capacity (edges holding it keep their copy).
    """

    __slots__ = ("_values", "capacity")

    def __init__(self, capacity: int = SHARED_VALUES) -> None:
        self.capacity = capacity
        self._values: dict[Hashable, Any] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: Hashable) -> Any:
        """The kept value whose key is ``key``, or None."""
        return self._values.get(key)

    def shared(self, key: Hashable, value: T) -> T:
        """The kept value equal to ``value`` (whose key is ``key``), or ``value``, now kept."""
        values = self._values
        kept = values.get(key)
        if kept is not None:
            return cast(T, kept)
        if len(values) >= self.capacity:
            del values[next(iter(values))]
        values[key] = value
        return value


class SharedTables:
    """The registry's tables of values many edges repeat, by what they hold."""

    def __init__(self) -> None:
        self._labels = SharedValues(SHARED_LABEL_MAPS)
        self._hellos = SharedValues(SHARED_CATALOGS)
        self._counts = SharedValues()
        self._attributes = SharedValues(SHARED_ATTRIBUTES)

    def hello(self, hello: EdgeHello) -> EdgeHello:
        """``hello`` with its texts interned and its label map shared with
        every edge that announced an equal one (small maps only); with a
        shared map, the hello itself is shared with every edge that said
        the same (same labels, versions and catalog copy).

        A hello is replaced, never edited, and views copy the map or only
        read it.
        """
        # Most hellos of a fleet repeat an earlier one: found by value
        # first, before any text is interned or any size estimated.
        labels_key = frozenset(hello.labels.items())
        kept_labels: dict[str, str] | None = self._labels.get(labels_key)
        if kept_labels is not None:
            key = (id(kept_labels), hello.software_version, hello.protocol_version, id(hello.commands))
            kept: EdgeHello | None = self._hellos.get(key)
            if kept is not None:
                return kept
        labels = {sys.intern(key): sys.intern(value) for key, value in hello.labels.items()}
        software_version = sys.intern(hello.software_version)
        protocol_version = sys.intern(hello.protocol_version)
        if map_size(labels) > SHARED_LABELS_BYTES:
            return attrs.evolve(
                hello, labels=labels, software_version=software_version, protocol_version=protocol_version
            )
        labels = self._labels.shared(labels_key, labels)
        shared_form = attrs.evolve(
            hello, labels=labels, software_version=software_version, protocol_version=protocol_version
        )
        if sum(spec.ByteSize() for spec in hello.commands) > SHARED_CATALOG_BYTES:
            # Only hellos with catalogs as small as the catalog cache shares
            # are kept (so the table holds no more bytes of catalogs than it).
            return shared_form
        # The kept hello holds its map and catalog, so while it is kept no
        # other object can have their ids: equal keys mean the same objects.
        key = (id(labels), software_version, protocol_version, id(hello.commands))
        kept = self._hellos.get(key)
        if kept is not None:
            return kept
        return self._hellos.shared(key, shared_form)

    def counts(self, counts: tuple[int, ...]) -> tuple[int, ...]:
        """One copy of a snapshot's counts for every snapshot with equal ones."""
        return self._counts.shared(counts, counts)

    def connected_attributes(self, software_version: str) -> Mapping[str, str]:
        """The attributes of an ``edge.connected`` event (one map per version)."""
        kept: Mapping[str, str] | None = self._attributes.get(software_version)
        if kept is None:
            kept = self._attributes.shared(software_version, {"software_version": software_version})
        return kept


class CatalogCache:
    """One copy of each announced catalog for every edge that announces it.

    A fleet runs a few Edge versions, so thousands of edges announce the
    same catalog. The cache hands out one detached copy per distinct
    catalog (keyed by its serialized bytes), for catalogs up to
    :data:`SHARED_CATALOG_BYTES`, and forgets the oldest beyond
    :data:`SHARED_CATALOGS` (edges holding it keep their copy).
    """

    def __init__(self) -> None:
        self._catalogs: dict[bytes, tuple[pb.CommandSpec, ...]] = {}

    def __len__(self) -> int:
        return len(self._catalogs)

    def detached(self, commands: Sequence[pb.CommandSpec]) -> tuple[pb.CommandSpec, ...]:
        """The catalog as :func:`bounds.detached_catalog` makes it, shared with
        every earlier hello that announced the same one."""
        key = b"".join(_length_prefixed(spec.SerializeToString()) for spec in commands)
        if len(key) > SHARED_CATALOG_BYTES:
            return bounds.detached_catalog(commands)
        shared = self._catalogs.get(key)
        if shared is None:
            shared = bounds.detached_catalog(commands)
            if len(self._catalogs) >= SHARED_CATALOGS:
                del self._catalogs[next(iter(self._catalogs))]
            self._catalogs[key] = shared
        return shared


def _length_prefixed(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data
