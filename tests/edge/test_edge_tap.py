"""Wiring of ``twistd iop-edge`` / ``iop-node`` without sockets (MemoryReactor)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import pytest_twisted
import yaml
from twisted.internet.testing import MemoryReactorClock

from twisted_iop.daemon import ConfigurationExit
from twisted_iop.edge.tap import Options, makeService
from twisted_iop.node.tap import Options as NodeOptions
from twisted_iop.node.tap import makeService as make_node_service
from twisted_iop.testing.configs import edge_mapping, edge_yaml, write_yaml
from twisted_iop.testing.harness import start_daemon, start_edge, stop
from twisted_iop.testing.wires.peers import raw_node
from twisted_iop.wire import control_pb2 as pb


def test_make_service_listens_and_dials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Edge listens for nodes, inference clients and scrapes (metrics on its default port) and dials the Control Plane."""
    monkeypatch.delenv("IOP_EDGE_METRICS_LISTEN", raising=False)
    monkeypatch.delenv("IOP_EDGE_INFERENCE_LISTEN", raising=False)
    data = edge_mapping(address="127.0.0.1:7999")
    data["node_server"]["listen"] = "tcp:7555:interface=127.0.0.1"
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    options = Options()
    options.parseOptions(["--config", str(path)])
    reactor = MemoryReactorClock()
    service = makeService(options, reactor=reactor)
    assert [s.name for s in service] == ["registry", "node_server", "inference", "metrics", "control-plane"]
    assert service.tune_gc  # a long-lived daemon's collector is tuned as it starts
    service.privilegedStartService()
    service.startService()
    assert [(port, interface) for port, _, _, interface in reactor.tcpServers] == [
        (7555, "127.0.0.1"),
        (8090, "127.0.0.1"),
        (9101, "127.0.0.1"),
    ]
    assert [(host, port) for host, port, *_ in reactor.tcpClients] == [("127.0.0.1", 7999)]
    assert service.node_port == 7555
    service.stopService()


def test_bad_edge_config_ends_option_parsing(tmp_path: Path) -> None:
    """A bad edge.yaml ends option parsing with one line naming the file and the field."""
    data = edge_mapping()
    data["nodes"][0]["providers"][0]["kind"] = "triton"
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigurationExit, match=rf"^iop-edge: {path}: nodes\[0\].providers\[0\].kind: "):
        Options().parseOptions(["--config", str(path)])
    with pytest.raises(ConfigurationExit, match=r"^iop-edge: --config PATH is required"):
        Options().parseOptions([])


def test_bad_dial_address_is_a_config_error(tmp_path: Path) -> None:
    """A control_plane.address Twisted cannot use is a config error, not a traceback in makeService."""
    data = edge_mapping(address="tcp:host=127.0.0.1:port=http")
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigurationExit, match=r"control_plane.address: cannot use .*port must be a number"):
        Options().parseOptions(["--config", str(path)])
    data = edge_mapping(address=f"tls:127.0.0.1:7443:trustRoots={tmp_path}/missing")
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigurationExit, match=r"control_plane.address: cannot use 'tls:"):
        Options().parseOptions(["--config", str(path)])


def test_node_make_service_dials_edge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Node runtime dials its Edge's address, serves metrics on its default port, and starts its probe loop."""
    monkeypatch.delenv("IOP_NODE_METRICS_LISTEN", raising=False)
    path = tmp_path / "node.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "node_id": "node-1",
                "edge": {"address": "127.0.0.1:7556"},
                "providers": [{"provider_id": "m", "kind": "mock", "models": ["x"]}],
            }
        )
    )
    options = NodeOptions()
    options.parseOptions(["--config", str(path)])
    reactor = MemoryReactorClock()
    service = make_node_service(options, reactor=reactor)
    assert [s.name for s in service] == ["runtime", "engines", "metrics", "edge-link"]
    assert service.tune_gc
    service.privilegedStartService()
    service.startService()
    assert [(port, interface) for port, _, _, interface in reactor.tcpServers] == [(9102, "127.0.0.1")]
    assert [(host, port) for host, port, *_ in reactor.tcpClients] == [("127.0.0.1", 7556)]
    service.stopService()


def test_metrics_listen_empty_disables_the_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`metrics: {listen: ""}` builds an Edge and a Node without a metrics listener."""
    monkeypatch.delenv("IOP_EDGE_METRICS_LISTEN", raising=False)
    monkeypatch.delenv("IOP_NODE_METRICS_LISTEN", raising=False)
    data = edge_mapping(address="127.0.0.1:7999")
    data["metrics"] = {"listen": ""}
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    options = Options()
    options.parseOptions(["--config", str(path)])
    edge = makeService(options, reactor=MemoryReactorClock())
    assert "metrics" not in [s.name for s in edge]
    assert edge.metrics_server is None
    node_path = tmp_path / "node.yaml"
    node_path.write_text(
        yaml.safe_dump(
            {
                "node_id": "node-1",
                "metrics": {"listen": ""},
                "providers": [{"provider_id": "m", "kind": "mock", "models": ["x"]}],
            }
        )
    )
    node_options = NodeOptions()
    node_options.parseOptions(["--config", str(node_path)])
    node = make_node_service(node_options, reactor=MemoryReactorClock())
    assert [s.name for s in node] == ["runtime", "engines", "edge-link"]


def test_busy_node_port_fails_startup_cleanly(tmp_path: Path) -> None:
    """`twistd -n iop-edge` with its Node port taken exits 1 with one clear line, no traceback."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        data = edge_mapping(address="127.0.0.1:1")
        data["node_server"]["listen"] = f"tcp:{port}:interface=127.0.0.1"
        path = tmp_path / "edge.yaml"
        path.write_text(yaml.safe_dump(data))
        daemon = start_daemon(["iop-edge", "--config", str(path)], tmp_path, name="edge")
        assert daemon.process.wait(30) == 1
    log = daemon.log()
    assert f"iop-edge: cannot listen for node_server on tcp:{port}:interface=127.0.0.1" in log
    assert "Traceback" not in log


@pytest_twisted.ensureDeferred
async def test_stopping_the_edge_closes_node_connections(tmp_path: Path) -> None:
    """Stopping the Edge closes its Node connections with SHUTTING_DOWN, so Nodes keep their normal backoff."""
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_yaml("127.0.0.1:1")))
    node = await raw_node(edge.node_port)
    assert (await node.hello("node-1")).accepted
    await stop(edge)
    await node.lost
    assert [e.code for e in node.errors] == [pb.ERROR_CODE_SHUTTING_DOWN]
