"""Replicas sharing one fleet through a real Redis (in-process replicas, real sockets)."""

from __future__ import annotations

from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, gatherResults

from twisted_iop.client.wire import ClientWireClient
from twisted_iop.testing.cluster import start_replica
from twisted_iop.testing.harness import eventually
from twisted_iop.testing.redis import RedisServer
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import control_pb2 as pb


def _connected(listing: Any) -> dict[str, bool]:
    return {item["edge_id"]: item["connected"] for item in listing["items"]}


@pytest_twisted.ensureDeferred
async def test_every_replica_shows_the_whole_fleet_and_routes_status_and_commands(redis_server: RedisServer) -> None:
    """Edges on A and B appear connected on both; status and a command for
    B's edge work through A exactly as for a local one."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        _e1, r1 = await connect_edge(a.edge_wire_port, "edge-1")
        e2, r2 = await connect_edge(b.edge_wire_port, "edge-2")
        assert r1 is not None and r1.accepted and r2 is not None and r2.accepted

        async def both_connected(replica: Any) -> bool:
            status, body = await replica.get_json("/edges")
            return status == 200 and _connected(body) == {"edge-1": True, "edge-2": True}

        await eventually(lambda: both_connected(a), timeout=5, message="fleet visible on A")
        await eventually(lambda: both_connected(b), timeout=5, message="fleet visible on B")

        status, body = await a.get_json("/edges/edge-2/status")
        assert status == 200, body
        assert body["edge_id"] == "edge-2" and len(body["nodes"]) == 2
        assert e2.status_requests == 1

        status, op = await a.post_json("/edges/edge-2/commands", {"name": "node.drain", "target": "node-1"})
        assert status == 200, op
        assert op["state"] == "succeeded"
        assert [c.name for c in e2.commands_seen] == ["node.drain"]

        async def operation_on_b() -> bool:
            status, page = await b.get_json("/edges/edge-2/operations")
            return status == 200 and [o["state"] for o in page["items"]] == ["succeeded"]

        await eventually(operation_on_b, timeout=5, message="operation visible on B")

        metrics = await (await treq.get(a.http_url + "/metrics")).text()
        assert "iop_cluster_available 1.0" in metrics
        assert "iop_cluster_routed_requests_total 2.0" in metrics  # the status ask and the command

        status, fleet = await a.get_json("/fleet/status")
        assert status == 200
        rows = {row["edge_id"]: row for row in fleet["items"]}
        assert rows["edge-1"]["state"] == "ok" and rows["edge-2"]["state"] == "ok"
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_newest_connection_wins_across_replicas(redis_server: RedisServer) -> None:
    """An edge on A enrolls again on B: A closes its old connection
    (SUPERSEDED), every replica shows one connected entry held by B, and the
    old connection's close changes nothing."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        old, _ = await connect_edge(a.edge_wire_port, "edge-1")
        await eventually(lambda: b.registry.find("edge-1") is not None, timeout=5, message="B knows edge-1")
        new, answer = await connect_edge(b.edge_wire_port, "edge-1")
        assert answer is not None and answer.accepted
        await old.lost  # A closed the superseded connection
        assert [e.code for e in old.errors][-1:] == [pb.ERROR_CODE_SUPERSEDED]

        async def held_by_b(replica: Any) -> bool:
            status, body = await replica.get_json("/edges/edge-1")
            return status == 200 and body["connected"] is True and body["enrollments"] == 2

        await eventually(lambda: held_by_b(a), timeout=5, message="A shows edge-1 connected")
        await eventually(lambda: held_by_b(b), timeout=5, message="B shows edge-1 connected")
        status, _ = await a.get_json("/edges/edge-1/status")
        assert status == 200
        assert new.status_requests == 1 and old.status_requests == 0
        status, events = await b.get_json("/edges/edge-1/events")
        kinds = [e["kind"] for e in events["items"]]
        assert kinds.count("edge.connected") == 2 and kinds.count("edge.superseded") == 1
        assert "edge.disconnected" not in kinds
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_an_idempotency_key_dispatches_once_across_replicas(redis_server: RedisServer) -> None:
    """The same key POSTed to two replicas at once runs the command once;
    both callers get the same operation, one of them as a replay."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        edge, _ = await connect_edge(a.edge_wire_port, "edge-1")
        await eventually(lambda: b.registry.find("edge-1") is not None, timeout=5, message="B knows edge-1")
        body = {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-once"}
        (s1, op1), (s2, op2) = await gatherResults(
            [
                ensureDeferred(a.post_json("/edges/edge-1/commands", body)),
                ensureDeferred(b.post_json("/edges/edge-1/commands", body)),
            ]
        )
        assert (s1, s2) == (200, 200), (op1, op2)
        assert op1["operation_id"] == op2["operation_id"]
        assert sorted([op1["replayed"], op2["replayed"]]) == [False, True]
        assert len(edge.commands_seen) == 1
        status, again = await b.post_json("/edges/edge-1/commands", body)
        assert status == 200 and again["operation_id"] == op1["operation_id"] and again["replayed"] is True
        assert len(edge.commands_seen) == 1
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_events_carry_the_same_sequences_on_every_replica(redis_server: RedisServer) -> None:
    """Events relayed by an edge on A are numbered once, in Redis: B lists
    them with the same fleet sequences, so a cursor read on A resumes on B."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        edge, _ = await connect_edge(a.edge_wire_port, "edge-1")
        for n in range(5):
            edge.event("node.ready", node_id=f"node-{n}")

        async def relayed(replica: Any) -> list[Any]:
            status, page = await replica.get_json("/fleet/events?limit=100")
            assert status == 200
            return [e for e in page["items"] if e["kind"] == "node.ready"]

        await eventually(lambda: _count(relayed(a), 5), timeout=5, message="events on A")
        await eventually(lambda: _count(relayed(b), 5), timeout=5, message="events on B")
        on_a = await relayed(a)
        on_b = await relayed(b)
        assert [(e["fleet_sequence"], e["node_id"]) for e in on_a] == [
            (e["fleet_sequence"], e["node_id"]) for e in on_b
        ]
        cursor = on_a[1]["fleet_sequence"]
        _status, page = await b.get_json(f"/fleet/events?since={cursor}&limit=100")
        assert [e["node_id"] for e in page["items"] if e["kind"] == "node.ready"] == ["node-2", "node-3", "node-4"]
    finally:
        await a.stop()
        await b.stop()


