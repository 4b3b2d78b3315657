"""Real sockets on 127.0.0.1: an Edge, two Nodes (mock providers) and a fake
Control Plane in one reactor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
from twisted.internet import reactor

from twisted_iop.edge.tap import EdgeService
from twisted_iop.node.tap import NodeService
from twisted_iop.testing.configs import edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.testing.wires.peers import FakeControlPlaneServer, raw_node
from twisted_iop.wire import control_pb2 as pb


class Fleet:
    """The running pieces of one test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.cp = FakeControlPlaneServer()
        self.edge: EdgeService | None = None
        self.nodes: dict[str, NodeService] = {}
        self.node_configs: dict[str, str] = {}

    async def start(self) -> Fleet:
        """CP, Edge, then both Nodes; wait until both are ready and the Edge enrolled."""
        address = await self.cp.start()
        self.edge = await start_edge(write_yaml(self.tmp_path / "edge.yaml", edge_yaml(address)))
        for node_id in ("node-1", "node-2"):
            path = write_yaml(self.tmp_path / f"{node_id}.yaml", node_yaml(node_id, self.edge.node_port))
            self.node_configs[node_id] = path
            self.nodes[node_id] = start_node(path)
        await eventually(lambda: self.cp.connections and self.cp.current.hellos, timeout=5, message="edge hello")
        await eventually(lambda: self.ready_nodes() == {"node-1", "node-2"}, timeout=5, message="both nodes ready")
        await eventually(
            lambda: sum(1 for e in self.cp.events() if e.kind == "node.ready") == 2,
            timeout=5,
            message="node.ready events relayed",
        )
        return self

    def ready_nodes(self) -> set[str]:
        """Nodes the Edge's registry has as dispatch-ready."""
        assert self.edge is not None
        return {n.node_id for n in self.edge.registry.nodes() if self.edge.registry.is_ready(n.node_id)}

    async def snapshot(self) -> dict[str, pb.EdgeNodeSnapshot]:
        """A snapshot asked for over the wire, by node id."""
        response = await self.cp.current.status()
        return {n.node_id: n for n in response.nodes}

    async def stop(self) -> None:
        """Stop everything."""
        await stop(*self.nodes.values(), self.edge)
        await self.cp.stop()


def assert_offline(node: pb.EdgeNodeSnapshot) -> None:
    """connected=false; providers keep identity, unavailable/offline, every counter 0."""
    assert not node.connected
    assert node.providers
    for p in node.providers:
        assert p.provider_id and p.kind == "mock" and list(p.models)
        assert p.status == pb.PROVIDER_STATUS_UNAVAILABLE
        assert p.health == pb.PROVIDER_HEALTH_OFFLINE
        assert [
            p.capacity,
            p.in_flight,
            p.queued,
            p.long_context_capacity,
            p.long_context_in_flight,
            p.long_context_queued,
        ] == [0] * 6


