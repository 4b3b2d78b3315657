"""The Edge's deployments without sockets: the set split per node, versions, hold, what nodes say."""

from __future__ import annotations

from twisted.internet.task import Clock

from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_config, healthy, node_hello
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb


def desired(instance_id: str, node_id: str = "node-1", tokens: str = "100") -> pb.DesiredInstance:
    """A desired mock instance."""
    return pb.DesiredInstance(
        instance_id=instance_id,
        deployment="chat",
        generation=1,
        node_id=node_id,
        profile="mock",
        model="m1",
        parameters={"tokens_per_second": tokens},
        capacity=4,
    )


class Edge:
    """A registry with node-1 ready (it declares the mock profile) and node-2 not connected."""

    def __init__(self, held: bool = False) -> None:
        self.clock = Clock()
        self.registry = NodeRegistry(edge_config(), self.clock)
        self.deployments = EdgeDeployments(self.registry, self.clock, held=held)
        self.peer = FakeNodePeer()
        hello = node_hello("node-1")
        hello.profiles.append(pb.EngineProfile(name="mock", kind="vllm", free_ports=10))
        hello.gpus = 2
        hello.free_gpus = 2
        token = self.registry.node_accepted(hello, self.peer)
        self.registry.node_ready(token, healthy("mock-a"))
        self.token = token

    def take(self, version: int, *instances: pb.DesiredInstance) -> pb.EdgeDeploymentsResponse:
        """Send a desired set."""
        return self.deployments.take(pb.EdgeDeploymentsRequest(version=version, instances=list(instances)))

    def answer(self, index: int, *statuses: pb.InstanceStatus, free_gpus: int = 2) -> None:
        """Answer the ``index``-th request node-1 got."""
        self.peer.instance_requests[index][1].callback(
            pb.NodeInstancesResponse(instances=list(statuses), free_gpus=free_gpus)
        )


def status(instance_id: str, state: int, reason: str = "") -> pb.InstanceStatus:
    """A node's status of an instance."""
    return pb.InstanceStatus(instance_id=instance_id, deployment="chat", state=state, reason=reason)  # type: ignore[arg-type]  # the stubs want the enum type; the state is its int value


def test_the_set_is_split_per_node_and_its_instances_become_providers() -> None:
    """node-1 gets its own instances only; they are its providers here (with the profile's kind)
    beside the configured one; an instance for an unknown node is refused here."""
    edge = Edge()
    response = edge.take(1, desired("a"), desired("b", node_id="node-2"), desired("c", node_id="node-9"))
    assert response.observed_version == 1 and not response.held
    ((request, _),) = edge.peer.instance_requests
    assert [d.instance_id for d in request.instances] == ["a"]
    providers = {p.provider_id: p for p in edge.registry.node("node-1").providers}
    assert set(providers) == {"mock-a", "a"}
    assert providers["a"].kind == "vllm" and providers["a"].capacity == 4 and providers["a"].models == ("m1",)
    assert [p.provider_id for p in edge.registry.node("node-2").providers] == ["mock-b", "b"]
    reasons = {s.instance_id: (s.state, s.reason) for s in response.instances}
    assert reasons["b"] == (pb.INSTANCE_STATE_PENDING, "node node-2 is not connected")
    assert reasons["c"] == (pb.INSTANCE_STATE_REFUSED, "no node 'node-9' is configured on this edge")
    assert reasons["a"] == (pb.INSTANCE_STATE_PENDING, "sent to its node, no answer yet")


def test_the_nodes_answer_is_what_is_shown_and_a_refusal_removes_the_provider() -> None:
    """The node's statuses replace the Edge's guesses; a refused instance is no provider here;
    the status snapshot carries the version, the instances, the profiles and free GPU slots."""
    edge = Edge()
    edge.take(7, desired("a"), desired("b", tokens="5000"))
    edge.answer(
        0, status("a", pb.INSTANCE_STATE_READY), status("b", pb.INSTANCE_STATE_REFUSED, "too fast"), free_gpus=1
    )
    shown = {s.instance_id: (s.state, s.reason) for s in edge.deployments.statuses()}
    assert shown == {"a": (pb.INSTANCE_STATE_READY, ""), "b": (pb.INSTANCE_STATE_REFUSED, "too fast")}
    assert [p.provider_id for p in edge.registry.node("node-1").providers] == ["mock-a", "a"]
    snapshot = StatusProvider(edge.registry, edge.clock, edge.deployments).snapshot()
    assert snapshot.observed_deployments_version == 7 and len(snapshot.instances) == 2 and not snapshot.held
    node = snapshot.nodes[0]
    assert [p.name for p in node.profiles] == ["mock"] and (node.gpus, node.free_gpus) == (2, 1)
    assert {p.provider_id: p.deployment for p in node.providers} == {"mock-a": "", "a": "chat"}


