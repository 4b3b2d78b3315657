"""What a store keeps and reads back: the JSON shapes of hellos, events,
operations and rollouts, checked on the way in.

Both stores that outlive the process write these forms: the SQLite file
(``store/sqlite*.py``) and, in cluster mode, Redis, which every replica
shares. What is read back is checked like anything read from a wire: a
value of the wrong type raises :class:`BadRecord` (or ``ValueError`` for a
rollout), and the reader skips that entry (counted and logged) instead of
failing.
"""

from __future__ import annotations

import base64
import json
import marshal
from collections.abc import Mapping, Sequence
from functools import partial
from itertools import chain
from operator import itemgetter
from typing import Any, Optional

import attrs

from twisted_iop.controlplane.fleet.event_record import (
    EVENT_FIELDS,
    NO_ATTRIBUTES,
    EventRecord,
    FieldKind,
    new_record,
)
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.requests.operation_states import LateOutcome
from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.wire import control_pb2 as pb


class BadRecord(ValueError):
    """Something read from a store does not have the shape this code writes."""


#: One encoder for every write: ``json.dumps`` with any argument of its own
#: builds a new encoder per call (an event's attributes took 5.5 us that
#: way, 1.2 us through this one).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def dumps(value: Any) -> str:
    """Compact JSON."""
    return _ENCODE(value)


def _loads(text: Any, what: str) -> Any:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise BadRecord(f"{what}: not a string")
    try:
        return json.loads(text)
    except ValueError as e:
        raise BadRecord(f"{what}: not JSON ({e})") from None


def loads_object(text: Any, what: str) -> dict[str, Any]:
    """A JSON object from ``text``; BadRecord names ``what`` otherwise."""
    value = _loads(text, what)
    if not isinstance(value, dict):
        raise BadRecord(f"{what}: not a JSON object")
    return value


def loads_list(text: Any, what: str) -> list[Any]:
    """A JSON list from ``text``; BadRecord names ``what`` otherwise."""
    value = _loads(text, what)
    if not isinstance(value, list):
        raise BadRecord(f"{what}: not a JSON list")
    return value


def _str(data: Mapping[str, Any], key: str, default: Optional[str] = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise BadRecord(f"field {key!r} must be a string")
    return value


def _num(data: Mapping[str, Any], key: str, default: Optional[float] = None) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"field {key!r} must be a number")
    return float(value)


def _opt_num(data: Mapping[str, Any], key: str) -> Optional[float]:
    return None if data.get(key) is None else _num(data, key)


def _str_map(data: Mapping[str, Any], key: str) -> dict[str, str]:
    value = data.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRecord(f"field {key!r} must be an object of strings")
    return dict(value)


def b64(data: bytes) -> str:
    """Bytes as base64 text."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, what: str) -> bytes:
    """base64 text as bytes; BadRecord names ``what`` otherwise."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise BadRecord(f"{what}: not base64") from None


# -- hello ----------------------------------------------------------------------


def hello_json(hello: EdgeHello) -> str:
    """What an edge said in hello, as JSON (the catalog as protobuf bytes)."""
    catalog = pb.EdgeHelloRequest(commands=list(hello.commands)).SerializeToString()
    return dumps(
        {
            "labels": hello.labels,
            "software_version": hello.software_version,
            "protocol_version": hello.protocol_version,
            "commands": b64(catalog),
        }
    )


def hello_from(data: Mapping[str, Any]) -> EdgeHello:
    """The hello of :func:`hello_json`, parsed."""
    catalog = pb.EdgeHelloRequest()
    try:
        catalog.ParseFromString(unb64(_str(data, "commands", ""), "hello commands"))
    except Exception as e:
        raise BadRecord(f"hello commands: {e}") from None
    return EdgeHello(
        labels=_str_map(data, "labels"),
        software_version=_str(data, "software_version", ""),
        protocol_version=_str(data, "protocol_version", ""),
        commands=tuple(catalog.commands),
    )


# -- events -----------------------------------------------------------------------


#: How each field of an event is stored (sequences are not: Redis numbers
#: the event) and checked on the way back in, from the one declaration.
_STORED_EVENT_FIELDS = tuple((name, kind) for name, kind in EVENT_FIELDS if kind is not FieldKind.SEQUENCE)
_STORED_AS_IS = (FieldKind.TEXT, FieldKind.OPTIONAL_TEXT, FieldKind.TIME)


