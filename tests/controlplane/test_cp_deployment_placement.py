"""Placement: which node of an edge each instance goes to, what a dry run answers, and that it never churns."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments.spec import parse_spec
from twisted_iop.wire import control_pb2 as pb

TPS = pl.ParameterBounds("tokens_per_second", "int", 1.0, 1000.0, has_default=True)


def mock(free_ports: int = 10, gpus_per_instance: int = 0) -> pl.ProfileView:
    """The issue's mock profile with ``free_ports`` ports free."""
    return pl.ProfileView("mock", (TPS,), free_ports, gpus_per_instance)


def node(node_id: str, *profiles: pl.ProfileView, free_gpus: int = 0, **labels: str) -> pl.NodeView:
    """A connected node declaring ``profiles``."""
    return pl.NodeView(node_id, True, tuple(sorted(labels.items())), profiles, free_gpus)


def edge(*nodes: pl.NodeView, running: tuple[pl.RunningInstance, ...] = (), **labels: str) -> pl.EdgeView:
    """A connected edge with ``nodes``."""
    return pl.EdgeView("edge-a", True, False, tuple(sorted(labels.items())), nodes, running)


def deployment(name: str = "chat", generation: int = 1, **body: Any) -> pl.Deployment:
    """A deployment of the mock profile serving m1."""
    return pl.Deployment(parse_spec(name, {"model": "m1", "profile": "mock", **body}), generation)


def test_one_replica_goes_to_the_first_node_that_fits() -> None:
    """One instance, id <deployment>-1, on the lowest node id declaring the profile, with the spec's hash."""
    chat = deployment(parameters={"tokens_per_second": 100}, capacity=4)
    plan = pl.place_edge([chat], edge(node("node-2", mock()), node("node-1", mock())))
    (instance,) = plan.instances
    assert (instance.instance_id, instance.node_id, instance.generation) == ("chat-1", "node-1", 1)
    assert instance.spec_hash == chat.spec.spec_hash
    desired = instance.desired()
    assert dict(desired.parameters) == {"tokens_per_second": "100"} and desired.capacity == 4
    assert plan.unplaced == ()


def test_replicas_spread_over_the_nodes() -> None:
    """Two replicas on two nodes go one on each."""
    plan = pl.place_edge([deployment(replicas_per_edge=2)], edge(node("node-1", mock()), node("node-2", mock())))
    assert {(i.instance_id, i.node_id) for i in plan.instances} == {("chat-1", "node-1"), ("chat-2", "node-2")}


def test_an_edge_the_selector_does_not_match_gets_nothing() -> None:
    """edge_selector site=lab: an edge labelled site=other gets no instance and is not selected."""
    plan = pl.place_edge([deployment(edge_selector="site=lab")], edge(node("node-1", mock()), site="other"))
    assert plan.instances == () and plan.selected == ()


def test_the_node_selector_picks_the_nodes() -> None:
    """node_selector gpu=a100 places on the node so labelled only."""
    plan = pl.place_edge(
        [deployment(node_selector="gpu=a100")], edge(node("node-1", mock()), node("node-2", mock(), gpu="a100"))
    )
    assert [i.node_id for i in plan.instances] == ["node-2"]


def test_what_cannot_be_placed_says_why() -> None:
    """No such profile, no free GPU, no free port, no matching node: unplaced with the reason."""
    cases = [
        (deployment(profile="vllm"), edge(node("node-1", mock())), "no node declares engine profile 'vllm'"),
        (deployment(), edge(node("node-1", mock(gpus_per_instance=1), free_gpus=0)), "no free GPU"),
        (deployment(), edge(node("node-1", mock(free_ports=0))), "no free port"),
        (deployment(node_selector="gpu=h100"), edge(node("node-1", mock())), "no node of this edge matches"),
        (deployment(), edge(), "this edge reports no nodes"),
    ]
    for chat, view, reason in cases:
        plan = pl.place_edge([chat], view)
        assert plan.instances == ()
        (missing,) = plan.unplaced
        assert reason in missing.reason, missing.reason


