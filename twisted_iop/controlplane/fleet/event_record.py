"""One recorded event, declared once.

:class:`EventRecord` is the one declaration of an event's fields: its
name, type and :class:`FieldKind` per field. Everything that writes an
event somewhere derives what it writes from this declaration
(:data:`EVENT_FIELDS`), so adding a field is one line here (and its
entry in the OpenAPI document):

* the JSON view (``json_views.event_json``),
* the kept form in the event buffers (``memory.kept_form``),
* the stored form (SQLite, Redis) (``stored_forms.event_text`` / ``event_from``),
* the ``/client`` frame (``live_event.fleet_event_message``: every
  field ``FleetEvent`` has; a time ``x`` travels as ``x_ms``).

``tests/controlplane/test_cp_event_fields.py`` fails when a second list of
these fields appears elsewhere.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping, Sequence
from operator import itemgetter
from types import MappingProxyType
from typing import Annotated, NamedTuple, TypedDict, cast, get_type_hints


class FieldKind(enum.Enum):
    """How a field of an event is written in each of its forms."""

    #: A sequence number (an int) the buffers, or the shared store, give.
    SEQUENCE = "sequence"
    #: A text, shown as it is.
    TEXT = "text"
    #: A text most events leave empty; JSON shows an empty one as null.
    OPTIONAL_TEXT = "optional_text"
    #: Seconds since the epoch (a float); JSON shows ISO 8601, the wire
    #: sends integer milliseconds in the field named ``<name>_ms``.
    TIME = "time"
    #: The attribute map (``str -> str``); always the last field.
    MAP = "map"


#: The attributes of an event that has none (one immutable map for all).
NO_ATTRIBUTES: Mapping[str, str] = MappingProxyType({})


class EventRecord(NamedTuple):
    """One recorded event of one edge (immutable, as cheap as a tuple)."""

    sequence: Annotated[int, FieldKind.SEQUENCE]
    fleet_sequence: Annotated[int, FieldKind.SEQUENCE]
    edge_id: Annotated[str, FieldKind.TEXT]
    kind: Annotated[str, FieldKind.TEXT]
    occurred_at: Annotated[float, FieldKind.TIME]
    recorded_at: Annotated[float, FieldKind.TIME]
    node_id: Annotated[str, FieldKind.OPTIONAL_TEXT] = ""
    provider_id: Annotated[str, FieldKind.OPTIONAL_TEXT] = ""
    command_id: Annotated[str, FieldKind.OPTIONAL_TEXT] = ""
    message: Annotated[str, FieldKind.TEXT] = ""
    attributes: Annotated[Mapping[str, str], FieldKind.MAP] = NO_ATTRIBUTES

    def __repr__(self) -> str:
        return (
            f"EventRecord(sequence={self.sequence}, fleet_sequence={self.fleet_sequence}, "
            f"edge_id={self.edge_id!r}, kind={self.kind!r})"
        )


def _kinds() -> tuple[tuple[str, FieldKind], ...]:
    hints = get_type_hints(EventRecord, include_extras=True)
    fields = []
    for name in EventRecord._fields:
        (kind,) = (meta for meta in hints[name].__metadata__ if isinstance(meta, FieldKind))
        fields.append((name, kind))
    return tuple(fields)


#: Every field of an event, in order, with its kind.
EVENT_FIELDS: tuple[tuple[str, FieldKind], ...] = _kinds()
assert [kind for _, kind in EVENT_FIELDS[:2]] == [FieldKind.SEQUENCE, FieldKind.SEQUENCE]
#: ``tuple.__new__`` for records: a record from its values, in one call.
new_record = cast(Callable[[type[EventRecord], Iterable[object]], EventRecord], tuple.__new__)


def record_from(values: Sequence[object]) -> EventRecord:
    """The record whose fields are ``values``, in declaration order (as
    ``EventRecord._make`` without its length check: callers build the values
    from the declaration)."""
    return new_record(EventRecord, values)


#: The index of the attribute map in a record: the last field.
ATTRIBUTES_INDEX = len(EVENT_FIELDS) - 1
assert EVENT_FIELDS[ATTRIBUTES_INDEX][1] is FieldKind.MAP
assert all(kind is not FieldKind.MAP for _, kind in EVENT_FIELDS[:ATTRIBUTES_INDEX])


def fields_of(*kinds: FieldKind) -> tuple[tuple[int, str], ...]:
    """``(index, name)`` of every field of one of ``kinds``, in order."""
    return tuple((i, name) for i, (name, kind) in enumerate(EVENT_FIELDS) if kind in kinds)


def values_getter(indexes: Sequence[int]) -> Callable[[EventRecord], tuple[object, ...]]:
    """A function that reads the fields at ``indexes`` of a record as one
    tuple, in one call (``operator.itemgetter``, which gives a lone value
    for one index: wrapped here)."""
    if len(indexes) == 1:
        (index,) = indexes
        return lambda event: (event[index],)
    return itemgetter(*indexes)


class EventTexts(TypedDict, total=False):
    """The fields of an event the Control Plane may set when it records one
    of its own (``EdgeRegistry.record``); the others come from the record's
    place and time."""

    node_id: str
    provider_id: str
    command_id: str
    message: str
    attributes: Mapping[str, str]
