"""A Node that runs its engine, behind a real Edge in this reactor: the engine's state reaches
the Edge at once, admission follows it, and provider.restart with a drain under load fails
no request.

The engine is ``iop-mock-provider`` launched by the Node on a free loopback port, paced so
that requests overlap the restart.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import attrs
import pytest_twisted
from prometheus_client import generate_latest
from twisted.internet.defer import DeferredList, ensureDeferred

from twisted_iop.edge.tap import EdgeService
from twisted_iop.node.metrics import node_metric_registry
from twisted_iop.node.tap import NodeService
from twisted_iop.testing.configs import gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.launch import ChatLoad, alive, free_port, launched_mock
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.testing.http import chat, post
from twisted_iop.wire import control_pb2 as pb

#: Bound on the launched engine (a Python process) becoming ready on this machine.
READY_SECONDS = 30.0
#: The engine's pace: a request of MAX_TOKENS takes about 0.25 s.
TOKENS_PER_SECOND = 40
MAX_TOKENS = 10
CLIENTS = 6


@attrs.define
class LaunchFleet:
    """An Edge and one Node whose provider ``p1``'s engine the Node launches."""

    edge: EdgeService
    node: NodeService
    base: str

    def launch(self) -> Any:
        """What the Edge last heard of the engine."""
        return self.edge.registry.providers.launch("node-1", "p1")

    def state(self) -> str:
        """The engine's state as the Edge knows it."""
        launch = self.launch()
        return launch.name if launch is not None else "none"

    def pid(self) -> int:
        """The engine's pid, from its Node."""
        engine = self.node.engines.engines["p1"]
        assert engine.pid is not None
        return engine.pid

    async def command(self, name: str, timeout_ms: int = 30_000, **arguments: str) -> pb.EdgeCommandResponse:
        """Run a catalog command at the Edge as the Control Plane would send it."""
        request = pb.EdgeCommandRequest(
            command_id=f"c-{name}", name=name, target="node-1/p1", arguments=arguments, timeout_ms=timeout_ms
        )
        response: pb.EdgeCommandResponse = await self.edge.commands.run(request)
        return response


async def start_launch_fleet(tmp_path: Path, **launch: Any) -> LaunchFleet:
    """Start the Edge and the Node (its engine launched; ``launch`` overrides keys of its
    launch block); wait until the Edge sees it ready."""
    edge_config = gateway_edge_yaml(second_node=False, capacity=4, inference={"queue_timeout_seconds": 60})
    edge_config["nodes"][0]["providers"][0]["kind"] = "openai"
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
    await edge.inference_server.bound()
    provider = launched_mock("p1", free_port(), args=("--tokens-per-second", str(TOKENS_PER_SECOND)), **launch)
    config = gateway_node_yaml("node-1", edge.node_port, provider)
    config["state_directory"] = str(tmp_path / "state")
    node = start_node(write_yaml(tmp_path / "node.yaml", config))
    fleet = LaunchFleet(edge, node, f"http://127.0.0.1:{edge.inference_port}")
    await eventually(lambda: fleet.state() == "ready", timeout=READY_SECONDS, message="the engine ready at the Edge")
    return fleet


@pytest_twisted.ensureDeferred
async def test_restart_with_drain_under_load_fails_no_request(tmp_path: Path) -> None:
    """provider.restart (drain by default) while 6 clients keep asking: the engine drains,
    restarts (a new pid) and is ready again; the Edge held it meanwhile; every request
    ended with a whole answer."""
    fleet = await start_launch_fleet(tmp_path)
    load = ChatLoad(fleet.base, max_tokens=MAX_TOKENS)
    clients = [ensureDeferred(load.client(i)) for i in range(CLIENTS)]
    try:
        await eventually(lambda: len(load.outcomes) >= 10, timeout=20, message="the load running")
        before = fleet.pid()
        seen: list[str] = []
        fleet.edge.registry.relay.add_listener(
            lambda e: seen.append(e.attributes["state"]) if e.kind == "provider.launch_changed" else None
        )
        response = await fleet.command("provider.restart")
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED, response.reason
        result = dict(response.result)
        assert result["state"] == "ready" and result["cut_requests"] == "0"
        assert int(result["drained_requests"]) >= 1, result
        assert seen[0] == "draining" and seen[-1] == "ready" and "stopping" in seen and "starting" in seen
        after = fleet.pid()
        assert after != before and not alive(before)
        served_before = len(load.outcomes)
        await eventually(lambda: len(load.outcomes) >= served_before + 10, timeout=20, message="served again")
    finally:
        load.running = False
        await DeferredList(clients)
        await stop(fleet.node, fleet.edge)
    assert load.failures() == [], load.failures()[:5]
    assert len(load.outcomes) >= 20