async def _count(items: Any, n: int) -> bool:
    return len(await items) == n


@pytest_twisted.ensureDeferred
async def test_a_replica_cut_off_from_redis_is_not_ready_and_recovers(redis_server: RedisServer) -> None:
    """Redis stops: readiness says 503, shared views say cluster_unavailable,
    the local edge stays connected; Redis starts again: ready, and the edge
    is still shown connected on both replicas."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        edge, _ = await connect_edge(a.edge_wire_port, "edge-1")
        await eventually(lambda: b.registry.find("edge-1") is not None, timeout=5, message="B knows edge-1")
        redis_server.stop()

        async def unavailable(replica: Any) -> bool:
            status, body = await replica.get_json("/readyz")
            return status == 503 and body["cluster"]["available"] is False

        await eventually(lambda: unavailable(a), timeout=10, message="A not ready")
        status, body = await a.get_json("/edges")
        assert status == 503 and body["error"]["code"] == "cluster_unavailable"
        assert not edge.lost.called
        redis_server.start()

        async def ready(replica: Any) -> bool:
            status, _ = await replica.get_json("/readyz")
            return bool(status == 200)

        await eventually(lambda: ready(a), timeout=15, message="A ready again")
        await eventually(lambda: ready(b), timeout=15, message="B ready again")

        async def connected_on(replica: Any) -> bool:
            status, body = await replica.get_json("/edges/edge-1")
            return status == 200 and body["connected"] is True

        await eventually(lambda: connected_on(a), timeout=5, message="connected on A")
        await eventually(lambda: connected_on(b), timeout=5, message="connected on B")
        status, _ = await b.get_json("/edges/edge-1/status")
        assert status == 200
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_a_silent_replica_is_reaped_and_its_edges_show_disconnected(redis_server: RedisServer) -> None:
    """A replica stops refreshing its lease (as a killed one would): another
    reaps it, and its edge shows disconnected there until it enrolls again."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        _edge, _ = await connect_edge(a.edge_wire_port, "edge-1")
        await eventually(lambda: _connected_in(b, "edge-1"), timeout=5, message="B shows edge-1 connected")
        cluster = a.service.cluster
        assert cluster is not None
        cluster.presence.stop()  # the lease is no longer refreshed
        await eventually(lambda: not _connected_in(b, "edge-1"), timeout=10, message="B reaped A's edge")
        _status, events = await b.get_json("/edges/edge-1/events")
        last = events["items"][-1]
        assert last["kind"] == "edge.disconnected" and last["attributes"] == {"reason": "owner_lost"}
        _again, answer = await connect_edge(b.edge_wire_port, "edge-1")
        assert answer is not None and answer.accepted
        await eventually(lambda: _connected_in(b, "edge-1"), timeout=5, message="re-enrolled on B")
    finally:
        await a.stop()
        await b.stop()


