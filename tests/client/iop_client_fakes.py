"""Fakes for the client tests: canned Control Plane JSON and a fake wire server.

The canned documents copy the examples of docs/http-api.md; the fake HTTP
resource serves them by method and path (``StubTreq`` drives it without
sockets), and :class:`FakeWireServer` is a tiny WebSocket ``/client`` server
that speaks the ClientEnvelope protocol as the contract describes, with
knobs to drop connections and trim its buffer.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Optional

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.web.resource import Resource
from twisted.web.server import Request

from twisted_iop.wire import control_pb2 as pb

T0 = "2026-11-29T20:00:00.123Z"
T1 = "2026-11-29T20:00:05.000Z"

COUNTERS = {"capacity": 4, "in_flight": 1, "queued": 0}
LC_COUNTERS = {"capacity": 1, "in_flight": 0, "queued": 2}

EDGE_SUMMARY = {
    "edge_id": "edge-a",
    "connected": True,
    "labels": {"site": "lab", "region": "eu"},
    "software_version": "0.1.0",
    "protocol_version": "1.0",
    "connected_at": T0,
    "last_seen": T1,
    "disconnected_at": None,
    "enrollments": 2,
    "commands": ["node.drain", "node.undrain"],
}

EDGE_B_SUMMARY = dict(
    EDGE_SUMMARY,
    edge_id="edge-b",
    connected=False,
    labels={},
    connected_at=None,
    disconnected_at=T1,
    enrollments=1,
    commands=[],
)

EDGE_DETAIL = dict(
    EDGE_SUMMARY,
    status={"available": True, "stale": False, "received_at": T1},
    events={"capacity": 1000, "kept": 120, "dropped": 3, "last_sequence": 123},
    operations={"capacity": 500, "kept": 2, "dropped": 0},
)

PROVIDER = {
    "provider_id": "mock-a",
    "kind": "mock",
    "models": ["llama-3-8b"],
    "status": "available",
    "health": "healthy",
    "health_reason": "",
    "general": COUNTERS,
    "long_context": LC_COUNTERS,
}

EDGE_TOTALS = {
    "nodes_connected": 1,
    "nodes_configured": 2,
    "providers": 2,
    "providers_by_status": {"available": 1, "drained": 0, "unavailable": 1},
    "providers_by_health": {"healthy": 1, "degraded": 0, "unhealthy": 0, "offline": 1, "unknown": 0},
    "general": COUNTERS,
    "long_context": LC_COUNTERS,
}

EDGE_STATUS = {
    "edge_id": "edge-a",
    "connected": True,
    "stale": False,
    "generated_at": T0,
    "received_at": T1,
    "nodes": [
        {
            "node_id": "node-1",
            "connected": True,
            "drained": False,
            "connected_since": T0,
            "last_seen": T1,
            "labels": {"gpu": "a100"},
            "providers": [PROVIDER],
        },
        {
            "node_id": "node-2",
            "connected": False,
            "drained": False,
            "connected_since": None,
            "last_seen": T0,
            "labels": {},
            "providers": [
                dict(
                    PROVIDER,
                    provider_id="vllm-b",
                    kind="vllm",
                    status="unavailable",
                    health="offline",
                    health_reason="node not connected",
                    general={"capacity": 0, "in_flight": 0, "queued": 0},
                    long_context={"capacity": 0, "in_flight": 0, "queued": 0},
                )
            ],
        },
    ],
    "totals": EDGE_TOTALS,
}

EVENT = {
    "sequence": 7,
    "fleet_sequence": 42,
    "edge_id": "edge-a",
    "kind": "node.ready",
    "occurred_at": T0,
    "recorded_at": T1,
    "node_id": "node-1",
    "provider_id": None,
    "command_id": None,
    "message": "node node-1 is ready",
    "attributes": {},
}

EVENTS = {
    "edge_id": "edge-a",
    "items": [EVENT, dict(EVENT, sequence=8, fleet_sequence=43, kind="node.disconnected", message="node node-1 left")],
    "capacity": 1000,
    "kept": 120,
    "dropped": 0,
    "first_sequence": 1,
    "last_sequence": 120,
    "next_since": 8,
}

FLEET_EVENTS = dict(EVENTS, first_sequence=1, last_sequence=43, next_since=43)
del FLEET_EVENTS["edge_id"]

OPERATION = {
    "operation_id": "0f3c9a",
    "edge_id": "edge-a",
    "name": "node.drain",
    "target": "node-1",
    "arguments": {"reason": "maintenance"},
    "idempotency_key": "drain-1",
    "state": "succeeded",
    "reason": "",
    "result": {"drained": "true"},
    "created_at": T0,
    "updated_at": T1,
    "finished_at": T1,
    "deadline_at": T1,
    "history": [
        {"state": "sent", "at": T0, "reason": ""},
        {"state": "accepted", "at": T0, "reason": ""},
        {"state": "succeeded", "at": T1, "reason": ""},
    ],
}

OPERATIONS = {"items": [OPERATION], "total": 1, "next_cursor": None, "capacity": 500, "kept": 1, "dropped": 0}

COMMANDS = {
    "edge_id": "edge-a",
    "commands": [
        {
            "name": "node.drain",
            "description": "Stop new leases on a node",
            "target_kind": "node",
            "arguments": [{"name": "reason", "description": "why", "required": False}],
        },
        {"name": "edge.diagnostics", "description": "Versions and counters", "target_kind": "", "arguments": []},
    ],
}

FLEET_ROW = {
    "edge_id": "edge-a",
    "connected": True,
    "state": "ok",
    "error": None,
    "received_at": T1,
    "stale": False,
    "nodes_connected": 2,
    "nodes_configured": 2,
    "providers": 3,
    "general": {"capacity": 12, "in_flight": 0, "queued": 0},
    "long_context": {"capacity": 2, "in_flight": 0, "queued": 0},
}

FLEET_TOTALS = {
    "edges_known": 2,
    "edges_connected": 1,
    "nodes_connected": 2,
    "nodes_configured": 2,
    "providers": 3,
    "providers_by_status": {"available": 3, "drained": 0, "unavailable": 0},
    "providers_by_health": {"healthy": 3, "degraded": 0, "unhealthy": 0, "offline": 0, "unknown": 0},
    "general": {"capacity": 12, "in_flight": 0, "queued": 0},
    "long_context": {"capacity": 2, "in_flight": 0, "queued": 0},
}

FLEET_STATUS = {
    "generated_at": T1,
    "items": [FLEET_ROW],
    "total": 2,
    "next_cursor": "edge-a",
    "totals": FLEET_TOTALS,
}

FLEET_STATUS_PAGE_2 = dict(
    FLEET_STATUS,
    items=[
        dict(
            FLEET_ROW,
            edge_id="edge-b",
            connected=False,
            state="disconnected",
            stale=True,
            error=None,
            nodes_connected=0,
        )
    ],
    next_cursor=None,
)


def error_body(code: str, message: str, status: int, **extra: Any) -> dict[str, Any]:
    """An error document as the Control Plane writes it."""
    return dict({"error": {"code": code, "message": message, "status": status}}, **extra)


class FakeControlPlaneResource(Resource):
    """Serves canned JSON by ``(method, path)``; records every request.

    ``routes`` maps ``(method, path)`` to ``(status, document)``; a path
    with a query string (arguments sorted by name) matches only that query. Unknown routes
    answer 404 ``not_found`` like the real server. When ``api_token`` is set
    the Bearer check of docs/http-api.md is applied.
    """

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}
        self.requests: list[dict[str, Any]] = []
        self.api_token: Optional[str] = None
        self.install_defaults()

    def install_defaults(self) -> None:
        """The canned documents of docs/http-api.md for edge-a."""
        r = self.routes
        r[("GET", "/healthz")] = (200, {"status": "ok"})
        r[("GET", "/readyz")] = (
            200,
            {"ready": True, "listeners": {"http": True, "edge_wire": True, "client_wire": True}},
        )
        r[("GET", "/edges")] = (200, {"items": [EDGE_SUMMARY, EDGE_B_SUMMARY], "total": 2, "next_cursor": None})
        r[("GET", "/edges/edge-a")] = (200, EDGE_DETAIL)
        r[("GET", "/edges/edge-a/status")] = (200, EDGE_STATUS)
        r[("GET", "/edges/edge-a/events")] = (200, EVENTS)
        r[("GET", "/edges/edge-a/operations")] = (200, OPERATIONS)
        r[("GET", "/edges/edge-a/operations/0f3c9a")] = (200, OPERATION)
        r[("GET", "/edges/edge-a/commands")] = (200, COMMANDS)
        r[("POST", "/edges/edge-a/commands")] = (200, OPERATION)
        r[("GET", "/fleet/status")] = (200, FLEET_STATUS)
        r[("GET", "/fleet/status?cursor=edge-a&limit=1000")] = (200, FLEET_STATUS_PAGE_2)
        r[("GET", "/fleet/events")] = (200, FLEET_EVENTS)
        r[("GET", "/fleet/operations")] = (200, {"items": [OPERATION], "total": 1, "next_cursor": None})
        for path in ("/edges/nope", "/edges/nope/status", "/edges/nope/events", "/edges/nope/commands"):
            r[("GET", path)] = (404, error_body("unknown_edge", "no edge named 'nope' is known", 404))
        stale = dict(copy.deepcopy(EDGE_STATUS), edge_id="edge-b", connected=False, stale=True)
        r[("GET", "/edges/edge-b/status")] = (
            409,
            error_body("edge_not_connected", "edge 'edge-b' is not connected", 409, snapshot=stale),
        )

    def render(self, request: Request) -> bytes:
        """Answer from ``routes``."""
        method = request.method.decode()
        full = request.uri.decode()
        path = request.path.decode()
        body = request.content.read() if request.content is not None else b""
        self.requests.append(
            {
                "method": method,
                "uri": full,
                "path": path,
                "args": {k.decode(): [v.decode() for v in vs] for k, vs in request.args.items()},
                "headers": {k.decode().lower(): v[0].decode() for k, v in request.requestHeaders.getAllRawHeaders()},
                "body": body,
            }
        )
        request.setHeader(b"Content-Type", b"application/json")
        if self.api_token is not None and path not in ("/healthz", "/readyz"):
            given = request.getHeader(b"Authorization")
            if given is None:
                request.setResponseCode(401)
                return json.dumps(error_body("unauthorized", "an API token is required", 401)).encode()
            if given.decode() != f"Bearer {self.api_token}":
                request.setResponseCode(403)
                return json.dumps(error_body("forbidden", "the API token is wrong", 403)).encode()
        query = sorted(f"{k.decode()}={v.decode()}" for k, vs in request.args.items() for v in vs)
        keyed = path + ("?" + "&".join(query) if query else "")
        route = self.routes.get((method, keyed)) or self.routes.get((method, path))
        if route is None:
            request.setResponseCode(404)
            return json.dumps(error_body("not_found", f"no route {method} {path}", 404)).encode()
        status, document = route
        request.setResponseCode(status)
        if isinstance(document, bytes):
            return document
        return json.dumps(document).encode()


# ---------------------------------------------------------------- wire


def fleet_event(edge_id: str, sequence: int, fleet_sequence: int, kind: str = "node.ready") -> pb.FleetEvent:
    """A wire event."""
    return pb.FleetEvent(
        sequence=sequence,
        fleet_sequence=fleet_sequence,
        edge_id=edge_id,
        kind=kind,
        occurred_at_ms=1_700_000_000_000 + sequence,
        recorded_at_ms=1_700_000_000_000 + sequence,
        node_id="node-1",
        message=f"event {sequence}",
        attributes={"n": str(sequence)},
    )


class FakeWireProtocol(WebSocketServerProtocol):
    """The server side of one client connection of :class:`FakeWireServer`."""

    factory: FakeWireServer

    def onOpen(self) -> None:
        self.said_hello = False
        self.subscribed: Optional[str] = None
        self.factory.connections.append(self)

    def onClose(self, wasClean: bool, code: Any, reason: Any) -> None:
        if self in self.factory.connections:
            self.factory.connections.remove(self)

    def send_envelope(self, body: str, message: Any, request_id: int = 0) -> None:
        envelope = pb.ClientEnvelope(request_id=request_id)
        getattr(envelope, body).CopyFrom(message)
        self.sendMessage(envelope.SerializeToString(), isBinary=True)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        envelope = pb.ClientEnvelope()
        envelope.ParseFromString(payload)
        body = envelope.WhichOneof("body")
        self.factory.received.append(envelope)
        rid = envelope.request_id
        server = self.factory
        if body == "client_hello_request":
            hello = envelope.client_hello_request
            accepted = server.token is None or hello.api_token == server.token
            self.send_envelope(
                "client_hello_response",
                pb.ClientHelloResponse(
                    accepted=accepted,
                    reason="" if accepted else "the API token is missing or wrong",
                    server_version="fake-1",
                    protocol_major=1,
                    protocol_minor=0,
                    features=["events.subscribe", "events.resume"],
                ),
                rid,
            )
            if accepted:
                self.said_hello = True
            else:
                self.sendClose(code=4001, reason="bad token")
        elif not self.said_hello:
            self.send_envelope("error", pb.Error(code=pb.ERROR_CODE_HELLO_REQUIRED, message="hello first"), rid)
        elif body == "subscribe_request":
            request = envelope.subscribe_request
            if request.edge_id and request.edge_id not in server.known_edges:
                self.send_envelope(
                    "error",
                    pb.Error(code=pb.ERROR_CODE_INVALID_ARGUMENT, message=f"no edge named {request.edge_id!r}"),
                    rid,
                )
                return
            buffered = server.buffered(request.edge_id)
            seq = server.sequence_key(request.edge_id)
            last = seq(buffered[-1]) if buffered else server.trimmed_through
            oldest = seq(buffered[0]) if buffered else 0
            self.send_envelope(
                "subscribe_response",
                pb.SubscribeResponse(edge_id=request.edge_id, last_sequence=last, oldest_sequence=oldest),
                rid,
            )
            self.subscribed = request.edge_id
            if request.resume:
                since = request.since_sequence
                first = oldest or last + 1
                if since + 1 < first:
                    self.send_envelope(
                        "events_lost",
                        pb.EventsLost(
                            count=first - since - 1,
                            first_sequence=since + 1,
                            last_sequence=first - 1,
                            reason="resume_gap",
                        ),
                    )
                for event in buffered:
                    if seq(event) > since:
                        self.send_envelope("event", event)


class FakeWireServer(WebSocketServerFactory):
    """A fake ``/client`` server: hello, subscribe with resume, publish, drop.

    Events are kept in ``events``; :meth:`trim` forgets the oldest ones so a
    resume produces a ``resume_gap``.
    """

    protocol = FakeWireProtocol

    def __init__(self, token: Optional[str] = None) -> None:
        super().__init__()
        self.setProtocolOptions(maxFramePayloadSize=1 << 20, maxMessagePayloadSize=1 << 20, autoPingInterval=0)
        self.token = token
        self.known_edges = {"edge-a"}
        self.events: list[pb.FleetEvent] = []
        self.trimmed_through = 0
        self.connections: list[FakeWireProtocol] = []
        self.received: list[pb.ClientEnvelope] = []
        self.port: Any = None

    @staticmethod
    def sequence_key(edge_id: str) -> Any:
        """The sequence a subscription on ``edge_id`` counts in."""
        return (lambda e: e.sequence) if edge_id else (lambda e: e.fleet_sequence)

    def buffered(self, edge_id: str) -> list[pb.FleetEvent]:
        """The events a subscription on ``edge_id`` can still replay."""
        return [e for e in self.events if not edge_id or e.edge_id == edge_id]

    def publish(self, event: pb.FleetEvent) -> None:
        """Record an event and send it to matching subscribers."""
        self.events.append(event)
        for connection in list(self.connections):
            if connection.subscribed is not None and connection.subscribed in ("", event.edge_id):
                connection.send_envelope("event", event)

    def send_lost(self, count: int, first: int, last: int, reason: str = "slow_consumer") -> None:
        """Tell every subscriber that events were lost."""
        for connection in list(self.connections):
            connection.send_envelope(
                "events_lost", pb.EventsLost(count=count, first_sequence=first, last_sequence=last, reason=reason)
            )

    def trim(self, keep: int) -> None:
        """Forget all but the newest ``keep`` events."""
        dropped = self.events[: len(self.events) - keep]
        if dropped:
            self.trimmed_through = max(self.trimmed_through, max(e.sequence for e in dropped))
        self.events = self.events[len(self.events) - keep :]

    def drop_all(self) -> None:
        """Abort every client connection (a network failure, as clients see it)."""
        for connection in list(self.connections):
            assert connection.transport is not None
            connection.transport.abortConnection()

    async def listen(self, reactor: Any) -> str:
        """Listen on a free loopback port; answer the ws:// URL."""
        self.port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(self)
        return f"ws://127.0.0.1:{self.port.getHost().port}/client"

    async def stop(self) -> None:
        """Stop listening and drop every connection."""
        self.drop_all()
        if self.port is not None:
            await self.port.stopListening()
