"""Node runtime + its Edge link against the real Edge node protocol, over iosim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from twisted.internet.task import Clock
from twisted.test import iosim

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.nodes.wire import NodeServerFactory, NodeServerProtocol
from twisted_iop.node.config import load_node_config, parse_node_config
from twisted_iop.node.edge_link import EdgeLink, EdgeLinkProtocol
from twisted_iop.node.runtime import NodeRuntime
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.settings import PeerSettings

EDGE = {
    "control_plane": {"edge_id": "edge-a"},
    "nodes": [
        {
            "node_id": "node-1",
            "credential": "k1",
            "providers": [
                {"provider_id": "mock-a", "kind": "mock", "models": ["m"], "capacity": 2},
                {"provider_id": "mock-b", "kind": "mock", "models": ["m"], "capacity": 1},
            ],
        }
    ],
}


def node_mapping(health_file: str = "", **extra: Any) -> dict[str, Any]:
    """node.yaml for node-1 with two mock providers (mock-b follows ``health_file``)."""
    mock_b: dict[str, Any] = {"provider_id": "mock-b", "kind": "mock", "models": ["m"]}
    if health_file:
        mock_b["mock"] = {"health_file": health_file}
    data: dict[str, Any] = {
        "node_id": "node-1",
        "credential": "k1",
        "probes": {"interval_seconds": 5, "timeout_seconds": 1},
        "providers": [{"provider_id": "mock-a", "kind": "mock", "models": ["m"]}, mock_b],
    }
    data.update(extra)
    return data


class Pair:
    """A Node runtime and an Edge registry on one clock, connected by iosim."""

    def __init__(self, node_config: Any) -> None:
        self.clock = Clock()
        self.registry = NodeRegistry(parse_edge_config(EDGE), self.clock)
        self.events: list[pb.EdgeEvent] = []
        self.registry.relay.add_listener(self.events.append)
        self.edge_factory = NodeServerFactory(self.registry, self.clock, PeerSettings())
        self.runtime = NodeRuntime(node_config, self.clock)
        self.link = EdgeLink(node_config, self.runtime, self.clock, rand=lambda: 1.0)

    def connect(self) -> tuple[NodeServerProtocol, EdgeLinkProtocol, iosim.IOPump]:
        """Open one Node connection, say hello as the dialling service would, and exchange everything."""
        server = self.edge_factory.buildProtocol(None)
        client = self.link.factory().buildProtocol(None)
        assert isinstance(server, NodeServerProtocol) and isinstance(client, EdgeLinkProtocol)
        pump = iosim.connect(server, iosim.makeFakeServer(server), client, iosim.makeFakeClient(client))
        self.hello = self.link.prepare_connection(client)
        self.hello.addErrback(lambda _: None)  # a refused hello is what some tests check
        pump.flush()
        return server, client, pump


def test_node_becomes_ready_with_health() -> None:
    """Hello, first probes and NodeReady make the node dispatch-ready at the Edge."""
    pair = Pair(parse_node_config(node_mapping()))
    _, client, _ = pair.connect()
    assert client.accepted and pair.runtime.ready_sent
    assert pair.registry.is_ready("node-1")
    health = pair.registry.providers.health("node-1", "mock-a")
    assert health is not None and health.health == pb.PROVIDER_HEALTH_HEALTHY
    assert [e.kind for e in pair.events] == ["node.pending", "node.ready"]


def test_wrong_credential_is_rejected_permanently() -> None:
    """A wrong credential: rejected, closed, retried only at the maximum delay; no event."""
    config = parse_node_config(node_mapping(credential="wrong", edge={"backoff": {"max_seconds": 40}}))
    pair = Pair(config)
    _, client, _pump = pair.connect()
    assert not client.accepted
    assert pair.link.permanent_rejection is not None and "bad_credential" in pair.link.permanent_rejection
    assert pair.link.retry_delay(1) == 40
    assert pair.events == []
    assert not pair.registry.is_ready("node-1")


def test_health_change_reported_by_periodic_probe(tmp_path: Path) -> None:
    """A provider going unhealthy is reported by the next periodic probe."""
    health_file = tmp_path / "b.health"
    pair = Pair(parse_node_config(node_mapping(str(health_file))))
    pair.runtime.startService()
    _, _, pump = pair.connect()
    health_file.write_text("unhealthy gpu fell off the bus")
    pair.clock.advance(5)
    pump.flush()
    changed = [e for e in pair.events if e.kind == "provider.health_changed"]
    assert [(e.provider_id, e.attributes["health"]) for e in changed] == [("mock-b", "unhealthy")]
    health = pair.registry.providers.health("node-1", "mock-b")
    assert health is not None and health.reason == "gpu fell off the bus"
    pair.runtime.stopService()


def test_provider_down_is_reprobed_with_backoff_and_reported_the_moment_it_is_back(tmp_path: Path) -> None:
    """A provider found down is re-probed at 0.5 s, 1 s, 2 s...; the Edge hears it is healthy at the re-probe."""
    health_file = tmp_path / "b.health"
    health_file.write_text("offline engine gone")
    pair = Pair(parse_node_config(node_mapping(str(health_file))))
    pair.runtime.startService()
    _, _, pump = pair.connect()
    assert pair.runtime.reprobes == {"mock-b": 0.5}
    pair.clock.advance(0.5)
    assert pair.runtime.reprobes == {"mock-b": 1.0}
    pair.clock.advance(1.0)
    assert pair.runtime.reprobes == {"mock-b": 2.0}
    pair.clock.advance(2.0)
    # Capped at the probe interval (5 s).
    assert pair.runtime.reprobes == {"mock-b": 4.0}
    pair.clock.advance(4.0)
    assert pair.runtime.reprobes == {"mock-b": 5.0}
    health_file.write_text("healthy")
    pair.clock.advance(5.0)
    pump.flush()
    health = pair.registry.providers.health("node-1", "mock-b")
    assert health is not None and health.health == pb.PROVIDER_HEALTH_HEALTHY
    assert pair.runtime.reprobes == {}
    health_file.write_text("offline again")
    pair.clock.advance(5.0)  # the periodic round finds it down: the backoff starts over
    assert pair.runtime.reprobes == {"mock-b": 0.5}
    health_file.write_text("healthy")
    pair.clock.advance(0.5)
    pump.flush()
    health = pair.registry.providers.health("node-1", "mock-b")
    assert health is not None and health.health == pb.PROVIDER_HEALTH_HEALTHY
    pair.runtime.stopService()
    assert pair.runtime.reprobes == {}


def test_probe_request_rereads_providers(tmp_path: Path) -> None:
    """NodeProbeRequest makes the Node re-read node.yaml's providers and answer with them."""
    path = tmp_path / "node.yaml"
    data = node_mapping()
    path.write_text(yaml.safe_dump(data))
    pair = Pair(load_node_config(str(path), environ={}))
    server, _, pump = pair.connect()
    data["providers"].append({"provider_id": "mock-c", "kind": "mock", "models": ["z"]})
    path.write_text(yaml.safe_dump(data))
    answers: list[pb.NodeProbeResponse] = []
    server.probe(2).addCallback(answers.append)
    pump.flush()
    [answer] = answers
    assert [p.provider_id for p in answer.providers] == ["mock-a", "mock-b", "mock-c"]
    assert {h.provider_id for h in answer.health} == {"mock-a", "mock-b", "mock-c"}


def test_base_url_never_sent_to_edge() -> None:
    """Hello and probe answers carry id, kind and models but never base_url."""
    config = parse_node_config(
        node_mapping(
            providers=[{"provider_id": "v", "kind": "vllm", "models": ["m"], "base_url": "http://secret-host:8000"}]
        )
    )
    runtime = NodeRuntime(config, Clock())
    link = EdgeLink(config, runtime, Clock())
    wire = link.hello().SerializeToString()
    assert b"secret-host" not in wire
    assert runtime.provider_specs()[0].provider_id == "v"


def test_reconnect_after_loss_reaches_ready_again() -> None:
    """After the connection drops the Edge shows the node gone; a new connection is ready again."""
    pair = Pair(parse_node_config(node_mapping()))
    server, client, _ = pair.connect()
    client.transport.loseConnection()  # type: ignore[union-attr]  # connected by now
    server.connectionLost()
    client.connectionLost()
    assert not pair.registry.is_ready("node-1")
    assert pair.runtime.session is None
    pair.connect()
    assert pair.registry.is_ready("node-1")
    assert [e.kind for e in pair.events] == [
        "node.pending",
        "node.ready",
        "node.disconnected",
        "node.pending",
        "node.ready",
    ]
