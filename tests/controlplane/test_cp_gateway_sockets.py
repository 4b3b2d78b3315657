"""The gateway over real sockets: takeover with a stuck old socket, late
answers, forged answers and events, keepalive as a sign of life."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import ensureDeferred

import twisted_iop.wire.peer
from twisted_iop.controlplane.wires.edge_wire import EdgeWireProtocol
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge
from twisted_iop.wire import control_pb2 as pb


async def connect_holding(cp: ControlPlaneHarness, edge_id: str) -> ScriptedEdge:
    """Connect and enroll a scripted edge that keeps command requests until told to answer them."""
    edge, response = await connect_edge(cp.edge_wire_port, edge_id, command_behaviour="hold")
    assert response is not None and response.accepted
    return edge


def server_side(cp: ControlPlaneHarness, edge_id: str) -> list[EdgeWireProtocol]:
    """The Control Plane's open connections of ``edge_id``."""
    return [c for c in cp.service.edge_factory.connections if getattr(c, "edge_id", None) == edge_id]  # type: ignore[misc]  # the connections with an edge_id are EdgeWireProtocols


@pytest_twisted.ensureDeferred
async def test_takeover_with_a_stuck_old_socket_asks_the_new_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A superseded connection that does not close holds nothing up.

    Edge A never answers status and stops reading, and the Control Plane's
    writes to it fill the socket buffers, so its socket stays open after
    the takeover. A status view in flight before the takeover and one
    issued after it are both answered by the new connection B, and the
    commands in flight on A end ``superseded`` (503 edge_superseded) at once.
    """
    monkeypatch.setattr(twisted_iop.wire.peer, "CLOSE_GRACE_SECONDS", 120.0)
    cp = await start_control_plane(config_text="http: {status_timeout_seconds: 60}")
    try:
        old, _ = await connect_edge(cp.edge_wire_port, "edge-a", status=lambda: None, command_behaviour="silent")
        (cp_side,) = server_side(cp, "edge-a")
        # Small socket buffers both ways, and A stops reading: what the
        # Control Plane writes to A now stays in its own write buffer.
        old.tcp.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        cp_side_transport: Any = cp_side.transport
        cp_side_transport.getHandle().setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        old.tcp.pauseProducing()
        big = {
            "name": "node.drain",
            "target": "node-1",
            "timeout_seconds": 60,
            "arguments": {f"pad{i:02d}": "x" * 1024 for i in range(32)},
        }
        commands = [ensureDeferred(cp.post_json("/edges/edge-a/commands", big)) for _ in range(8)]
        early = ensureDeferred(cp.get_json("/edges/edge-a/status"))
        await eventually(lambda: cp.service.gateway.status_waiters("edge-a") == 1, message="status view waiting")
        await eventually(
            lambda: len(cp.registry.get("edge-a").operations) == 8, message="eight commands dispatched to A"
        )

        new, response = await connect_edge(cp.edge_wire_port, "edge-a")
        assert response is not None and response.accepted
        assert cp_side.closing and cp_side in server_side(cp, "edge-a")  # A's socket is still open
        code, late_view = await cp.get_json("/edges/edge-a/status")
        assert code == 200 and late_view["connected"] is True
        code, _early_view = await early
        assert code == 200
        assert new.status_requests >= 1 and old.status_requests == 0  # A never even read its request
        for code, body in [await d for d in commands]:
            assert code == 503 and body["error"]["code"] == "edge_superseded", body
            assert body["operation"]["state"] == "superseded" and body["replayed"] is False
            assert "newer connection" in body["operation"]["reason"]
        assert cp_side in server_side(cp, "edge-a")  # all of it while A's socket stayed open
        old.tcp.abortConnection()
        await eventually(lambda: cp_side not in server_side(cp, "edge-a"), message="A's socket closed")
        assert cp.registry.get("edge-a").connected  # the stale close changed nothing
        new.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_late_answer_after_timed_out_is_shown_as_late_outcome() -> None:
    """The operation stays timed_out; the late answer shows in every operation view."""
    cp = await start_control_plane()
    try:
        edge = await connect_holding(cp, "edge-a")
        code, body = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 0.2}
        )
        assert code == 504 and body["operation"]["state"] == "timed_out"
        assert body["operation"]["late_outcome"] is None and body["replayed"] is False
        operation_id = body["operation"]["operation_id"]
        edge.answer_held(outcome=pb.COMMAND_OUTCOME_FAILED, reason="late", n="1")
        path = f"/edges/edge-a/operations/{operation_id}"

        async def late_outcome() -> Any:
            return (await cp.get_json(path))[1]["late_outcome"]

        late = await eventually(late_outcome, message="late outcome recorded")
        assert late["state"] == "failed" and late["reason"] == "late" and late["result"] == {"n": "1"}
        assert late["received_at"] is not None
        code, one = await cp.get_json(path)
        assert one["state"] == "timed_out" and one["finished_at"] is not None
        code, page = await cp.get_json("/edges/edge-a/operations")
        assert page["items"][0]["late_outcome"] == late
        code, fleet = await cp.get_json("/fleet/operations")
        assert fleet["items"][0]["late_outcome"] == late
        code, events = await cp.get_json("/edges/edge-a/events")
        late_events = [e for e in events["items"] if e["kind"] == "operation.late_outcome"]
        assert len(late_events) == 1 and late_events[0]["command_id"] == operation_id
        assert late_events[0]["node_id"] == "node-1"
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_idempotency_conflict_and_replayed_flag() -> None:
    """A reused key with another command is 409 idempotency_conflict; a true replay says replayed."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        payload = {"name": "node.drain", "target": "node-1", "idempotency_key": "k-1"}
        code, first = await cp.post_json("/edges/edge-a/commands", payload)
        assert code == 200 and first["replayed"] is False
        code, again = await cp.post_json("/edges/edge-a/commands", payload)
        assert code == 200 and again["replayed"] is True and again["operation_id"] == first["operation_id"]
        for changed in ({"target": "node-2"}, {"name": "node.undrain"}, {"arguments": {"reason": "x"}}):
            code, body = await cp.post_json("/edges/edge-a/commands", {**payload, **changed})
            assert code == 409 and body["error"]["code"] == "idempotency_conflict", body
            assert body["operation"]["operation_id"] == first["operation_id"]
        assert len(edge.commands_seen) == 1
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_spoofed_operation_events_and_forged_command_ids_never_end_an_operation() -> None:
    """Events of the Control Plane's kinds, from the target edge or another, and a
    response naming another command id, all leave the operation to its deadline."""
    cp = await start_control_plane()
    try:
        target = await connect_holding(cp, "edge-a")
        other, _ = await connect_edge(cp.edge_wire_port, "edge-b")
        post = ensureDeferred(
            cp.post_json("/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 1})
        )
        await eventually(lambda: target.held_commands, message="command reached edge-a")
        operation_id = target.held_commands[0][1].command_id
        for spoofer in (target, other):
            spoofer.event("operation.succeeded", command_id=operation_id, message="forged")
            spoofer.event("edge.connected", message="forged")
            spoofer.event("command.started", command_id=operation_id)
        target.answer_held(command_id="not-" + operation_id)
        code, body = await post
        assert code == 504 and body["operation"]["state"] == "timed_out", body
        states = [h["state"] for h in body["operation"]["history"]]
        assert states == ["sent", "running", "timed_out"]  # only edge-a's own command.started counted
        for edge_id in ("edge-a", "edge-b"):
            code, events = await cp.get_json(f"/edges/{edge_id}/events")
            kinds = [e["kind"] for e in events["items"]]
            assert kinds.count("edge.protocol_violation") == 1, kinds
            assert not [e for e in events["items"] if e["message"] == "forged"]
        code, op = await cp.get_json(f"/edges/edge-a/operations/{operation_id}")
        assert op["state"] == "timed_out" and op["late_outcome"] is None  # the forged answer is no outcome
        target.tcp.loseConnection()
        other.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_keepalive_traffic_advances_last_seen() -> None:
    """An otherwise silent edge's pongs to keepalive pings move last_seen forward."""
    cp = await start_control_plane(
        config_text="edge_wire: {keepalive_interval_seconds: 0.2, keepalive_deadline_seconds: 5}"
    )
    try:
        edge: ScriptedEdge
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        _code, first = await cp.get_json("/edges/edge-a")
        pongs_before = edge.last_ping_sent

        async def advanced() -> bool:
            _code, now = await cp.get_json("/edges/edge-a")
            return bool(now["last_seen"] > first["last_seen"])

        await eventually(advanced, message="last_seen advanced by keepalive")
        assert edge.last_ping_sent == pongs_before  # the edge sent only pongs, no traffic of its own
        _code, summary = await cp.get_json("/edges")
        assert summary["items"][0]["last_seen"] > first["last_seen"]
        edge.tcp.loseConnection()
    finally:
        await cp.stop()
