"""The Edge's and the Node's work for one desired set, in process (no sockets, no engines).

An Edge with ``--nodes`` nodes (default 1,000), each running ``--per-node``
instances (default 10: 10,000 in all) on a Node of its own: each node's
peer is the Node's real :class:`~twisted_iop.node.deployments.instances.NodeInstances`
(its checker, allocation, rendering and plan) over a supervisor stand-in
whose engines are ready at once. It measures, for the whole set:

* the first apply (every instance checked, placed and started);
* the same set again (the converge-never-churn path: must restart nothing);
* one parameter changed on every instance (each restarted once);

each next to the reference: parsing the same ``EdgeDeploymentsRequest``
from its bytes (what the wire costs anyway). CPU seconds, one run each;
settings printed beside the figures. ``.venv/bin/python bench/deployments_edge_node.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from twisted_iop.deployments.spec import spec_hash
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.node.config import NodeProviderConfig, parse_node_config
from twisted_iop.node.deployments.instances import NodeInstances
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.testing.harness import MOCK_PROVIDER
from twisted_iop.wire import control_pb2 as pb


class ReadyEngines:
    """A supervisor stand-in: every provider handed to it is ready; restarts are counted."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        #: Restarted engines whose new process has not been seen starting yet.
        self.starting: set[str] = set()
        self.restarts = 0

    def state(self, provider_id: str) -> Optional[EngineState]:
        """Starting once restarted, until seen; else ready if it was handed over."""
        if provider_id in self.starting:
            return EngineState.STARTING
        return EngineState.READY if provider_id in self.ready else None

    def report(self, provider_id: str) -> Optional[pb.EngineLaunch]:
        """No reason."""
        return pb.EngineLaunch() if provider_id in self.ready else None

    def restart(self, provider_id: str, reason: str, drain_seconds: float = 0.0) -> None:
        """Count it; its new engine starts."""
        self.restarts += 1
        self.starting.add(provider_id)

    def configure(self, providers: tuple[NodeProviderConfig, ...]) -> None:
        """The providers now."""
        self.ready = {p.provider_id for p in providers}


class LocalNode:
    """A NodePeer whose answers come from a real NodeInstances."""

    def __init__(self, node_id: str, ports: int) -> None:
        profile = {
            "name": "mock",
            "kind": "openai",
            "launch": {"command": [MOCK_PROVIDER, "--listen", "tcp:{port}", "--models", "{model}", "{tps}"]},
            "ports": [20000, 20000 + ports - 1],
            "parameters": {"tps": {"type": "int", "min": 1, "max": 1000, "default": 50}},
        }
        config = parse_node_config(
            {"node_id": node_id, "engines": [profile]}, {"PATH": str(Path(MOCK_PROVIDER).parent)}
        )
        self.engines = ReadyEngines()
        self.node_instances = NodeInstances(config, Clock(), self.engines, self.engines.configure)

    def close(self) -> None:
        """Unused."""

    def supersede(self) -> None:
        """Unused."""

    def probe(self, timeout: float) -> Deferred[pb.NodeProbeResponse]:
        """Unused."""
        return Deferred()

    def provider_command(self, request: Any, timeout: float) -> Deferred[pb.NodeProviderCommandResponse]:
        """Unused."""
        return Deferred()

    def instances_request(self, request: pb.NodeInstancesRequest) -> pb.NodeInstancesResponse:
        """Converge and answer, as the Node does (a restarted engine is seen starting, then ready)."""
        statuses = self.node_instances.converge(request.instances)
        if self.engines.starting:
            for provider_id in sorted(self.engines.starting):
                self.node_instances.engine_changed(provider_id)
            self.engines.starting.clear()
            for provider_id in sorted(self.engines.ready):
                self.node_instances.engine_changed(provider_id)
            statuses = self.node_instances.statuses()
        return pb.NodeInstancesResponse(instances=statuses, profiles=self.node_instances.profile_specs())

    def instances(self, request: pb.NodeInstancesRequest, timeout: float) -> Deferred[pb.NodeInstancesResponse]:
        """The Node's answer, at once."""
        return succeed(self.instances_request(request))


def desired_set(nodes: int, per_node: int, tps: int, version: int) -> pb.EdgeDeploymentsRequest:
    """Every node runs ``per_node`` instances of deployment ``chat``."""
    request = pb.EdgeDeploymentsRequest(version=version)
    for n in range(nodes):
        for i in range(per_node):
            parameters = {"tps": str(tps)}
            request.instances.add(
                instance_id=f"chat-{i}",
                deployment="chat",
                generation=version,
                node_id=f"node-{n}",
                profile="mock",
                model="m1",
                parameters=parameters,
                capacity=4,
                spec_hash=spec_hash("mock", "m1", parameters, 4),
            )
    return request


def cpu(run: Any) -> float:
    """CPU seconds ``run()`` took."""
    start = time.process_time()
    run()
    return time.process_time() - start


def main(argv: list[str]) -> int:
    """Run the three phases and print their figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--per-node", type=int, default=10)
    options = parser.parse_args(argv)
    clock = Clock()
    config = parse_edge_config(
        {"control_plane": {"edge_id": "edge-a"}, "nodes": [{"node_id": f"node-{n}"} for n in range(options.nodes)]},
        {},
    )
    registry = NodeRegistry(config, clock)
    deployments = EdgeDeployments(registry, clock)
    nodes = {}
    for n in range(options.nodes):
        node = nodes[f"node-{n}"] = LocalNode(f"node-{n}", options.per_node)
        hello = pb.NodeHelloRequest(node_id=f"node-{n}", profiles=node.node_instances.profile_specs())
        token = registry.node_accepted(hello, node)
        registry.node_ready(token, [])
    total = options.nodes * options.per_node
    print(f"settings: {options.nodes} nodes x {options.per_node} instances = {total} instances, one edge, in process")
    phases = [("first apply", 100, 1), ("same set again", 100, 2), ("one parameter changed", 200, 3)]
    for name, tps, version in phases:
        request = desired_set(options.nodes, options.per_node, tps, version)
        data = request.SerializeToString()
        reference = cpu(lambda: pb.EdgeDeploymentsRequest.FromString(data))  # noqa: B023
        before = sum(n.engines.restarts for n in nodes.values())
        starts_before = sum(n.node_instances.starts for n in nodes.values())
        seconds = cpu(lambda: deployments.take(request))  # noqa: B023
        restarts = sum(n.engines.restarts for n in nodes.values()) - before
        starts = sum(n.node_instances.starts for n in nodes.values()) - starts_before
        ready = sum(1 for s in deployments.statuses() if s.state == pb.INSTANCE_STATE_READY)
        print(
            f"{name:>22}: {seconds * 1000:8.1f} ms CPU ({seconds / total * 1e6:6.1f} us/instance), "
            f"reference parse {reference * 1000:6.1f} ms ({len(data) / 1e6:.1f} MB); "
            f"starts {starts}, restarts {restarts}, ready {ready}/{total}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
