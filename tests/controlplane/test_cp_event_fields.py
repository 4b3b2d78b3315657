"""One declaration of an event's fields, and every form of an event derived from it."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.controlplane.fleet.event_log import EventBuffer
from twisted_iop.controlplane.fleet.event_record import EVENT_FIELDS, EventRecord, FieldKind
from twisted_iop.controlplane.fleet.live_event import fleet_event_message
from twisted_iop.controlplane.http import json_views as views
from twisted_iop.controlplane.store import forms as codec
from twisted_iop.wire import control_pb2 as pb

PACKAGE = Path(__file__).resolve().parents[2] / "twisted_iop"
DECLARATION = PACKAGE / "controlplane" / "event_record.py"
#: Code that may spell the fields out, and why.
ALLOWED = {
    # The client library reads the HTTP and wire contracts as a client
    # outside this repo would: it imports no server code, so it cannot
    # use the declaration.
    PACKAGE / "client",
}
FIELD_NAMES = {name for name, _ in EVENT_FIELDS}
#: A place naming this many of the fields is a list of them.
LIST_THRESHOLD = len(FIELD_NAMES) - 2


def _field_name(text: str) -> str:
    """The declared field a name stands for (``occurred_at_ms`` is ``occurred_at``)."""
    return text[:-3] if text.endswith("_ms") else text


def _names_in(node: ast.AST) -> set[str]:
    """Every field name ``node`` mentions: attributes, keywords, parameters, strings."""
    found: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute):
            found.add(child.attr)
        elif isinstance(child, ast.keyword):
            found.add(child.arg or "")
        elif isinstance(child, ast.arg):
            found.add(child.arg)
        elif isinstance(child, ast.Constant) and isinstance(child.value, str):
            found.add(child.value)
    return {_field_name(name) for name in found} & FIELD_NAMES


def _lists_of_fields(tree: ast.Module) -> list[tuple[int, set[str]]]:
    """The functions (and module-level statements) that name most of the fields."""
    lists = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node in tree.body:
            names = _names_in(node)
            if len(names) >= LIST_THRESHOLD and not any(
                isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and len(_names_in(inner)) >= LIST_THRESHOLD
                for inner in ast.walk(node)
                if inner is not node
            ):
                lists.append((getattr(node, "lineno", 0), names))
    return lists


def test_no_second_list_of_event_fields() -> None:
    """Outside the declaration no function or class names most of an event's
    fields: each form of an event is derived from the declaration."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == DECLARATION or path.name.endswith("_pb2.py") or any(a in path.parents for a in ALLOWED):
            continue
        for line, names in _lists_of_fields(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{line} names {sorted(names)}")
    assert not found, "a second list of event fields:\n" + "\n".join(found)


def test_the_detector_finds_a_hand_written_list() -> None:
    """The check above fails on a function that copies an event field by field."""
    members = ", ".join(f'"{name}": event.{name}' for name in sorted(FIELD_NAMES)[:LIST_THRESHOLD])
    source = f"def to_dict(event):\n    return {{{members}}}\n"
    assert [line for line, _ in _lists_of_fields(ast.parse(source))] == [1]


_texts = st.text(max_size=12)


@st.composite
def events(draw: st.DrawFn) -> EventRecord:
    """Any event the Control Plane may record."""
    values: list[object] = []
    for _, kind in EVENT_FIELDS:
        if kind is FieldKind.SEQUENCE:
            values.append(draw(st.integers(1, 2**40)))
        elif kind is FieldKind.TIME:
            values.append(draw(st.integers(1, 2**41)) / 1000.0)
        elif kind is FieldKind.MAP:
            values.append(draw(st.dictionaries(_texts, _texts, max_size=4)))
        else:
            values.append(draw(_texts))
    return EventRecord._make(values)


@settings(max_examples=200, deadline=None)
@given(event=events())
def test_every_form_of_an_event_carries_every_field(event: EventRecord) -> None:
    """The kept form, the Redis form, the SQLite block, the /client message and
    the JSON view each give back every declared field of an event."""
    buffer = EventBuffer(10, 1 << 20)
    buffer.append(event, event.sequence)
    assert buffer.since(0, 1) == [event]
    stored = codec.event_from(json.loads(codec.event_text(event)), event.sequence, event.fleet_sequence)
    assert stored == event
    assert codec.events_of_block(codec.event_block([event, event])) == [event, event]
    wire = fleet_event_message(event)
    shown = views.event_json(event)
    assert set(shown) == {name for name, _ in EVENT_FIELDS}
    on_the_wire = pb.FleetEvent.DESCRIPTOR.fields_by_name
    for name, kind in EVENT_FIELDS:
        value = getattr(event, name)
        wire_name = name + "_ms" if kind is FieldKind.TIME else name
        # A field the wire contract does not carry (yet) travels in every other form.
        carried = wire_name in on_the_wire
        if kind is FieldKind.TIME:
            assert not carried or getattr(wire, wire_name) == int(value * 1000)
            assert shown[name] == views.iso(value)
        elif kind is FieldKind.MAP:
            assert dict(value) == shown[name]
            assert not carried or dict(getattr(wire, name)) == dict(value)
        else:
            assert not carried or getattr(wire, name) == value
            assert shown[name] == (value or None if kind is FieldKind.OPTIONAL_TEXT else value)


def test_every_field_fleet_event_has_is_declared() -> None:
    """The /client message has no field the declaration lacks (a field added to
    the wire contract alone would travel empty)."""
    declared = {name + "_ms" if kind is FieldKind.TIME else name for name, kind in EVENT_FIELDS}
    assert set(pb.FleetEvent.DESCRIPTOR.fields_by_name) <= declared
