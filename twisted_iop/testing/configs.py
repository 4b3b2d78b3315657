"""Configurations for tests: edge.yaml and node.yaml mappings for a small
fleet, the hellos that match them, and loopback listeners on free ports.

The fleet every builder describes: Edge ``edge-a`` with ``node-1`` (provider
``mock-a``, model ``llama-3-8b``) and ``node-2`` (a credential; provider
``mock-b``, models ``llama-3-8b`` and ``qwen-2-7b``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Optional

import yaml

from twisted_iop.edge.config import EdgeConfig, parse_edge_config
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb

#: A TCP listener on a free loopback port.
LOOPBACK_ZERO = "tcp:0:interface=127.0.0.1"

#: Environment that puts every Control Plane daemon listener on a free loopback port.
CONTROL_PLANE_LOOPBACK_ENV = {
    "IOP_HTTP_LISTEN": LOOPBACK_ZERO,
    "IOP_WIRE_LISTEN": LOOPBACK_ZERO,
    "IOP_EDGE_WIRE_LISTEN": LOOPBACK_ZERO,
}

#: Reconnect backoff short enough for tests.
FAST_BACKOFF = {"initial_seconds": 0.05, "max_seconds": 0.3}

#: The model the inference gateway configs serve.
MODEL = "llama-3-8b"
#: The grace period of the gateway daemons the tests start: a stop with work
#: in flight ends it after this long (tests that stop mid-stream wait for it).
TEST_GRACE = {"grace_seconds": 1}

#: The credential of ``node-2`` in :func:`edge_yaml` and :func:`node_yaml`.
NODE_2_CREDENTIAL = "n2-secret"


def loopback_listen(port: int = 0) -> str:
    """A TCP listener on ``port`` of 127.0.0.1 (0: a free one)."""
    return f"tcp:{port}:interface=127.0.0.1"


#: edge.yaml entries of the two mock providers the test fleets configure.
_MOCK_PROVIDERS: dict[str, dict[str, Any]] = {
    "mock-a": {
        "provider_id": "mock-a",
        "kind": "mock",
        "models": ["llama-3-8b"],
        "capacity": 4,
        "long_context_capacity": 1,
    },
    "mock-b": {
        "provider_id": "mock-b",
        "kind": "mock",
        "models": ["llama-3-8b", "qwen-2-7b"],
        "capacity": 8,
        "long_context_capacity": 2,
    },
}


def mock_provider_entry(provider_id: str) -> dict[str, Any]:
    """A fresh edge.yaml entry for ``mock-a`` (llama-3-8b, capacity 4) or ``mock-b``
    (llama-3-8b and qwen-2-7b, capacity 8)."""
    return copy.deepcopy(_MOCK_PROVIDERS[provider_id])


def edge_mapping(**control_plane: Any) -> dict[str, Any]:
    """A valid edge.yaml mapping with two nodes (one with a credential), for unit tests.

    ``control_plane`` overrides keys of the ``control_plane`` section.
    """
    cp = {"address": "127.0.0.1:7443", "edge_id": "edge-a", "labels": {"site": "lab"}}
    cp.update(control_plane)
    return {
        "control_plane": cp,
        "node_server": {"listen": LOOPBACK_ZERO},
        "nodes": [
            {
                "node_id": "node-1",
                "labels": {"rack": "r1"},
                "providers": [mock_provider_entry("mock-a")],
            },
            {
                "node_id": "node-2",
                "credential": "s3cret",
                "providers": [mock_provider_entry("mock-b")],
            },
        ],
    }


def edge_config(**control_plane: Any) -> EdgeConfig:
    """The :func:`edge_mapping` config, parsed."""
    return parse_edge_config(edge_mapping(**control_plane), {})


def edge_yaml(cp_address: str, edge_id: str = "edge-a", outbox_size: int = 100) -> dict[str, Any]:
    """edge.yaml for a running fleet: :func:`edge_mapping`'s nodes, free node,
    inference and metrics ports, fast reconnects to the Control Plane at ``cp_address``."""
    mapping = edge_mapping(
        address=cp_address,
        edge_id=edge_id,
        labels={"site": "test"},
        backoff=FAST_BACKOFF,
        outbox_size=outbox_size,
    )
    mapping["node_server"]["probe_timeout_seconds"] = 2
    mapping["inference"] = {"listen": LOOPBACK_ZERO}
    mapping["metrics"] = {"listen": LOOPBACK_ZERO}
    del mapping["nodes"][0]["labels"]
    mapping["nodes"][1]["credential"] = NODE_2_CREDENTIAL
    return mapping


def node_yaml(node_id: str, edge_port: int, providers: Optional[list[dict[str, Any]]] = None) -> dict[str, Any]:
    """node.yaml for one of the :func:`edge_yaml` nodes."""
    default = {
        "node-1": [{"provider_id": "mock-a", "kind": "mock", "models": ["llama-3-8b"]}],
        "node-2": [{"provider_id": "mock-b", "kind": "mock", "models": ["llama-3-8b", "qwen-2-7b"]}],
    }
    return {
        "node_id": node_id,
        "credential": NODE_2_CREDENTIAL if node_id == "node-2" else "",
        "edge": {"address": f"127.0.0.1:{edge_port}", "backoff": FAST_BACKOFF},
        "probes": {"interval_seconds": 0.2, "timeout_seconds": 1},
        "providers": providers if providers is not None else default.get(node_id, []),
    }


def write_yaml(path: Path, data: dict[str, Any]) -> str:
    """Write ``data`` to ``path`` as YAML; return the path as a string."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def node_hello(node_id: str = "node-1", credential: str = "", major: int = PROTOCOL_MAJOR) -> pb.NodeHelloRequest:
    """A Node hello announcing the providers :func:`edge_mapping` configures."""
    providers = {
        "node-1": [pb.NodeProviderSpec(provider_id="mock-a", kind="mock", models=["llama-3-8b"])],
        "node-2": [pb.NodeProviderSpec(provider_id="mock-b", kind="mock", models=["llama-3-8b", "qwen-2-7b"])],
    }.get(node_id, [])
    return pb.NodeHelloRequest(
        node_id=node_id, protocol_major=major, protocol_minor=0, credential=credential, providers=providers
    )


