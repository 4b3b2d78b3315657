"""Typed, frozen views of the Control Plane's JSON documents.

Each class mirrors one schema of the OpenAPI document the Control Plane
serves at ``GET /openapi.json`` (``twisted_iop/controlplane/openapi.json``,
explained in docs/http-api.md), field for field and with the same names.
One generic reader, :func:`read`, turns a decoded document into a model,
driven by the attrs field types: ``str``, ``int``, ``float``, ``bool``,
``Optional[...]``, :class:`~datetime.datetime`, nested attrs classes,
``tuple[X, ...]``/``list[X]``, ``dict[str, X]`` and ``Literal[...]``. It
ignores keys it does not know (a newer server may add some), requires every
key the document requires, and raises
:class:`~twisted_iop.client.errors.InvalidResponse` naming the JSON path of
a value that does not fit (``items[0].error: expected an object or null``).
:func:`to_json` turns a model back into the same JSON shape.

Field metadata says what the types cannot: :data:`OPTIONAL` marks a key the
document does not require (absent or ``null`` read as ``None``, and ``None``
is left out when written back); :data:`DEFAULTED` a key the document
requires that an older Control Plane leaves out (absent read as the field's
default, always written back); :data:`FLATTEN` marks a nested model whose
keys sit in the same JSON object (an edge detail *is* a summary plus more).

Times are timezone-aware :class:`datetime.datetime` in UTC, or ``None``.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Optional, TypeVar, Union, get_args, get_origin, get_type_hints

import attrs

from twisted_iop.client.base_errors import InvalidResponse

T = TypeVar("T")

#: Metadata of a field whose key the server may leave out (see the module doc).
OPTIONAL = {"optional": True}
#: Metadata of a nested model read from (and written into) the enclosing object.
FLATTEN = {"flatten": True}
#: Metadata of a field whose key an older Control Plane leaves out: read as
#: the field's default when absent, and always written back.
DEFAULTED = {"defaulted": True}


def _optional_field() -> Any:
    return attrs.field(default=None, metadata=OPTIONAL)


# ---------------------------------------------------------------- times


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


# ---------------------------------------------------------------- the reader


def read(model: type[T], data: Any, path: str = "") -> T:
    """Read the decoded JSON ``data`` as an instance of the attrs class ``model``.

    ``path`` prefixes the JSON paths named in errors (``"snapshot"`` for a
    document nested in an error answer, say).
    """
    result: T = _read_object(model, data, path)
    return result


@functools.cache
def _field_types(model: type) -> dict[str, Any]:
    return get_type_hints(model)


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(kind))
    if kind is str:
        return "a string"
    if kind is bool:
        return "true or false"
    if kind is int:
        return "a whole number"
    if kind is float:
        return "a number"
    if kind is datetime:
        return "an ISO 8601 time"
    if origin in (tuple, list):
        return "a list"
    return "an object"


def _read_object(model: Any, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise InvalidResponse(f"{path or 'response'}: expected an object")
    kinds = _field_types(model)
    values: dict[str, Any] = {}
    for field in attrs.fields(model):
        kind = kinds[field.name]
        if field.metadata.get("rest"):
            # Members a newer Control Plane sends that this client does not
            # know yet: kept as they are, and written back.
            known = {f.name for f in attrs.fields(model)}
            values[field.alias] = {key: value for key, value in data.items() if key not in known}
            continue
        if field.metadata.get("flatten"):
            values[field.alias] = _read_object(kind, data, path)
            continue
        where = _at(path, field.name)
        if field.name not in data:
            if field.metadata.get("optional") or field.metadata.get("defaulted"):
                continue
            raise InvalidResponse(f"{where}: missing")
        values[field.alias] = _read_value(kind, data[field.name], where, bool(field.metadata.get("optional")))
    return model(**values)


def _read_value(kind: Any, value: Any, path: str, nullable: bool = False) -> Any:
    origin = get_origin(kind)
    if origin is Union or origin is types.UnionType:
        choices = [a for a in get_args(kind) if a is not type(None)]
        if len(choices) != 1:
            raise TypeError(f"{path}: unions other than Optional[X] are not supported: {kind!r}")
        return _read_value(choices[0], value, path, nullable=nullable or len(choices) < len(get_args(kind)))
    if value is None:
        if nullable:
            return None
        raise InvalidResponse(f"{path}: expected {_describe(kind)}, not null")
    try:
        return _read_present(kind, origin, value, path)
    except _Mismatch:
        raise InvalidResponse(f"{path}: expected {_describe(kind)}{' or null' if nullable else ''}") from None


class _Mismatch(Exception):
    """The value does not have the type the field wants."""


def _read_present(kind: Any, origin: Any, value: Any, path: str) -> Any:
    if kind is Any:
        return value  # a JSON value taken as it is (a deployment's parameters: scalars of any type)
    if origin is Literal:
        if isinstance(value, bool) or value not in get_args(kind):
            raise _Mismatch()
        return value
    if kind is str or kind is bool:
        if not isinstance(value, kind):
            raise _Mismatch()
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mismatch()
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch()
        return float(value)
    if kind is datetime:
        if not isinstance(value, str):
            raise _Mismatch()
        try:
            return parse_time(value)
        except ValueError:
            raise InvalidResponse(f"{path}: not an ISO 8601 time: {value[:40]!r}") from None
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _Mismatch()
        item = get_args(kind)[0]
        items = [_read_value(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch()
        item = get_args(kind)[1]
        return {str(k): _read_value(item, v, _at(path, str(k))) for k, v in value.items()}
    if attrs.has(kind):
        if not isinstance(value, Mapping):
            raise _Mismatch()
        return _read_object(kind, value, path)
    raise TypeError(f"{path}: no reader for {kind!r}")


# ---------------------------------------------------------------- writing


def to_json(model: Any) -> Any:
    """Turn a model (or a list of models) back into its JSON shape."""
    if isinstance(model, (list, tuple)):
        return [to_json(m) for m in model]
    if isinstance(model, datetime):
        return format_time(model)
    if isinstance(model, Mapping):
        return {k: to_json(v) for k, v in model.items()}
    if attrs.has(type(model)):
        out: dict[str, Any] = {}
        for field in attrs.fields(type(model)):
            value = getattr(model, field.name)
            if field.metadata.get("flatten") or field.metadata.get("rest"):
                out.update(to_json(value))
            elif value is not None or not field.metadata.get("optional"):
                out[field.name] = to_json(value)
        return out
    return model


# ---------------------------------------------------------------- health


@attrs.frozen
class Health:
    """``GET /healthz``: the process runs."""

    status: str


@attrs.frozen
class StoreReadiness:
    """The store's part of ``GET /readyz``: whether it is writing."""

    backend: str
    writable: bool
    error: str = ""
    pending: int = 0
    pending_bytes: int = 0
    dropped: int = 0
    last_commit_age_seconds: Optional[float] = None
    file_bytes: int = 0


