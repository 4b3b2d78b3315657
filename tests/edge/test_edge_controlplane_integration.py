"""Real sockets: the real Control Plane, an Edge and two Nodes in one reactor,
checked through the Control Plane's HTTP views."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest_twisted
import yaml

from twisted_iop.edge.tap import EdgeService
from twisted_iop.node.tap import NodeService
from twisted_iop.testing.configs import edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.harness import (
    ControlPlaneHarness,
    eventually,
    start_control_plane,
    start_edge,
    start_node,
    stop,
)
from twisted_iop.wire.status_totals import response_counts


class Fleet:
    """A real Control Plane, an Edge and its two Nodes."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.cp: Optional[ControlPlaneHarness] = None
        self.edge: Optional[EdgeService] = None
        self.nodes: dict[str, NodeService] = {}
        self.edge_config = tmp_path / "edge.yaml"
        self.edge_data: dict[str, Any] = {}

    async def start(self) -> Fleet:
        """Start everything and wait until both nodes show connected over HTTP."""
        self.cp = await start_control_plane()
        self.edge_data = edge_yaml(self.cp.edge_wire_address)
        self.edge = await start_edge(write_yaml(self.edge_config, self.edge_data))
        for node_id in ("node-1", "node-2"):
            path = write_yaml(self.tmp_path / f"{node_id}.yaml", node_yaml(node_id, self.edge.node_port))
            self.nodes[node_id] = start_node(path)
        await eventually(self.both_connected, timeout=10, message="both nodes connected in /status")
        return self

    async def status(self) -> tuple[int, Any]:
        """GET /edges/edge-a/status."""
        assert self.cp is not None
        return await self.cp.get_json("/edges/edge-a/status")

    async def nodes_by_id(self) -> dict[str, Any]:
        """The status view's nodes by id (empty unless 200)."""
        code, body = await self.status()
        return {n["node_id"]: n for n in body["nodes"]} if code == 200 else {}

    async def both_connected(self) -> bool:
        """Whether the status view shows both nodes connected."""
        nodes = await self.nodes_by_id()
        return bool(nodes) and all(n["connected"] for n in nodes.values())

    async def stop(self) -> None:
        """Stop everything."""
        await stop(*self.nodes.values(), self.edge)
        if self.cp is not None:
            await self.cp.stop()


def offline(node: dict[str, Any]) -> bool:
    """The HTTP form of a not-ready node: every provider unavailable/offline with zero counters."""
    zero = {"capacity": 0, "in_flight": 0, "queued": 0}
    return not node["connected"] and all(
        p["status"] == "unavailable" and p["health"] == "offline" and p["general"] == zero and p["long_context"] == zero
        for p in node["providers"]
    )


