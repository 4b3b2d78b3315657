"""Command catalog: validation, effects, results and lifecycle events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from twisted.internet.task import Clock

from twisted_iop.edge.commands import CATALOG, CommandRunner, nodes_from_file
from twisted_iop.edge.config import load_edge_config
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_config, edge_mapping, healthy, node_hello
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb


def make(registry: NodeRegistry | None = None) -> tuple[NodeRegistry, CommandRunner, list[pb.EdgeEvent]]:
    """A registry with node-1 ready, a runner and the recorded events."""
    clock = Clock()
    registry = registry or NodeRegistry(edge_config(), clock)
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    events: list[pb.EdgeEvent] = []
    registry.relay.add_listener(events.append)
    return registry, CommandRunner(registry, clock), events


def run(runner: CommandRunner, name: str, target: str = "", **arguments: str) -> pb.EdgeCommandResponse:
    """Run a command synchronously (every command here completes at once)."""
    results: list[Any] = []
    request = pb.EdgeCommandRequest(command_id="c1", name=name, target=target, arguments=arguments, timeout_ms=5000)
    runner.run(request).addBoth(results.append)
    assert results, "command did not complete"
    assert isinstance(results[0], pb.EdgeCommandResponse), results[0]
    return results[0]


def test_catalog_lists_every_command() -> None:
    """The hello catalog names every command with its target kind."""
    _, runner, _ = make()
    specs = {spec.name: spec for spec in runner.catalog()}
    assert set(specs) == {
        "node.drain",
        "node.undrain",
        "node.disconnect",
        "providers.refresh",
        "edge.diagnostics",
        "provider.restart",
        "provider.stop",
        "provider.start",
        "provider.logs",
        "edge.hold",
        "edge.release",
    }
    assert specs["edge.hold"].target_kind == "edge"
    assert specs["node.drain"].target_kind == "node"
    assert [a.name for a in specs["node.drain"].arguments] == ["reason"]
    assert specs["provider.restart"].target_kind == "provider"
    assert [a.name for a in specs["provider.restart"].arguments] == ["drain", "drain_timeout_seconds", "reason"]
    assert len(CATALOG) == 11


@pytest.mark.parametrize(
    ("name", "target", "arguments", "reason"),
    [
        ("node.reboot", "node-1", {}, "unknown command 'node.reboot'"),
        ("node.drain", "", {}, "needs a target node id"),
        ("node.drain", "node-9", {}, "no node named 'node-9'"),
        ("node.drain", "node-1", {"force": "yes"}, "does not take argument 'force'"),
        ("node.disconnect", "node-2", {}, "has no connection"),
        ("edge.diagnostics", "edge-b", {}, "target must be empty or 'edge-a'"),
        ("providers.refresh", "", {"x": "1"}, "takes no arguments"),
    ],
)
def test_invalid_requests_are_rejected_without_events(
    name: str, target: str, arguments: dict[str, str], reason: str
) -> None:
    """Validation failures answer REJECTED with a clear reason and emit nothing."""
    _, runner, events = make()
    response = run(runner, name, target, **arguments)
    assert response.outcome == pb.COMMAND_OUTCOME_REJECTED
    assert reason in response.reason
    assert response.command_id == "c1"
    assert events == []


def test_drain_lifecycle_and_effect() -> None:
    """node.drain relays accepted/started/drained/succeeded and the snapshot shows it."""
    registry, runner, events = make()
    response = run(runner, "node.drain", "node-1", reason="maintenance")
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
    assert response.result["drained"] == "true" and response.result["changed"] == "true"
    assert [e.kind for e in events] == ["command.accepted", "command.started", "node.drained", "command.succeeded"]
    assert all(e.command_id == "c1" for e in events)
    snapshot = StatusProvider(registry, Clock()).snapshot()
    assert snapshot.nodes[0].drained
    assert snapshot.nodes[0].providers[0].status == pb.PROVIDER_STATUS_DRAINED
    assert run(runner, "node.undrain", "node-1").result["drained"] == "false"
    assert not StatusProvider(registry, Clock()).snapshot().nodes[0].drained


def test_disconnect_closes_connections() -> None:
    """node.disconnect closes the node's connections (owner and pending)."""
    clock = Clock()
    registry = NodeRegistry(edge_config(), clock)
    owner, pending = FakeNodePeer(), FakeNodePeer()
    token = registry.node_accepted(node_hello("node-1"), owner)
    registry.node_ready(token, healthy("mock-a"))
    registry.node_accepted(node_hello("node-1"), pending)
    runner = CommandRunner(registry, clock)
    response = run(runner, "node.disconnect", "node-1")
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
    assert response.result["closed_connections"] == "2"
    assert (owner.closed, pending.closed) == (1, 1)


