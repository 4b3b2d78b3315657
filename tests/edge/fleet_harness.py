"""Real-socket fleet pieces for integration tests: an Edge and Nodes in this
reactor, started through their taps from temporary YAML files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater

from twisted_iop.edge.tap import EdgeService
from twisted_iop.edge.tap import Options as EdgeOptions
from twisted_iop.edge.tap import makeService as make_edge
from twisted_iop.node.tap import NodeService
from twisted_iop.node.tap import Options as NodeOptions
from twisted_iop.node.tap import makeService as make_node
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, PeerSettings

FAST_BACKOFF = {"initial_seconds": 0.05, "max_seconds": 0.3}


def edge_yaml(cp_address: str, edge_id: str = "edge-a", outbox_size: int = 100) -> dict[str, Any]:
    """edge.yaml for two mock nodes, a free node port and fast reconnects."""
    return {
        "control_plane": {
            "address": cp_address,
            "edge_id": edge_id,
            "labels": {"site": "test"},
            "backoff": FAST_BACKOFF,
            "outbox_size": outbox_size,
        },
        "node_server": {"listen": "tcp:0:interface=127.0.0.1", "probe_timeout_seconds": 2},
        "inference": {"listen": "tcp:0:interface=127.0.0.1"},
        "nodes": [
            {
                "node_id": "node-1",
                "providers": [
                    {
                        "provider_id": "mock-a",
                        "kind": "mock",
                        "models": ["llama-3-8b"],
                        "capacity": 4,
                        "long_context_capacity": 1,
                    }
                ],
            },
            {
                "node_id": "node-2",
                "credential": "n2-secret",
                "providers": [
                    {
                        "provider_id": "mock-b",
                        "kind": "mock",
                        "models": ["llama-3-8b", "qwen-2-7b"],
                        "capacity": 8,
                        "long_context_capacity": 2,
                    }
                ],
            },
        ],
    }


def node_yaml(node_id: str, edge_port: int, providers: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """node.yaml for one of the :func:`edge_yaml` nodes."""
    default = {
        "node-1": [{"provider_id": "mock-a", "kind": "mock", "models": ["llama-3-8b"]}],
        "node-2": [{"provider_id": "mock-b", "kind": "mock", "models": ["llama-3-8b", "qwen-2-7b"]}],
    }
    return {
        "node_id": node_id,
        "credential": "n2-secret" if node_id == "node-2" else "",
        "edge": {"address": f"127.0.0.1:{edge_port}", "backoff": FAST_BACKOFF},
        "probes": {"interval_seconds": 0.2, "timeout_seconds": 1},
        "providers": providers if providers is not None else default.get(node_id, []),
    }


def write_yaml(path: Path, data: dict[str, Any]) -> str:
    """Write ``data`` to ``path`` as YAML; return the path as a string."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


async def start_edge(config_path: str) -> EdgeService:
    """Start an Edge in this reactor from ``config_path``; wait for its node port."""
    options = EdgeOptions()
    options.parseOptions(["--config", config_path])
    service = make_edge(options, reactor=global_reactor)
    service.privilegedStartService()
    service.startService()
    await service.node_listening_port()
    return service


def start_node(config_path: str) -> NodeService:
    """Start a Node runtime in this reactor from ``config_path``."""
    options = NodeOptions()
    options.parseOptions(["--config", config_path])
    service = make_node(options, reactor=global_reactor)
    service.privilegedStartService()
    service.startService()
    return service


class RawNode(FramedPeerProtocol):
    """A hand-driven Node connection (for duplicate and rejected connections)."""

    def __init__(self) -> None:
        super().__init__(global_reactor, PeerSettings())
        self.lost: Deferred[None] = Deferred()
        self.errors: list[pb.Error] = []

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """Keep the error frames the Edge sends before closing."""
        if body == "error":
            self.errors.append(envelope.error)

    def peer_disconnected(self, reason: Any) -> None:
        """Fire ``lost``."""
        self.lost.callback(None)

    def hello(self, node_id: str, credential: str = "") -> Deferred[pb.NodeHelloResponse]:
        """Say hello; fire with the Edge's answer."""
        hello = pb.NodeHelloRequest(node_id=node_id, protocol_major=PROTOCOL_MAJOR, credential=credential)
        return self.request("node_hello_request", hello, timeout=5).addCallback(
            lambda envelope: envelope.node_hello_response
        )

    def ready(self, *provider_ids: str) -> None:
        """Send NodeReady with healthy providers."""
        reports = [pb.ProviderHealthReport(provider_id=p, health=pb.PROVIDER_HEALTH_HEALTHY) for p in provider_ids]
        self.send("node_ready", pb.NodeReady(providers=reports))


async def raw_node(port: int) -> RawNode:
    """Connect a :class:`RawNode` to an Edge's node port."""
    node = RawNode()
    await connectProtocol(TCP4ClientEndpoint(global_reactor, "127.0.0.1", port), node)
    return node


async def stop(*services: Any) -> None:
    """Stop services (ignoring ones already stopped) and let closes settle."""
    for service in services:
        if service is not None and service.running:
            await service.stopService()
    await deferLater(global_reactor, 0.01, lambda: None)
