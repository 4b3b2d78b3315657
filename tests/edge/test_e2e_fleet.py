"""End to end: the three daemons started with ``twistd -n`` from temporary
configs on free ports, checked through the Control Plane's HTTP views."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV, edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import get_json, post_json

pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_fleet_of_daemons(tmp_path: Path) -> None:
    """CP, Edge and two Nodes as processes: status over HTTP, a killed Node shown offline, a drain."""
    daemons: list[Daemon] = []
    try:
        started = time.monotonic()
        cp = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
        daemons.append(cp)
        cp_ports = await wait_for_ports(cp, {"http", "edge_wire"})
        http = f"http://127.0.0.1:{cp_ports['http']}"
        edge_config = write_yaml(tmp_path / "edge.yaml", edge_yaml(f"127.0.0.1:{cp_ports['edge_wire']}"))
        edge = start_daemon(["iop-edge", "--config", edge_config], tmp_path, name="edge")
        daemons.append(edge)
        edge_ports = await wait_for_ports(edge, {"node_server"})
        nodes: dict[str, Daemon] = {}
        for node_id in ("node-1", "node-2"):
            config = write_yaml(tmp_path / f"{node_id}.yaml", node_yaml(node_id, edge_ports["node_server"]))
            nodes[node_id] = start_daemon(["iop-node", "--config", config], tmp_path, name=node_id)
            daemons.append(nodes[node_id])

        async def connected_nodes() -> set[str]:
            code, body = await get_json(http + "/edges/edge-a/status", timeout=5)
            return {n["node_id"] for n in body["nodes"] if n["connected"]} if code == 200 else set()

        await eventually(
            lambda: _eq(connected_nodes(), {"node-1", "node-2"}),
            timeout=20,
            message="both nodes connected",
        )
        ready_after = time.monotonic() - started
        code, status = await get_json(http + "/edges/edge-a/status", timeout=5)
        by_id = {n["node_id"]: n for n in status["nodes"]}
        assert by_id["node-2"]["providers"][0]["general"]["capacity"] == 8

        nodes["node-1"].kill()
        await eventually(lambda: _eq(connected_nodes(), {"node-2"}), timeout=10, message="node-1 offline")
        code, status = await get_json(http + "/edges/edge-a/status", timeout=5)
        gone = {n["node_id"]: n for n in status["nodes"]}["node-1"]
        assert not gone["connected"]
        provider = gone["providers"][0]
        assert provider["provider_id"] == "mock-a"
        assert (provider["status"], provider["health"]) == ("unavailable", "offline")
        assert provider["general"] == {"capacity": 0, "in_flight": 0, "queued": 0}

        code, operation = await post_json(
            http + "/edges/edge-a/commands",
            {"name": "node.drain", "target": "node-2", "timeout_seconds": 5},
            timeout=10,
        )
        assert code == 200 and operation["state"] == "succeeded", operation
        code, status = await get_json(http + "/edges/edge-a/status", timeout=5)
        assert {n["node_id"]: n for n in status["nodes"]}["node-2"]["drained"]

        edge_log = edge.log()
        assert "node node-1 is ready" in edge_log and "node node-1 disconnected" in edge_log
        assert "n2-secret" not in edge_log and "n2-secret" not in nodes["node-2"].log()
        print(f"fleet of 4 daemons ready over HTTP after {ready_after:.2f}s")
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
    assert "Server Shut Down." in edge.log()


async def _eq(check: Any, expected: set[str]) -> bool:
    """Await ``check`` and compare it with ``expected``."""
    return bool(await check == expected)
