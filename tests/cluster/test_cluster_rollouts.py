"""Rollouts in cluster mode, with a real redis-server: two in-process
replicas on real sockets, scripted edges split between them."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import gatherResults

from twisted_iop.controlplane.rollouts.states import EXECUTION_TERMINAL, ROLLOUT_TERMINAL
from twisted_iop.controlplane.store.forms import rollout_dict, rollout_from
from twisted_iop.testing.cluster import start_replica
from twisted_iop.testing.harness import ControlPlaneHarness, eventually
from twisted_iop.testing.redis import RedisServer
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge
from twisted_iop.wire import control_pb2 as pb

EDGES = 200
#: How long each edge holds a command before answering it.
HOLD_SECONDS = 0.15

#: Commands each edge id received, over all its connections.
Received = Counter[str]


def _answer_later(edge: ScriptedEdge, received: Received) -> None:
    """Make ``edge`` hold each command for a while, then succeed, counting them."""
    original = edge.envelope_received

    def envelope_received(envelope: pb.Envelope, body: str) -> None:
        if body != "edge_command_request":
            original(envelope, body)
            return
        command = envelope.edge_command_request
        received[edge.edge_id] += 1
        response = pb.EdgeCommandResponse(command_id=command.command_id, outcome=pb.COMMAND_OUTCOME_SUCCEEDED)
        reactor.callLater(HOLD_SECONDS, edge.send, "edge_command_response", response, envelope.request_id)

    edge.envelope_received = envelope_received  # type: ignore[method-assign]  # replaced for this test


async def _edge(port: int, edge_id: str, received: Received) -> ScriptedEdge:
    edge, _ = await connect_edge(port, edge_id)
    _answer_later(edge, received)
    return edge


def _kill(replica: ControlPlaneHarness) -> None:
    """Stop ``replica`` as SIGKILL would, as far as the cluster sees: no more
    dispatching, no lease refreshed, no write to Redis."""
    cluster = replica.service.cluster
    assert cluster is not None
    replica.service.rollouts.shut_down()
    cluster.presence.stop()
    cluster.link.stop()


@pytest_twisted.ensureDeferred
async def test_a_rollout_finishes_on_the_other_replica_when_its_runner_is_killed(redis_server: RedisServer) -> None:
    """A replica running a rollout over 200 edges is killed mid-rollout: the
    other takes the rollout over from Redis and finishes it; every target
    ends in one terminal state and no edge receives the command twice."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    received: Received = Counter()
    ids = [f"edge-{i:03d}" for i in range(EDGES)]
    try:
        on_a = {i: await _edge(a.edge_wire_port, i, received) for i in ids[::2]}
        for i in ids[1::2]:
            await _edge(b.edge_wire_port, i, received)

        async def all_connected(replica: ControlPlaneHarness) -> bool:
            status, page = await replica.get_json("/edges?state=connected&limit=1000")
            return status == 200 and page["total"] == EDGES

        await eventually(lambda: all_connected(a), timeout=15, message="A sees every edge")
        await eventually(lambda: all_connected(b), timeout=15, message="B sees every edge")
        status, rollout = await a.post_json(
            "/rollouts",
            {
                "command": {"name": "node.drain", "target": "node-1"},
                "selector": "",
                "strategy": {"batch_size": 20, "max_in_flight": 20},
                "timeout_seconds": 10,
                "wait_seconds": 20,
            },
        )
        assert status == 201, rollout
        rollout_id = rollout["rollout_id"]

        async def progressed_on_b() -> bool:
            status, seen = await b.get_json(f"/rollouts/{rollout_id}")
            return status == 200 and seen["counts"]["succeeded"] >= 50

        await eventually(progressed_on_b, timeout=15, message="B mirrors A's progress")
        _kill(a)
        # A's edges lose their connection and enroll again on B.
        await gatherResults([edge.tcp.loseConnection() or edge.lost for edge in on_a.values()])
        for i in on_a:
            await _edge(b.edge_wire_port, i, received)

        async def finished_on_b() -> bool:
            status, seen = await b.get_json(f"/rollouts/{rollout_id}")
            return status == 200 and seen["state"] in ROLLOUT_TERMINAL and seen["finished_at"] is not None

        await eventually(finished_on_b, timeout=25, message="B finished the rollout")
        status, seen = await b.get_json(f"/rollouts/{rollout_id}")
        status, executions = await b.get_json(f"/rollouts/{rollout_id}/executions?limit=1000")
        items: list[dict[str, Any]] = executions["items"]
        assert sorted(item["edge_id"] for item in items) == ids
        assert all(item["state"] in EXECUTION_TERMINAL for item in items)
        assert sum(seen["counts"].values()) == EDGES
        assert seen["counts"]["pending"] == seen["counts"]["in_flight"] == seen["counts"]["waiting"] == 0
        # No edge ran the command twice; every edge that succeeded ran it once.
        assert max(received.values()) == 1, [e for e, n in received.items() if n > 1]
        assert all(received[item["edge_id"]] == 1 for item in items if item["state"] == "succeeded")
        assert seen["counts"]["succeeded"] >= EDGES - 2 * 20  # at most what was in flight at the kill fails
        # B took it over: the lease was taken a second time.
        assert redis_server.command("GET", f"iop:rollout_epoch:{rollout_id}").endswith(b"\r\n2\r\n")
    finally:
        await b.stop()
        await a.stop()


