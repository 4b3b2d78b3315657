"""HTTP JSON routes of the Control Plane (Klein). See docs/http-api.md."""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any, Optional, Protocol
from urllib.parse import urlsplit

from klein import Klein
from prometheus_client import CollectorRegistry
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.static import File
from werkzeug.exceptions import MethodNotAllowed

from twisted_iop.controlplane.cluster.store import ClusterUnavailable
from twisted_iop.controlplane.deployments.routes import add_deployment_routes
from twisted_iop.controlplane.deployments.service import DeploymentService
from twisted_iop.controlplane.fleet.edge_filters import EDGE_STATES, FLEET_STATES, EdgeFilter
from twisted_iop.controlplane.fleet.edge_record import UnknownEdge
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.http import json_views as views
from twisted_iop.controlplane.http.auth import OPERATOR, VIEWER, ApiToken
from twisted_iop.controlplane.http.console_files import CONSOLE_DIR, ConsoleFiles
from twisted_iop.controlplane.http.errors import (
    DOMAIN_ERRORS,
    BadRequest,
    BodyTooLarge,
    Forbidden,
    NotFound,
    Unauthorized,
    encoded_json_body,
    error_body,
    json_body,
    method_not_allowed,
    query_int,
    query_text,
)
from twisted_iop.controlplane.http.history_routes import add_history_routes
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.http.settings import HttpSettings
from twisted_iop.controlplane.requests.command_body import parse_command_body
from twisted_iop.controlplane.requests.command_dispatch import IdempotencyConflict
from twisted_iop.controlplane.requests.errors import SHUTTING_DOWN_REASON, STOPPED_BEFORE_END_REASON
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.requests.operation_states import EDGE_DISCONNECTED, FAILED, SUPERSEDED, TIMED_OUT
from twisted_iop.controlplane.rollouts.routes import add_rollout_routes
from twisted_iop.controlplane.rollouts.service import RolloutService
from twisted_iop.controlplane.slo.routes import add_slo_routes
from twisted_iop.controlplane.slo.service import SloService
from twisted_iop.controlplane.slo.settings import SloSettings
from twisted_iop.controlplane.store.interface import StoreHealth
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.ids import id_problem
from twisted_iop.metrics import render as render_metrics
from twisted_iop.web.http_site import WRITE_METHODS, Refusal
from twisted_iop.web.route_methods import allow_header, served_methods

if TYPE_CHECKING:
    from twisted_iop.controlplane.cluster.replica import ClusterReplica

DEFAULT_PAGE = 100
MAX_PAGE = 1000
#: The OpenAPI 3.1 document of these routes, packaged next to this module.
OPENAPI_RESOURCE = "openapi.json"


class Listener(Protocol):
    """What readiness needs to know of a listener (see twisted_iop.listeners)."""

    label: str
    is_bound: bool
    port_number: int


class ListenerReadiness:
    """A live view of the listeners: ready when every one is bound.

    It keeps the sequence it is given (not a copy), so listeners added to
    it later are seen.
    """

    def __init__(self, listeners: Sequence[Listener] = ()) -> None:
        self._listeners = listeners
        #: Set from the first moment of a stop: never ready again.
        self.stopping = False

    @property
    def listeners(self) -> dict[str, bool]:
        """Whether each listener is bound, by label."""
        return {listener.label: listener.is_bound for listener in self._listeners}

    @property
    def ports(self) -> dict[str, int]:
        """The bound TCP port of each bound listener, by label."""
        return {l.label: l.port_number for l in self._listeners if l.is_bound and l.port_number}

    @property
    def ready(self) -> bool:
        """Whether there are listeners, every one is bound, and no stop has begun."""
        return not self.stopping and bool(self._listeners) and all(l.is_bound for l in self._listeners)


class StoreHealthSource(Protocol):
    """What readiness asks of the store."""

    def health(self) -> StoreHealth:
        """How the store is doing now."""


