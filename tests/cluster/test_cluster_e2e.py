"""End to end: three ``twistd -n iop-control-plane`` replicas sharing one
private redis-server, started as a user would, with scripted edges spread
over them; checked only through each replica's HTTP views and client wire."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults

from twisted_iop.client.wire import ClientWireClient
from twisted_iop.testing.cluster import cluster_config
from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV, edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import get_json, post_json
from twisted_iop.testing.redis import RedisServer
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.e2e

#: Bound of every wait for the cluster to converge (never reached when it
#: works). The replicas' configs (cluster_config) have a 1 s lease and a
#: 0.25 s heartbeat, so a killed replica's edges are let go in about 1.25 s.
CONVERGE_SECONDS = 15.0
#: How long a stopping replica may take before it is killed.
STOP_SECONDS = 15.0


@attrs.define
class Replica:
    """One Control Plane replica process and the ports it logged."""

    replica_id: str
    daemon: Daemon
    ports: dict[str, int]

    @property
    def http_url(self) -> str:
        """Base URL of its HTTP views."""
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def edge_wire_port(self) -> int:
        """Its edge wire port."""
        return self.ports["edge_wire"]

    @property
    def wire_url(self) -> str:
        """Its client wire."""
        return f"ws://127.0.0.1:{self.ports['client_wire']}/client"

    async def get_json(self, path: str) -> tuple[int, Any]:
        """GET ``path`` on this replica."""
        return await get_json(self.http_url + path, timeout=10)

    async def post_json(self, path: str, payload: Any) -> tuple[int, Any]:
        """POST JSON to ``path`` on this replica."""
        return await post_json(self.http_url + path, payload, timeout=30)


def _spawn_replica(redis: RedisServer, replica_id: str, directory: Path) -> Daemon:
    config = directory / f"{replica_id}.yaml"
    config.write_text(cluster_config(redis.url, replica_id))
    return start_daemon(
        ["iop-control-plane", "--config", str(config)], directory, env=CONTROL_PLANE_LOOPBACK_ENV, name=replica_id
    )


async def _ready(replica: Replica) -> bool:
    code, body = await replica.get_json("/readyz")
    return code == 200 and body["cluster"]["available"] is True


@asynccontextmanager
async def replicas(
    redis: RedisServer, directory: Path, ids: Sequence[str] = ("a", "b", "c")
) -> AsyncIterator[list[Replica]]:
    """Start one replica process per id (all at once), wait until each is
    ready in its cluster; stop them all (SIGTERM) on the way out."""
    daemons = [_spawn_replica(redis, replica_id, directory) for replica_id in ids]
    try:
        started: list[Replica] = []
        for replica_id, daemon in zip(ids, daemons, strict=True):
            ports = await wait_for_ports(daemon, {"http", "edge_wire", "client_wire"})
            started.append(Replica(replica_id, daemon, ports))
        await on_every(started, _ready, "ready")
        yield started
    finally:
        # SIGTERM all at once (one signal each: a second one while stopping
        # is a different request), then wait for each.
        for daemon in daemons:
            if daemon.running():
                daemon.process.send_signal(signal.SIGTERM)
        for daemon in daemons:
            try:
                daemon.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                daemon.kill()
    for daemon in daemons:
        assert "Traceback" not in daemon.log(), daemon.log()


async def enroll(replica: Replica, edge_id: str, **attributes: Any) -> ScriptedEdge:
    """A scripted edge enrolled on ``replica`` (its hello accepted)."""
    edge, hello = await connect_edge(replica.edge_wire_port, edge_id, **attributes)
    assert hello is not None and hello.accepted, hello
    return edge


async def listing(replica: Replica) -> list[tuple[str, bool]]:
    """``GET /edges`` on ``replica`` as (edge_id, connected) in listed order, duplicates kept."""
    code, body = await replica.get_json("/edges")
    assert code == 200, body
    return [(item["edge_id"], item["connected"]) for item in body["items"]]


async def shows(replica: Replica, expected: dict[str, bool]) -> bool:
    """Whether ``replica`` lists exactly ``expected``, one entry per edge."""
    return sorted(await listing(replica)) == sorted(expected.items())


async def on_every(cluster: Sequence[Replica], check: Callable[[Replica], Awaitable[bool]], what: str) -> None:
    """Wait (bounded) until ``check`` holds on every replica, one after the other."""
    for replica in cluster:
        await eventually(partial(check, replica), timeout=CONVERGE_SECONDS, message=f"{what} on {replica.replica_id}")


async def all_show(cluster: Sequence[Replica], expected: dict[str, bool], what: str) -> None:
    """Wait (bounded) until every replica lists exactly ``expected``."""
    await on_every(cluster, lambda replica: shows(replica, expected), what)


def _both(first: Any, second: Any) -> Deferred[list[Any]]:
    return gatherResults([ensureDeferred(first), ensureDeferred(second)], consumeErrors=True)


@pytest_twisted.ensureDeferred
async def test_edges_spread_over_three_replicas_are_served_by_every_replica(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Edges enrolled on A, B and C are listed connected by every replica, and
    status and a command for an edge held by another replica work through
    any of them (200, the command succeeded, the edge saw it once)."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, c = cluster
        edges = {
            "edge-a1": await enroll(a, "edge-a1"),
            "edge-a2": await enroll(a, "edge-a2"),
            "edge-b1": await enroll(b, "edge-b1"),
            "edge-c1": await enroll(c, "edge-c1"),
        }
        await all_show(cluster, {edge_id: True for edge_id in edges}, "the whole fleet connected")

        code, status = await a.get_json("/edges/edge-c1/status")
        assert code == 200, status
        assert status["edge_id"] == "edge-c1" and [n["node_id"] for n in status["nodes"]] == ["node-1", "node-2"]
        assert edges["edge-c1"].status_requests == 1

        code, operation = await c.post_json("/edges/edge-a2/commands", {"name": "node.drain", "target": "node-1"})
        assert code == 200, operation
        assert operation["state"] == "succeeded" and operation["result"] == {"target": "node-1"}
        assert [command.name for command in edges["edge-a2"].commands_seen] == ["node.drain"]
        assert all(not edge.commands_seen for edge_id, edge in edges.items() if edge_id != "edge-a2")

        async def operation_everywhere() -> bool:
            for replica in cluster:
                code, page = await replica.get_json("/edges/edge-a2/operations")
                ids = [(o["operation_id"], o["state"]) for o in page["items"]] if code == 200 else []
                if ids != [(operation["operation_id"], "succeeded")]:
                    return False
            return True

        await eventually(operation_everywhere, timeout=CONVERGE_SECONDS, message="the operation on every replica")


@pytest_twisted.ensureDeferred
async def test_one_idempotency_key_on_two_replicas_dispatches_once(redis_server: RedisServer, tmp_path: Path) -> None:
    """The same idempotency key POSTed to A and B at once (for an edge held by
    C) runs one command: both answers name one operation, one is a replay."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, c = cluster
        edge = await enroll(c, "edge-k")
        await all_show(cluster, {"edge-k": True}, "edge-k connected")
        command = {"name": "node.drain", "target": "node-2", "idempotency_key": "drain-node-2-once"}

        (code_a, on_a), (code_b, on_b) = await _both(
            a.post_json("/edges/edge-k/commands", command), b.post_json("/edges/edge-k/commands", command)
        )
        assert (code_a, code_b) == (200, 200), (on_a, on_b)
        assert on_a["operation_id"] == on_b["operation_id"]
        assert on_a["state"] == on_b["state"] == "succeeded"
        assert sorted([on_a["replayed"], on_b["replayed"]]) == [False, True]
        assert [c.name for c in edge.commands_seen] == ["node.drain"]

        # A third try, on the replica holding the edge, is a replay too.
        code, on_c = await c.post_json("/edges/edge-k/commands", command)
        assert code == 200 and on_c["operation_id"] == on_a["operation_id"] and on_c["replayed"] is True
        assert len(edge.commands_seen) == 1


