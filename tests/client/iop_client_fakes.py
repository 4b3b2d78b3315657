"""The fake WebSocket ``/client`` server that test_wire_client.py still uses.

Only the wire client's own tests (owned by the wire client's rewrite) use
it; every HTTP client test runs against the real Control Plane
(tests/client/real_fleet.py). Remove this file once test_wire_client.py
no longer imports it.
"""

from __future__ import annotations

from typing import Any, Optional

from autobahn.twisted.websocket import WebSocketServerFactory, WebSocketServerProtocol
from twisted.internet.endpoints import TCP4ServerEndpoint

from twisted_iop.wire import control_pb2 as pb


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