def test_an_older_version_is_ignored_and_a_late_answer_does_not_count() -> None:
    """A set older than the one taken changes nothing; the answer to a superseded request is dropped."""
    edge = Edge()
    edge.take(5, desired("a"))
    edge.take(6, desired("a", tokens="200"))
    response = edge.take(4, desired("z"))
    assert response.observed_version == 6 and len(edge.peer.instance_requests) == 2
    edge.answer(0, status("old", pb.INSTANCE_STATE_READY))
    assert "old" not in {s.instance_id for s in edge.deployments.statuses()}
    edge.answer(1, status("a", pb.INSTANCE_STATE_STARTING))
    assert [s.state for s in edge.deployments.statuses()] == [pb.INSTANCE_STATE_STARTING]


def test_held_sets_are_kept_not_sent_and_applied_on_release() -> None:
    """Held: acknowledged (held=true), nothing sent or changed; release sends it; a node that becomes
    ready while held gets nothing."""
    edge = Edge(held=True)
    response = edge.take(1, desired("a"))
    assert response.held and response.observed_version == 1
    assert edge.peer.instance_requests == []
    assert [p.provider_id for p in edge.registry.node("node-1").providers] == ["mock-a"]
    assert [s.reason for s in response.instances] == ["held: this edge holds changes"]
    assert edge.deployments.release() and not edge.deployments.release()
    assert len(edge.peer.instance_requests) == 1
    assert edge.deployments.hold()
    edge.take(2, desired("a", tokens="300"))
    assert len(edge.peer.instance_requests) == 1


def test_a_ready_node_gets_its_set_again_but_only_once_one_was_received() -> None:
    """A node that becomes ready again gets its part of the set; before any set arrived, nothing."""
    edge = Edge()
    second = FakeNodePeer()
    token = edge.registry.node_accepted(node_hello("node-1"), second)
    edge.registry.node_ready(token, healthy("mock-a"))
    assert second.instance_requests == []
    edge.take(1, desired("a"))
    assert len(second.instance_requests) == 1
    third = FakeNodePeer()
    token = edge.registry.node_accepted(node_hello("node-1"), third)
    edge.registry.node_ready(token, healthy("mock-a"))
    assert len(third.instance_requests) == 1


def test_unknown_states_and_long_texts_from_a_node_are_checked() -> None:
    """A state this Edge does not know is kept as unspecified with a reason; texts are cut to a bound."""
    edge = Edge()
    edge.take(1, desired("a"))
    edge.answer(0, status("a", 99, "x" * 10_000))
    (shown,) = edge.deployments.statuses()
    assert shown.state == pb.INSTANCE_STATE_UNSPECIFIED
    assert shown.reason == "the node reported an instance state this edge does not know (unknown_99)"
    report = pb.NodeInstancesReport(instances=[status("a", pb.INSTANCE_STATE_DRIFTED, "y" * 10_000)])
    edge.deployments.node_report("node-1", report)
    (shown,) = edge.deployments.statuses()
    assert shown.state == pb.INSTANCE_STATE_DRIFTED and len(shown.reason) == 256


def test_a_node_without_profiles_or_instances_is_sent_nothing() -> None:
    """node-2 declares no profiles: an empty part of the set is not sent to it (an older Node
    would not know the message); its instances are sent as soon as it has some."""
    edge = Edge()
    peer = FakeNodePeer()
    token = edge.registry.node_accepted(node_hello("node-2"), peer)
    edge.registry.node_ready(token, healthy("mock-b"))
    edge.take(1, desired("a"))
    assert peer.instance_requests == [] and len(edge.peer.instance_requests) == 1
    edge.take(2, desired("a"), desired("b", node_id="node-2"))
    assert [d.instance_id for d in peer.instance_requests[0][0].instances] == ["b"]
    assert edge.deployments.diagnostics()["deployments_instances"] == "2"