@pytest_twisted.ensureDeferred
async def test_newest_connection_wins_across_replicas(redis_server: RedisServer, tmp_path: Path) -> None:
    """An edge connected to A that enrolls again on B: A closes the old
    connection (SUPERSEDED), every replica lists the edge once, connected,
    and the old connection's close does not mark it disconnected."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, _c = cluster
        old = await enroll(a, "edge-n")
        await all_show(cluster, {"edge-n": True}, "edge-n connected through A")

        new = await enroll(b, "edge-n")
        await old.lost
        assert [e.code for e in old.errors] == [pb.ERROR_CODE_SUPERSEDED]
        await all_show(cluster, {"edge-n": True}, "edge-n connected once, through B")

        async def enrolled_twice(replica: Replica) -> bool:
            code, detail = await replica.get_json("/edges/edge-n")
            return code == 200 and detail["enrollments"] == 2

        await on_every(cluster, enrolled_twice, "two enrollments")

        # A command through A (the old holder) reaches the new connection:
        # the edge's current connection is B's everywhere.
        code, operation = await a.post_json("/edges/edge-n/commands", {"name": "node.drain", "target": "node-1"})
        assert code == 200 and operation["state"] == "succeeded", operation
        assert len(new.commands_seen) == 1 and not old.commands_seen

        # Every replica has applied the fleet stream up to that command; the
        # old connection's close recorded no disconnect for the edge.
        await on_every(cluster, lambda replica: _has_event(replica, "edge-n", "command.started"), "command events")
        for replica in cluster:
            code, page = await replica.get_json("/edges/edge-n/events")
            kinds = [e["kind"] for e in page["items"]]
            assert "edge.disconnected" not in kinds, kinds
            assert kinds.count("edge.connected") == 2, kinds
            assert await listing(replica) == [("edge-n", True)]


async def _has_event(replica: Replica, edge_id: str, kind: str) -> bool:
    code, page = await replica.get_json(f"/edges/{edge_id}/events")
    return code == 200 and kind in [e["kind"] for e in page["items"]]


@pytest_twisted.ensureDeferred
async def test_a_killed_replica_lets_go_of_its_edges(redis_server: RedisServer, tmp_path: Path) -> None:
    """kill -9 of C: its edges show disconnected on A and B once its lease
    expires; a command through A held by one of C's edges ends
    edge_disconnected (503) instead of hanging; the edges enroll again on
    the survivors and are listed once each, connected."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, c = cluster
        survivor = await enroll(a, "edge-s")
        held = await enroll(c, "edge-h", command_behaviour="hold")
        other = await enroll(c, "edge-o")
        await all_show(cluster, {"edge-s": True, "edge-h": True, "edge-o": True}, "fleet connected")

        command = ensureDeferred(
            a.post_json("/edges/edge-h/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 60})
        )
        await eventually(lambda: len(held.commands_seen) == 1, timeout=CONVERGE_SECONDS, message="the held command")
        assert not command.called

        killed_at = time.monotonic()
        c.daemon.kill()
        await held.lost
        await other.lost
        a_and_b = [a, b]
        await all_show(a_and_b, {"edge-s": True, "edge-h": False, "edge-o": False}, "C's edges reaped")
        print(f"C's edges shown disconnected on A and B {time.monotonic() - killed_at:.2f}s after its kill")

        code, answer = await command
        assert code == 503, answer
        assert answer["error"]["code"] == "edge_disconnected"
        assert answer["operation"]["state"] == "edge_disconnected"

        await enroll(b, "edge-h")
        await enroll(a, "edge-o")
        await all_show(a_and_b, {"edge-s": True, "edge-h": True, "edge-o": True}, "C's edges back on A and B")
        assert survivor.commands_seen == []


@pytest_twisted.ensureDeferred
async def test_redis_away_and_back(redis_server: RedisServer, tmp_path: Path) -> None:
    """While Redis is stopped every replica is not ready (503, cluster
    unavailable), refuses shared views with 503 cluster_unavailable and
    sends new edges to retry later, while its own edges stay connected;
    once Redis is back they are ready again and agree on the fleet."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, c = cluster
        edges = [await enroll(a, "edge-1"), await enroll(b, "edge-2"), await enroll(c, "edge-3")]
        await all_show(cluster, {"edge-1": True, "edge-2": True, "edge-3": True}, "fleet connected")

        redis_server.stop()

        async def cut_off(replica: Replica) -> bool:
            code, body = await replica.get_json("/readyz")
            return code == 503 and body["ready"] is False and body["cluster"]["available"] is False

        await on_every(cluster, cut_off, "not ready")
        for replica in cluster:
            code, body = await replica.get_json("/edges")
            assert code == 503 and body["error"]["code"] == "cluster_unavailable", body
            code, body = await replica.get_json("/fleet/events")
            assert code == 503 and body["error"]["code"] == "cluster_unavailable", body
        # A new edge is sent to try again later (it could not be claimed).
        refused, hello = await connect_edge(a.edge_wire_port, "edge-4")
        assert hello is not None and not hello.accepted, hello
        assert hello.reason_code == "retry_later" and not hello.permanent and hello.retry_after_ms > 0, hello
        await refused.lost

        redis_server.start()
        await on_every(cluster, _ready, "ready again")
        await all_show(cluster, {"edge-1": True, "edge-2": True, "edge-3": True}, "fleet connected after Redis")
        assert not any(edge.lost.called for edge in edges)

        # The fleet still works across replicas: a command through A for C's edge.
        code, operation = await a.post_json("/edges/edge-3/commands", {"name": "node.drain", "target": "node-1"})
        assert code == 200 and operation["state"] == "succeeded", operation
        assert len(edges[2].commands_seen) == 1


@pytest_twisted.ensureDeferred
async def test_a_fleet_cursor_read_on_one_replica_resumes_on_another(redis_server: RedisServer, tmp_path: Path) -> None:
    """The fleet_sequence a client wire subscriber saw on A is a cursor B
    understands: GET /fleet/events?since=N on B returns exactly the events
    after N, numbered as on A."""
    async with replicas(redis_server, tmp_path, ("a", "b")) as cluster:
        a, b = cluster
        client = ClientWireClient(a.wire_url, reactor=reactor)
        seen: list[pb.FleetEvent] = []
        try:
            hello = await client.hello()
            assert hello.accepted
            await client.subscribe(on_event=seen.append)
            edge_a = await enroll(a, "edge-a")
            edge_b = await enroll(b, "edge-b")
            edge_a.event("node.ready", node_id="node-1")
            await eventually(
                lambda: {(e.edge_id, e.kind) for e in seen} >= {("edge-a", "node.ready"), ("edge-b", "edge.connected")},
                timeout=CONVERGE_SECONDS,
                message="the first events on A's client wire",
            )
            cursor = max(e.fleet_sequence for e in seen)
            edge_b.event("node.ready", node_id="node-2")
            edge_a.event("node.draining", node_id="node-1")
            await eventually(
                lambda: [e.kind for e in seen if e.fleet_sequence > cursor] == ["node.ready", "node.draining"],
                timeout=CONVERGE_SECONDS,
                message="the later events on A's client wire",
            )
        finally:
            await client.close()
        after_on_a = [(e.fleet_sequence, e.edge_id, e.kind) for e in seen if e.fleet_sequence > cursor]

        async def page_on(replica: Replica) -> list[tuple[int, str, str]]:
            code, page = await replica.get_json(f"/fleet/events?since={cursor}")
            assert code == 200, page
            return [(e["fleet_sequence"], e["edge_id"], e["kind"]) for e in page["items"]]

        await eventually(
            lambda: _equals(page_on(b), after_on_a), timeout=CONVERGE_SECONDS, message="B's page after the cursor"
        )
        assert await page_on(a) == after_on_a
        assert after_on_a == [
            (after_on_a[0][0], "edge-b", "node.ready"),
            (after_on_a[1][0], "edge-a", "node.draining"),
        ]


async def _equals(got: Any, expected: Any) -> bool:
    return bool(await got == expected)


@pytest_twisted.ensureDeferred
async def test_a_real_edge_fails_over_between_replicas(redis_server: RedisServer, tmp_path: Path) -> None:
    """A real ``iop-edge`` daemon (with a real Node) that lists B and C as its
    Control Plane addresses: A shows its live status and drains the node
    through the replica holding it; when that replica is killed (-9) the
    Edge enrolls on the other one, and A lists it once, connected, and
    drives it again."""
    async with replicas(redis_server, tmp_path) as cluster:
        a, b, c = cluster
        mapping = edge_yaml(f"127.0.0.1:{b.edge_wire_port}")
        del mapping["control_plane"]["address"]
        mapping["control_plane"]["addresses"] = [f"127.0.0.1:{r.edge_wire_port}" for r in (b, c)]
        edge = start_daemon(
            ["iop-edge", "--config", write_yaml(tmp_path / "edge.yaml", mapping)], tmp_path, name="edge"
        )
        node = None
        try:
            edge_ports = await wait_for_ports(edge, {"node_server"})
            node_config = write_yaml(tmp_path / "node-1.yaml", node_yaml("node-1", edge_ports["node_server"]))
            node = start_daemon(["iop-node", "--config", node_config], tmp_path, name="node-1")
            await all_show(cluster, {"edge-a": True}, "the real edge connected")

            async def node_connected() -> bool:
                code, status = await a.get_json("/edges/edge-a/status")
                nodes = {n["node_id"]: n["connected"] for n in status["nodes"]} if code == 200 else {}
                return nodes == {"node-1": True, "node-2": False}

            await eventually(node_connected, timeout=CONVERGE_SECONDS, message="node-1 connected, seen through A")
            code, operation = await a.post_json(
                "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 5}
            )
            assert code == 200 and operation["state"] == "succeeded", operation

            holders = [r for r in (b, c) if "edge edge-a connected" in r.daemon.log()]
            assert len(holders) == 1, [r.replica_id for r in holders]
            holder = holders[0]
            survivors = [r for r in cluster if r is not holder]
            holder.daemon.kill()

            async def enrolled_again(replica: Replica) -> bool:
                code, detail = await replica.get_json("/edges/edge-a")
                return code == 200 and detail["connected"] is True and detail["enrollments"] == 2

            await on_every(survivors, enrolled_again, "the edge enrolled on the other replica")
            for replica in survivors:
                assert await listing(replica) == [("edge-a", True)]
            await eventually(node_connected, timeout=CONVERGE_SECONDS, message="node-1 still connected, through A")
            code, operation = await a.post_json(
                "/edges/edge-a/commands", {"name": "node.undrain", "target": "node-1", "timeout_seconds": 5}
            )
            assert code == 200 and operation["state"] == "succeeded", operation
        finally:
            if node is not None:
                node.stop()
            edge.stop()
        assert "Server Shut Down." in edge.log()