@pytest_twisted.ensureDeferred
async def test_kill_9_is_seen_at_the_edge_and_requests_wait_for_the_restart(tmp_path: Path) -> None:
    """kill -9 of the engine: the Edge hears crashed (reason, one restart; the Node's metrics
    count the crash) and leases nothing until the Node restarted it; a request asked meanwhile
    is answered once it is ready."""
    fleet = await start_launch_fleet(tmp_path)
    try:
        before = fleet.pid()
        os.kill(before, signal.SIGKILL)
        await eventually(lambda: fleet.state() == "crashed", timeout=10, message="crashed at the Edge")
        launch = fleet.launch()
        assert launch.reason == "killed by signal 9 (SIGKILL)" and launch.restarts == 1
        assert not fleet.edge.registry.provider_takes_work("node-1", "p1")
        snapshot = fleet.edge.status.snapshot().nodes[0].providers[0]
        assert snapshot.launch.state == pb.ENGINE_STATE_CRASHED and snapshot.launch.next_try_at_ms > 0
        metrics = generate_latest(node_metric_registry(fleet.node)).decode()
        assert 'iop_node_engine_state{provider="p1",state="crashed"} 1.0' in metrics
        assert 'iop_node_engine_crashes_total{provider="p1"} 1.0' in metrics
        assert 'iop_node_engine_restarts{provider="p1"} 1.0' in metrics
        assert snapshot.health == pb.PROVIDER_HEALTH_OFFLINE
        assert snapshot.health_reason == "engine crashed: killed by signal 9 (SIGKILL)"
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=2))
        assert answer.code == 200 and answer.json()["choices"][0]["message"]["content"] == "the quick"
        assert fleet.state() == "ready" and fleet.pid() != before
    finally:
        await stop(fleet.node, fleet.edge)


@pytest_twisted.ensureDeferred
async def test_stop_start_and_logs_through_the_edge(tmp_path: Path) -> None:
    """provider.stop leaves it stopped (no leases; with no other provider a request gets 503
    model_unavailable at once: a stopped engine is not coming back by itself), provider.start
    brings it back, provider.logs returns its last lines; the Node's stop ends the engine."""
    fleet = await start_launch_fleet(tmp_path)
    try:
        pid = fleet.pid()
        response = await fleet.command("provider.stop", drain="false")
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED, response.reason
        assert response.result["state"] == "stopped" and not alive(pid)
        await eventually(lambda: fleet.state() == "stopped", timeout=5, message="stopped at the Edge")
        assert not fleet.edge.registry.provider_takes_work("node-1", "p1")
        refused = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=2))
        assert refused.code == 503 and refused.json()["error"]["code"] == "model_unavailable"
        starting = ensureDeferred(fleet.command("provider.start"))
        await eventually(lambda: fleet.state() in ("starting", "loading"), timeout=5, message="starting")
        # On its way back: a request now waits in the queue for it.
        waiting = ensureDeferred(post(fleet.base, "/v1/chat/completions", chat(max_tokens=2)))
        response = await starting
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED, response.reason
        assert response.result["state"] == "ready"
        assert (await waiting).code == 200
        response = await fleet.command("provider.logs", bytes="4000")
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
        text = "".join(response.result[f"log.{i:03d}"] for i in range(int(response.result["log_chunks"])))
        assert "mock_provider listening on" in text
        pid = fleet.pid()
        await stop(fleet.node)
        assert not alive(pid)
        assert list((tmp_path / "state").iterdir()) == []
    finally:
        await stop(fleet.node, fleet.edge)


@pytest_twisted.ensureDeferred
async def test_a_ready_engine_that_stops_answering_is_restarted(tmp_path: Path) -> None:
    """liveness.failures 2: an engine frozen with SIGSTOP fails two probes in a row, is killed
    (it cannot act on SIGTERM) after its stop timeout, counts as a crash with that reason, and
    is ready again with a new pid."""
    fleet = await start_launch_fleet(tmp_path, liveness={"failures": 2}, stop={"timeout_seconds": 0.5})
    try:
        frozen = fleet.pid()
        os.kill(frozen, signal.SIGSTOP)
        await eventually(lambda: fleet.state() == "crashed", timeout=15, message="crashed at the Edge")
        launch = fleet.launch()
        assert launch.reason.startswith("not alive: 2 health checks failed (no answer within 1s")
        await eventually(lambda: fleet.state() == "ready", timeout=READY_SECONDS, message="ready again")
        assert fleet.pid() != frozen and not alive(frozen)
    finally:
        await stop(fleet.node, fleet.edge)