@attrs.frozen
class ClusterReadiness:
    """Cluster mode's part of ``GET /readyz``: this replica and the shared store."""

    replica_id: str
    available: bool
    loaded: bool


@attrs.frozen
class Readiness:
    """``GET /readyz``: whether every listener is bound, the store writes and
    (cluster mode) Redis is reachable."""

    ready: bool
    listeners: dict[str, bool] = attrs.field(factory=dict)
    stopping: bool = attrs.field(default=False, metadata=DEFAULTED)
    store: Optional[StoreReadiness] = attrs.field(default=None, metadata=OPTIONAL)
    cluster: Optional[ClusterReadiness] = attrs.field(default=None, metadata=OPTIONAL)


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


@attrs.frozen
class SnapshotInfo:
    """What the Control Plane holds of an edge's last status snapshot."""

    available: bool
    stale: bool
    received_at: Optional[datetime] = None


@attrs.frozen
class BufferInfo:
    """How much a bounded per-edge buffer keeps and how much it dropped."""

    capacity: int
    kept: int
    dropped: int
    last_sequence: Optional[int] = _optional_field()
    #: The buffer's byte budget, the estimated bytes it keeps, and how many
    #: of the dropped left for the byte budget (None from older servers).
    byte_budget: Optional[int] = _optional_field()
    bytes: Optional[int] = _optional_field()
    dropped_by_bytes: Optional[int] = _optional_field()


@attrs.frozen
class EdgeDetail:
    """``GET /edges/{id}``: the summary plus its last snapshot and buffers."""

    summary: EdgeSummary = attrs.field(metadata=FLATTEN)
    status: SnapshotInfo
    events: BufferInfo
    operations: BufferInfo


@attrs.frozen
class EdgePage:
    """``GET /edges``: one page of edge summaries (or every page, joined)."""

    items: tuple[EdgeSummary, ...]
    total: int
    next_cursor: Optional[str] = None


# ---------------------------------------------------------------- status

ProviderStatusName = Literal["available", "drained", "unavailable"]
ProviderHealthName = Literal["healthy", "degraded", "unhealthy", "offline", "unknown"]


@attrs.frozen
class ProviderCounters:
    """Capacity, leases in flight and queued requests of one admission class."""

    capacity: int = 0
    in_flight: int = 0
    queued: int = 0


