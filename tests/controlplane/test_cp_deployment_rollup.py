"""The state of a deployment on an edge, from what the edge reports, and the rollup's counts."""

from __future__ import annotations

from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments.rollup import Observation, edge_rollup, rollup_counts
from twisted_iop.controlplane.deployments.spec import parse_spec
from twisted_iop.wire import control_pb2 as pb

SPEC = parse_spec("chat", {"model": "m1", "profile": "mock", "replicas_per_edge": 2})
PLAN = pl.place_edge(
    [pl.Deployment(SPEC, 3)],
    pl.EdgeView("edge-a", nodes=(pl.NodeView("node-1", profiles=(pl.ProfileView("mock", (), 5),)),)),
)


def status(instance_id: str, state: int, spec_hash: str = SPEC.spec_hash, reason: str = "") -> pb.InstanceStatus:
    """An instance of chat on node-1 as the edge reports it."""
    return pb.InstanceStatus(
        instance_id=instance_id,
        deployment="chat",
        generation=3,
        node_id="node-1",
        spec_hash=spec_hash,
        state=state,  # type: ignore[arg-type]  # the stubs want the enum type; the state is its int value
        reason=reason,
    )


def rollup_of(*statuses: pb.InstanceStatus, version: int = 7, held: bool = False, connected: bool = True) -> str:
    """The edge's state for chat when it reports ``statuses`` having taken ``version`` (7 was sent)."""
    observed = Observation(version, statuses, held, 0.0)
    return edge_rollup("edge-a", "chat", SPEC.spec_hash, connected, PLAN.instances, PLAN.unplaced, 7, observed).state


def test_every_instance_ready_with_the_spec_hash_is_ready() -> None:
    """Both replicas ready with the deployment's hash: ready, observed generation 3."""
    ready = [status("chat-1", pb.INSTANCE_STATE_READY), status("chat-2", pb.INSTANCE_STATE_READY)]
    assert rollup_of(*ready) == "ready"
    observed = Observation(7, tuple(ready), False, 0.0)
    edge = edge_rollup("edge-a", "chat", SPEC.spec_hash, True, PLAN.instances, (), 7, observed)
    assert edge.observed_generation == 3
    assert [(r.instance_id, r.state) for r in edge.instances] == [("chat-1", "ready"), ("chat-2", "ready")]


def test_the_states_follow_what_the_edge_reports() -> None:
    """Starting: progressing; an old hash still ready: progressing; refused or failed: failed;
    drifted: out_of_sync; an older version: out_of_sync; held: held; not connected: offline."""
    one_ready = status("chat-1", pb.INSTANCE_STATE_READY)
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_STARTING)) == "progressing"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_READY, spec_hash="old")) == "progressing"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_REFUSED, reason="above max")) == "failed"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_FAILED)) == "failed"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_DRIFTED)) == "out_of_sync"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_READY), version=6) == "out_of_sync"
    assert rollup_of(one_ready, status("chat-2", pb.INSTANCE_STATE_PENDING), held=True) == "held"
    assert rollup_of(connected=False) == "offline"


def test_a_refused_instance_gives_its_reason() -> None:
    """The edge's reason is the Node's reason for the refused instance."""
    observed = Observation(
        7, (status("chat-1", pb.INSTANCE_STATE_REFUSED, reason="tokens_per_second: above"),), False, 0
    )
    edge = edge_rollup("edge-a", "chat", SPEC.spec_hash, True, PLAN.instances, (), 7, observed)
    assert edge.state == "failed"
    assert "tokens_per_second: above" in edge.reason


def test_an_instance_that_cannot_be_placed_fails_the_edge() -> None:
    """An unplaced instance shows as unplaced with its reason, and the edge is failed."""
    unplaced = (pl.Unplaced("chat", "chat-2", "no free GPU"),)
    ready = (status("chat-1", pb.INSTANCE_STATE_READY),)
    edge = edge_rollup(
        "edge-a", "chat", SPEC.spec_hash, True, PLAN.instances[:1], unplaced, 7, Observation(7, ready, False, 0)
    )
    assert edge.state == "failed"
    assert ("chat-2", "unplaced", "no free GPU") in [(r.instance_id, r.state, r.reason) for r in edge.instances]


def test_counts_by_state_and_the_offline_policy() -> None:
    """desired counts every edge with wait and only the connected ones with skip."""
    states = ["ready", "ready", "offline", "failed"]
    assert rollup_counts(states, "wait") == {
        "desired": 4,
        "ready": 2,
        "progressing": 0,
        "out_of_sync": 0,
        "failed": 1,
        "offline": 1,
        "held": 0,
    }
    assert rollup_counts(states, "skip")["desired"] == 3