def test_ports_and_gpus_are_counted_within_one_placement() -> None:
    """Two replicas on one node with one free port: the second is unplaced; with two GPU slots and
    two per instance, likewise."""
    plan = pl.place_edge([deployment(replicas_per_edge=2)], edge(node("node-1", mock(free_ports=1))))
    assert [i.instance_id for i in plan.instances] == ["chat-1"]
    assert [u.instance_id for u in plan.unplaced] == ["chat-2"]
    plan = pl.place_edge(
        [deployment(replicas_per_edge=2)], edge(node("node-1", mock(gpus_per_instance=2), free_gpus=2))
    )
    assert [u.instance_id for u in plan.unplaced] == ["chat-2"]


def test_a_parameter_out_of_bounds_is_placed_with_its_problem_named() -> None:
    """tokens_per_second=5000 over a max of 1000: still placed (the Node refuses it), the problem named."""
    plan = pl.place_edge([deployment(parameters={"tokens_per_second": 5000})], edge(node("node-1", mock())))
    (instance,) = plan.instances
    assert "above the profile's maximum 1000" in instance.problem
    assert "tokens_per_second" in instance.problem


def test_parameter_checks_follow_the_declaration() -> None:
    """Undeclared, wrong type, enum, pattern, required: each named; good values pass."""
    profile = pl.ProfileView(
        "p",
        (
            pl.ParameterBounds("n", "int", 1.0, 10.0, has_default=True),
            pl.ParameterBounds("dtype", "enum", choices=("auto", "float16"), has_default=True),
            pl.ParameterBounds("tag", "string", pattern="[a-z]+", has_default=True),
            pl.ParameterBounds("need", "bool"),
        ),
    )
    assert pl.parameter_problem(profile, [("need", True)]) is None
    assert pl.parameter_problem(profile, [("need", True), ("n", 10), ("dtype", "float16"), ("tag", "ab")]) is None
    assert "does not declare" in (pl.parameter_problem(profile, [("need", True), ("x", 1)]) or "")
    assert "integer" in (pl.parameter_problem(profile, [("need", True), ("n", 1.5)]) or "")
    assert "minimum" in (pl.parameter_problem(profile, [("need", True), ("n", 0)]) or "")
    assert "not one of" in (pl.parameter_problem(profile, [("need", True), ("dtype", "int8")]) or "")
    assert "pattern" in (pl.parameter_problem(profile, [("need", True), ("tag", "A1")]) or "")
    assert "required" in (pl.parameter_problem(profile, []) or "")


def test_an_instance_stays_where_it_runs() -> None:
    """chat-1 runs on node-2: placement keeps it there even though node-1 sorts first."""
    running = (pl.RunningInstance("chat-1", "node-2", "chat", "x", pb.INSTANCE_STATE_READY),)
    plan = pl.place_edge(
        [deployment()], edge(node("node-1", mock()), node("node-2", mock(free_ports=0)), running=running)
    )
    assert [i.node_id for i in plan.instances] == ["node-2"]


def test_an_instance_stays_where_it_was_placed_while_its_node_is_away() -> None:
    """Placed on node-2 before; node-2 now reports no profiles (not connected): it stays there."""
    away = pl.NodeView("node-2", False)
    plan = pl.place_edge([deployment()], edge(node("node-1", mock()), away), previous={"chat-1": "node-2"})
    assert [i.node_id for i in plan.instances] == ["node-2"]