@attrs.frozen
class EngineLoad:
    """What a provider's engine last said of its own load.

    ``kv_cache_usage`` is a fraction 0..1 and ``parallel`` the requests it
    runs at once: ``None`` when the engine does not say.
    """

    running: int = 0
    waiting: int = 0
    kv_cache_usage: Optional[float] = None
    parallel: Optional[int] = None
    age_seconds: float = 0.0


EngineStateName = Literal[
    "starting", "loading", "ready", "draining", "stopping", "crashed", "stopped", "failed", "unknown"
]


@attrs.frozen
class EngineLaunch:
    """The lifecycle of a provider's engine that its Node launches.

    ``next_try_at`` is set while ``crashed`` (when its Node starts it
    again); ``pid`` while its process runs.
    """

    state: EngineStateName = "unknown"
    reason: str = ""
    restarts: int = 0
    next_try_at: Optional[datetime] = None
    since: Optional[datetime] = None
    pid: Optional[int] = None


@attrs.frozen
class EstimatedTokenCounts:
    """The part of a provider's tokens the Node estimated (the engine's stream carried no usage)."""

    prompt: int = 0
    completion: int = 0


@attrs.frozen
class TokenCounts:
    """Prompt and completion tokens counted from the engine's usage since the Edge started.

    ``estimated`` is the part of them the Node estimated (zero from a
    Control Plane that does not say).
    """

    prompt: int = 0
    completion: int = 0
    estimated: EstimatedTokenCounts = attrs.field(default=EstimatedTokenCounts(), metadata=DEFAULTED)


def _defaulted(default: Any) -> Any:
    return attrs.field(default=default, metadata=DEFAULTED)


@attrs.frozen
class Latency:
    """How fast requests went over the Edge's recent window (``window_seconds``).

    Quantiles are within 2 % of a duration really observed at that rank
    (docs/latency.md), ``None`` when no request of their kind ended in the
    window: TTFT of streamed requests, TPOT and duration of completed ones.
    """

    ttft_p50_seconds: Optional[float] = None
    ttft_p95_seconds: Optional[float] = None
    tpot_p50_seconds: Optional[float] = None
    tpot_p95_seconds: Optional[float] = None
    duration_p95_seconds: Optional[float] = None
    requests_per_second: Optional[float] = None
    requests: int = 0
    errors: int = 0
    window_seconds: Optional[float] = None


@attrs.frozen
class ModelStatus:
    """One model of an edge: its providers' figures merged."""

    latency: Latency = Latency()


@attrs.frozen
class ProviderStatus:
    """One inference provider on a node, as the edge reported it.

    ``engine`` is ``None`` without a reading of the engine's load, and
    ``tokens_per_second`` ``None`` when the Edge sent no usable figure (a
    Control Plane before they were shown leaves the engine's members out).
    ``launch`` is the engine's lifecycle when its Node launches it.
    """

    provider_id: str
    kind: str = ""
    models: tuple[str, ...] = ()
    status: ProviderStatusName = "unavailable"
    health: ProviderHealthName = "unknown"
    health_reason: str = ""
    general: ProviderCounters = ProviderCounters()
    long_context: ProviderCounters = ProviderCounters()
    engine: Optional[EngineLoad] = _defaulted(None)
    tokens_per_second: Optional[float] = _defaulted(None)
    tokens: TokenCounts = _defaulted(TokenCounts())
    saturated: bool = _defaulted(False)
    cooling_down: bool = _defaulted(False)
    #: ``None`` when someone else runs the engine (or an older Control Plane).
    launch: Optional[EngineLaunch] = _defaulted(None)
    #: No figures from an older Control Plane.
    latency: Latency = _defaulted(Latency())


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


@attrs.frozen
class EdgeStatus:
    """``GET /edges/{id}/status``: a fresh (or, in errors, the last) snapshot."""

    edge_id: str
    connected: bool = False
    stale: bool = False
    generated_at: Optional[datetime] = None
    received_at: Optional[datetime] = None
    nodes: tuple[NodeStatus, ...] = ()
    totals: StatusTotals = StatusTotals()
    #: Per model its providers list, their figures merged (empty from an older Control Plane).
    models: dict[str, ModelStatus] = attrs.field(factory=dict, metadata=DEFAULTED)


FleetRowState = Literal["ok", "timeout", "error", "disconnected"]


@attrs.frozen
class RowError:
    """Why a fleet row has no fresh snapshot: ``edge_timeout`` or ``edge_error`` and the words."""

    code: str
    message: str


