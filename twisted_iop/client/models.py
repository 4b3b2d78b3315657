"""Typed, frozen views of the Control Plane's JSON documents.

Each class mirrors one document of docs/http-api.md field for field; the
``from_json`` class methods read a decoded document, ignore fields they do
not know (a newer server may add some), fill documented defaults for
missing ones, and raise :class:`~twisted_iop.client.errors.InvalidResponse`
naming the field when a value has the wrong type. :func:`to_json` turns any
of them back into the documented JSON shape.

Times are timezone-aware :class:`datetime.datetime` in UTC, or ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Generic, Optional, TypeVar

import attrs

from twisted_iop.client.errors import InvalidResponse

T = TypeVar("T")

#: Field metadata: leave the field out of :func:`to_json` when it is ``None``
#: (the server only sends it in some views).
_OPTIONAL = {"omit_if_none": True}


def _optional_field() -> Any:
    return attrs.field(default=None, metadata=_OPTIONAL)


# ---------------------------------------------------------------- reading


class _Reader:
    """A JSON object being read, with its dotted path for error messages."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise InvalidResponse(f"{path or 'response'}: expected a JSON object")
        self._data = data
        self._path = path

    def _where(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def _get(self, key: str) -> Any:
        return self._data.get(key)

    def string(self, key: str, default: str = "") -> str:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise InvalidResponse(f"{self._where(key)}: expected a string")
        return value

    def optional_string(self, key: str) -> Optional[str]:
        value = self._get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise InvalidResponse(f"{self._where(key)}: expected a string or null")
        return value

    def integer(self, key: str, default: int = 0) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidResponse(f"{self._where(key)}: expected a whole number")
        return value

    def optional_integer(self, key: str) -> Optional[int]:
        if self._get(key) is None:
            return None
        return self.integer(key)

    def number(self, key: str, default: float = 0.0) -> float:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidResponse(f"{self._where(key)}: expected a number")
        return float(value)

    def boolean(self, key: str, default: bool = False) -> bool:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise InvalidResponse(f"{self._where(key)}: expected true or false")
        return value

    def time(self, key: str) -> Optional[datetime]:
        value = self.optional_string(key)
        if value is None or value == "":
            return None
        try:
            return parse_time(value)
        except ValueError:
            raise InvalidResponse(f"{self._where(key)}: not an ISO 8601 time: {value!r}") from None

    def string_map(self, key: str) -> dict[str, str]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise InvalidResponse(f"{self._where(key)}: expected an object")
        out: dict[str, str] = {}
        for k, v in value.items():
            if v is None or isinstance(v, (Mapping, list)):
                raise InvalidResponse(f"{self._where(key)}.{k}: expected a string")
            out[str(k)] = v if isinstance(v, str) else str(v)
        return out

    def int_map(self, key: str) -> dict[str, int]:
        value = self._get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise InvalidResponse(f"{self._where(key)}: expected an object")
        out: dict[str, int] = {}
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidResponse(f"{self._where(key)}.{k}: expected a whole number")
            out[str(k)] = v
        return out

    def strings(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InvalidResponse(f"{self._where(key)}: expected a list of strings")
        return tuple(value)

    def objects(self, key: str, parse: Callable[[Any, str], T]) -> tuple[T, ...]:
        value = self._get(key)
        if value is None:
            return ()
        if not isinstance(value, list):
            raise InvalidResponse(f"{self._where(key)}: expected a list")
        return tuple(parse(item, f"{self._where(key)}[{i}]") for i, item in enumerate(value))

    def object(self, key: str, parse: Callable[[Any, str], T]) -> T:
        return parse(self._get(key) or {}, self._where(key))

    def optional_object(self, key: str, parse: Callable[[Any, str], T]) -> Optional[T]:
        value = self._get(key)
        if value is None:
            return None
        return parse(value, self._where(key))

    def raw(self, key: str) -> Any:
        return self._get(key)


def parse_time(text: str) -> datetime:
    """Parse an ISO 8601 time (``2026-11-29T20:00:00.123Z``) into aware UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_time(value: Optional[datetime]) -> Optional[str]:
    """Format a time the way the Control Plane does (UTC, milliseconds, ``Z``)."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


# ---------------------------------------------------------------- health


@attrs.frozen
class Health:
    """``GET /healthz``: the process runs."""

    status: str

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Health:
        """Read the health document."""
        r = _Reader(data, path)
        return cls(status=r.string("status"))


@attrs.frozen
class Readiness:
    """``GET /readyz``: whether every listener is bound."""

    ready: bool
    listeners: dict[str, bool] = attrs.field(factory=dict)

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Readiness:
        """Read the readiness document."""
        r = _Reader(data, path)
        listeners = r.raw("listeners") or {}
        if not isinstance(listeners, Mapping) or not all(isinstance(v, bool) for v in listeners.values()):
            raise InvalidResponse(f"{path + '.' if path else ''}listeners: expected an object of booleans")
        return cls(ready=r.boolean("ready"), listeners={str(k): v for k, v in listeners.items()})


# ---------------------------------------------------------------- edges


@attrs.frozen
class EdgeSummary:
    """One edge as ``GET /edges`` lists it."""

    edge_id: str
    connected: bool
    labels: dict[str, str] = attrs.field(factory=dict)
    software_version: str = ""
    protocol_version: str = ""
    connected_at: Optional[datetime] = None
    last_seen: Optional[datetime] = None
    disconnected_at: Optional[datetime] = None
    enrollments: int = 0
    commands: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> EdgeSummary:
        """Read an edge summary."""
        r = _Reader(data, path)
        return cls(**_summary_fields(r))


def _summary_fields(r: _Reader) -> dict[str, Any]:
    return dict(
        edge_id=r.string("edge_id"),
        connected=r.boolean("connected"),
        labels=r.string_map("labels"),
        software_version=r.string("software_version"),
        protocol_version=r.string("protocol_version"),
        connected_at=r.time("connected_at"),
        last_seen=r.time("last_seen"),
        disconnected_at=r.time("disconnected_at"),
        enrollments=r.integer("enrollments"),
        commands=r.strings("commands"),
    )


@attrs.frozen
class SnapshotInfo:
    """What the Control Plane holds of an edge's last status snapshot."""

    available: bool
    stale: bool
    received_at: Optional[datetime] = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> SnapshotInfo:
        """Read the ``status`` block of an edge detail."""
        r = _Reader(data, path)
        return cls(available=r.boolean("available"), stale=r.boolean("stale"), received_at=r.time("received_at"))


@attrs.frozen
class BufferInfo:
    """How much a bounded per-edge buffer keeps and how much it dropped."""

    capacity: int
    kept: int
    dropped: int
    last_sequence: Optional[int] = _optional_field()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> BufferInfo:
        """Read an ``events`` or ``operations`` buffer block."""
        r = _Reader(data, path)
        return cls(
            capacity=r.integer("capacity"),
            kept=r.integer("kept"),
            dropped=r.integer("dropped"),
            last_sequence=r.optional_integer("last_sequence"),
        )


@attrs.frozen
class EdgeDetail:
    """``GET /edges/{id}``: the summary plus the state of its buffers."""

    edge_id: str
    connected: bool
    labels: dict[str, str] = attrs.field(factory=dict)
    software_version: str = ""
    protocol_version: str = ""
    connected_at: Optional[datetime] = None
    last_seen: Optional[datetime] = None
    disconnected_at: Optional[datetime] = None
    enrollments: int = 0
    commands: tuple[str, ...] = ()
    status: Optional[SnapshotInfo] = None
    events: Optional[BufferInfo] = None
    operations: Optional[BufferInfo] = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> EdgeDetail:
        """Read an edge detail."""
        r = _Reader(data, path)
        return cls(
            **_summary_fields(r),
            status=r.optional_object("status", SnapshotInfo.from_json),
            events=r.optional_object("events", BufferInfo.from_json),
            operations=r.optional_object("operations", BufferInfo.from_json),
        )


@attrs.frozen
class Page(Generic[T]):
    """One page of a cursor-paged list view."""

    items: tuple[T, ...]
    total: int
    next_cursor: Optional[str] = None

    @classmethod
    def from_json(cls, data: Any, parse: Callable[[Any, str], T], path: str = "") -> Page[T]:
        """Read a page whose items are parsed with ``parse``."""
        r = _Reader(data, path)
        items = r.objects("items", parse)
        return cls(items=items, total=r.integer("total", len(items)), next_cursor=r.optional_string("next_cursor"))


# ---------------------------------------------------------------- status


@attrs.frozen
class ProviderCounters:
    """Capacity, leases in flight and queued requests of one admission class."""

    capacity: int = 0
    in_flight: int = 0
    queued: int = 0

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> ProviderCounters:
        """Read a ``general`` or ``long_context`` counters block."""
        r = _Reader(data, path)
        return cls(capacity=r.integer("capacity"), in_flight=r.integer("in_flight"), queued=r.integer("queued"))


@attrs.frozen
class ProviderStatus:
    """One inference provider on a node, as the edge reported it."""

    provider_id: str
    kind: str = ""
    models: tuple[str, ...] = ()
    status: str = "unavailable"
    health: str = "unknown"
    health_reason: str = ""
    general: ProviderCounters = ProviderCounters()
    long_context: ProviderCounters = ProviderCounters()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> ProviderStatus:
        """Read a provider of a node snapshot."""
        r = _Reader(data, path)
        return cls(
            provider_id=r.string("provider_id"),
            kind=r.string("kind"),
            models=r.strings("models"),
            status=r.string("status", "unavailable"),
            health=r.string("health", "unknown"),
            health_reason=r.string("health_reason"),
            general=r.object("general", ProviderCounters.from_json),
            long_context=r.object("long_context", ProviderCounters.from_json),
        )


@attrs.frozen
class NodeStatus:
    """One configured node of an edge and its providers."""

    node_id: str
    connected: bool = False
    drained: bool = False
    connected_since: Optional[datetime] = None
    last_seen: Optional[datetime] = None
    labels: dict[str, str] = attrs.field(factory=dict)
    providers: tuple[ProviderStatus, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> NodeStatus:
        """Read a node snapshot."""
        r = _Reader(data, path)
        return cls(
            node_id=r.string("node_id"),
            connected=r.boolean("connected"),
            drained=r.boolean("drained"),
            connected_since=r.time("connected_since"),
            last_seen=r.time("last_seen"),
            labels=r.string_map("labels"),
            providers=r.objects("providers", ProviderStatus.from_json),
        )


@attrs.frozen
class StatusTotals:
    """Node and provider totals, of one edge or of the fleet.

    ``edges_known`` and ``edges_connected`` are only set for the fleet.
    """

    nodes_connected: int = 0
    nodes_configured: int = 0
    providers: int = 0
    providers_by_status: dict[str, int] = attrs.field(factory=dict)
    providers_by_health: dict[str, int] = attrs.field(factory=dict)
    general: ProviderCounters = ProviderCounters()
    long_context: ProviderCounters = ProviderCounters()
    edges_known: Optional[int] = _optional_field()
    edges_connected: Optional[int] = _optional_field()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> StatusTotals:
        """Read a ``totals`` block."""
        r = _Reader(data, path)
        return cls(
            nodes_connected=r.integer("nodes_connected"),
            nodes_configured=r.integer("nodes_configured"),
            providers=r.integer("providers"),
            providers_by_status=r.int_map("providers_by_status"),
            providers_by_health=r.int_map("providers_by_health"),
            general=r.object("general", ProviderCounters.from_json),
            long_context=r.object("long_context", ProviderCounters.from_json),
            edges_known=r.optional_integer("edges_known"),
            edges_connected=r.optional_integer("edges_connected"),
        )


@attrs.frozen
class EdgeStatus:
    """``GET /edges/{id}/status``: a fresh (or, in errors, the last) snapshot."""

    edge_id: str
    connected: bool = False
    stale: bool = False
    generated_at: Optional[datetime] = None
    received_at: Optional[datetime] = None
    nodes: tuple[NodeStatus, ...] = ()
    totals: Optional[StatusTotals] = None

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> EdgeStatus:
        """Read an edge status document."""
        r = _Reader(data, path)
        return cls(
            edge_id=r.string("edge_id"),
            connected=r.boolean("connected"),
            stale=r.boolean("stale"),
            generated_at=r.time("generated_at"),
            received_at=r.time("received_at"),
            nodes=r.objects("nodes", NodeStatus.from_json),
            totals=r.optional_object("totals", StatusTotals.from_json),
        )


@attrs.frozen
class FleetStatusRow:
    """One edge's row of ``GET /fleet/status``."""

    edge_id: str
    connected: bool = False
    state: str = "ok"
    error: Optional[str] = None
    received_at: Optional[datetime] = None
    stale: bool = False
    nodes_connected: int = 0
    nodes_configured: int = 0
    providers: int = 0
    general: ProviderCounters = ProviderCounters()
    long_context: ProviderCounters = ProviderCounters()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> FleetStatusRow:
        """Read a fleet status row."""
        r = _Reader(data, path)
        return cls(
            edge_id=r.string("edge_id"),
            connected=r.boolean("connected"),
            state=r.string("state", "ok"),
            error=r.optional_string("error"),
            received_at=r.time("received_at"),
            stale=r.boolean("stale"),
            nodes_connected=r.integer("nodes_connected"),
            nodes_configured=r.integer("nodes_configured"),
            providers=r.integer("providers"),
            general=r.object("general", ProviderCounters.from_json),
            long_context=r.object("long_context", ProviderCounters.from_json),
        )


@attrs.frozen
class FleetStatus:
    """``GET /fleet/status``: one row per edge and the fleet totals."""

    generated_at: Optional[datetime]
    items: tuple[FleetStatusRow, ...]
    total: int
    next_cursor: Optional[str]
    totals: StatusTotals

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> FleetStatus:
        """Read a fleet status document."""
        r = _Reader(data, path)
        items = r.objects("items", FleetStatusRow.from_json)
        return cls(
            generated_at=r.time("generated_at"),
            items=items,
            total=r.integer("total", len(items)),
            next_cursor=r.optional_string("next_cursor"),
            totals=r.object("totals", StatusTotals.from_json),
        )


# ---------------------------------------------------------------- events


@attrs.frozen
class Event:
    """One recorded event (Control Plane event or relayed from an edge)."""

    sequence: int
    fleet_sequence: int
    edge_id: str
    kind: str
    occurred_at: Optional[datetime] = None
    recorded_at: Optional[datetime] = None
    node_id: Optional[str] = None
    provider_id: Optional[str] = None
    command_id: Optional[str] = None
    message: str = ""
    attributes: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Event:
        """Read an event."""
        r = _Reader(data, path)
        return cls(
            sequence=r.integer("sequence"),
            fleet_sequence=r.integer("fleet_sequence"),
            edge_id=r.string("edge_id"),
            kind=r.string("kind"),
            occurred_at=r.time("occurred_at"),
            recorded_at=r.time("recorded_at"),
            node_id=r.optional_string("node_id") or None,
            provider_id=r.optional_string("provider_id") or None,
            command_id=r.optional_string("command_id") or None,
            message=r.string("message"),
            attributes=r.string_map("attributes"),
        )


@attrs.frozen
class EventPage:
    """A page of events by sequence (``/edges/{id}/events`` or ``/fleet/events``).

    ``edge_id`` is ``None`` for the fleet view, whose sequences are fleet
    sequences.
    """

    items: tuple[Event, ...]
    capacity: int = 0
    kept: int = 0
    dropped: int = 0
    first_sequence: Optional[int] = None
    last_sequence: Optional[int] = None
    next_since: Optional[int] = None
    edge_id: Optional[str] = _optional_field()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> EventPage:
        """Read an event page."""
        r = _Reader(data, path)
        return cls(
            items=r.objects("items", Event.from_json),
            capacity=r.integer("capacity"),
            kept=r.integer("kept"),
            dropped=r.integer("dropped"),
            first_sequence=r.optional_integer("first_sequence"),
            last_sequence=r.optional_integer("last_sequence"),
            next_since=r.optional_integer("next_since"),
            edge_id=r.optional_string("edge_id"),
        )


# ---------------------------------------------------------------- operations


@attrs.frozen
class OperationTransition:
    """One step of an operation's history."""

    state: str
    at: Optional[datetime] = None
    reason: str = ""

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> OperationTransition:
        """Read a history entry."""
        r = _Reader(data, path)
        return cls(state=r.string("state"), at=r.time("at"), reason=r.string("reason"))


#: Operation states after which nothing changes any more.
TERMINAL_STATES = frozenset({"succeeded", "failed", "rejected", "timed_out", "edge_disconnected"})


@attrs.frozen
class Operation:
    """The audit record of one command dispatched to an edge."""

    operation_id: str
    edge_id: str
    name: str
    state: str
    target: Optional[str] = None
    arguments: dict[str, str] = attrs.field(factory=dict)
    idempotency_key: Optional[str] = None
    reason: str = ""
    result: dict[str, str] = attrs.field(factory=dict)
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    deadline_at: Optional[datetime] = None
    history: tuple[OperationTransition, ...] = ()

    @property
    def finished(self) -> bool:
        """Whether the operation is in a terminal state."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> Operation:
        """Read an operation."""
        r = _Reader(data, path)
        return cls(
            operation_id=r.string("operation_id"),
            edge_id=r.string("edge_id"),
            name=r.string("name"),
            state=r.string("state"),
            target=r.optional_string("target") or None,
            arguments=r.string_map("arguments"),
            idempotency_key=r.optional_string("idempotency_key") or None,
            reason=r.string("reason"),
            result=r.string_map("result"),
            created_at=r.time("created_at"),
            updated_at=r.time("updated_at"),
            finished_at=r.time("finished_at"),
            deadline_at=r.time("deadline_at"),
            history=r.objects("history", OperationTransition.from_json),
        )


@attrs.frozen
class OperationPage:
    """A page of operations, newest first; edge views add buffer figures."""

    items: tuple[Operation, ...]
    total: int
    next_cursor: Optional[str] = None
    capacity: Optional[int] = _optional_field()
    kept: Optional[int] = _optional_field()
    dropped: Optional[int] = _optional_field()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> OperationPage:
        """Read an operations page."""
        r = _Reader(data, path)
        items = r.objects("items", Operation.from_json)
        return cls(
            items=items,
            total=r.integer("total", len(items)),
            next_cursor=r.optional_string("next_cursor"),
            capacity=r.optional_integer("capacity"),
            kept=r.optional_integer("kept"),
            dropped=r.optional_integer("dropped"),
        )


# ---------------------------------------------------------------- commands


@attrs.frozen
class CommandArgument:
    """One argument a command takes."""

    name: str
    description: str = ""
    required: bool = False

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> CommandArgument:
        """Read an argument spec."""
        r = _Reader(data, path)
        return cls(name=r.string("name"), description=r.string("description"), required=r.boolean("required"))


@attrs.frozen
class CommandSpec:
    """One command of an edge's catalog."""

    name: str
    description: str = ""
    target_kind: str = ""
    arguments: tuple[CommandArgument, ...] = ()

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> CommandSpec:
        """Read a command spec."""
        r = _Reader(data, path)
        return cls(
            name=r.string("name"),
            description=r.string("description"),
            target_kind=r.string("target_kind"),
            arguments=r.objects("arguments", CommandArgument.from_json),
        )


@attrs.frozen
class CommandCatalog:
    """``GET /edges/{id}/commands``: the catalog the edge announced."""

    edge_id: str
    commands: tuple[CommandSpec, ...]

    @classmethod
    def from_json(cls, data: Any, path: str = "") -> CommandCatalog:
        """Read a command catalog."""
        r = _Reader(data, path)
        return cls(edge_id=r.string("edge_id"), commands=r.objects("commands", CommandSpec.from_json))


# ---------------------------------------------------------------- writing


def _serialize(inst: Any, field: Any, value: Any) -> Any:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _keep(field: Any, value: Any) -> bool:
    return not (value is None and field.metadata.get("omit_if_none"))


def to_json(model: Any) -> Any:
    """Turn a model (or a list of models) back into its documented JSON shape."""
    if isinstance(model, (list, tuple)):
        return [to_json(m) for m in model]
    if attrs.has(type(model)):
        return attrs.asdict(model, value_serializer=_serialize, filter=_keep)
    return model