@pytest_twisted.ensureDeferred
async def test_kill_node_then_bring_it_back(tmp_path: Path) -> None:
    """A killed Node shows offline with zero counters; back again, its capacity returns."""
    fleet = await Fleet(tmp_path).start()
    try:
        nodes = await fleet.snapshot()
        assert nodes["node-1"].connected and nodes["node-1"].providers[0].capacity == 4
        assert nodes["node-2"].providers[0].long_context_capacity == 2
        # Kill node-1 abruptly: its socket is aborted, as when the process dies.
        link = fleet.nodes["node-1"].link
        assert link.current is not None and link.current.transport is not None
        await stop(fleet.nodes["node-1"])
        await eventually(lambda: "node-1" not in fleet.ready_nodes(), timeout=5, message="node-1 gone")
        nodes = await fleet.snapshot()
        assert_offline(nodes["node-1"])
        assert nodes["node-2"].connected
        await eventually(
            lambda: any(e.kind == "node.disconnected" and e.node_id == "node-1" for e in fleet.cp.events()),
            timeout=5,
            message="node.disconnected relayed",
        )
        fleet.nodes["node-1"] = start_node(fleet.node_configs["node-1"])
        await eventually(lambda: "node-1" in fleet.ready_nodes(), timeout=5, message="node-1 back")
        nodes = await fleet.snapshot()
        back = nodes["node-1"].providers[0]
        assert nodes["node-1"].connected
        assert (back.status, back.health, back.capacity, back.long_context_capacity) == (
            pb.PROVIDER_STATUS_AVAILABLE,
            pb.PROVIDER_HEALTH_HEALTHY,
            4,
            1,
        )
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_second_connection_never_shows_node_disconnected(tmp_path: Path) -> None:
    """A duplicate connection for a ready node: pending changes nothing; ready takes over without a gap."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.edge is not None
        # The Node runtime's connection is superseded; it reconnects and takes
        # over again, and through all of it the node never shows disconnected.
        runtime = fleet.nodes["node-1"]
        duplicate = await raw_node(fleet.edge.node_port)
        response = await duplicate.hello("node-1")
        assert response.accepted
        nodes = await fleet.snapshot()
        assert nodes["node-1"].connected
        before = len(fleet.cp.events())
        duplicate.ready("mock-a")
        await eventually(
            lambda: any(e.kind == "node.superseded" for e in fleet.cp.events()[before:]),
            timeout=5,
            message="node.superseded",
        )
        nodes = await fleet.snapshot()
        assert nodes["node-1"].connected and nodes["node-1"].providers[0].capacity == 4
        new_kinds = [e.kind for e in fleet.cp.events()[before:] if e.node_id == "node-1"]
        assert "node.disconnected" not in new_kinds
        assert runtime.running
        # The runtime's reconnect supersedes the duplicate in turn.
        await duplicate.lost.addTimeout(5, reactor)
        await eventually(lambda: "node-1" in fleet.ready_nodes(), timeout=5, message="runtime owns node-1")
        assert (await fleet.snapshot())["node-1"].connected
        kinds = [e.kind for e in fleet.cp.events()[before:] if e.node_id == "node-1"]
        assert "node.disconnected" not in kinds
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_rejected_connection_changes_nothing(tmp_path: Path) -> None:
    """An unknown node id or wrong credential is rejected and closed; no snapshot change, no event."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.edge is not None
        before_nodes = await fleet.snapshot()
        before_events = len(fleet.cp.events())
        for node_id, credential, code in (("node-9", "", "unknown_node"), ("node-2", "wrong", "bad_credential")):
            intruder = await raw_node(fleet.edge.node_port)
            response = await intruder.hello(node_id, credential)
            assert not response.accepted and response.reason_code == code
            await intruder.lost.addTimeout(5, reactor)
        after_nodes = await fleet.snapshot()
        for node_id in ("node-1", "node-2"):
            a, b = before_nodes[node_id], after_nodes[node_id]
            b.last_seen_ms = a.last_seen_ms
            assert a == b
        # Let any stray event arrive before asserting there is none.
        await fleet.snapshot()
        assert len(fleet.cp.events()) == before_events
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_drain_and_disconnect_commands_over_the_wire(tmp_path: Path) -> None:
    """node.drain shows DRAINED in the next snapshot; node.disconnect makes the node reconnect."""
    fleet = await Fleet(tmp_path).start()
    try:
        response = await fleet.cp.current.command("node.drain", "node-2", reason="maintenance")
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
        nodes = await fleet.snapshot()
        assert nodes["node-2"].drained
        assert nodes["node-2"].providers[0].status == pb.PROVIDER_STATUS_DRAINED
        response = await fleet.cp.current.command("node.disconnect", "node-1", command_id="op-2")
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
        assert response.result["closed_connections"] == "1"
        await eventually(
            lambda: any(e.kind == "node.disconnected" and e.node_id == "node-1" for e in fleet.cp.events()),
            timeout=5,
            message="node-1 disconnected",
        )
        await eventually(lambda: "node-1" in fleet.ready_nodes(), timeout=5, message="node-1 reconnected")
        diagnostics = await fleet.cp.current.command("edge.diagnostics", command_id="op-3")
        assert diagnostics.result["nodes_ready"] == "2"
        assert "127.0.0.1" not in repr(diagnostics.result)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_events_queued_while_cp_away_are_flushed_in_order(tmp_path: Path) -> None:
    """Events during a Control Plane outage arrive in order after re-enrollment."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.edge is not None
        first = fleet.cp.current
        first.close()
        await first.lost.addTimeout(5, reactor)
        # With full jitter the first retry may come at once: the gap can be too short to poll.
        link: Any = fleet.edge.link
        await eventually(lambda: not link.is_enrolled or link.enrollments >= 2, timeout=5, message="edge noticed")
        await stop(fleet.nodes["node-2"])
        await eventually(lambda: "node-2" not in fleet.ready_nodes(), timeout=5, message="node-2 gone")
        await eventually(
            lambda: fleet.cp.current is not first and fleet.cp.current.hellos, timeout=5, message="re-enrolled"
        )
        await eventually(
            lambda: any(e.kind == "node.disconnected" for e in fleet.cp.current.events()), timeout=5, message="flush"
        )
        sequences = [e.edge_sequence for e in fleet.cp.events()]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
        assert sequences == list(range(1, len(sequences) + 1))
    finally:
        await fleet.stop()
