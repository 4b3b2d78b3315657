"""The Edge's side of launched engines: their state in admission, the snapshot and events,
and the provider.* commands (held, sent to the Node, answered)."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from twisted_iop.edge.commands import LOG_CHUNK_CHARACTERS, CommandRunner, log_chunks
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_mapping, node_hello
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb


def report(provider_id: str, state: int | None, reason: str = "", restarts: int = 0) -> pb.ProviderHealthReport:
    """A healthy report of ``provider_id``, with an engine state when ``state`` is given."""
    health = pb.PROVIDER_HEALTH_HEALTHY if state in (None, pb.ENGINE_STATE_READY) else pb.PROVIDER_HEALTH_OFFLINE
    out = pb.ProviderHealthReport(provider_id=provider_id, health=health)
    if state is not None:
        out.launch.CopyFrom(pb.EngineLaunch(state=state, reason=reason, restarts=restarts, since_ms=1_700_000_000_000))  # type: ignore[arg-type]  # the stubs want the enum type; the state is its int value
    return out


class Edge:
    """A registry with node-1 (provider mock-a) ready on a fake peer, a runner, the events."""

    def __init__(self, state: int | None = pb.ENGINE_STATE_READY, extra_provider: bool = False) -> None:
        mapping = edge_mapping()
        if extra_provider:
            mapping["nodes"][0]["providers"].append({"provider_id": "mock-z", "kind": "mock", "models": ["llama-3-8b"]})
        self.clock = Clock()
        self.registry = NodeRegistry(parse_edge_config(mapping), self.clock)
        self.peer = FakeNodePeer()
        self.token = self.registry.node_accepted(node_hello("node-1"), self.peer)
        self.registry.node_ready(self.token, [report("mock-a", state)])
        self.events: list[pb.EdgeEvent] = []
        self.registry.relay.add_listener(self.events.append)
        self.runner = CommandRunner(self.registry, self.clock)

    def takes_work(self) -> bool:
        """Whether mock-a may take a lease now."""
        return self.registry.provider_takes_work("node-1", "mock-a")

    def run(self, name: str, target: str = "node-1/mock-a", timeout_ms: int = 10_000, **arguments: str) -> list[Any]:
        """Start a command; the list gets its response when it ends."""
        results: list[Any] = []
        request = pb.EdgeCommandRequest(
            command_id="c1", name=name, target=target, arguments=arguments, timeout_ms=timeout_ms
        )
        self.runner.run(request).addBoth(results.append)
        return results

    def sent(self) -> tuple[pb.NodeProviderCommandRequest, Deferred[pb.NodeProviderCommandResponse]]:
        """The one provider command sent to the Node."""
        assert len(self.peer.provider_commands) == 1, self.peer.provider_commands
        return self.peer.provider_commands[0]


def test_launched_engine_takes_leases_only_while_ready() -> None:
    """A launched engine that is not ready takes no lease; an external provider (no launch) does."""
    edge = Edge(pb.ENGINE_STATE_READY)
    assert edge.takes_work()
    for state in (pb.ENGINE_STATE_LOADING, pb.ENGINE_STATE_DRAINING, pb.ENGINE_STATE_CRASHED, pb.ENGINE_STATE_FAILED):
        healthy = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
        healthy.launch.state = state
        edge.registry.node_health(edge.token, [healthy])
        assert not edge.takes_work(), state
    assert Edge(None).takes_work()


def test_engine_state_in_the_snapshot_and_events() -> None:
    """A crash reported by the Node is in the snapshot (state, reason, restarts) and relayed as
    provider.launch_changed; a repeat of the same state is not relayed again."""
    edge = Edge()
    edge.registry.node_health(edge.token, [report("mock-a", pb.ENGINE_STATE_CRASHED, "exited with code 1", 2)])
    edge.registry.node_health(edge.token, [report("mock-a", pb.ENGINE_STATE_CRASHED, "exited with code 1", 2)])
    launched = [e for e in edge.events if e.kind == "provider.launch_changed"]
    assert len(launched) == 1
    event = launched[0]
    assert (event.node_id, event.provider_id) == ("node-1", "mock-a")
    assert dict(event.attributes) == {
        "previous": "ready",
        "state": "crashed",
        "reason": "exited with code 1",
        "restarts": "2",
    }
    provider = StatusProvider(edge.registry, edge.clock).snapshot().nodes[0].providers[0]
    assert provider.HasField("launch")
    assert (provider.launch.state, provider.launch.reason, provider.launch.restarts) == (
        pb.ENGINE_STATE_CRASHED,
        "exited with code 1",
        2,
    )
    external = StatusProvider(Edge(None).registry, Clock()).snapshot().nodes[0].providers[0]
    assert not external.HasField("launch")


def test_unknown_engine_state_takes_no_work_and_says_what_came() -> None:
    """An engine state this Edge does not know (a newer Node's) is unknown: no leases, a reason."""
    edge = Edge()
    odd = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
    odd.launch.state = 42  # type: ignore[assignment]  # an unknown enum value, on purpose
    odd.launch.reason = "warming up"
    edge.registry.node_health(edge.token, [odd])
    assert not edge.takes_work()
    launch = edge.registry.providers.launch("node-1", "mock-a")
    assert launch is not None and launch.name == "unknown"
    assert launch.reason == "node reported unknown engine state 42: warming up"


@pytest.mark.parametrize(
    ("target", "arguments", "reason"),
    [
        ("", {}, "needs a target: node_id/provider_id"),
        ("node-9/x", {}, "no node named 'node-9'"),
        ("node-1/nope", {}, "no provider named 'nope' is configured on node 'node-1'"),
        ("node-2/mock-b", {}, "node 'node-2' is not connected"),
        ("node-1/mock-a", {"drain": "maybe"}, "drain must be true or false"),
        ("node-1/mock-a", {"drain_timeout_seconds": "-1"}, "drain_timeout_seconds must be a number from 0 to 3600"),
        ("node-1/mock-a", {"force": "yes"}, "does not take argument 'force'"),
    ],
)
def test_provider_commands_are_checked_before_anything_is_sent(
    target: str, arguments: dict[str, str], reason: str
) -> None:
    """A bad target or argument is REJECTED with the reason, nothing sent, no event."""
    edge = Edge()
    request = pb.EdgeCommandRequest(command_id="c1", name="provider.restart", target=target, arguments=arguments)
    results: list[Any] = []
    edge.runner.run(request).addBoth(results.append)
    (response,) = results
    assert response.outcome == pb.COMMAND_OUTCOME_REJECTED and reason in response.reason, response.reason
    assert edge.peer.provider_commands == [] and edge.events == []


def test_a_node_id_alone_names_its_only_provider() -> None:
    """``node-1`` targets its one provider; with two providers the target must name one."""
    edge = Edge()
    edge.run("provider.logs", "node-1")
    request, _ = edge.sent()
    assert request.provider_id == "mock-a" and request.action == pb.PROVIDER_ACTION_LOGS
    two = Edge(extra_provider=True)
    (response,) = two.run("provider.logs", "node-1")
    assert response.outcome == pb.COMMAND_OUTCOME_REJECTED
    assert "has 2 providers; name one as node-1/PROVIDER (mock-a, mock-z)" in response.reason


def test_restart_holds_the_provider_until_the_node_answers() -> None:
    """provider.restart: no new lease from the moment it is sent until the Node's answer;
    the request carries drain and the times; the result has the engine's state."""
    edge = Edge()
    results = edge.run("provider.restart", drain_timeout_seconds="3", timeout_ms=20_000)
    request, answer = edge.sent()
    assert (request.provider_id, request.action, request.drain) == ("mock-a", pb.PROVIDER_ACTION_RESTART, True)
    assert (request.drain_timeout_ms, request.timeout_ms) == (3000, 16_000)
    assert not edge.takes_work() and results == []
    assert edge.registry.providers.held("node-1", "mock-a") == "provider.restart c1"
    answer.callback(
        pb.NodeProviderCommandResponse(
            ok=True,
            reason="ready after 2.5s",
            launch=pb.EngineLaunch(state=pb.ENGINE_STATE_READY, restarts=0),
            drained_requests=3,
        )
    )
    (response,) = results
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
    assert dict(response.result) == {
        "node_id": "node-1",
        "provider_id": "mock-a",
        "state": "ready",
        "state_reason": "",
        "restarts": "0",
        "drained_requests": "3",
        "cut_requests": "0",
        "message": "ready after 2.5s",
    }
    assert edge.takes_work() and edge.registry.providers.held("node-1", "mock-a") is None
    kinds = [e.kind for e in edge.events]
    assert kinds == ["command.accepted", "command.started", "command.succeeded"]
    assert all(e.provider_id == "mock-a" and e.node_id == "node-1" for e in edge.events)


def test_a_refusal_or_a_lost_node_fails_the_command_and_releases_the_provider() -> None:
    """ok=false from the Node fails the command with its reason; an error does too; either way
    the provider is released."""
    edge = Edge()
    results = edge.run("provider.stop", drain="false")
    request, answer = edge.sent()
    assert not request.drain
    answer.callback(pb.NodeProviderCommandResponse(ok=False, reason="provider 'mock-a' has no engine launched"))
    assert results[0].outcome == pb.COMMAND_OUTCOME_FAILED
    assert results[0].reason == "provider 'mock-a' has no engine launched"
    assert edge.registry.providers.held("node-1", "mock-a") is None
    edge.peer.provider_commands.clear()
    results = edge.run("provider.restart")
    _, answer = edge.sent()
    answer.errback(ConnectionError("gone"))
    assert results[0].outcome == pb.COMMAND_OUTCOME_FAILED and "did not answer" in results[0].reason
    assert edge.takes_work()


def test_logs_come_back_in_ordered_chunks_within_the_result_bounds() -> None:
    """provider.logs: the text in log.000, log.001 ... each at most 1000 characters, cut at
    line ends, and nothing is held."""
    edge = Edge()
    results = edge.run("provider.logs", bytes="20000")
    request, answer = edge.sent()
    assert request.max_log_bytes == 20000 and edge.takes_work()
    text = "".join(f"line {i} " + "x" * 50 + "\n" for i in range(300))
    answer.callback(pb.NodeProviderCommandResponse(ok=True, log_text=text, log_lines=300))
    result = dict(results[0].result)
    chunks = [result[f"log.{i:03d}"] for i in range(int(result["log_chunks"]))]
    assert "".join(chunks) == text and result["log_lines"] == "300"
    assert all(len(c) <= LOG_CHUNK_CHARACTERS and c.endswith("\n") for c in chunks)
    assert len(result) <= 64


def test_log_chunks_cut_a_line_longer_than_a_chunk() -> None:
    """A line longer than a chunk is split across chunks; nothing is lost."""
    text = "short\n" + "y" * 2500 + "\nend\n"
    chunks = log_chunks(text, 3)
    joined = "".join(chunks[f"log.{i:03d}"] for i in range(int(chunks["log_chunks"])))
    assert joined == text
    assert max(len(v) for k, v in chunks.items() if k.startswith("log.")) <= LOG_CHUNK_CHARACTERS