def event_text(event: EventRecord) -> str:
    """An event without its sequences (Redis numbers it), as JSON text."""
    stored = {name: value for (name, kind), value in zip(EVENT_FIELDS, event, strict=True) if kind in _STORED_AS_IS}
    stored["attributes"] = dict(event.attributes)
    return dumps(stored)


def _event_value(data: Mapping[str, Any], name: str, kind: FieldKind) -> Any:
    if kind is FieldKind.TIME:
        return _num(data, name)
    if kind is FieldKind.MAP:
        return _str_map(data, name)
    # Texts: the edge id and kind are required, the others may be absent.
    return _str(data, name, None if name in ("edge_id", "kind") else "")


def event_from(data: Mapping[str, Any], sequence: int, fleet_sequence: int) -> EventRecord:
    """The event of :func:`event_text` with the sequences Redis gave it."""
    return EventRecord(
        sequence,
        fleet_sequence,
        **{name: _event_value(data, name, kind) for name, kind in _STORED_EVENT_FIELDS},
    )


# -- events in blocks (the SQLite store) ------------------------------------------------

#: The fields of an event row, in declaration order (a block names them,
#: so a block written before a field was declared reads it as its default).
EVENT_ROW_FIELDS: tuple[str, ...] = tuple(name for name, _ in EVENT_FIELDS)
_MAP_INDEX = next(i for i, (_, kind) in enumerate(EVENT_FIELDS) if kind is FieldKind.MAP)
assert len(EVENT_FIELDS) - 1 == _MAP_INDEX
_FIELDS_BUT_MAP = itemgetter(*range(_MAP_INDEX))
#: What a field a block does not have reads as.
_DEFAULTS = {
    FieldKind.SEQUENCE: 0,
    FieldKind.TEXT: "",
    FieldKind.OPTIONAL_TEXT: "",
    FieldKind.TIME: 0.0,
    FieldKind.MAP: None,
}


_EDGE_ID_INDEX = EVENT_ROW_FIELDS.index("edge_id")
#: A record from a tuple of its values, in one C call.
_new_event = partial(new_record, EventRecord)

#: The version of Python's ``marshal`` format blocks are written in: the
#: format of 2.5 and later, which every later Python reads.
MARSHAL_VERSION = 2


def event_block(events: Sequence[EventRecord]) -> bytes:
    """Events (one edge's, in order) as one block of bytes: the field names
    once, then one tuple of values per event.

    Written with ``marshal`` (format version 2), which is about ten times
    cheaper than JSON for these values (0.3 us against 2.8-3.7 us an event:
    a float as JSON text is most of an event's cost): the writer thread
    holds the interpreter for that long per event, time the event loop
    cannot run. ``marshal`` only rebuilds values (nothing runs when a block
    is read), the blocks are only ever read from the Control Plane's own
    file (mode 0600, marked as a store, refused otherwise), and every value
    read back is checked as wire input is (:func:`events_of_block`).
    """
    rows = [(*_FIELDS_BUT_MAP(e), dict(e.attributes)) for e in events]
    return marshal.dumps((EVENT_ROW_FIELDS, rows), MARSHAL_VERSION)


def events_of_block(data: Any, edge_id: Optional[str] = None) -> list[EventRecord]:
    """The events of :func:`event_block`, checked as wire input is (with
    ``edge_id``, each must be that edge's); raises :class:`BadRecord`.

    Checked a column (one field of every event) at a time: the types of a
    column are one set built in C, where checking value by value took four
    times as long (a Control Plane restarting on a million events spent 12 s
    here).
    """
    if not isinstance(data, bytes):
        raise BadRecord("an event block must be bytes")
    try:
        block = marshal.loads(data)
    except (ValueError, EOFError, TypeError) as e:
        raise BadRecord(f"an event block does not read back ({e})") from None
    if not isinstance(block, tuple) or len(block) != 2:
        raise BadRecord("an event block must be its field names and its rows")
    names, rows = block
    if not isinstance(names, tuple) or not all(isinstance(n, str) for n in names) or not isinstance(rows, list):
        raise BadRecord("an event block needs a tuple of field names and a list of rows")
    if not rows:
        return []
    if set(map(type, rows)) != {tuple} or set(map(len, rows)) != {len(names)}:
        raise BadRecord("an event row does not match its block's fields")
    columns = list(zip(*rows, strict=True))
    where = {name: i for i, name in enumerate(names)}
    checked: list[Sequence[Any]] = []
    for name, kind in EVENT_FIELDS:
        at = where.get(name)
        if at is None:
            default = NO_ATTRIBUTES if kind is FieldKind.MAP else _DEFAULTS[kind]
            checked.append([default] * len(rows))
        else:
            checked.append(_event_column(columns[at], name, kind))
    if edge_id is not None and set(checked[_EDGE_ID_INDEX]) != {edge_id}:
        raise BadRecord("an event of another edge")
    return list(map(_new_event, zip(*checked, strict=True)))


