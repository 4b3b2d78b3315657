"""A recorded event as the ``/client`` wire carries it: its ``FleetEvent``,
and that message as a WebSocket payload and frame.

The message is written from the one declaration of an event's fields
(:mod:`~twisted_iop.controlplane.fleet.event_record`): every declared field that
``FleetEvent`` has travels, so a field added to both needs no code here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from twisted_iop.controlplane.fleet.event_record import EVENT_FIELDS, EventRecord, FieldKind
from twisted_iop.controlplane.wires.ws_frames import event_envelope_frame
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.preserialized import client_event_envelope


def _fleet_event_source() -> str:
    """The source of :func:`fleet_event_message`, written from the declaration.

    Every field of the declaration that ``FleetEvent`` has is set: texts
    and sequences as they are, times (``x``) as integer milliseconds in
    ``x_ms``, the optional texts only when not empty (most events leave
    them empty: cheaper, and the same message), then the attributes one
    item at a time (the map's ``update()``, and the constructor's
    ``attributes=``, go through Python's ``MutableMapping.update``).

    The function is generated, as ``dataclasses`` generate ``__init__``,
    because this runs for every live event: a loop over the declaration
    took 2.1 us per event, the generated keywords 1.5 us (the hand-written
    function they replace: 1.5 us). Fields are read by name: a record is a
    tuple subclass, whose indexing the interpreter does not specialize.
    """
    wire_fields = pb.FleetEvent.DESCRIPTOR.fields_by_name
    given, optional = [], []
    for name, kind in EVENT_FIELDS:
        if kind is FieldKind.TIME and name + "_ms" in wire_fields:
            given.append(f"{name}_ms=int(event.{name} * 1000)")
        elif kind in (FieldKind.SEQUENCE, FieldKind.TEXT) and name in wire_fields:
            given.append(f"{name}=event.{name}")
        elif kind is FieldKind.OPTIONAL_TEXT and name in wire_fields:
            optional.append(f"    if event.{name}:\n        message.{name} = event.{name}\n")
        elif kind is FieldKind.MAP and name in wire_fields:
            optional.append(
                f"    if event.{name}:\n        kept = message.{name}\n"
                f"        for key, value in event.{name}.items():\n            kept[key] = value\n"
            )
    return f"def fleet_event_message(event):\n    message = FleetEvent({', '.join(given)})\n{''.join(optional)}    return message\n"


def _compile_fleet_event_message() -> Callable[[EventRecord], pb.FleetEvent]:
    namespace: dict[str, object] = {"FleetEvent": pb.FleetEvent}
    exec(compile(_fleet_event_source(), "<fleet_event_message>", "exec"), namespace)
    function = cast(Callable[[EventRecord], pb.FleetEvent], namespace["fleet_event_message"])
    function.__doc__ = "The wire form of a recorded event (every declared field ``FleetEvent`` has)."
    return function


#: The wire form of a recorded event (see :func:`_fleet_event_source`).
fleet_event_message = _compile_fleet_event_message()


def event_payload(event: EventRecord) -> bytes:
    """The WebSocket message of a live event: a ``ClientEnvelope`` whose
    body is the event (request_id 0), serialized without building the envelope."""
    return client_event_envelope(fleet_event_message(event).SerializeToString())


def event_frame(event: EventRecord) -> bytes:
    """The WebSocket frame of :func:`event_payload`, built by :mod:`ws_frames`."""
    return event_envelope_frame(fleet_event_message(event).SerializeToString())