def store_json(health: StoreHealth) -> dict[str, Any]:
    """The store's part of ``GET /readyz`` (no path: where files live is the host's business)."""
    age = health.last_commit_age
    return {
        "backend": health.backend,
        "writable": health.writable,
        "error": health.error,
        "pending": health.pending,
        "pending_bytes": health.pending_bytes,
        "dropped": health.dropped,
        "last_commit_age_seconds": None if age is None else round(age, 3),
        "file_bytes": health.file_bytes,
    }


def _arg(request: IRequest, name: str) -> Optional[str]:
    return query_text(request, name)


def _page(request: IRequest, keys: list[str]) -> tuple[list[str], str | None]:
    """Cut a sorted key list at ``cursor``/``limit``; return keys and next cursor."""
    limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    cursor = _arg(request, "cursor")
    start = 0
    if cursor:
        # keys are sorted: start after the cursor even if it has gone away.
        start = bisect.bisect_right(keys, cursor)
    chosen = keys[start : start + limit]
    next_cursor = chosen[-1] if start + limit < len(keys) and chosen else None
    return chosen, next_cursor


def _filter(request: IRequest, states: tuple[str, ...]) -> EdgeFilter:
    """The request's ``selector``, ``state`` and ``q``, parsed once."""
    return EdgeFilter.parse(_arg(request, "selector"), _arg(request, "state"), _arg(request, "q"), states)


