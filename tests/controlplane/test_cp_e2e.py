"""End to end: ``twistd -n iop-control-plane`` started as a user would."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from twisted_iop.client.wire import ClientWireClient
from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV, LOOPBACK_ZERO
from twisted_iop.testing.harness import ControlPlaneHarness, Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import control_pb2 as pb


class ProcessHarness(ControlPlaneHarness):
    """HTTP helpers of the harness, pointed at a daemon's ports."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"


pytestmark = pytest.mark.e2e


@pytest_twisted.ensureDeferred
async def test_daemon_serves_edges_over_tcp_and_http(tmp_path: Path) -> None:
    """The real daemon enrolls a TCP edge, rejects a bad one, and shows them over HTTP."""
    daemon = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
    try:
        ports = await wait_for_ports(daemon, {"http", "edge_wire", "client_wire"})
        cp = ProcessHarness(ports)
        code, ready = await cp.get_json("/readyz")
        assert code == 200 and ready["ready"]
        bad, response = await connect_edge(ports["edge_wire"], "")
        assert response is not None and not response.accepted
        await bad.lost
        edge, response = await connect_edge(ports["edge_wire"], "edge-e2e")
        assert response is not None and response.accepted
        code, edges = await cp.get_json("/edges")
        assert [(e["edge_id"], e["connected"]) for e in edges["items"]] == [("edge-e2e", True)]
        code, status = await cp.get_json("/edges/edge-e2e/status")
        assert code == 200 and len(status["nodes"]) == 2
        code, op = await cp.post_json("/edges/edge-e2e/commands", {"name": "node.drain", "target": "node-1"})
        assert code == 200 and op["state"] == "succeeded"
        edge.tcp.loseConnection()
        await eventually(lambda: _disconnected(cp), message="edge shown disconnected")
        log = daemon.log()
        assert "edge edge-e2e connected" in log and "edge hello rejected" in log
        assert "edge edge-e2e disconnected" in log
    finally:
        daemon.stop()
    log = daemon.log()
    assert "Server Shut Down." in log
    assert "object at 0x" not in log
    for label in ("http", "edge_wire", "client_wire"):
        assert f"{label} listening on {LOOPBACK_ZERO} (port {ports[label]})" in log


@pytest_twisted.ensureDeferred
async def test_client_wire_on_the_http_port(tmp_path: Path) -> None:
    """A client says hello and gets live events at /client on the HTTP port (one port behind a proxy)."""
    daemon = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
    client = None
    try:
        ports = await wait_for_ports(daemon, {"http", "edge_wire", "client_wire"})
        edge, response = await connect_edge(ports["edge_wire"], "edge-proxy")
        assert response is not None and response.accepted
        client = ClientWireClient(f"ws://127.0.0.1:{ports['http']}/client", reactor=reactor)
        hello = await client.hello()
        assert hello.accepted and "events.subscribe" in hello.features
        events: list[pb.FleetEvent] = []
        await client.subscribe("edge-proxy", on_event=events.append)
        edge.event("node.ready", node_id="node-1")
        await eventually(lambda: [e.kind for e in events] == ["node.ready"], message="the relayed event")
        assert events[0].edge_id == "edge-proxy"
        code, ready = await ProcessHarness(ports).get_json("/readyz")
        assert code == 200 and ready["ready"]
        edge.tcp.loseConnection()
    finally:
        if client is not None:
            await client.close()
        daemon.stop()


async def _disconnected(cp: ProcessHarness) -> bool:
    _code, body = await cp.get_json("/edges/edge-e2e")
    return body["connected"] is False


def test_bad_config_fails_startup_with_clear_message(tmp_path: Path) -> None:
    """A bad config file stops start-up with the field named and a non-zero exit."""
    config = tmp_path / "cp.yaml"
    config.write_text("edge_wire:\n  max_frame_bytes: lots\n")
    daemon = start_daemon(
        ["iop-control-plane", "--config", str(config)], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="bad"
    )
    assert daemon.process.wait(30) != 0
    assert "edge_wire.max_frame_bytes: must be a whole number" in daemon.log()


def test_unbindable_port_fails_startup(tmp_path: Path) -> None:
    """A port already in use fails start-up with one clear line and exit code 1."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = dict(CONTROL_PLANE_LOOPBACK_ENV, IOP_HTTP_LISTEN=f"tcp:{port}:interface=127.0.0.1")
        daemon: Daemon = start_daemon(["iop-control-plane"], tmp_path, env=env, name="busy")
        assert daemon.process.wait(30) == 1
    log = daemon.log()
    assert f"cannot listen for http on tcp:{port}:interface=127.0.0.1" in log
    assert "Traceback" not in log