def healthy(*provider_ids: str) -> list[pb.ProviderHealthReport]:
    """Healthy reports for ``provider_ids``."""
    return [pb.ProviderHealthReport(provider_id=p, health=pb.PROVIDER_HEALTH_HEALTHY) for p in provider_ids]


# -- the inference gateway -----------------------------------------------------------


def gateway_edge_yaml(
    cp_address: str = "127.0.0.1:1",
    inference: Optional[dict[str, Any]] = None,
    capacity: int = 2,
    long_context_capacity: int = 1,
    second_node: bool = True,
) -> dict[str, Any]:
    """edge.yaml with one or two Nodes serving :data:`MODEL` and an inference listener on a free port."""
    nodes: list[dict[str, Any]] = [
        {
            "node_id": "node-1",
            "providers": [
                {
                    "provider_id": "p1",
                    "kind": "mock",
                    "models": [MODEL],
                    "capacity": capacity,
                    "long_context_capacity": long_context_capacity,
                }
            ],
        }
    ]
    if second_node:
        nodes.append(
            {
                "node_id": "node-2",
                "providers": [{"provider_id": "p2", "kind": "mock", "models": [MODEL], "capacity": capacity}],
            }
        )
    section = {"listen": LOOPBACK_ZERO}
    section.update(inference or {})
    return {
        "control_plane": {"address": cp_address, "edge_id": "edge-a", "backoff": FAST_BACKOFF},
        "node_server": {"listen": LOOPBACK_ZERO, "probe_timeout_seconds": 2},
        "inference": section,
        "nodes": nodes,
        "shutdown": TEST_GRACE,
    }


def gateway_node_yaml(
    node_id: str, edge_port: int, provider: dict[str, Any], keepalive: Optional[dict[str, float]] = None
) -> dict[str, Any]:
    """node.yaml for one Node with one provider."""
    edge: dict[str, Any] = {"address": f"127.0.0.1:{edge_port}", "backoff": FAST_BACKOFF}
    if keepalive:
        edge["keepalive"] = keepalive
    return {
        "node_id": node_id,
        "edge": edge,
        "probes": {"interval_seconds": 0.2, "timeout_seconds": 1},
        "providers": [provider],
        "shutdown": TEST_GRACE,
    }


def mock_provider(provider_id: str, **mock: Any) -> dict[str, Any]:
    """A node.yaml mock provider entry with inference options."""
    return {"provider_id": provider_id, "kind": "mock", "models": [MODEL], "mock": mock}
