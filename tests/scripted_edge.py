"""A small scripted Edge for Control Plane tests: enrolls, answers status
and commands as told, relays events, reconnects and misbehaves on purpose."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.python.failure import Failure

from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, PeerSettings

CATALOG = [
    pb.CommandSpec(name="node.drain", description="Stop new leases on a node", target_kind="node"),
    pb.CommandSpec(name="node.undrain", description="Resume new leases on a node", target_kind="node"),
    pb.CommandSpec(name="edge.diagnostics", description="Versions and counters", target_kind=""),
]


def snapshot(edge_id: str, nodes: int = 2, capacity: int = 4) -> pb.EdgeStatusResponse:
    """A status response with ``nodes`` connected nodes, one provider each."""
    response = pb.EdgeStatusResponse(edge_id=edge_id, generated_at_ms=1_700_000_000_000)
    for i in range(nodes):
        node = response.nodes.add(node_id=f"node-{i + 1}", connected=True, connected_since_ms=1_700_000_000_000)
        node.providers.add(
            provider_id=f"mock-{i + 1}",
            kind="mock",
            models=["llama-3-8b"],
            status=pb.PROVIDER_STATUS_AVAILABLE,
            health=pb.PROVIDER_HEALTH_HEALTHY,
            capacity=capacity,
            in_flight=1,
            queued=2,
            long_context_capacity=1,
            long_context_in_flight=0,
            long_context_queued=1,
        )
    return response


class ScriptedEdge(FramedPeerProtocol):
    """The edge side of one connection, behaving as its attributes say."""

    def __init__(self, edge_id: str, settings: PeerSettings = PeerSettings(), reactor: Any = global_reactor) -> None:
        super().__init__(reactor, settings)
        self.edge_id = edge_id
        self.credential = ""
        self.protocol_major = PROTOCOL_MAJOR
        self.catalog = list(CATALOG)
        #: Returns the status to answer with, or None to stay silent.
        self.status: Callable[[], Optional[pb.EdgeStatusResponse]] = lambda: snapshot(self.edge_id)
        #: "succeed", "fail", "reject", "silent", "hold" (kept in
        #: ``held_commands`` to answer later with :meth:`answer_held`) or "disconnect".
        self.command_behaviour = "succeed"
        self.held_commands: list[tuple[int, pb.EdgeCommandRequest]] = []
        self.commands_seen: list[pb.EdgeCommandRequest] = []
        self.status_requests = 0
        #: With hold_status, status requests wait here until release_status().
        self.hold_status = False
        self.held: list[int] = []
        self.lost: Deferred[None] = Deferred()
        self.errors: list[pb.Error] = []

    def hello(self) -> Deferred[pb.EdgeHelloResponse]:
        """Send hello; fire with the Control Plane's answer."""
        request = pb.EdgeHelloRequest(
            edge_id=self.edge_id,
            protocol_major=self.protocol_major,
            protocol_minor=PROTOCOL_MINOR,
            software_version="test-edge",
            credential=self.credential,
            labels={"site": "test"},
            commands=self.catalog,
        )
        d = self.request("edge_hello_request", request, 5)
        return d.addCallback(lambda env: env.edge_hello_response)

    def event(self, kind: str, node_id: str = "", command_id: str = "", message: str = "") -> None:
        """Relay one event."""
        self.send(
            "edge_event",
            pb.EdgeEvent(
                kind=kind, node_id=node_id, command_id=command_id, message=message, occurred_at_ms=1_700_000_000_000
            ),
        )

    def release_status(self) -> None:
        """Answer every held status request."""
        held, self.held = self.held, []
        for rid in held:
            self.send("edge_status_response", snapshot(self.edge_id), rid)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        rid = envelope.request_id
        if body == "edge_status_request":
            self.status_requests += 1
            if self.hold_status:
                self.held.append(rid)
                return
            answer = self.status()
            if answer is not None:
                self.send("edge_status_response", answer, rid)
        elif body == "edge_command_request":
            command = envelope.edge_command_request
            self.commands_seen.append(command)
            behaviour = self.command_behaviour
            if behaviour == "silent":
                return
            if behaviour == "hold":
                self.held_commands.append((rid, command))
                return
            if behaviour == "disconnect":
                assert self.transport is not None
                self.transport.loseConnection()
                return
            self.event("command.accepted", command_id=command.command_id)
            self.event("command.started", command_id=command.command_id)
            outcome = {
                "succeed": pb.COMMAND_OUTCOME_SUCCEEDED,
                "fail": pb.COMMAND_OUTCOME_FAILED,
                "reject": pb.COMMAND_OUTCOME_REJECTED,
            }[behaviour]
            self.send(
                "edge_command_response",
                pb.EdgeCommandResponse(
                    command_id=command.command_id,
                    outcome=outcome,
                    reason="" if behaviour == "succeed" else f"told to {behaviour}",
                    result={"target": command.target},
                ),
                rid,
            )
        elif body == "error":
            self.errors.append(envelope.error)

    def answer_held(self, outcome: int = pb.COMMAND_OUTCOME_SUCCEEDED, reason: str = "", **result: str) -> None:
        """Answer the oldest held command now (late, if its deadline has passed)."""
        rid, command = self.held_commands.pop(0)
        response = pb.EdgeCommandResponse(command_id=command.command_id, outcome=outcome, reason=reason, result=result)  # type: ignore[arg-type]
        self.send("edge_command_response", response, rid)

    def peer_disconnected(self, reason: Failure) -> None:
        self.lost.callback(None)


async def connect_edge(
    port: int, edge_id: str, hello: bool = True, reactor: Any = global_reactor, **attributes: Any
) -> tuple[ScriptedEdge, Optional[pb.EdgeHelloResponse]]:
    """Connect a scripted edge to ``127.0.0.1:port`` and (optionally) say hello."""
    edge = ScriptedEdge(edge_id, reactor=reactor)
    for name, value in attributes.items():
        setattr(edge, name, value)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), edge)
    response = await edge.hello() if hello else None
    return edge, response