@attrs.frozen
class FleetStatusRow:
    """One edge's row of ``GET /fleet/status``; counts are of its last snapshot."""

    edge_id: str
    connected: bool = False
    state: FleetRowState = "ok"
    error: Optional[RowError] = None
    received_at: Optional[datetime] = None
    stale: bool = False
    labels: dict[str, str] = attrs.field(factory=dict)
    nodes_connected: int = 0
    nodes_configured: int = 0
    providers: int = 0
    #: Its providers by health (empty from a Control Plane that does not say).
    providers_by_health: dict[str, int] = attrs.field(factory=dict, metadata=DEFAULTED)
    general: ProviderCounters = ProviderCounters()
    long_context: ProviderCounters = ProviderCounters()
    #: Its providers' figures merged (none from an older Control Plane).
    latency: Latency = _defaulted(Latency())


@attrs.frozen
class FleetStatus:
    """``GET /fleet/status``: one row per edge and the fleet totals.

    ``round_at`` is when the status round these rows come from began (a
    server that does not say leaves it ``None``).
    """

    generated_at: Optional[datetime]
    items: tuple[FleetStatusRow, ...]
    total: int
    next_cursor: Optional[str]
    totals: StatusTotals
    round_at: Optional[datetime] = None


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
    #: Members of the event this client does not know (a newer Control
    #: Plane's), kept as they came.
    unknown: dict[str, Any] = attrs.field(factory=dict, metadata={"rest": True})


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
    byte_budget: Optional[int] = _optional_field()
    bytes: Optional[int] = _optional_field()
    dropped_by_bytes: Optional[int] = _optional_field()
    first_sequence: int = 0
    last_sequence: int = 0
    next_since: int = 0
    edge_id: Optional[str] = _optional_field()


# ---------------------------------------------------------------- operations

OperationState = Literal[
    "sent",
    "accepted",
    "running",
    "succeeded",
    "failed",
    "rejected",
    "timed_out",
    "edge_disconnected",
    "superseded",
]

#: Operation states after which nothing changes any more.
TERMINAL_STATES = frozenset({"succeeded", "failed", "rejected", "timed_out", "edge_disconnected", "superseded"})


@attrs.frozen
class OperationTransition:
    """One step of an operation's history."""

    state: OperationState
    at: Optional[datetime] = None
    reason: str = ""


@attrs.frozen
class LateOutcome:
    """The edge's answer that arrived after its operation had already ended (e.g. timed out)."""

    state: Literal["succeeded", "failed", "rejected"]
    reason: str
    result: dict[str, str]
    received_at: datetime


@attrs.frozen
class Operation:
    """The audit record of one command dispatched to an edge.

    ``replayed`` is only set on the answer to ``POST /edges/{id}/commands``:
    ``True`` when an idempotency key matched an identical earlier command,
    so nothing was dispatched again.
    """

    operation_id: str
    edge_id: str
    name: str
    state: OperationState
    target: str = ""
    arguments: dict[str, str] = attrs.field(factory=dict)
    idempotency_key: Optional[str] = None
    reason: str = ""
    result: dict[str, str] = attrs.field(factory=dict)
    created_at: Optional[datetime] = None
    updated_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    deadline_at: Optional[datetime] = None
    history: tuple[OperationTransition, ...] = ()
    late_outcome: Optional[LateOutcome] = None
    #: The name of the API token that sent the command (None when access is open).
    requested_by: Optional[str] = None
    replayed: Optional[bool] = _optional_field()

    @property
    def finished(self) -> bool:
        """Whether the operation is in a terminal state."""
        return self.state in TERMINAL_STATES


@attrs.frozen
class OperationPage:
    """A page of operations, newest first; edge views add the edge and buffer figures."""

    items: tuple[Operation, ...]
    total: int
    next_cursor: Optional[str] = None
    edge_id: Optional[str] = _optional_field()
    capacity: Optional[int] = _optional_field()
    kept: Optional[int] = _optional_field()
    dropped: Optional[int] = _optional_field()
    byte_budget: Optional[int] = _optional_field()
    bytes: Optional[int] = _optional_field()
    dropped_by_bytes: Optional[int] = _optional_field()


# ---------------------------------------------------------------- commands


@attrs.frozen
class CommandArgument:
    """One argument a command takes."""

    name: str
    description: str = ""
    required: bool = False


@attrs.frozen
class CommandSpec:
    """One command of an edge's catalog."""

    name: str
    description: str = ""
    target_kind: str = ""
    arguments: tuple[CommandArgument, ...] = ()


@attrs.frozen
class CommandCatalog:
    """``GET /edges/{id}/commands``: the catalog the edge announced."""

    edge_id: str
    connected: bool
    commands: tuple[CommandSpec, ...]