def _event_column(column: tuple[Any, ...], name: str, kind: FieldKind) -> Sequence[Any]:
    """One field of every event of a block, checked (times as floats)."""
    types = set(map(type, column))
    if kind is FieldKind.SEQUENCE:
        if not types <= {int} or min(column) < 0:
            raise BadRecord(f"event field {name!r} must be a whole number")
        return column
    if kind is FieldKind.TIME:
        if types <= {float}:
            return column
        if not types <= {float, int}:
            raise BadRecord(f"event field {name!r} must be a number")
        return [float(value) for value in column]
    if kind is FieldKind.MAP:
        # marshal made each dict afresh: checked (keys and values texts), not copied.
        maps = [value for value in column if value]
        if (
            not set(map(type, maps)) <= {dict}
            or not set(map(type, chain.from_iterable(maps))) <= {str}
            or not set(map(type, chain.from_iterable(map(dict.values, maps)))) <= {str}
        ):
            raise BadRecord(f"field {name!r} must be an object of strings")
        return [value or NO_ATTRIBUTES for value in column]
    if not types <= {str}:
        raise BadRecord(f"event field {name!r} must be a string")
    return column


# -- operations ---------------------------------------------------------------------


def operation_dict(op: OperationRecord) -> dict[str, Any]:
    """An operation as a JSON-ready dict (everything it records)."""
    late = op.late_outcome
    return {
        "operation_id": op.operation_id,
        "edge_id": op.edge_id,
        "name": op.name,
        "target": op.target,
        "arguments": op.arguments,
        "idempotency_key": op.idempotency_key,
        "created_at": op.created_at,
        "deadline_at": op.deadline_at,
        "state": op.state,
        "reason": op.reason,
        "result": op.result,
        "updated_at": op.updated_at,
        "finished_at": op.finished_at,
        "history": [list(entry) for entry in op.history],
        "late_outcome": None
        if late is None
        else {"state": late.state, "reason": late.reason, "result": late.result, "received_at": late.received_at},
        "requested_by": op.requested_by,
        "replica": op.replica,
    }


def operation_from(data: Mapping[str, Any]) -> OperationRecord:
    """The operation of :func:`operation_dict`, parsed and checked."""
    history_raw = data.get("history", [])
    if not isinstance(history_raw, list):
        raise BadRecord("field 'history' must be a list")
    history: list[tuple[str, float, str]] = []
    for entry in history_raw:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not isinstance(entry[0], str)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], (int, float))
            or not isinstance(entry[2], str)
        ):
            raise BadRecord("field 'history' has a malformed entry")
        history.append((entry[0], float(entry[1]), entry[2]))
    late_raw = data.get("late_outcome")
    late = None
    if late_raw is not None:
        if not isinstance(late_raw, dict):
            raise BadRecord("field 'late_outcome' must be an object")
        late = LateOutcome(
            _str(late_raw, "state"),
            _str(late_raw, "reason", ""),
            _str_map(late_raw, "result"),
            _num(late_raw, "received_at"),
        )
    return OperationRecord(
        operation_id=_str(data, "operation_id"),
        edge_id=_str(data, "edge_id"),
        name=_str(data, "name"),
        target=_str(data, "target", ""),
        arguments=_str_map(data, "arguments"),
        idempotency_key=_str(data, "idempotency_key", ""),
        created_at=_num(data, "created_at"),
        deadline_at=_num(data, "deadline_at"),
        state=_str(data, "state"),
        reason=_str(data, "reason", ""),
        result=_str_map(data, "result"),
        updated_at=_num(data, "updated_at", 0.0),
        finished_at=_opt_num(data, "finished_at"),
        history=history,
        late_outcome=late,
        requested_by=_str(data, "requested_by", ""),
        replica=_str(data, "replica", ""),
    )


# -- rollouts ------------------------------------------------------------------------

#: A rollout's stored state at most (20,000 targets take about 2 MiB).
MAX_STATE_BYTES = 16 * 1024 * 1024