def _connected_in(replica: Any, edge_id: str) -> bool:
    record = replica.registry.find(edge_id)
    return record is not None and record.connected


@pytest_twisted.ensureDeferred
async def test_live_events_follow_the_fleet_and_resume_on_another_replica(redis_server: RedisServer) -> None:
    """A /client subscriber on B hears an edge connected to A; its cursor
    (the fleet sequence) resumes on A with exactly the events it missed."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    on_b = ClientWireClient(b.wire_url, reactor=reactor)
    on_a = ClientWireClient(a.wire_url, reactor=reactor)
    heard_b: list[pb.FleetEvent] = []
    heard_a: list[pb.FleetEvent] = []
    try:
        edge, _ = await connect_edge(a.edge_wire_port, "edge-1")
        subscription = await on_b.subscribe(on_event=heard_b.append)
        edge.event("node.ready", message="one")
        await eventually(lambda: [e.message for e in heard_b if e.kind == "node.ready"] == ["one"], timeout=5)
        cursor = next(e for e in heard_b if e.kind == "node.ready").fleet_sequence
        await subscription.stop()
        edge.event("node.ready", message="two")  # while the client is away
        await eventually(lambda: _fleet_last(a) > cursor, timeout=5, message="two recorded")
        await on_a.subscribe(since=cursor, on_event=heard_a.append)
        edge.event("node.ready", message="three")
        await eventually(
            lambda: [e.message for e in heard_a if e.kind == "node.ready"] == ["two", "three"],
            timeout=5,
            message="resumed",
        )
        assert all(e.fleet_sequence > cursor for e in heard_a)
    finally:
        await on_a.close()
        await on_b.close()
        await a.stop()
        await b.stop()


def _fleet_last(replica: Any) -> int:
    last: int = replica.registry.fleet_events.last_sequence
    return last


@pytest_twisted.ensureDeferred
async def test_commands_left_open_by_a_dead_replica_end_failed(redis_server: RedisServer) -> None:
    """A replica dies with a command in flight: the replica that reaps it
    ends the operation failed, saying why, instead of leaving it open."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        edge, _ = await connect_edge(b.edge_wire_port, "edge-1", command_behaviour="hold")
        await eventually(lambda: _connected_in(a, "edge-1"), timeout=5, message="A shows edge-1")
        posted = ensureDeferred(a.post_json("/edges/edge-1/commands", {"name": "node.drain", "target": "node-1"}))
        await eventually(lambda: len(edge.held_commands) == 1, timeout=5, message="command held by the edge")
        cluster = a.service.cluster
        assert cluster is not None
        cluster.presence.stop()  # A stops refreshing its lease, as a killed replica would

        async def ended_on_b() -> bool:
            status, page = await b.get_json("/edges/edge-1/operations")
            return status == 200 and [o["state"] for o in page["items"]] == ["failed"]

        await eventually(ended_on_b, timeout=10, message="B ended A's operation")
        status, page = await b.get_json("/edges/edge-1/operations")
        assert "replica a" in page["items"][0]["reason"]
        status, body = await posted  # A's caller, still served by A, hears the end too
        assert status == 200 and body["state"] == "failed"
    finally:
        await a.stop()
        await b.stop()


@pytest_twisted.ensureDeferred
async def test_a_replica_that_stops_cleanly_leaves_nothing_connected(redis_server: RedisServer) -> None:
    """A replica stopped the normal way releases its edges and unregisters:
    the others show its edge disconnected and it is gone from the replicas."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        await connect_edge(a.edge_wire_port, "edge-1")
        await eventually(lambda: _connected_in(b, "edge-1"), timeout=5, message="B shows edge-1")
        await a.stop()
        await eventually(lambda: not _connected_in(b, "edge-1"), timeout=5, message="released on B")
        assert redis_server.command("HEXISTS", "iop:replicas", "a").startswith(b":0")
        assert redis_server.command("EXISTS", "iop:inbox:a").startswith(b":0")
        assert redis_server.command("HGET", "iop:edge:edge-1", "connected") == b"$1\r\n0\r\n"
    finally:
        await a.stop()
        await b.stop()
