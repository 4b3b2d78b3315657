"""Replicas sharing one fleet through a real Redis (in-process replicas, real sockets)."""

from __future__ import annotations

from typing import Any

import pytest_twisted

from twisted_iop.testing.cluster import start_replica
from twisted_iop.testing.harness import eventually
from twisted_iop.testing.peers import connect_edge
from twisted_iop.testing.redis import RedisServer


def _connected(listing: Any) -> dict[str, bool]:
    return {item["edge_id"]: item["connected"] for item in listing["items"]}


@pytest_twisted.ensureDeferred
async def test_every_replica_shows_the_whole_fleet_and_routes_status_and_commands(redis_server: RedisServer) -> None:
    """Edges on A and B appear connected on both; status and a command for
    B's edge work through A exactly as for a local one."""
    a = await start_replica(redis_server.url, "a")
    b = await start_replica(redis_server.url, "b")
    try:
        e1, r1 = await connect_edge(a.edge_wire_port, "edge-1")
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

        status, fleet = await a.get_json("/fleet/status")
        assert status == 200
        rows = {row["edge_id"]: row for row in fleet["items"]}
        assert rows["edge-1"]["state"] == "ok" and rows["edge-2"]["state"] == "ok"
    finally:
        await a.stop()
        await b.stop()
