"""Deployments through the real Klein app (StubTreq), the real service and registry, on a clock.

The edges are simulated peers that answer status with nodes declaring the
mock profile and report every instance of the last desired set they took
as ready (or refused, when a value is out of the profile's bounds). Every
answer is validated against the OpenAPI document's schemas.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted

from twisted_iop.controlplane.metrics import deployment_metrics
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.deployments import VIEWER, SimulatedEdge
from twisted_iop.testing.deployments import SimulatedFleet as Fleet
from twisted_iop.testing.harness import contract_validator
from twisted_iop.testing.wires.peers import CATALOG

CHAT = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}


def _valid(schema: str, body: Any) -> Any:
    errors = list(contract_validator(schema).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


@pytest_twisted.ensureDeferred
async def test_put_sends_the_selected_edge_its_set_and_the_rollup_becomes_ready() -> None:
    """PUT /deployments/chat selecting site=lab: 201 generation 1; only the lab edge gets chat-1 on
    node-1 with the spec hash; GET shows desired 1, ready 1 and the instance; the event names alice."""
    fleet = Fleet()
    lab, other = fleet.edge("edge-lab", "lab"), fleet.edge("edge-other", "other")
    code, body = await fleet.call("PUT", "/deployments/chat", CHAT)
    assert code == 201, body
    _valid("Deployment", body)
    assert (body["name"], body["generation"], body["changed"]) == ("chat", 1, True)
    (instance,) = lab.deployment_sets[-1].instances
    assert (instance.instance_id, instance.node_id, instance.generation) == ("chat-1", "node-1", 1)
    assert instance.spec_hash == body["spec_hash"]
    assert all(not s.instances for s in other.deployment_sets)
    code, shown = await fleet.call("GET", "/deployments/chat", token=VIEWER)
    assert code == 200
    _valid("Deployment", shown)
    assert shown["rollup"] == {
        "desired": 1,
        "ready": 1,
        "progressing": 0,
        "out_of_sync": 0,
        "failed": 0,
        "offline": 0,
        "held": 0,
    }
    (edge,) = shown["edges"]["items"]
    assert (edge["edge_id"], edge["state"], edge["observed_generation"]) == ("edge-lab", "ready", 1)
    assert [(i["instance_id"], i["state"]) for i in edge["instances"]] == [("chat-1", "ready")]
    events = [e for e in fleet.registry.fleet_events.since(0, 1000) if e.kind.startswith("deployment.")]
    assert [(e.kind, dict(e.attributes)["actor"]) for e in events] == [("deployment.created", "alice")]
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_the_same_spec_again_changes_nothing_and_a_change_bumps_the_generation() -> None:
    """PUT of the same body: 200, generation 1, changed false, no new set sent; a parameter change:
    generation 2, a new set with a new spec hash on the same instance and node."""
    fleet = Fleet()
    lab = fleet.edge("edge-lab", "lab")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    sent = len(lab.deployment_sets)
    code, body = await fleet.call("PUT", "/deployments/chat", CHAT)
    assert (code, body["generation"], body["changed"]) == (200, 1, False)
    assert len(lab.deployment_sets) == sent
    old_hash = lab.instances[0].spec_hash
    code, body = await fleet.call("PUT", "/deployments/chat", {**CHAT, "parameters": {"tokens_per_second": 200}})
    assert (code, body["generation"]) == (200, 2)
    (instance,) = lab.deployment_sets[-1].instances
    assert (instance.instance_id, instance.node_id, instance.generation) == ("chat-1", "node-1", 2)
    assert instance.spec_hash != old_hash
    assert lab.deployment_sets[-1].version > lab.deployment_sets[sent - 1].version
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_dry_run_answers_the_placement_and_changes_nothing() -> None:
    """?dry_run=true: start chat-1 on node-1 for the lab edge; a value out of bounds is named as a
    problem; nothing is kept and nothing sent."""
    fleet = Fleet()
    lab = fleet.edge("edge-lab", "lab")
    fleet.edge("edge-other", "other")
    code, body = await fleet.call("PUT", "/deployments/chat?dry_run=true", CHAT)
    assert code == 200, body
    _valid("DeploymentDryRun", body)
    (edge,) = body["edges"]
    assert edge["changes"] == [{"action": "start", "instance_id": "chat-1", "node_id": "node-1"}]
    assert body["summary"]["start"] == 1
    bad = {**CHAT, "parameters": {"tokens_per_second": 5000}}
    code, body = await fleet.call("PUT", "/deployments/chat?dry_run=true", bad)
    (problem,) = body["edges"][0]["problems"]
    assert "tokens_per_second=5000" in problem["reason"] and "maximum 1000" in problem["reason"]
    assert len(fleet.deployments) == 0
    assert all(not s.instances for s in lab.deployment_sets)
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_refused_value_shows_failed_with_the_nodes_reason() -> None:
    """Applied out of bounds: the edge reports it refused; the rollup counts it failed with the reason."""
    fleet = Fleet()
    fleet.edge("edge-lab", "lab")
    await fleet.call("PUT", "/deployments/chat", {**CHAT, "parameters": {"tokens_per_second": 5000}})
    code, shown = await fleet.call("GET", "/deployments/chat?state=failed")
    assert code == 200
    assert shown["rollup"]["failed"] == 1
    (edge,) = shown["edges"]["items"]
    assert edge["instances"][0]["state"] == "refused"
    assert "above its maximum 1000" in edge["instances"][0]["reason"]
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_delete_sends_an_empty_set_and_records_who() -> None:
    """DELETE: 200; the lab edge gets a set without chat; a second DELETE is 404 unknown_deployment."""
    fleet = Fleet()
    lab = fleet.edge("edge-lab", "lab")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    code, body = await fleet.call("DELETE", "/deployments/chat")
    assert code == 200
    _valid("DeploymentDeleted", body)
    assert list(lab.deployment_sets[-1].instances) == []
    code, body = await fleet.call("DELETE", "/deployments/chat")
    assert (code, body["error"]["code"]) == (404, "unknown_deployment")
    kinds = [e.kind for e in fleet.registry.fleet_events.since(0, 1000) if e.kind.startswith("deployment.")]
    assert kinds == ["deployment.created", "deployment.deleted"]
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_errors_and_roles() -> None:
    """A bad field: 400 invalid_deployment naming it; a viewer may read and not write (403); an
    unknown name is 404; an unknown state filter is 400 invalid_state."""
    fleet = Fleet()
    code, body = await fleet.call("PUT", "/deployments/chat", {**CHAT, "replicas_per_edge": 0})
    assert (code, body["error"]["code"]) == (400, "invalid_deployment")
    assert "replicas_per_edge" in body["error"]["message"]
    code, body = await fleet.call("PUT", "/deployments/chat", CHAT, token=VIEWER)
    assert (code, body["error"]["code"]) == (403, "forbidden")
    code, body = await fleet.call("GET", "/deployments", token=VIEWER)
    assert code == 200 and body == {"items": [], "total": 0}
    code, body = await fleet.call("GET", "/deployments/nope")
    assert (code, body["error"]["code"]) == (404, "unknown_deployment")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    code, body = await fleet.call("GET", "/deployments/chat?state=sleepy")
    assert (code, body["error"]["code"]) == (400, "invalid_state")
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_restart_keeps_the_deployment_and_sends_a_newer_version() -> None:
    """A new service on the same store: the deployment is back with its generation; the edge that
    reconnects gets the same instance (same spec hash) under a version above the one it holds."""
    store = MemoryStore()
    fleet = Fleet(store)
    lab = fleet.edge("edge-lab", "lab")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    before = lab.deployment_sets[-1]
    fleet.stop()
    again = Fleet(store)
    assert again.deployments.get("chat").generation == 1
    peer = again.edge("edge-lab", "lab")
    peer.version = before.version  # the edge still holds what the earlier process sent
    peer.instances = list(before.instances)
    again.registry.connect("edge-lab", peer, again.registry.get("edge-lab").hello)
    latest = peer.deployment_sets[-1]
    assert latest.version > before.version
    assert [(i.instance_id, i.node_id, i.spec_hash) for i in latest.instances] == [
        (i.instance_id, i.node_id, i.spec_hash) for i in before.instances
    ]
    assert again.deployments.ready("chat")
    again.stop()


@pytest_twisted.ensureDeferred
async def test_an_edge_without_deployments_gets_nothing_and_one_that_takes_them_an_empty_set() -> None:
    """An Edge older than deployments (no edge.hold in its catalog) is sent nothing and asked
    nothing; one that takes them, selected by no deployment, gets an empty set at once (no status asked)."""
    fleet = Fleet()
    await fleet.call("PUT", "/deployments/chat", CHAT)
    old = SimulatedEdge("edge-old")
    hello = EdgeHello(labels={"site": "lab"}, software_version="t", protocol_version="1.0", commands=tuple(CATALOG))
    fleet.registry.connect("edge-old", old, hello)
    assert (old.deployment_sets, old.status_requests) == ([], 0)
    (edge,) = (await fleet.call("GET", "/deployments/chat"))[1]["edges"]["items"]
    assert (edge["edge_id"], edge["state"]) == ("edge-old", "failed")
    assert "does not take deployments" in edge["reason"]
    other = fleet.edge("edge-other", "other")
    assert [list(s.instances) for s in other.deployment_sets] == [[]]
    assert other.status_requests == 0
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_held_edge_shows_held_until_released_and_an_offline_one_offline() -> None:
    """An edge that holds changes acknowledges the set and runs nothing new: held; released, it
    runs it: ready. A second edge that goes away: offline, counted as desired with offline: wait and
    not with skip."""
    fleet = Fleet()
    lab = fleet.edge("edge-lab", "lab")
    lab.held = True
    lab._running = lambda: []  # type: ignore[method-assign]  # held: nothing of the set started
    fleet.edge("edge-lab-2", "lab")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    _, shown = await fleet.call("GET", "/deployments/chat")
    states = {e["edge_id"]: e["state"] for e in shown["edges"]["items"]}
    assert states == {"edge-lab": "held", "edge-lab-2": "ready"}
    lab.held = False
    del lab._running  # released: it runs the set it kept
    fleet.clock.advance(2)
    fleet.deployments.poll()  # the service asks the edges that are not settled for a snapshot
    _, shown = await fleet.call("GET", "/deployments/chat")
    assert shown["rollup"]["ready"] == 2
    token = fleet.registry.get("edge-lab-2").token
    assert token is not None
    fleet.registry.disconnect("edge-lab-2", token, "gone")
    _, shown = await fleet.call("GET", "/deployments/chat")
    assert (shown["rollup"]["desired"], shown["rollup"]["offline"], shown["rollup"]["ready"]) == (2, 1, 1)
    _, body = await fleet.call("PUT", "/deployments/chat", {**CHAT, "offline": "skip"})
    assert (body["rollup"]["desired"], body["rollup"]["offline"]) == (1, 1)
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_change_rolls_out_max_in_flight_edges_at_a_time() -> None:
    """Three lab edges at generation 1; a change with rollout.max_in_flight 1 reaches one edge, the
    others keep their instance (no new set) and show out_of_sync waiting their turn; each poll
    after the reached edge is ready reaches the next; at the end deployment.rolled_out is recorded
    and every edge runs the new hash, each sent it once."""
    fleet = Fleet()
    edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2, 3)]
    await fleet.call("PUT", "/deployments/chat", CHAT)
    old_hash = edges[0].instances[0].spec_hash
    sent_before = [len(e.deployment_sets) for e in edges]
    changed = {**CHAT, "parameters": {"tokens_per_second": 200}, "rollout": {"max_in_flight": 1}}
    code, body = await fleet.call("PUT", "/deployments/chat", changed)
    assert (code, body["generation"]) == (200, 2)
    new_hash = body["spec_hash"]
    assert [e.instances[0].spec_hash for e in edges] == [new_hash, old_hash, old_hash]
    _, shown = await fleet.call("GET", "/deployments/chat")
    _valid("Deployment", shown)
    states = [(e["edge_id"], e["state"]) for e in shown["edges"]["items"]]
    assert states == [("edge-1", "ready"), ("edge-2", "out_of_sync"), ("edge-3", "out_of_sync")]
    assert "waits its turn" in shown["edges"]["items"][1]["reason"]
    fleet.deployments.poll()
    assert [e.instances[0].spec_hash for e in edges] == [new_hash, new_hash, old_hash]
    fleet.deployments.poll()
    assert [e.instances[0].spec_hash for e in edges] == [new_hash, new_hash, new_hash]
    fleet.deployments.poll()
    assert fleet.deployments.get("chat").rolling_from is None
    kinds = [e.kind for e in fleet.registry.fleet_events.since(0, 1000) if e.kind.startswith("deployment.")]
    assert kinds == ["deployment.created", "deployment.updated", "deployment.rolled_out"]
    new_sets = [
        sum(1 for s in e.deployment_sets[before:] if s.instances and s.instances[0].spec_hash == new_hash)
        for e, before in zip(edges, sent_before, strict=True)
    ]
    assert new_sets == [1, 1, 1]
    _, shown = await fleet.call("GET", "/deployments/chat")
    assert shown["rollup"]["ready"] == 3
    fleet.stop()


@pytest.mark.parametrize("offline", ["wait", "skip"])
@pytest_twisted.ensureDeferred
async def test_an_edge_lost_mid_rollout_holds_the_roll_with_wait_and_not_with_skip(offline: str) -> None:
    """Three lab edges; a change with max_in_flight 1 reaches edge-1, which is then lost. With
    offline: wait it holds its place: polls reach no other edge (they keep the old spec) until it is
    back and ready, then the roll goes on. With skip the roll goes on without it (out of desired),
    and it gets the new spec when it comes back. Either way every edge ends ready on the new hash."""
    fleet = Fleet()
    edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2, 3)]
    await fleet.call("PUT", "/deployments/chat", {**CHAT, "offline": offline})
    old_hash = edges[0].instances[0].spec_hash
    changed = {**CHAT, "offline": offline, "parameters": {"tokens_per_second": 200}, "rollout": {"max_in_flight": 1}}
    _, body = await fleet.call("PUT", "/deployments/chat", changed)
    new_hash = body["spec_hash"]
    assert [e.instances[0].spec_hash for e in edges] == [new_hash, old_hash, old_hash]
    first = fleet.registry.get("edge-1")
    assert first.token is not None
    hello = first.hello
    fleet.registry.disconnect("edge-1", first.token, "killed")

    def hashes() -> list[str]:
        return [e.instances[0].spec_hash for e in edges]

    def kinds() -> list[str]:
        return [e.kind for e in fleet.registry.fleet_events.since(0, 1000) if e.kind.startswith("deployment.")]

    for _ in range(3):
        fleet.clock.advance(2)
        fleet.deployments.poll()
    _, shown = await fleet.call("GET", "/deployments/chat")
    _valid("Deployment", shown)
    states = {e["edge_id"]: e["state"] for e in shown["edges"]["items"]}
    rollup = shown["rollup"]
    if offline == "wait":
        assert hashes() == [new_hash, old_hash, old_hash]
        assert states == {"edge-1": "offline", "edge-2": "out_of_sync", "edge-3": "out_of_sync"}
        assert (rollup["desired"], rollup["offline"], rollup["ready"]) == (3, 1, 0)
        assert "deployment.rolled_out" not in kinds()
    else:
        assert hashes()[1:] == [new_hash, new_hash]
        assert states == {"edge-1": "offline", "edge-2": "ready", "edge-3": "ready"}
        assert (rollup["desired"], rollup["offline"], rollup["ready"]) == (2, 1, 2)

    fleet.registry.connect("edge-1", edges[0], hello)  # back: sent its set at once
    for _ in range(3):
        fleet.clock.advance(2)
        fleet.deployments.poll()
    assert hashes() == [new_hash, new_hash, new_hash]
    _, shown = await fleet.call("GET", "/deployments/chat")
    assert (shown["rollup"]["desired"], shown["rollup"]["ready"]) == (3, 3)
    assert fleet.deployments.get("chat").rolling_from is None
    assert kinds().count("deployment.rolled_out") == 1
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_roll_in_progress_survives_a_restart() -> None:
    """A roll reached one edge of two when the service restarts: the new service keeps the second
    edge on the old spec until the first is ready, then reaches it."""
    store = MemoryStore()
    fleet = Fleet(store)
    edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2)]
    await fleet.call("PUT", "/deployments/chat", CHAT)
    old_hash = edges[0].instances[0].spec_hash
    changed = {**CHAT, "parameters": {"tokens_per_second": 200}, "rollout": {"max_in_flight": 1}}
    await fleet.call("PUT", "/deployments/chat", changed)
    fleet.stop()
    again = Fleet(store)
    state = again.deployments.get("chat")
    assert state.rolling_from is not None and state.promoted == {"edge-1"}
    for old in edges:
        again.registry.connect(old.edge_id, old, fleet.registry.get(old.edge_id).hello)
    assert edges[1].instances[0].spec_hash == old_hash
    again.deployments.poll()
    assert edges[1].instances[0].spec_hash == state.spec.spec_hash
    again.stop()


@pytest_twisted.ensureDeferred
async def test_metrics_count_deployments_and_edges_by_state() -> None:
    """iop_deployments is 1 and iop_deployment_edges{chat, ready} is 1."""
    fleet = Fleet()
    fleet.edge("edge-lab", "lab")
    await fleet.call("PUT", "/deployments/chat", CHAT)
    figures = {m.name: m for m in deployment_metrics(fleet.deployments)}
    assert figures["iop_deployments"].samples[0].value == 1
    ready = [s for s in figures["iop_deployment_edges"].samples if s.labels == {"deployment": "chat", "state": "ready"}]
    assert [s.value for s in ready] == [1]
    fleet.stop()