_EXECUTION = (
    "edge_id",
    "state",
    "operation_ids",
    "reason",
    "started_at",
    "finished_at",
    "waiting_since",
    "latency_before",
    "latency_after",
)
#: The execution fields an older release stored (the latency figures came later).
_EXECUTION_BEFORE_LATENCY = 7


def rollout_dict(rollout: rs.Rollout) -> dict[str, Any]:
    """``rollout`` as JSON values (its notices are not kept: they were recorded)."""
    return {
        "rollout_id": rollout.rollout_id,
        "command": attrs.asdict(rollout.command),
        "selector": rollout.selector,
        "strategy": attrs.asdict(rollout.strategy),
        "abort": attrs.asdict(rollout.abort),
        "timeout_seconds": rollout.timeout_seconds,
        "disconnected": rollout.disconnected,
        "wait_seconds": rollout.wait_seconds,
        "created_at": rollout.created_at,
        "targets": rollout.targets,
        "idempotency_key": rollout.idempotency_key,
        "requested_by": rollout.requested_by,
        "state": rollout.state,
        "reason": rollout.reason,
        "started_at": rollout.started_at,
        "finished_at": rollout.finished_at,
        "executions": [[getattr(e, name) for name in _EXECUTION] for e in rollout.executions.values()],
        "counts": rollout.counts,
        "batch": [rollout.batch_number, rollout.batch_start, rollout.batch_end],
        "open": list(rollout.open),
        "unfinished": rollout.unfinished,
        "next_batch_at": rollout.next_batch_at,
        "watching": rollout.watching,
    }


def _abort_from(value: dict[str, Any]) -> rs.AbortCriteria:
    fields = dict(value)
    latency = fields.pop("latency", None)
    if latency is not None:
        if latency.get("metric") not in rs.LATENCY_FIGURES:
            raise ValueError(f"bad latency metric {latency.get('metric')!r}")
        fields["latency"] = rs.LatencyCriterion(**latency)
    return rs.AbortCriteria(**fields)


def rollout_from(value: Any) -> rs.Rollout:
    """The rollout :func:`rollout_dict` made; raises ValueError when ``value`` is not one."""
    try:
        executions = {}
        for row in value["executions"]:
            if len(row) == _EXECUTION_BEFORE_LATENCY:
                row = [*row, None, None]
            fields = dict(zip(_EXECUTION, row, strict=True))
            if fields["state"] not in rs.EXECUTION_STATES:
                raise ValueError(f"bad execution state {fields['state']!r}")
            executions[str(fields["edge_id"])] = rs.Execution(**fields)
        counts = {state: int(value["counts"][state]) for state in rs.EXECUTION_STATES}
        if value["state"] not in rs.ROLLOUT_STATES:
            raise ValueError(f"bad rollout state {value['state']!r}")
        command = value["command"]
        rollout = rs.Rollout(
            rollout_id=str(value["rollout_id"]),
            command=rs.RolloutCommand(
                name=str(command["name"]),
                target=str(command["target"]),
                node_selector=str(command["node_selector"]),
                arguments={str(k): str(v) for k, v in command["arguments"].items()},
            ),
            selector=str(value["selector"]),
            strategy=rs.Strategy(**value["strategy"]),
            abort=_abort_from(value["abort"]),
            timeout_seconds=float(value["timeout_seconds"]),
            disconnected=str(value["disconnected"]),
            wait_seconds=float(value["wait_seconds"]),
            created_at=float(value["created_at"]),
            targets=[str(t) for t in value["targets"]],
            idempotency_key=str(value["idempotency_key"]),
            requested_by=str(value["requested_by"]),
            state=str(value["state"]),
            reason=value["reason"],
            started_at=value["started_at"],
            finished_at=value["finished_at"],
            executions=executions,
            counts=counts,
            batch_number=int(value["batch"][0]),
            batch_start=int(value["batch"][1]),
            batch_end=int(value["batch"][2]),
            open=dict.fromkeys(str(e) for e in value["open"]),
            unfinished=int(value["unfinished"]),
            next_batch_at=value["next_batch_at"],
            watching={str(k): float(v) for k, v in value.get("watching", {}).items()},
        )
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise ValueError(f"not a stored rollout: {e!r}") from e
    if set(rollout.executions) != set(rollout.targets):
        raise ValueError("a stored rollout's executions are not its targets")
    rollout.take_notices()  # "rollout.created" was recorded when it was
    return rollout