def test_diagnostics_has_counts_and_no_secrets() -> None:
    """edge.diagnostics reports versions and counts, never credentials or addresses."""
    _, runner, _ = make()
    result = dict(run(runner, "edge.diagnostics").result)
    assert result["edge_id"] == "edge-a"
    assert result["nodes_configured"] == "2" and result["nodes_ready"] == "1"
    assert result["node_connections"] == "1"
    assert "software_version" in result and "uptime_seconds" in result
    text = repr(result)
    assert "s3cret" not in text and "127.0.0.1" not in text


def test_refresh_picks_up_added_provider(tmp_path: Path) -> None:
    """providers.refresh re-reads edge.yaml: an added provider appears, ready nodes are probed."""
    data = edge_mapping()
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    clock = Clock()
    registry = NodeRegistry(load_edge_config(str(path), environ={}), clock)
    peer = FakeNodePeer()
    token = registry.node_accepted(node_hello("node-1"), peer)
    registry.node_ready(token, healthy("mock-a"))
    data["nodes"][0]["providers"].append({"provider_id": "mock-c", "kind": "mock", "models": ["phi-3"], "capacity": 2})
    path.write_text(yaml.safe_dump(data))
    peer.answer = pb.NodeProbeResponse(health=healthy("mock-a", "mock-c"))
    runner = CommandRunner(registry, clock)
    response = run(runner, "providers.refresh")
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED, response.reason
    assert response.result["added"] == "node-1/mock-c"
    assert response.result["nodes_probed"] == "1"
    entry = StatusProvider(registry, clock).snapshot().nodes[0]
    by_id = {p.provider_id: p for p in entry.providers}
    assert by_id["mock-c"].capacity == 2
    assert by_id["mock-c"].health == pb.PROVIDER_HEALTH_HEALTHY
    assert registry.pool.try_acquire("phi-3") is not None


def test_refresh_with_broken_file_fails_and_keeps_providers(tmp_path: Path) -> None:
    """A refresh that cannot parse edge.yaml fails with the field and changes nothing."""
    data = edge_mapping()
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(data))
    clock = Clock()
    registry = NodeRegistry(load_edge_config(str(path), environ={}), clock)
    data["nodes"][0]["providers"][0]["capacity"] = "lots"
    path.write_text(yaml.safe_dump(data))
    events: list[pb.EdgeEvent] = []
    registry.relay.add_listener(events.append)
    response = run(CommandRunner(registry, clock), "providers.refresh")
    assert response.outcome == pb.COMMAND_OUTCOME_FAILED
    assert "nodes[0].providers[0].capacity" in response.reason
    assert [e.kind for e in events][-1] == "command.failed"
    assert registry.nodes()[0].providers[0].capacity == 4


def test_refresh_without_file_fails() -> None:
    """An edge built without a config file cannot refresh from disk."""
    clock = Clock()
    registry = NodeRegistry(edge_config(), clock)
    runner = CommandRunner(registry, clock, load_nodes=nodes_from_file(None))
    response = run(runner, "providers.refresh")
    assert response.outcome == pb.COMMAND_OUTCOME_FAILED
    assert "config file" in response.reason