@pytest_twisted.ensureDeferred
async def test_status_view_follows_node_loss_and_return(tmp_path: Path) -> None:
    """/edges/{id}/status shows a killed node offline with zeros and its capacity when it returns."""
    fleet = await Fleet(tmp_path).start()
    try:
        nodes = await fleet.nodes_by_id()
        provider = nodes["node-1"]["providers"][0]
        assert provider["general"]["capacity"] == 4 and provider["long_context"]["capacity"] == 1
        assert provider["status"] == "available" and provider["health"] == "healthy"
        await stop(fleet.nodes["node-1"])

        async def node1_offline() -> bool:
            return offline((await fleet.nodes_by_id())["node-1"])

        await eventually(node1_offline, timeout=5, message="node-1 offline")
        nodes = await fleet.nodes_by_id()
        assert nodes["node-1"]["providers"][0]["provider_id"] == "mock-a"
        assert nodes["node-2"]["connected"]
        fleet.nodes["node-1"] = start_node(str(tmp_path / "node-1.yaml"))
        await eventually(fleet.both_connected, timeout=5, message="node-1 back")
        nodes = await fleet.nodes_by_id()
        assert nodes["node-1"]["providers"][0]["general"]["capacity"] == 4
        assert fleet.cp is not None
        _code, events = await fleet.cp.get_json("/edges/edge-a/events?limit=1000")
        kinds = [(e["kind"], e["node_id"]) for e in events["items"]]
        assert ("node.disconnected", "node-1") in kinds
        assert kinds.count(("node.ready", "node-1")) == 2
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_drain_through_http_commands(tmp_path: Path) -> None:
    """POST /edges/{id}/commands node.drain succeeds and the next status shows it drained."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.cp is not None
        code, catalog = await fleet.cp.get_json("/edges/edge-a/commands")
        assert code == 200
        assert {"node.drain", "node.undrain", "node.disconnect", "providers.refresh", "edge.diagnostics"} <= {
            c["name"] for c in catalog["commands"]
        }
        code, operation = await fleet.cp.post_json(
            "/edges/edge-a/commands",
            {"name": "node.drain", "target": "node-2", "arguments": {"reason": "maintenance"}, "timeout_seconds": 5},
        )
        assert code == 200, operation
        assert operation["state"] == "succeeded" and operation["result"]["drained"] == "true"
        nodes = await fleet.nodes_by_id()
        assert nodes["node-2"]["drained"]
        assert nodes["node-2"]["providers"][0]["status"] == "drained"
        code, rejected = await fleet.cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-9", "timeout_seconds": 5}
        )
        assert code == 200 and rejected["state"] == "rejected"
        assert "node-9" in rejected["reason"]
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_providers_refresh_picks_up_added_provider(tmp_path: Path) -> None:
    """providers.refresh re-reads edge.yaml (and the node re-reads node.yaml): the new provider appears."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.cp is not None
        extra = {"provider_id": "mock-c", "kind": "mock", "models": ["phi-3"]}
        fleet.edge_data["nodes"][0]["providers"].append(dict(extra, capacity=3, long_context_capacity=0))
        write_yaml(fleet.edge_config, fleet.edge_data)
        node_data = yaml.safe_load((tmp_path / "node-1.yaml").read_text())
        node_data["providers"].append(extra)
        write_yaml(tmp_path / "node-1.yaml", node_data)
        code, operation = await fleet.cp.post_json(
            "/edges/edge-a/commands", {"name": "providers.refresh", "timeout_seconds": 5}
        )
        assert code == 200, operation
        assert operation["state"] == "succeeded", operation
        assert operation["result"]["added"] == "node-1/mock-c"
        nodes = await fleet.nodes_by_id()
        by_id = {p["provider_id"]: p for p in nodes["node-1"]["providers"]}
        assert by_id["mock-c"]["general"]["capacity"] == 3
        assert by_id["mock-c"]["health"] == "healthy"
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_edge_reenrolls_after_control_plane_restart(tmp_path: Path) -> None:
    """After a Control Plane restart on the same port the Edge enrolls again and flushes its outbox."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.cp is not None and fleet.edge is not None
        port = fleet.cp.edge_wire_port
        await fleet.cp.stop()
        # A stopped Control Plane service keeps accepted connections open;
        # reset the Edge's like a crashed process would.
        current = fleet.edge.link.current
        if current is not None and current.transport is not None:
            current.transport.abortConnection()  # type: ignore[attr-defined]  # a TCP transport
        await eventually(lambda: not fleet.edge.link.is_enrolled, timeout=5, message="edge noticed")  # type: ignore[union-attr]  # the fleet has an Edge
        await stop(fleet.nodes["node-2"])  # happens while the Control Plane is away
        fleet.cp = await start_control_plane(edge_wire_port=port)

        async def reconnected() -> bool:
            assert fleet.cp is not None
            code, body = await fleet.cp.get_json("/edges/edge-a")
            return code == 200 and body["connected"]

        await eventually(reconnected, timeout=10, message="edge re-enrolled")
        _code, events = await fleet.cp.get_json("/edges/edge-a/events?limit=1000")
        assert ("node.disconnected", "node-2") in [(e["kind"], e["node_id"]) for e in events["items"]]
        nodes = await fleet.nodes_by_id()
        assert nodes["node-1"]["connected"] and offline(nodes["node-2"])
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_the_edges_totals_are_the_counts_the_control_plane_shows(tmp_path: Path) -> None:
    """The real Edge sends totals with each snapshot; the Control Plane
    keeps them, and its status and fleet views add up to the nodes they
    show, with a node ready and with a node lost."""
    fleet = await Fleet(tmp_path).start()
    try:
        assert fleet.cp is not None
        for step in ("both ready", "node-1 lost"):
            if step == "node-1 lost":
                await stop(fleet.nodes.pop("node-1"))

                async def node1_offline() -> bool:
                    return offline((await fleet.nodes_by_id())["node-1"])

                await eventually(node1_offline, timeout=5, message="node-1 offline")
            code, body = await fleet.status()
            assert code == 200
            # The edge's totals were kept as the counts, not in the bytes.
            kept = fleet.cp.registry.get("edge-a").snapshot
            assert not kept.parse().HasField("totals") and response_counts(kept.parse()) == kept.counts
            assert fleet.cp.service.gateway.status_refused == {}
            providers = [p for node in body["nodes"] for p in node["providers"]]
            totals = body["totals"]
            assert totals["nodes_configured"] == len(body["nodes"])
            assert totals["nodes_connected"] == sum(1 for node in body["nodes"] if node["connected"])
            assert totals["general"]["capacity"] == sum(p["general"]["capacity"] for p in providers)
            assert totals["providers_by_health"]["offline"] == sum(1 for p in providers if p["health"] == "offline")

            async def fleet_agrees(general: dict[str, int] = totals["general"]) -> bool:
                # A fleet round is reused for up to a second: wait for a new one.
                assert fleet.cp is not None
                code, page = await fleet.cp.get_json("/fleet/status")
                return code == 200 and page["totals"]["general"] == general

            await eventually(fleet_agrees, timeout=5, message=f"fleet totals as the edge's ({step})")
    finally:
        await fleet.stop()
