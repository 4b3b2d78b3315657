"""Deployments over real sockets: a fake Control Plane sends desired sets over the Edge wire to a
real Edge, whose Node (profiles only, no providers) runs the instances as launched engines."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest_twisted
from prometheus_client import generate_latest
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred

from twisted_iop.deployments.spec import spec_hash
from twisted_iop.node.metrics import node_metric_registry
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.deployments import desired, start_deployment_fleet
from twisted_iop.testing.engines.launch import ChatLoad, alive
from twisted_iop.testing.harness import eventually
from twisted_iop.testing.http import chat, post
from twisted_iop.wire import control_pb2 as pb


@pytest_twisted.ensureDeferred
async def test_an_instance_serves_and_only_a_changed_spec_restarts_it(tmp_path: Path) -> None:
    """The set reaches READY and serves chat through the Edge; the same set again, a Control Plane
    reconnect and a Node reconnect keep its engine (same pid); a parameter change restarts it once."""
    fleet = await start_deployment_fleet(tmp_path)
    try:
        response = await fleet.send(desired(tokens_per_second=100))
        assert response.observed_version == 1 and not response.held
        await fleet.ready()
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=3))
        assert answer.code == 200, answer.body
        snapshot = await fleet.link.status()
        assert snapshot.observed_deployments_version == 1 and not snapshot.held
        (instance,) = snapshot.instances
        assert instance.state == pb.INSTANCE_STATE_READY
        assert instance.spec_hash == spec_hash("mock", MODEL, {"tokens_per_second": "100"}, 4)
        (node,) = snapshot.nodes
        assert [p.name for p in node.profiles] == ["mock"] and node.profiles[0].free_ports == 0
        (provider,) = node.providers
        assert provider.provider_id == "chat-1" and provider.deployment == "chat" and provider.capacity == 4
        pid = provider.launch.pid
        assert pid == fleet.pid() and alive(pid)

        # The same set again: nothing restarts.
        await fleet.send(desired(tokens_per_second=100))
        # The Edge loses its Control Plane and enrolls again; the set comes again.
        old = fleet.link
        old.close()
        await eventually(lambda: fleet.link is not old and fleet.link.hellos, timeout=10, message="re-enrolled")
        assert (await fleet.send(desired(tokens_per_second=100))).observed_version == 3
        # The Node loses its Edge and comes back: the Edge sends its set again.
        sends = fleet.edge.deployments.sends
        fleet.edge.registry.disconnect_node("node-1")
        await eventually(lambda: fleet.edge.deployments.sends > sends, timeout=10, message="set resent to node-1")
        await fleet.ready()
        assert fleet.pid() == pid
        assert fleet.node.runtime.instances is not None and fleet.node.runtime.instances.restarts == 0

        # A parameter change: restarted once, with the new spec.
        await fleet.send(desired(tokens_per_second=200))
        await eventually(lambda: fleet.pid() not in (0, pid), timeout=30, message="a new engine")
        await fleet.ready()
        status = fleet.status()
        assert status is not None
        assert status.spec_hash == spec_hash("mock", MODEL, {"tokens_per_second": "200"}, 4)
        assert fleet.node.runtime.instances.restarts == 1 and not alive(pid)
        metrics = generate_latest(node_metric_registry(fleet.node)).decode()
        assert 'iop_node_instance_changes_total{change="restart"} 1.0' in metrics
        assert 'iop_node_instances{state="ready"} 1.0' in metrics
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=3))
        assert answer.code == 200, answer.body
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_value_out_of_bounds_is_refused_and_a_killed_engine_is_drift_corrected(tmp_path: Path) -> None:
    """tokens_per_second 5000 (max 1000) is REFUSED with its reason and starts nothing; kill -9 of a
    running instance's engine is reported DRIFTED, then the supervisor has it READY again."""
    fleet = await start_deployment_fleet(tmp_path)
    try:
        await fleet.send(desired("bad", tokens_per_second=5000))
        await eventually(lambda: fleet.state("bad") == "INSTANCE_STATE_REFUSED", timeout=10, message="refused")
        status = fleet.status("bad")
        assert status is not None
        assert status.reason == "parameter tokens_per_second must be at most 1000, not 5000"
        assert fleet.pid("bad") == 0 and "bad" not in fleet.node.engines.engines
        assert [p.provider_id for p in fleet.edge.registry.node("node-1").providers] == []

        await fleet.send(desired())
        await fleet.ready()
        pid = fleet.pid()
        seen: list[str] = []
        fleet.edge.deployments.report_listener = lambda status: seen.append(pb.InstanceState.Name(status.state))
        os.kill(pid, signal.SIGKILL)
        await eventually(lambda: "INSTANCE_STATE_DRIFTED" in seen, timeout=10, message="drift reported")
        await fleet.ready()
        assert fleet.pid() != pid
        drifted = seen.index("INSTANCE_STATE_DRIFTED")
        assert "INSTANCE_STATE_READY" in seen[drifted:]
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_held_edge_keeps_the_set_and_changes_nothing_until_released(tmp_path: Path) -> None:
    """Held from edge.yaml: the set is acknowledged (held) and nothing starts; released by command, it
    runs; held by command, a change waits; released, it applies; an empty set stops the instance."""
    fleet = await start_deployment_fleet(tmp_path, hold=True)
    try:
        response = await fleet.send(desired())
        assert response.held and response.observed_version == 1
        assert [s.reason for s in response.instances] == ["held: this edge holds changes"]
        assert fleet.edge.deployments.sends == 0 and fleet.node.engines.engines == {}
        released = await fleet.link.command("edge.release")
        assert released.outcome == pb.COMMAND_OUTCOME_SUCCEEDED and released.result["held"] == "false"
        await fleet.ready()
        pid = fleet.pid()

        held = await fleet.link.command("edge.hold", command_id="op-2", reason="maintenance")
        assert held.outcome == pb.COMMAND_OUTCOME_SUCCEEDED and held.result["held"] == "true"
        sends = fleet.edge.deployments.sends
        response = await fleet.send(desired(tokens_per_second=300))
        assert response.held and response.observed_version == 2
        assert (await fleet.link.status()).held
        assert fleet.edge.deployments.sends == sends and fleet.pid() == pid
        assert fleet.state() == "INSTANCE_STATE_PENDING"

        await fleet.link.command("edge.release", command_id="op-3")
        await eventually(lambda: fleet.pid() not in (0, pid), timeout=30, message="the held change applied")
        await fleet.ready()

        await fleet.send()
        await eventually(lambda: fleet.node.engines.engines == {}, timeout=30, message="the instance stopped")
        await eventually(
            lambda: fleet.edge.registry.node("node-1").providers == (), timeout=10, message="provider removed"
        )
        kinds = [e.kind for e in fleet.cp.events()]
        assert "edge.held" in kinds and "edge.released" in kinds
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_an_edge_restart_restarts_no_instance(tmp_path: Path) -> None:
    """A new Edge process sends the Node nothing until the Control Plane sends the set again; the
    Node kept its instance running meanwhile, and the same set restarts nothing (same pid)."""
    fleet = await start_deployment_fleet(tmp_path)
    try:
        await fleet.send(desired())
        await fleet.ready()
        pid = fleet.pid()
        await fleet.restart_edge()
        assert fleet.edge.deployments.sends == 0 and not fleet.edge.deployments.received
        assert fleet.pid() == pid and alive(pid)
        response = await fleet.send(desired())
        assert response.observed_version == 2
        await fleet.ready()
        assert fleet.pid() == pid
        instances = fleet.node.runtime.instances
        assert instances is not None and (instances.starts, instances.restarts, instances.stops) == (1, 0, 0)
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=3))
        assert answer.code == 200, answer.body
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_restarted_node_gets_its_set_again_from_the_edge(tmp_path: Path) -> None:
    """A Node that stops stops its engines; started again it runs nothing until its Edge, seeing it
    ready, sends its set again: the instance is started anew and READY."""
    fleet = await start_deployment_fleet(tmp_path)
    try:
        await fleet.send(desired())
        await fleet.ready()
        pid = fleet.pid()
        sends = fleet.edge.deployments.sends
        await fleet.restart_node()
        assert not alive(pid)
        await eventually(lambda: fleet.edge.deployments.sends > sends, timeout=15, message="set resent")
        await fleet.ready()
        assert fleet.pid() not in (0, pid)
        instances = fleet.node.runtime.instances
        assert instances is not None and instances.starts == 1
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_parameter_change_under_load_fails_no_request(tmp_path: Path) -> None:
    """4 clients keep asking while tokens_per_second changes: the old engine drains (its requests
    finish), the new one starts, requests asked meanwhile wait in the Edge's queue; none fails."""
    fleet = await start_deployment_fleet(tmp_path)
    load = ChatLoad(fleet.base, max_tokens=10)
    clients: list[Deferred[None]] = []
    try:
        await fleet.send(desired(tokens_per_second=40))
        await fleet.ready()
        pid = fleet.pid()
        clients = [ensureDeferred(load.client(i)) for i in range(4)]
        await eventually(lambda: len(load.outcomes) >= 8, timeout=20, message="the load running")
        seen: list[str] = []
        fleet.edge.registry.relay.add_listener(
            lambda e: seen.append(e.attributes["state"]) if e.kind == "provider.launch_changed" else None
        )
        await fleet.send(desired(tokens_per_second=50))
        await eventually(lambda: fleet.pid() not in (0, pid), timeout=30, message="a new engine")
        await fleet.ready()
        served = len(load.outcomes)
        await eventually(lambda: len(load.outcomes) >= served + 8, timeout=20, message="served again")
        assert "draining" in seen and seen[-1] == "ready", seen
    finally:
        load.running = False
        await DeferredList(clients)
        await fleet.stop()
    assert load.failures() == [], load.failures()[:5]


