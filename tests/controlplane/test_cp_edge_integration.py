"""Real-socket integration: a Control Plane on 127.0.0.1:0 and scripted edges."""

from __future__ import annotations

import json
import struct

import pytest_twisted
from twisted.internet.defer import ensureDeferred

from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.http import connect
from twisted_iop.testing.wires.frames import decode_frames
from twisted_iop.testing.wires.peers import CATALOG, connect_edge, snapshot
from twisted_iop.wire import control_pb2 as pb


@pytest_twisted.ensureDeferred
async def test_empty_edge_id_is_rejected_and_closed() -> None:
    """A hello with an empty edge_id gets accepted=false with a reason, then a close."""
    cp = await start_control_plane()
    try:
        edge, response = await connect_edge(cp.edge_wire_port, "")
        assert response is not None and not response.accepted
        assert response.reason_code == "invalid_id"
        assert "empty" in response.reason
        await edge.lost
        _code, body = await cp.get_json("/edges")
        assert body["total"] == 0
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_valid_edge_is_listed_connected() -> None:
    """A valid hello enrolls the edge: GET /edges lists it connected."""
    cp = await start_control_plane()
    try:
        edge, response = await connect_edge(cp.edge_wire_port, "edge-a")
        assert response is not None and response.accepted
        code, body = await cp.get_json("/edges")
        assert code == 200
        assert [(e["edge_id"], e["connected"]) for e in body["items"]] == [("edge-a", True)]
        assert body["items"][0]["labels"] == {"site": "test"}
        assert "node.drain" in body["items"][0]["commands"]
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_newest_connection_wins_and_stale_close_changes_nothing() -> None:
    """Two connections with one id leave one connected entry; the old one's close is harmless."""
    cp = await start_control_plane()
    try:
        first, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        second, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        await first.lost  # the older socket is closed by the Control Plane
        assert first.errors and first.errors[0].code == pb.ERROR_CODE_SUPERSEDED
        code, body = await cp.get_json("/edges")
        assert [(e["edge_id"], e["connected"]) for e in body["items"]] == [("edge-a", True)]
        code, events = await cp.get_json("/edges/edge-a/events")
        kinds = [e["kind"] for e in events["items"]]
        assert kinds == ["edge.connected", "edge.superseded", "edge.connected"]
        # The newer connection still answers status: it is the current one.
        code, status = await cp.get_json("/edges/edge-a/status")
        assert code == 200 and status["connected"] is True
        assert second.status_requests == 1
        second.tcp.loseConnection()
        await second.lost
        await eventually(lambda: not cp.registry.get("edge-a").connected, message="edge disconnected")
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_status_view_fresh_unknown_and_stale() -> None:
    """Status is fresh for a connected edge, 404 for an unknown one, stale 409 after disconnect."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        code, status = await cp.get_json("/edges/edge-a/status")
        assert code == 200
        assert status["stale"] is False
        assert [n["node_id"] for n in status["nodes"]] == ["node-1", "node-2"]
        provider = status["nodes"][0]["providers"][0]
        assert provider["general"] == {"capacity": 4, "in_flight": 1, "queued": 2}
        assert provider["long_context"] == {"capacity": 1, "in_flight": 0, "queued": 1}
        assert provider["status"] == "available" and provider["health"] == "healthy"
        assert status["totals"]["general"]["capacity"] == 8

        code, body = await cp.get_json("/edges/nope/status")
        assert code == 404 and body["error"]["code"] == "unknown_edge"

        edge.tcp.loseConnection()
        await eventually(lambda: not cp.registry.get("edge-a").connected, message="disconnect seen")
        code, body = await cp.get_json("/edges/edge-a/status")
        assert code == 409
        assert body["error"]["code"] == "edge_not_connected"
        assert body["snapshot"]["stale"] is True
        assert body["snapshot"]["received_at"] is not None
        assert body["snapshot"]["nodes"][0]["node_id"] == "node-1"
        code, edges = await cp.get_json("/edges/edge-a")
        assert edges["connected"] is False and edges["disconnected_at"] is not None
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_silent_edge_status_times_out_with_504() -> None:
    """An edge that never answers a status request gives 504 edge_timeout."""
    cp = await start_control_plane(config_text="http: {status_timeout_seconds: 0.3}")
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", status=lambda: None)
        code, body = await cp.get_json("/edges/edge-a/status")
        assert code == 504 and body["error"]["code"] == "edge_timeout"
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_command_succeeds_and_idempotency_key_does_not_dispatch_twice() -> None:
    """A command ends succeeded; the same key again returns the same operation, one dispatch."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        payload = {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-1"}
        code, op = await cp.post_json("/edges/edge-a/commands", payload)
        assert code == 200, op
        assert op["state"] == "succeeded"
        assert [h["state"] for h in op["history"]] == ["sent", "accepted", "running", "succeeded"]
        code, again = await cp.post_json("/edges/edge-a/commands", payload)
        assert code == 200 and again["operation_id"] == op["operation_id"]
        assert len(edge.commands_seen) == 1
        code, ops = await cp.get_json("/edges/edge-a/operations")
        assert [o["operation_id"] for o in ops["items"]] == [op["operation_id"]]
        assert ops["items"][0]["state"] == "succeeded"
        code, events = await cp.get_json("/edges/edge-a/events")
        operation_events = [e for e in events["items"] if e["kind"].startswith("operation.")]
        assert {e["node_id"] for e in operation_events} == {"node-1"}  # node.drain targets a node
        code, fleet_ops = await cp.get_json("/fleet/operations")
        assert fleet_ops["items"][0]["operation_id"] == op["operation_id"]
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_command_timeout_and_disconnect_states() -> None:
    """A silent edge ends timed_out (504); an edge dropping mid-command ends edge_disconnected (503)."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", command_behaviour="silent")
        code, body = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 0.3}
        )
        assert code == 504 and body["error"]["code"] == "edge_timeout"
        assert body["operation"]["state"] == "timed_out"

        edge.command_behaviour = "disconnect"
        code, body = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 30}
        )
        assert code == 503 and body["error"]["code"] == "edge_disconnected"
        assert body["operation"]["state"] == "edge_disconnected"
        code, ops = await cp.get_json("/edges/edge-a/operations")
        assert sorted(o["state"] for o in ops["items"]) == ["edge_disconnected", "timed_out"]
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_engine_commands_default_to_the_engine_deadline() -> None:
    """Without timeout_seconds, provider.restart (a command or a rollout's) is
    given http.engine_command_timeout_seconds (a model takes minutes to load)
    and other commands http.default_command_timeout_seconds."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(
            cp.edge_wire_port,
            "edge-a",
            command_behaviour="hold",
            catalog=[*CATALOG, pb.CommandSpec(name="provider.restart", target_kind="provider")],
        )
        posted = [
            ensureDeferred(cp.post_json("/edges/edge-a/commands", {"name": name, "target": "node-1"}))
            for name in ("provider.restart", "node.drain")
        ]
        code, rollout = await cp.post_json(
            "/rollouts", {"command": {"name": "provider.restart", "target": "node-1"}, "selector": ""}
        )
        assert code == 201, rollout
        await eventually(lambda: len(edge.held_commands) == 3, message="three commands held")
        deadlines = sorted((command.name, command.timeout_ms) for _, command in edge.held_commands)
        assert deadlines == [("node.drain", 10_000), ("provider.restart", 300_000), ("provider.restart", 300_000)]
        while edge.held_commands:
            edge.answer_held()
        assert [(await d)[0] for d in posted] == [200, 200]
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_unknown_command_is_refused() -> None:
    """A command outside the announced catalog is refused with 400 unknown_command."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        code, body = await cp.post_json("/edges/edge-a/commands", {"name": "rm.rf"})
        assert code == 400 and body["error"]["code"] == "unknown_command"
        assert edge.commands_seen == []
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_hostile_connections_are_closed_and_others_keep_working() -> None:
    """A 2 GiB length prefix, random bytes and a silent socket are closed; a good edge is served."""
    cp = await start_control_plane(config_text="edge_wire: {hello_timeout_seconds: 0.5}")
    try:
        good, _ = await connect_edge(cp.edge_wire_port, "edge-good")
        huge = await connect(cp.edge_wire_port)
        huge.tcp.write(struct.pack(">I", 2 * 1024**3) + b"x" * 100)
        garbage = await connect(cp.edge_wire_port)
        garbage.tcp.write(struct.pack(">I", 12) + b"\xff" * 12)
        silent = await connect(cp.edge_wire_port)
        await eventually(lambda: huge.is_closed and garbage.is_closed and silent.is_closed, timeout=5, message="closes")
        assert decode_frames(huge.received)[0].error.code == pb.ERROR_CODE_FRAME_TOO_LARGE
        assert decode_frames(garbage.received)[0].error.code == pb.ERROR_CODE_MALFORMED_FRAME
        assert decode_frames(silent.received)[0].error.code == pb.ERROR_CODE_HELLO_TIMEOUT
        code, status = await cp.get_json("/edges/edge-good/status")
        assert code == 200 and status["connected"]
        good.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_fleet_status_marks_only_the_slow_edge() -> None:
    """One silent edge gets a timeout row; the others are fresh and counted."""
    cp = await start_control_plane(config_text="http: {status_timeout_seconds: 0.3}")
    try:
        fast, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        slow, _ = await connect_edge(cp.edge_wire_port, "edge-b", status=lambda: None)
        code, fleet = await cp.get_json("/fleet/status")
        assert code == 200
        rows = {r["edge_id"]: r for r in fleet["items"]}
        assert rows["edge-a"]["state"] == "ok" and rows["edge-a"]["stale"] is False
        assert rows["edge-b"]["state"] == "timeout" and rows["edge-b"]["error"]["code"] == "edge_timeout"
        totals = fleet["totals"]
        assert totals["edges_known"] == 2 and totals["edges_connected"] == 2
        assert totals["nodes_connected"] == 2 and totals["providers"] == 2
        assert totals["general"] == {"capacity": 8, "in_flight": 2, "queued": 4}
        assert totals["long_context"] == {"capacity": 2, "in_flight": 0, "queued": 2}
        assert totals["providers_by_health"]["healthy"] == 2
        fast.tcp.loseConnection()
        slow.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_concurrent_status_callers_share_one_request() -> None:
    """Three status views in flight at once for one edge cause one EdgeStatusRequest."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", hold_status=True)
        from twisted.internet.defer import ensureDeferred, gatherResults

        views = [ensureDeferred(cp.get_json("/edges/edge-a/status")) for _ in range(3)]
        gateway = cp.service.gateway
        await eventually(lambda: gateway.status_waiters("edge-a") == 3, message="three waiting views")
        edge.release_status()
        results = await gatherResults(views)
        assert [code for code, _ in results] == [200, 200, 200]
        assert edge.status_requests == 1
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_relayed_events_are_recorded_with_sequences() -> None:
    """Events relayed by an edge appear in its event view and the fleet view, in order."""
    cp = await start_control_plane()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        edge.event("node.ready", node_id="node-1", message="ready")
        edge.event("node.disconnected", node_id="node-1", message="gone")
        await eventually(lambda: cp.registry.get("edge-a").events.last_sequence >= 3, message="events")
        _code, events = await cp.get_json("/edges/edge-a/events?since=1")
        assert [(e["sequence"], e["kind"]) for e in events["items"]] == [(2, "node.ready"), (3, "node.disconnected")]
        assert events["items"][0]["node_id"] == "node-1"
        assert events["capacity"] == 1000 and events["dropped"] == 0
        _code, fleet = await cp.get_json("/fleet/events")
        assert [e["fleet_sequence"] for e in fleet["items"]] == [1, 2, 3]
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_no_view_leaks_credentials_addresses_or_transport_internals() -> None:
    """Every HTTP view, after real traffic, is free of credentials, peer addresses and tokens."""
    secret = "edge-secret-Zq8"
    cp = await start_control_plane(config_text=f"edge_wire: {{credentials: {{edge-a: {secret}}}}}")
    try:
        edge, response = await connect_edge(cp.edge_wire_port, "edge-a", credential=secret)
        assert response is not None and response.accepted
        local_port = str(edge.tcp.getHost().port)
        await cp.post_json("/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "idempotency_key": "k"})
        edge.event("node.ready", node_id="node-1")
        await eventually(lambda: cp.registry.get("edge-a").events.last_sequence >= 6, message="events")
        operation_id = cp.registry.get("edge-a").operations.newest_first()[0].operation_id
        views = [
            "/healthz",
            "/readyz",
            "/edges",
            "/edges/edge-a",
            "/edges/edge-a/status",
            "/edges/edge-a/events",
            "/edges/edge-a/operations",
            f"/edges/edge-a/operations/{operation_id}",
            "/edges/edge-a/commands",
            "/fleet/status",
            "/fleet/events",
            "/fleet/operations",
        ]
        edge.tcp.loseConnection()
        await eventually(lambda: not cp.registry.get("edge-a").connected, message="disconnect")
        # Once more while disconnected: the stale views are checked too.
        for path in [*views, "/edges/edge-a/status"]:
            _code, body = await cp.get_json(path)
            text = json.dumps(body)
            assert secret not in text, path
            assert "127.0.0.1" not in text, path
            assert f":{local_port}" not in text and f'"{local_port}"' not in text, path
            for word in ("token", "credential", "request_id", "peer", "address", "host"):
                assert f'"{word}' not in text, (path, word)
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_absurd_edge_timestamps_do_not_break_views() -> None:
    """Events and snapshots with impossible times still render (time shown as null)."""
    cp = await start_control_plane()
    try:
        absurd = snapshot("edge-a")
        absurd.generated_at_ms = 2**62
        absurd.nodes[0].connected_since_ms = 2**62
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", status=lambda: absurd)
        edge.send("edge_event", pb.EdgeEvent(kind="node.ready", occurred_at_ms=2**62))
        await eventually(lambda: cp.registry.get("edge-a").events.last_sequence >= 2, message="event")
        code, events = await cp.get_json("/edges/edge-a/events")
        event = events["items"][-1]
        assert code == 200 and event["occurred_at"] == event["recorded_at"] is not None
        code, status = await cp.get_json("/edges/edge-a/status")
        assert code == 200 and status["generated_at"] is None
        assert status["nodes"][0]["connected_since"] is None
        edge.tcp.loseConnection()
    finally:
        await cp.stop()
