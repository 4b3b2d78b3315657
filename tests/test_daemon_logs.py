"""What the daemons log: lines a person can read, never Python object reprs."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import pytest_twisted

from twisted_iop.daemon import raise_open_file_limit
from twisted_iop.testing.configs import LOOPBACK_ZERO
from twisted_iop.testing.harness import eventually, start_daemon, wait_for_ports

ROOT = Path(__file__).resolve().parents[1]


CONFIGS = ROOT / "configs"

pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_edge_and_node_logs_name_addresses_not_objects(tmp_path: Path) -> None:
    """An Edge retrying an absent Control Plane and a Node enrolling with it log no ``object at 0x``.

    Twisted's own lines (factory start/stop, ClientService retries) used to
    print reprs; now the listener line gives label, endpoint and port and the
    retry line names the endpoint string.
    """
    edge = start_daemon(
        ["iop-edge", "--config", str(CONFIGS / "edge.yaml")],
        tmp_path,
        env={"IOP_CONTROL_PLANE_EDGE_WIRE": "127.0.0.1:1", "IOP_EDGE_NODE_LISTEN": LOOPBACK_ZERO},
        name="edge",
    )
    node = None
    try:
        ports = await wait_for_ports(edge, {"node_server"})
        node = start_daemon(
            ["iop-node", "--config", str(CONFIGS / "node.yaml")],
            tmp_path,
            env={"IOP_EDGE_NODE_WIRE": f"127.0.0.1:{ports['node_server']}"},
            name="node",
        )
        await eventually(lambda: "edge accepted node node-1" in node.log(), timeout=20, message="the node enrolled")
        await eventually(
            lambda: "Scheduling retry 2 to connect tcp:host=127.0.0.1:port=1 in" in edge.log(),
            timeout=20,
            message="the edge retrying the control plane",
        )
    finally:
        if node is not None:
            node.stop()
        edge.stop()
    edge_log, node_log = edge.log(), node.log() if node is not None else ""
    assert f"node_server listening on {LOOPBACK_ZERO} (port {ports['node_server']})" in edge_log
    assert "Server Shut Down." in edge_log and "Server Shut Down." in node_log
    for log in (edge_log, node_log):
        assert "object at 0x" not in log
        assert "Starting factory" not in log and "Stopping factory" not in log


def test_open_file_limit_is_raised_to_the_hard_limit() -> None:
    """raise_open_file_limit lifts a low soft limit up to the hard one and says so."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 64:
        pytest.fail(f"this test needs a finite hard limit of at least 64, not {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard - 1, hard))
    try:
        assert raise_open_file_limit() == (hard - 1, hard)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        # Already at the hard limit: nothing to do.
        assert raise_open_file_limit() == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
