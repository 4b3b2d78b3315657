"""Rollouts against the real Control Plane, with scripted edges over real sockets.

Every rollout answer is validated against the OpenAPI document's schemas.
"""

from __future__ import annotations

from typing import Any

import pytest_twisted
import treq
from twisted.internet.defer import Deferred, gatherResults

from twisted_iop.testing.harness import ControlPlaneHarness, contract_validator, eventually, sleep, start_control_plane
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge, snapshot

#: Many hellos at once: no admission pacing in these tests.
FAST_HELLOS = "edge_wire:\n  max_hellos_per_second: 100000\n"


def _valid(schema: str, body: Any) -> Any:
    errors = list(contract_validator(schema).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


async def _edges(cp: ControlPlaneHarness, ids: list[str], **attributes: Any) -> list[ScriptedEdge]:
    async def one(edge_id: str) -> ScriptedEdge:
        edge, answer = await connect_edge(cp.edge_wire_port, edge_id, **attributes)
        assert answer is not None and answer.accepted
        return edge

    return list(await gatherResults([Deferred.fromCoroutine(one(i)) for i in ids]))


async def _create(cp: ControlPlaneHarness, body: dict[str, Any], expect: int = 201, **kwargs: Any) -> Any:
    code, rollout = await cp.post_json("/rollouts", body, **kwargs)
    assert code == expect, rollout
    return _valid("Rollout", rollout)


async def _rollout(cp: ControlPlaneHarness, rollout_id: str, **kwargs: Any) -> Any:
    code, rollout = await cp.get_json(f"/rollouts/{rollout_id}", **kwargs)
    assert code == 200
    return _valid("Rollout", rollout)


async def _until(cp: ControlPlaneHarness, rollout_id: str, check: Any, timeout: float = 10.0, **kwargs: Any) -> Any:
    found: dict[str, Any] = {}

    async def poll() -> bool:
        found["rollout"] = await _rollout(cp, rollout_id, **kwargs)
        return bool(check(found["rollout"]))

    await eventually(poll, timeout=timeout, interval=0.05, message=f"rollout {rollout_id}")
    return found["rollout"]


def _drain(selector: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"command": {"name": "node.drain", "target": "node-1"}, "selector": selector}
    body.update(extra)
    return body


async def _fleet_events(cp: ControlPlaneHarness, since: int) -> list[Any]:
    """Every fleet event after ``since``."""
    events: list[Any] = []
    while True:
        code, page = await cp.get_json(f"/fleet/events?limit=1000&since={since}")
        assert code == 200
        if not page["items"]:
            return events
        events += page["items"]
        since = page["next_since"]


async def _close(cp: ControlPlaneHarness, edges: list[ScriptedEdge]) -> None:
    for edge in edges:
        if edge.transport is not None:
            edge.tcp.loseConnection()
    await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_rollout_over_1000_edges_with_5_percent_failing_aborts_by_its_criteria() -> None:
    """1,000 edges in region eu (every 20th fails the command) and 20 in us: the
    rollout targets eu only, aborts once 3% of at least 100 executed failed,
    cancels the rest, and each execution is an ordinary operation of its edge."""
    cp = await start_control_plane(config_text=FAST_HELLOS)
    edges: list[ScriptedEdge] = []
    try:
        eu = [f"edge-{i:04d}" for i in range(1000)]
        edges = await _edges(cp, eu, labels={"region": "eu"})
        for index, edge in enumerate(edges):
            if index % 20 == 7:
                edge.command_behaviour = "fail"
        edges += await _edges(cp, [f"us-{i:02d}" for i in range(20)], labels={"region": "us"})
        body = _drain(
            "region=eu",
            strategy={"batch_size": 50, "max_in_flight": 50, "increase_factor": 2.0},
            abort={"failure_percent": 3, "min_executed": 100},
            timeout_seconds=10,
        )
        code, before = await cp.get_json("/fleet/events?limit=1")
        since = before["last_sequence"]
        rollout = await _create(cp, body)
        rollout_id = rollout["rollout_id"]
        assert rollout["targets"] == 1000 and rollout["state"] == "running"
        rollout = await _until(cp, rollout_id, lambda r: r["finished_at"] is not None, timeout=20)
        counts = rollout["counts"]
        executed = counts["succeeded"] + counts["failed"] + counts["timed_out"]
        assert rollout["state"] == "aborted", rollout
        assert "abort.failure_percent 3%" in rollout["reason"]
        assert 100 <= executed < 1000 and counts["cancelled"] == 1000 - executed
        assert counts["failed"] * 100 > 3 * executed
        assert sum(counts.values()) == 1000 and counts["in_flight"] == 0
        assert not any(edge.commands_seen for edge in edges[1000:]), "us edges were not targets"
        # A failed execution is the failed operation of its edge, linked by the idempotency key.
        code, page = await cp.get_json(f"/rollouts/{rollout['rollout_id']}/executions?state=failed&limit=5")
        assert code == 200 and _valid("ExecutionPage", page)["items"]
        failed = page["items"][0]
        code, operations = await cp.get_json(f"/edges/{failed['edge_id']}/operations")
        (operation,) = operations["items"]
        assert operation["operation_id"] == failed["operation_ids"][0]
        assert operation["state"] == "failed" and operation["idempotency_key"] == f"rollout:{rollout['rollout_id']}"
        kinds = [e["kind"] for e in await _fleet_events(cp, since) if e["attributes"].get("rollout_id") == rollout_id]
        assert kinds[:3] == ["rollout.created", "rollout.started", "rollout.batch_started"]
        assert kinds[-1] == "rollout.aborted"
        metrics = (await (await treq.get(cp.http_url + "/metrics")).text()).splitlines()
        assert 'iop_rollouts{state="aborted"} 1.0' in metrics
        assert f'iop_rollout_executions{{state="cancelled"}} {float(counts["cancelled"])}' in metrics
        assert f"iop_rollout_dispatched_total {float(executed)}" in metrics
    finally:
        await _close(cp, edges)


@pytest_twisted.ensureDeferred
async def test_pause_stops_dispatching_and_resume_finishes_the_rollout() -> None:
    """Paused with 5 in flight: they end and are recorded, nothing new goes out; resumed, the rest runs."""
    cp = await start_control_plane()
    edges: list[ScriptedEdge] = []
    try:
        edges = await _edges(cp, [f"edge-{i:02d}" for i in range(20)], command_behaviour="hold")
        rollout = await _create(cp, _drain("", strategy={"batch_size": 10, "max_in_flight": 5}))
        rollout_id = rollout["rollout_id"]
        await _until(cp, rollout_id, lambda r: r["counts"]["in_flight"] == 5)
        code, paused = await cp.post_json(f"/rollouts/{rollout_id}/pause", {})
        assert code == 200 and _valid("Rollout", paused)["state"] == "paused"
        for edge in edges:
            edge.command_behaviour = "succeed"
            while edge.held_commands:
                edge.answer_held()
        paused = await _until(cp, rollout_id, lambda r: r["counts"]["succeeded"] == 5)
        await sleep(0.3)
        paused = await _rollout(cp, rollout_id)
        assert paused["state"] == "paused" and paused["counts"]["in_flight"] == 0
        assert sum(len(edge.commands_seen) for edge in edges) == 5
        code, error = await cp.post_json(f"/rollouts/{rollout_id}/pause", {})
        assert code == 409 and _valid("Error", error)["error"]["code"] == "invalid_transition"
        code, resumed = await cp.post_json(f"/rollouts/{rollout_id}/resume", {})
        assert code == 200 and resumed["state"] == "running"
        done = await _until(cp, rollout_id, lambda r: r["state"] == "succeeded")
        assert done["counts"]["succeeded"] == 20 and done["progress"] == 1.0 and done["batch"]["number"] == 2
        assert all(len(edge.commands_seen) == 1 for edge in edges)
    finally:
        await _close(cp, edges)


@pytest_twisted.ensureDeferred
async def test_edges_that_drop_or_come_back_mid_rollout_end_cleanly() -> None:
    """An edge that drops with its command in flight fails (edge_disconnected); one
    disconnected at its turn waits and runs when it reconnects; the rollout ends failed."""
    cp = await start_control_plane()
    edges: list[ScriptedEdge] = []
    try:
        (holder,) = await _edges(cp, ["edge-a"], command_behaviour="hold")
        (away,) = await _edges(cp, ["edge-b"])
        (fine,) = await _edges(cp, ["edge-c"])
        edges = [holder, away, fine]
        away.tcp.loseConnection()
        await eventually(lambda: not cp.registry.get("edge-b").connected)
        rollout = await _create(cp, _drain("", wait_seconds=30))
        rollout_id = rollout["rollout_id"]
        await _until(cp, rollout_id, lambda r: r["counts"]["waiting"] == 1 and r["counts"]["in_flight"] == 1)
        holder.tcp.loseConnection()
        (back,) = await _edges(cp, ["edge-b"])
        edges.append(back)
        done = await _until(cp, rollout_id, lambda r: r["finished_at"] is not None)
        assert done["state"] == "failed" and done["counts"] == dict(
            pending=0, waiting=0, in_flight=0, succeeded=2, failed=1, timed_out=0, skipped=0, cancelled=0
        )
        code, page = await cp.get_json(f"/rollouts/{rollout_id}/executions")
        assert code == 200
        by_edge = {e["edge_id"]: e for e in _valid("ExecutionPage", page)["items"]}
        assert by_edge["edge-a"]["state"] == "failed" and "edge_disconnected" in by_edge["edge-a"]["reason"]
        assert by_edge["edge-b"]["state"] == "succeeded" and len(back.commands_seen) == 1
    finally:
        await _close(cp, edges)


@pytest_twisted.ensureDeferred
async def test_cancel_lets_in_flight_finish_and_dispatches_nothing_more() -> None:
    """Cancelled with 4 in flight: 16 cancelled at once, the 4 end succeeded and are recorded."""
    cp = await start_control_plane()
    edges: list[ScriptedEdge] = []
    try:
        edges = await _edges(cp, [f"edge-{i:02d}" for i in range(20)], command_behaviour="hold")
        rollout = await _create(cp, _drain("", strategy={"max_in_flight": 4}, disconnected="skip"))
        rollout_id = rollout["rollout_id"]
        await _until(cp, rollout_id, lambda r: r["counts"]["in_flight"] == 4)
        code, cancelled = await cp.post_json(f"/rollouts/{rollout_id}/cancel", {})
        assert code == 200 and cancelled["state"] == "cancelled" and cancelled["finished_at"] is None
        assert cancelled["counts"]["cancelled"] == 16 and cancelled["counts"]["in_flight"] == 4
        for edge in edges:
            while edge.held_commands:
                edge.answer_held()
        done = await _until(cp, rollout_id, lambda r: r["finished_at"] is not None)
        assert done["state"] == "cancelled" and done["counts"]["succeeded"] == 4
        assert sum(len(edge.commands_seen) for edge in edges) == 4
        code, error = await cp.post_json(f"/rollouts/{rollout_id}/resume", {})
        assert code == 409 and error["error"]["code"] == "invalid_transition"
    finally:
        await _close(cp, edges)


TOKENS = (
    "http:\n  tokens:\n"
    "    - {name: ops, role: operator, token: operator-secret-1}\n"
    "    - {name: dash, role: viewer, token: viewer-secret-12}\n"
)


def _as(token: str) -> dict[str, Any]:
    return {"headers": {b"Authorization": [b"Bearer " + token.encode()]}}


@pytest_twisted.ensureDeferred
async def test_roles_idempotency_and_bad_requests() -> None:
    """A viewer reads but cannot start; the same key answers the same rollout (200);
    bad bodies are 400 naming the field; unknown ids 404; a node selector runs one
    command per matching node of the edge's last snapshot."""
    cp = await start_control_plane(config_text=TOKENS)
    edges: list[ScriptedEdge] = []
    try:
        (edge,) = await _edges(cp, ["edge-a"], labels={"region": "eu"})
        edges = [edge]
        status = snapshot("edge-a")
        status.nodes[0].labels["gpu"] = "h100"
        status.nodes[1].labels["gpu"] = "a100"
        edge.status = lambda: status
        ops, dash = _as("operator-secret-1"), _as("viewer-secret-12")
        code, _ = await cp.get_json("/edges/edge-a/status", **ops)
        assert code == 200
        body = {
            "command": {"name": "node.drain", "node_selector": "gpu=h100", "arguments": {"reason": "maintenance"}},
            "selector": "region=eu",
            "idempotency_key": "drain-eu-1",
        }
        code, error = await cp.post_json("/rollouts", body, **dash)
        assert code == 403 and error["error"]["code"] == "forbidden"
        first = await _create(cp, body, **ops)
        assert first["requested_by"] == "ops" and first["idempotency_key"] == "drain-eu-1"
        again = await _create(cp, body, expect=200, **ops)
        assert again["rollout_id"] == first["rollout_id"]
        code, page = await cp.get_json("/rollouts", **dash)
        assert code == 200 and _valid("RolloutPage", page)["total"] == 1
        await eventually(lambda: edge.commands_seen)
        (command,) = edge.commands_seen
        assert command.target == "node-1" and dict(command.arguments) == {"reason": "maintenance"}
        await _until(cp, first["rollout_id"], lambda r: r["state"] == "succeeded", **dash)
        bad: list[tuple[dict[str, Any], str, str]] = [
            ({"strategy": {"batch_sise": 5}}, "bad_request", "strategy"),
            ({"strategy": {"max_in_flight": -1}}, "bad_request", "strategy.max_in_flight"),
            ({"abort": {"failure_percent": 101}}, "bad_request", "abort.failure_percent"),
            ({"selector": "region in (eu"}, "invalid_selector", "position"),
            ({"disconnected": "maybe"}, "bad_request", "disconnected"),
            ({"command": {"name": ""}}, "bad_request", "command.name"),
            ({"timeout_seconds": 0}, "bad_request", "timeout_seconds"),
            ({"surprise": 1}, "bad_request", "surprise"),
        ]
        for change, code_name, named in bad:
            code, error = await cp.post_json("/rollouts", {**_drain("region=eu"), **change}, **ops)
            assert code == 400 and _valid("Error", error)["error"]["code"] == code_name, (change, error)
            assert named in error["error"]["message"], (change, error)
        for path in ("/rollouts/nope", "/rollouts/nope/executions"):
            code, error = await cp.get_json(path, **dash)
            assert code == 404 and error["error"]["code"] == "unknown_rollout"
        code, error = await cp.post_json("/rollouts/nope/cancel", {}, **ops)
        assert code == 404 and error["error"]["code"] == "unknown_rollout"
        code, error = await cp.post_json(f"/rollouts/{first['rollout_id']}/cancel", {}, **dash)
        assert code == 403
        code, error = await cp.get_json(f"/rollouts/{first['rollout_id']}/executions?state=lost", **dash)
        assert code == 400 and error["error"]["code"] == "invalid_state"
    finally:
        await _close(cp, edges)