class ControlPlaneHttp:
    """The Klein app: health, edges, status, events, operations, commands, fleet."""

    app = Klein()
    _log = Logger()

    def __init__(
        self,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        clock: IReactorTime,
        readiness: ListenerReadiness,
        settings: HttpSettings = HttpSettings(),
        metrics: Optional[CollectorRegistry] = None,
        cluster: Optional[ClusterReplica] = None,
        rollouts: Optional[RolloutService] = None,
        store: Optional[StoreHealthSource] = None,
        history: Optional[HistoryService] = None,
        slos: Optional[SloService] = None,
        deployments: Optional[DeploymentService] = None,
    ) -> None:
        self._cluster = cluster
        #: What keeps the fleet's history across restarts (its health is part of readiness).
        self._store = store
        #: The rollouts (``rollout_routes.py`` puts their routes on this app).
        self._rollouts = rollouts if rollouts is not None else RolloutService(registry, gateway, clock)
        #: Capacity history (``history_routes.py`` puts its routes on this app);
        #: without one, an empty history that is never sampled.
        self._history = (
            history
            if history is not None
            else HistoryService(HistorySettings(), registry, gateway, MemoryStore(), clock)
        )
        #: SLOs (``slo/routes.py`` puts their routes on this app); without
        #: one, SLOs that are kept but never evaluated or stored.
        self._slos = (
            slos
            if slos is not None
            else SloService(SloSettings(), registry, gateway, MemoryStore(), self._rollouts.event_buffer, clock)
        )
        #: Deployments (``deployments/routes.py`` puts their routes on this app); without
        #: one, deployments that are kept in memory and sent to no edge until started.
        self._deployments = (
            deployments
            if deployments is not None
            else DeploymentService(registry, gateway, MemoryStore(), self._rollouts.event_buffer, clock)
        )
        self._registry = registry
        self._gateway = gateway
        self._clock = clock
        self._readiness = readiness
        self._settings = settings
        self._metrics = metrics
        self._openapi: Optional[bytes] = None
        #: The views that reuse earlier renderings, and the caches they keep.
        self._json = JsonBytesRenderer()

    # -- errors --------------------------------------------------------------

    @app.handle_errors(BadRequest)
    def _bad_request(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert isinstance(error, BadRequest)
        return error_body(request, 400, error.code, str(error))

    @app.handle_errors(*DOMAIN_ERRORS)
    def _domain_error(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert error is not None
        for kind, (status, code) in DOMAIN_ERRORS.items():
            if isinstance(error, kind):
                if kind is Unauthorized:
                    request.setHeader(b"WWW-Authenticate", b'Bearer realm="iop"')
                return error_body(request, status, code, str(error))
        raise error

    @app.handle_errors(MethodNotAllowed)
    def _method_not_allowed(self, request: IRequest, failure: Failure) -> bytes:
        error = failure.value
        assert isinstance(error, MethodNotAllowed)
        return method_not_allowed(
            request, [m for m in ("GET", "HEAD", "POST", "PUT", "DELETE") if m in (error.valid_methods or ())]
        )

    @app.handle_errors(Exception)
    def _internal(self, request: IRequest, failure: Failure) -> bytes:
        self._log.failure("HTTP view failed", failure)
        return error_body(request, 500, "internal", "internal error; see the Control Plane log")

    # -- helpers ----------------------------------------------------------------

    @property
    def _now(self) -> float:
        """The clock's time."""
        return self._clock.seconds()

    def _authorize(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, checked for the role the method needs.

        Reads need a ``viewer`` token and writes an ``operator`` one (when
        tokens are configured at all); returns None when access is open.
        """
        tokens = self._settings.tokens
        if not tokens.required:
            return None
        header = request.getHeader(b"authorization")
        if not header:
            raise Unauthorized()
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer" or not given.strip():
            raise Unauthorized()
        token = tokens.identify(given.strip())
        if token is None:
            raise Forbidden()
        role = OPERATOR if request.method in WRITE_METHODS else VIEWER
        if not token.may(role):
            raise Forbidden(f"token {token.name!r} is a {token.role} token; this needs the {role} role")
        return token

    def _shared(self, request: IRequest) -> Optional[ApiToken]:
        """Authorize a view of shared state; in cluster mode it needs the store.

        A replica cut off from Redis would answer from a mirror that no
        longer follows the fleet: it says 503 ``cluster_unavailable``
        instead, so a client (or load balancer) goes to another replica.
        """
        caller = self._authorize(request)
        if self._cluster is not None and not self._cluster.available:
            raise ClusterUnavailable("this replica cannot reach the shared store; try another replica")
        return caller

    def check_headers(self, request: IRequest) -> Optional[Refusal]:
        """The HTTP site's check before a write's body is read: a token that may write."""
        if request.method not in WRITE_METHODS:
            return None
        try:
            self._authorize(request)
        except Unauthorized as e:
            return Refusal(401, "unauthorized", str(e))
        except Forbidden as e:
            return Refusal(403, "forbidden", str(e))
        return None

    def _edge(self, request: IRequest, edge_id: str) -> Any:
        self._shared(request)
        if id_problem("edge_id", edge_id) is not None:
            raise UnknownEdge(edge_id[:80])
        return self._registry.get(edge_id)

    def _body(self, request: IRequest) -> dict[str, Any]:
        content = request.content
        content.seek(0, 2)
        size = content.tell()
        if size > self._settings.max_body_bytes:
            raise BodyTooLarge(f"request body of {size} bytes exceeds {self._settings.max_body_bytes} bytes")
        content.seek(0)
        raw = content.read()
        if not raw.strip():
            raise BadRequest("the request body must be a JSON object", "invalid_json")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"the request body is not valid JSON: {e}", "invalid_json") from None
        except RecursionError:
            raise BadRequest("the request body is nested too deeply", "invalid_json") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object", "invalid_json")
        return body

    # -- health ----------------------------------------------------------------

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: IRequest) -> bytes:
        """Liveness: the process answers."""
        return json_body(request, 200, {"status": "ok"})

    @app.route("/readyz", methods=["GET"])
    def readyz(self, request: IRequest) -> bytes:
        """Readiness: every listener is bound and the Control Plane is not stopping."""
        ready = self._readiness.ready
        body: dict[str, Any] = {
            "ready": ready,
            "stopping": self._readiness.stopping,
            "listeners": dict(self._readiness.listeners),
        }
        if self._cluster is not None:
            available = self._cluster.available
            ready = ready and available
            body["ready"] = ready
            body["cluster"] = {
                "replica_id": self._cluster.replica_id,
                "available": available,
                "loaded": self._cluster.loaded,
            }
        if self._store is not None:
            health = self._store.health()
            ready = ready and health.writable
            body["ready"] = ready
            body["store"] = store_json(health)
        return json_body(request, 200 if ready else 503, body)

    @app.route("/metrics", methods=["GET"])
    def metrics(self, request: IRequest) -> bytes:
        """Prometheus metrics (text exposition format)."""
        self._authorize(request)
        if self._metrics is None:
            raise NotFound("metrics are not enabled")
        body, content_type = render_metrics(self._metrics)
        request.setHeader(b"Content-Type", content_type.encode("ascii"))
        request.setHeader(b"Cache-Control", b"no-store")
        return body

    @app.route("/openapi.json", methods=["GET"])
    def openapi(self, request: IRequest) -> bytes:
        """The OpenAPI document of this API: the contract every view is tested against."""
        if self._openapi is None:
            self._openapi = resources.files("twisted_iop.controlplane").joinpath(OPENAPI_RESOURCE).read_bytes()
        request.setHeader(b"Content-Type", b"application/json")
        return self._openapi

    # -- edges -----------------------------------------------------------------

    @app.route("/edges", methods=["GET"])
    def edges(self, request: IRequest) -> bytes:
        """A page of edge summaries, sorted by id; filtered by ``selector``,
        ``state`` and ``q`` (all must hold), ``total`` of the filtered set."""
        self._shared(request)
        filter_ = _filter(request, EDGE_STATES)
        if filter_.empty:
            ids = self._registry.edge_ids()
        else:
            ids = [record.edge_id for record in filter_.records(self._registry.edges())]
        chosen, next_cursor = _page(request, ids)
        items = [views.edge_summary(self._registry.get(i)) for i in chosen]
        return json_body(request, 200, {"items": items, "total": len(ids), "next_cursor": next_cursor})

    @app.route("/edges/<edge_id>", methods=["GET"])
    def edge(self, request: IRequest, edge_id: str) -> bytes:
        """One edge, its status and its buffers."""
        body = self._json.edge_detail(self._edge(request, edge_id))
        request.setHeader(b"Content-Type", b"application/json")
        request.setHeader(b"Cache-Control", b"no-store")
        # A known length: the answer goes out whole, not chunked.
        request.setHeader(b"Content-Length", b"%d" % len(body))
        return body

    @app.route("/edges/<edge_id>/status", methods=["GET"])
    async def edge_status(self, request: IRequest, edge_id: str) -> bytes:
        """A fresh status snapshot, or the stale one with the reason."""
        record = self._edge(request, edge_id)
        if not record.connected:
            stale = self._json.edge_status_json(record, record.snapshot, True) if record.snapshot else None
            return error_body(request, 409, "edge_not_connected", f"edge {edge_id!r} is not connected", snapshot=stale)
        snapshot = await self._gateway.status(edge_id)
        return encoded_json_body(request, 200, self._json.edge_status(record, snapshot, False))

    @app.route("/edges/<edge_id>/events", methods=["GET"])
    def edge_events(self, request: IRequest, edge_id: str) -> bytes:
        """Events of one edge after ``since``."""
        record = self._edge(request, edge_id)
        return json_body(request, 200, dict(edge_id=edge_id, **self._events_page(request, record.events, "sequence")))

    def _events_page(self, request: IRequest, buffer: Any, key: str) -> dict[str, Any]:
        since = query_int(request, "since", 0, 0)
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        events = buffer.since(since, limit)
        next_since = getattr(events[-1], key) if events else max(since, 0)
        return {
            "items": [views.event_json(e) for e in events],
            "capacity": buffer.capacity,
            "kept": len(buffer),
            "dropped": buffer.dropped,
            **views.byte_facts(buffer),
            "first_sequence": buffer.first_sequence,
            "last_sequence": buffer.last_sequence,
            "next_since": next_since,
        }

    @app.route("/edges/<edge_id>/operations", methods=["GET"])
    def edge_operations(self, request: IRequest, edge_id: str) -> bytes:
        """Operations of one edge, newest first."""
        record = self._edge(request, edge_id)
        page = self._operations_page(request, record.operations.newest_first())
        page.update(
            edge_id=edge_id,
            capacity=record.operations.capacity,
            kept=len(record.operations),
            dropped=record.operations.dropped,
            **views.byte_facts(record.operations),
        )
        return json_body(request, 200, page)

    def _operations_page(self, request: IRequest, operations: list[OperationRecord]) -> dict[str, Any]:
        limit = query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        cursor = _arg(request, "cursor")
        start = 0
        if cursor:
            for index, op in enumerate(operations):
                if op.operation_id == cursor:
                    start = index + 1
                    break
            else:
                raise BadRequest("cursor does not name a kept operation")
        chosen = operations[start : start + limit]
        more = start + limit < len(operations)
        return {
            "items": [views.operation_json(op) for op in chosen],
            "total": len(operations),
            "next_cursor": chosen[-1].operation_id if more and chosen else None,
        }

    @app.route("/edges/<edge_id>/operations/<operation_id>", methods=["GET"])
    def edge_operation(self, request: IRequest, edge_id: str, operation_id: str) -> bytes:
        """One operation."""
        record = self._edge(request, edge_id)
        operation = record.operations.get(operation_id)
        if operation is None:
            raise NotFound(f"no operation {operation_id[:80]!r} is kept for edge {edge_id!r}")
        return json_body(request, 200, views.operation_json(operation))

    @app.route("/edges/<edge_id>/commands", methods=["GET"])
    def edge_commands(self, request: IRequest, edge_id: str) -> bytes:
        """The command catalog the edge announced."""
        record = self._edge(request, edge_id)
        commands = [views.command_spec_json(c) for c in record.hello.commands]
        return json_body(request, 200, {"edge_id": edge_id, "connected": record.connected, "commands": commands})

    @app.route("/edges/<edge_id>/commands", methods=["POST"])
    async def send_command(self, request: IRequest, edge_id: str) -> bytes:
        """Dispatch a command and wait for its end, up to the timeout."""
        caller = self._authorize(request)
        self._edge(request, edge_id)
        body = self._body(request)
        command = parse_command_body(body)
        name, target, args = command.name, command.target, command.arguments
        timeout = body.get("timeout_seconds", self._settings.command_timeout(name))
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise BadRequest("field 'timeout_seconds' must be a number")
        if not 0 < timeout <= self._settings.max_command_timeout_seconds:
            raise BadRequest(
                f"field 'timeout_seconds' must be above 0 and at most {self._settings.max_command_timeout_seconds:g}"
            )
        key = body.get("idempotency_key")
        header = request.getHeader(b"idempotency-key")
        if key is None and header is not None:
            key = header.decode("utf-8", "replace")
        elif header is not None and len(header.decode("utf-8", "replace")) > 200:
            # The body's key wins, but a header over its documented bound is
            # still a bad request (not silently ignored).
            raise BadRequest("the Idempotency-Key header must be at most 200 characters")
        if key is None:
            key = body.get("command_id")
        if key is not None and (not isinstance(key, str) or len(key) > 200):
            raise BadRequest("the idempotency key must be a string of at most 200 characters")
        operation_id = ""
        if self._cluster is not None and key:
            # The key is taken cluster-wide first (SET NX): a retry of this
            # POST on another replica finds the same operation.
            operation_id = await self._cluster.reserve_operation(edge_id, key)
        try:
            dispatched = self._gateway.dispatch(
                edge_id,
                name,
                target,
                args,
                float(timeout),
                key or "",
                caller.name if caller is not None else "",
                operation_id,
            )
        except IdempotencyConflict as conflict:
            return error_body(
                request, 409, "idempotency_conflict", str(conflict), operation=views.operation_json(conflict.operation)
            )
        operation = await dispatched.ended
        return self._operation_answer(request, operation, dispatched.replayed)

    def _operation_answer(self, request: IRequest, operation: OperationRecord, replayed: bool) -> bytes:
        rendered = views.operation_json(operation)
        if operation.state == TIMED_OUT:
            return error_body(request, 504, "edge_timeout", operation.reason, operation=rendered, replayed=replayed)
        if operation.state == EDGE_DISCONNECTED:
            return error_body(
                request, 503, "edge_disconnected", operation.reason, operation=rendered, replayed=replayed
            )
        if operation.state == SUPERSEDED:
            return error_body(request, 503, "edge_superseded", operation.reason, operation=rendered, replayed=replayed)
        if operation.state == FAILED and operation.reason == SHUTTING_DOWN_REASON:
            if self._gateway.stopping:
                return error_body(
                    request, 503, "shutting_down", operation.reason, operation=rendered, replayed=replayed
                )
            # Ended by a stop that is over (a restart, or another replica's):
            # the operation as it ended, never the stop's 503 kept by its key.
            rendered["reason"] = STOPPED_BEFORE_END_REASON
        rendered["replayed"] = replayed
        return json_body(request, 200, rendered)

    # -- fleet --------------------------------------------------------------

    @app.route("/fleet/status", methods=["GET"])
    async def fleet_status(self, request: IRequest) -> bytes:
        """A row per edge (fresh where possible) and fleet totals, from the
        shared fleet round (joined while it runs, reused within its max age).
        Filtered by ``selector``, ``state`` and ``q``, the round asks only
        the matching edges and the totals are those of the matching rows."""
        self._shared(request)
        limit = query_int(request, "limit", MAX_PAGE, 1, 10000)
        cursor = _arg(request, "cursor") or ""
        round_ = await self._gateway.fleet_status(_filter(request, FLEET_STATES))
        return encoded_json_body(request, 200, self._json.fleet_page(round_, cursor, limit, self._clock.seconds()))

    @app.route("/fleet/events", methods=["GET"])
    def fleet_events(self, request: IRequest) -> bytes:
        """Events of every edge after fleet sequence ``since``."""
        self._shared(request)
        return json_body(request, 200, self._events_page(request, self._registry.fleet_events, "fleet_sequence"))

    @app.route("/fleet/operations", methods=["GET"])
    def fleet_operations(self, request: IRequest) -> bytes:
        """Operations of every edge, newest first."""
        self._shared(request)
        return json_body(request, 200, self._operations_page(request, self._registry.operations.fleet_operations()))

    # -- console ------------------------------------------------------------

    @app.route("/", methods=["GET"])
    def root(self, request: IRequest) -> bytes:
        """Send people to the console."""
        request.redirect(b"/console/")
        return b""

    @app.route("/console", methods=["GET"])
    def console_redirect(self, request: IRequest) -> bytes:
        """``/console`` -> ``/console/``."""
        request.redirect(b"/console/")
        return b""

    @app.route("/console/config.json", methods=["GET"])
    def console_config(self, request: IRequest) -> bytes:
        """Where the console finds the client WebSocket."""
        return json_body(
            request,
            200,
            {"wire_url": self._wire_url(request), "api_token_required": self._settings.tokens.required},
        )

    def _wire_url(self, request: IRequest) -> str:
        if self._settings.wire_public_url:
            return self._settings.wire_public_url
        host_header = request.getHeader(b"host") or b"127.0.0.1"
        host = urlsplit("//" + host_header.decode("ascii", "replace")).hostname or "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        port = self._readiness.ports.get("client_wire") or self._settings.wire_port
        scheme = "wss" if self._settings.wire_tls else "ws"
        return f"{scheme}://{host}:{port}{self._settings.wire_path}"

    @app.route("/console/", branch=True, methods=["GET"])
    def console(self, request: IRequest) -> File:
        """The static web console."""
        return ConsoleFiles(str(CONSOLE_DIR))

    @app.route("/<path:rest>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    def not_found(self, request: IRequest, rest: str) -> bytes:
        """Anything else: a JSON 404, or a 405 where another method is served."""
        served = served_methods(self.app.url_map, "/" + rest, "not_found")
        if served:
            return method_not_allowed(request, served)
        return error_body(request, 404, "not_found", "no such resource")

    def allow_header(self, path: bytes) -> Optional[bytes]:
        """The ``Allow`` header of ``path`` (the site's 405 for OPTIONS, TRACE ...), None if unknown."""
        return allow_header(self.app.url_map, path, "not_found")


add_rollout_routes(ControlPlaneHttp.app)
add_deployment_routes(ControlPlaneHttp.app)
add_history_routes(ControlPlaneHttp.app)
add_slo_routes(ControlPlaneHttp.app)
