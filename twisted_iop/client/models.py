"""Typed, frozen views of the Control Plane's JSON documents.

Each class mirrors one schema of the OpenAPI document the Control Plane
serves at ``GET /openapi.json`` (``twisted_iop/controlplane/openapi.json``,
explained in docs/http-api.md), field for field and with the same names.
:func:`read` turns a decoded document into a model and :func:`to_json` a
model back into the same JSON shape; both live in
:mod:`twisted_iop.client.model_json`, with the field markers
(:data:`OPTIONAL`, :data:`DEFAULTED`, :data:`FLATTEN`) and the time format,
and are importable from here too.

Times are timezone-aware :class:`datetime.datetime` in UTC, or ``None``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, Optional

import attrs

from twisted_iop.client.model_json import DEFAULTED as DEFAULTED
from twisted_iop.client.model_json import FLATTEN as FLATTEN
from twisted_iop.client.model_json import OPTIONAL as OPTIONAL
from twisted_iop.client.model_json import format_time as format_time
from twisted_iop.client.model_json import parse_time as parse_time
from twisted_iop.client.model_json import read as read
from twisted_iop.client.model_json import to_json as to_json


def _optional_field() -> Any:
    return attrs.field(default=None, metadata=OPTIONAL)


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