def test_dry_run_changes_start_restart_stay_stop() -> None:
    """Against what runs: a new instance starts, a new hash restarts, the same hash stays, an extra one stops."""
    old = deployment(replicas_per_edge=3, parameters={"tokens_per_second": 50})
    view = edge(node("node-1", mock()), node("node-2", mock()), node("node-3", mock()))
    first = pl.place_edge([old], view)
    new = deployment(replicas_per_edge=2, parameters={"tokens_per_second": 60}, generation=2)
    running = tuple(
        pl.RunningInstance(i.instance_id, i.node_id, "chat", i.spec_hash, pb.INSTANCE_STATE_READY)
        for i in first.instances
    )
    running_view = edge(*view.nodes, running=running)
    plan = pl.place_edge([new], running_view)
    actions = {(c.action, c.instance_id) for c in pl.changes(plan, running_view)}
    assert actions == {("restart", "chat-1"), ("restart", "chat-2"), ("stop", "chat-3")}
    same = pl.place_edge([old], running_view)
    assert {c.action for c in pl.changes(same, running_view)} == {"stay"}
    fresh = pl.place_edge([new], view)
    assert {c.action for c in pl.changes(fresh, view)} == {"start"}


# -- properties ---------------------------------------------------------------------------------

node_ids = st.sampled_from([f"node-{i}" for i in range(1, 7)])
nodes_strategy = st.lists(
    st.builds(
        lambda node_id, ports, gpus, per, label: pl.NodeView(
            node_id, True, (("rack", label),), (mock(ports, per),), gpus
        ),
        node_ids,
        st.integers(0, 4),
        st.integers(0, 4),
        st.integers(0, 2),
        st.sampled_from(["a", "b"]),
    ),
    max_size=6,
    unique_by=lambda n: n.node_id,
)
deployments_strategy = st.lists(
    st.builds(
        lambda name, replicas, rack, tps: deployment(
            name, replicas_per_edge=replicas, node_selector=rack, parameters={"tokens_per_second": tps}
        ),
        st.sampled_from(["chat", "embed", "code"]),
        st.integers(1, 4),
        st.sampled_from(["", "rack=a", "rack=b"]),
        st.integers(1, 2000),
    ),
    max_size=3,
    unique_by=lambda d: d.spec.name,
)


@settings(max_examples=200, deadline=None)
@given(nodes=nodes_strategy, deployments=deployments_strategy, data=st.data())
def test_placement_is_deterministic_whatever_the_order(
    nodes: list[pl.NodeView], deployments: list[pl.Deployment], data: st.DataObject
) -> None:
    """The same deployments and edge in any order give the same plan."""
    plan = pl.place_edge(deployments, edge(*nodes))
    shuffled_nodes = data.draw(st.permutations(nodes))
    shuffled_deployments = data.draw(st.permutations(deployments))
    assert pl.place_edge(shuffled_deployments, edge(*shuffled_nodes)) == plan


@settings(max_examples=200, deadline=None)
@given(nodes=nodes_strategy, deployments=deployments_strategy)
def test_placement_never_churns(nodes: list[pl.NodeView], deployments: list[pl.Deployment]) -> None:
    """Placing again with what the first placement started running (its ports and GPUs now taken),
    or with only its placement remembered, keeps every instance on its node: every change is stay."""
    view = edge(*nodes)
    plan = pl.place_edge(deployments, view)
    running = tuple(
        pl.RunningInstance(i.instance_id, i.node_id, i.deployment, i.spec_hash, pb.INSTANCE_STATE_READY)
        for i in plan.instances
    )
    taken: dict[str, int] = {}
    for instance in plan.instances:
        taken[instance.node_id] = taken.get(instance.node_id, 0) + 1
    busy_nodes = tuple(
        pl.NodeView(
            n.node_id,
            True,
            n.labels,
            tuple(attrs_evolve_ports(p, max(0, p.free_ports - taken.get(n.node_id, 0))) for p in n.profiles),
            0,
        )
        for n in nodes
    )
    again_view = edge(*busy_nodes, running=running)
    again = pl.place_edge(deployments, again_view)
    assert again.instances == plan.instances
    assert {c.action for c in pl.changes(again, again_view)} <= {"stay"}
    previous = {i.instance_id: i.node_id for i in plan.instances}
    assert pl.place_edge(deployments, view, previous).instances == plan.instances


def attrs_evolve_ports(profile: pl.ProfileView, free_ports: int) -> pl.ProfileView:
    """The profile with ``free_ports`` ports free."""
    return pl.ProfileView(profile.name, profile.parameters, free_ports, profile.gpus_per_instance)