@pytest_twisted.ensureDeferred
async def test_every_replica_lists_a_rollout_and_moves_reach_its_runner(redis_server: RedisServer) -> None:
    """A rollout started on A is listed on B; a pause and a cancel asked on B
    are applied by A, the runner, and B's view follows."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    received: Received = Counter()
    try:
        for i in range(4):
            await _edge(a.edge_wire_port, f"edge-{i}", received)
        await eventually(lambda: _known(b, 4), timeout=10, message="B sees the edges")
        status, rollout = await a.post_json(
            "/rollouts",
            {
                "command": {"name": "node.drain", "target": "node-1"},
                "selector": "",
                "strategy": {"batch_size": 1, "max_in_flight": 1, "pause_seconds": 5},
            },
        )
        assert status == 201
        rollout_id = rollout["rollout_id"]

        async def listed_on_b() -> bool:
            status, page = await b.get_json("/rollouts")
            return status == 200 and [r["rollout_id"] for r in page["items"]] == [rollout_id]

        await eventually(listed_on_b, timeout=10, message="B lists the rollout")
        status, paused = await b.post_json(f"/rollouts/{rollout_id}/pause", {})
        assert status == 200 and paused["state"] == "paused"

        async def state_on(replica: ControlPlaneHarness, state: str) -> bool:
            status, seen = await replica.get_json(f"/rollouts/{rollout_id}")
            return status == 200 and seen["state"] == state

        await eventually(lambda: state_on(a, "paused"), timeout=10, message="A, the runner, paused it")
        status, _ = await b.post_json(f"/rollouts/{rollout_id}/cancel", {})
        assert status == 200
        await eventually(lambda: state_on(a, "cancelled"), timeout=10, message="A cancelled it")
        await eventually(lambda: state_on(b, "cancelled"), timeout=10, message="B shows it cancelled")
        status, again = await b.post_json(f"/rollouts/{rollout_id}/resume", {})
        assert status == 409 and again["error"]["code"] == "invalid_transition"
    finally:
        await b.stop()
        await a.stop()


async def _known(replica: ControlPlaneHarness, count: int) -> bool:
    status, page = await replica.get_json("/edges?state=connected")
    return status == 200 and page["total"] == count


def test_the_stored_state_of_a_rollout_is_the_rollout() -> None:
    """The codec gives back the rollout it was given (round trip through JSON values)."""
    from twisted_iop.controlplane.rollouts import states as rs

    rollout = rs.Rollout(
        rollout_id="r1",
        command=rs.RolloutCommand("node.drain", "node-1", "", {"reason": "x"}),
        selector="region=eu",
        strategy=rs.Strategy(batch_size=2, max_in_flight=1),
        abort=rs.AbortCriteria(failure_percent=10.0, min_executed=2),
        timeout_seconds=5.0,
        disconnected=rs.WAIT,
        wait_seconds=3.0,
        created_at=1.0,
        targets=["e1", "e2", "e3"],
    )
    rollout.start(1.0)
    chosen = rollout.step(2.0, lambda edge: edge != "e2")
    rollout.dispatched(chosen[0], ["op-1"])
    again = rollout_from(rollout_dict(rollout))
    assert rollout_dict(again) == rollout_dict(rollout)
    assert again.take_notices() == []
    assert again.step(2.5, lambda edge: True) == rollout.step(2.5, lambda edge: True)