@pytest_twisted.ensureDeferred
async def test_an_instance_left_out_of_the_set_finishes_its_requests_before_it_stops(tmp_path: Path) -> None:
    """Requests running on an instance when a set leaves it out end with whole answers: its engine
    drains, then stops."""
    fleet = await start_deployment_fleet(tmp_path)
    load = ChatLoad(fleet.base, max_tokens=20)
    clients: list[Deferred[None]] = []
    try:
        await fleet.send(desired(tokens_per_second=40))
        await fleet.ready()
        pid = fleet.pid()
        clients = [ensureDeferred(load.client(i)) for i in range(4)]
        running = fleet.node.inference
        # All four at the Node (none in transit, which the removal would refuse), then no new ones.
        await eventually(lambda: running.running_on("chat-1") == 4, timeout=20, message="requests running")
        load.running = False
        seen: list[str] = []
        fleet.edge.registry.relay.add_listener(
            lambda e: seen.append(e.attributes["state"]) if e.kind == "provider.launch_changed" else None
        )
        await fleet.send()
        await DeferredList(clients)
        await eventually(lambda: not alive(pid), timeout=30, message="the engine stopped")
        assert fleet.node.engines.engines == {}
    finally:
        load.running = False
        await DeferredList(clients)
        await fleet.stop()
    assert load.outcomes and load.failures() == [], load.failures()[:5]
