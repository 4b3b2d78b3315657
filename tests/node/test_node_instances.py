"""The Node's instances: which start, stop, restart or stay, and what each reports (no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from twisted.internet.task import Clock

from twisted_iop.deployments.spec import spec_hash
from twisted_iop.node.config import NodeProviderConfig, parse_node_config
from twisted_iop.node.deployments.instances import NodeInstances
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.testing.harness import MOCK_PROVIDER
from twisted_iop.wire import control_pb2 as pb


class FakeEngines:
    """The supervisor as the instances see it: states set by the test, restarts counted."""

    def __init__(self) -> None:
        self.states: dict[str, EngineState] = {}
        self.restarted: list[str] = []

    def state(self, provider_id: str) -> Optional[EngineState]:
        """The state the test set."""
        return self.states.get(provider_id)

    def report(self, provider_id: str) -> Optional[pb.EngineLaunch]:
        """No reason beyond the state."""
        return pb.EngineLaunch(reason="") if provider_id in self.states else None

    def restart(self, provider_id: str, reason: str, drain_seconds: float = 0.0) -> None:
        """Count the restart."""
        self.restarted.append(provider_id)


class Harness:
    """A NodeInstances with two ports, one GPU profile and fake engines; the providers it hands out kept."""

    def __init__(self) -> None:
        data = {
            "node_id": "node-1",
            "gpus": 1,
            "engines": [
                {
                    "name": "mock",
                    "kind": "openai",
                    "launch": {"command": ["iop-mock-provider", "--models", "{model}", "{tokens_per_second}"]},
                    "ports": [28200, 28201],
                    "parameters": {"tokens_per_second": {"type": "int", "min": 1, "max": 1000, "default": 50}},
                },
                {
                    "name": "gpu",
                    "kind": "vllm",
                    "launch": {"command": ["iop-mock-provider", "--models", "{model}"], "env": {"CUDA": "{gpu}"}},
                    "ports": [28300, 28309],
                    "gpus_per_instance": 1,
                },
            ],
        }
        config = parse_node_config(data, {"PATH": str(Path(MOCK_PROVIDER).parent)})
        self.engines = FakeEngines()
        self.applied: list[tuple[NodeProviderConfig, ...]] = []
        self.instances = NodeInstances(config, Clock(), self.engines, self.applied.append, lambda: {"configured"})

    def converge(self, *desired: pb.DesiredInstance) -> dict[str, pb.InstanceStatus]:
        """Converge to ``desired``; the statuses by instance id."""
        return {s.instance_id: s for s in self.instances.converge(list(desired))}

    def ports(self) -> dict[str, str]:
        """The base URL of each instance's provider."""
        return {p.provider_id: p.base_url for p in self.applied[-1]}


def desired(instance_id: str = "chat-1", profile: str = "mock", **parameters: str) -> pb.DesiredInstance:
    """One desired instance of model m1 with capacity 4."""
    return pb.DesiredInstance(
        instance_id=instance_id,
        deployment="chat",
        generation=1,
        node_id="node-1",
        profile=profile,
        model="m1",
        parameters=parameters,
        capacity=4,
    )


def test_new_instances_start_and_a_repeated_set_changes_nothing() -> None:
    """Two asked for: two providers on two ports; the same set again starts, stops and restarts nothing."""
    h = Harness()
    first = h.converge(desired("a"), desired("b", tokens_per_second="100"))
    assert {s.state for s in first.values()} == {pb.INSTANCE_STATE_PENDING}
    assert first["b"].spec_hash == spec_hash("mock", "m1", {"tokens_per_second": "100"}, 4)
    assert h.ports() == {"a": "http://127.0.0.1:28200", "b": "http://127.0.0.1:28201"}
    h.engines.states.update(a=EngineState.READY, b=EngineState.READY)
    again = h.converge(desired("a"), desired("b", tokens_per_second="100"))
    assert {s.state for s in again.values()} == {pb.INSTANCE_STATE_READY}
    assert (h.instances.starts, h.instances.stops, h.instances.restarts) == (2, 0, 0)
    assert h.engines.restarted == []
    assert h.ports() == {"a": "http://127.0.0.1:28200", "b": "http://127.0.0.1:28201"}


def test_a_changed_spec_restarts_once_on_the_same_port() -> None:
    """A new parameter value restarts that instance only, once, keeping its port; its launch carries the value."""
    h = Harness()
    h.converge(desired("a"), desired("b"))
    h.engines.states.update(a=EngineState.READY, b=EngineState.READY)
    statuses = h.converge(desired("a"), desired("b", tokens_per_second="7"))
    assert h.engines.restarted == ["b"]
    assert statuses["b"].spec_hash == spec_hash("mock", "m1", {"tokens_per_second": "7"}, 4)
    provider = {p.provider_id: p for p in h.applied[-1]}["b"]
    assert provider.base_url == "http://127.0.0.1:28201"
    assert provider.launch is not None and provider.launch.command[-1] == "7"
    h.converge(desired("a"), desired("b", tokens_per_second="7"))
    assert h.engines.restarted == ["b"]


def test_a_restarting_instance_is_not_ready_until_its_new_engine_is() -> None:
    """While the old engine drains or stops it is STARTING (not READY at the new hash); the new
    engine's start, then its readiness, make it READY."""
    h = Harness()
    h.converge(desired("a"))
    h.engines.states["a"] = EngineState.READY
    statuses = h.converge(desired("a", tokens_per_second="7"))
    assert statuses["a"].state == pb.INSTANCE_STATE_STARTING
    assert statuses["a"].reason == "restarting with its new spec"
    h.engines.states["a"] = EngineState.DRAINING
    assert h.instances.engine_changed("a") is None
    h.engines.states["a"] = EngineState.STARTING
    h.instances.engine_changed("a")
    h.engines.states["a"] = EngineState.READY
    ready = h.instances.engine_changed("a")
    assert ready is not None and ready.state == pb.INSTANCE_STATE_READY


def test_an_instance_no_longer_desired_stops_and_holds_its_port_until_its_engine_exited() -> None:
    """Left out of the set: it stops (STOPPING while its engine runs) and its port is not given away meanwhile."""
    h = Harness()
    h.converge(desired("a"), desired("b"))
    h.engines.states.update(a=EngineState.READY, b=EngineState.STOPPING)
    statuses = h.converge(desired("a"), desired("c"))
    assert statuses["b"].state == pb.INSTANCE_STATE_STOPPING
    assert statuses["c"].state == pb.INSTANCE_STATE_REFUSED
    assert "no free port in 28200-28201" in statuses["c"].reason
    assert [p.provider_id for p in h.applied[-1]] == ["a"]
    h.engines.states["b"] = EngineState.STOPPED
    report = h.instances.engine_changed("b")
    assert report is not None and report.state == pb.INSTANCE_STATE_STOPPED
    del h.engines.states["b"]
    statuses = h.converge(desired("a"), desired("c"))
    assert statuses["c"].state == pb.INSTANCE_STATE_PENDING
    assert "b" not in statuses
    assert h.ports()["c"] == "http://127.0.0.1:28201"


def test_refusals_carry_their_reason_and_stop_a_running_instance() -> None:
    """Out of bounds, unknown profile, a configured id, another node's, a repeated id: refused; a refused
    spec for a running instance stops it."""
    h = Harness()
    h.converge(desired("a"))
    h.engines.states["a"] = EngineState.READY
    other = desired("o")
    other.node_id = "node-2"
    statuses = h.converge(
        desired("a", tokens_per_second="5000"),
        desired("x", profile="sglang"),
        desired("configured"),
        other,
        desired("d"),
        desired("d"),
    )
    assert statuses["a"].state == pb.INSTANCE_STATE_STOPPING
    assert "must be at most 1000" in statuses["a"].reason
    assert statuses["x"].reason == "no engine profile 'sglang' on this node"
    assert statuses["configured"].reason == "a provider node.yaml configures has this id"
    assert "meant for node 'node-2'" in statuses["o"].reason
    assert statuses["d"].reason == "the instance id is listed twice"
    assert h.applied[-1] == ()


def test_gpu_slots_are_held_and_counted() -> None:
    """A GPU profile takes the node's one slot; a second instance of it is refused; ``{gpu}`` is the slot."""
    h = Harness()
    statuses = h.converge(desired("g1", profile="gpu"), desired("g2", profile="gpu"))
    assert statuses["g1"].state == pb.INSTANCE_STATE_PENDING
    assert "needs 1 GPU slots; 0 of 1 are free" in statuses["g2"].reason
    assert h.instances.free_gpus() == 0
    (provider,) = h.applied[-1]
    assert provider.launch is not None and provider.launch.env == {"CUDA": "0"}
    profiles = {p.name: p for p in h.instances.profile_specs()}
    assert profiles["gpu"].free_ports == 9 and profiles["mock"].free_ports == 2
    assert profiles["mock"].parameters[0].has_bounds and profiles["mock"].parameters[0].maximum == 1000


def test_an_engine_that_exits_unasked_is_drift_until_it_is_ready_again() -> None:
    """Crashed and restarting: DRIFTED (reported once per change); ready again: READY."""
    h = Harness()
    h.converge(desired("a"))
    h.engines.states["a"] = EngineState.READY
    assert h.instances.engine_changed("a") is not None
    h.engines.states["a"] = EngineState.CRASHED
    drifted = h.instances.engine_changed("a")
    assert drifted is not None and drifted.state == pb.INSTANCE_STATE_DRIFTED
    h.engines.states["a"] = EngineState.STARTING
    assert h.instances.engine_changed("a") is None  # still drifted, nothing new to say
    h.engines.states["a"] = EngineState.READY
    ready = h.instances.engine_changed("a")
    assert ready is not None and ready.state == pb.INSTANCE_STATE_READY


def test_a_node_without_profiles_refuses_every_instance() -> None:
    """A Node whose node.yaml declares no engines answers REFUSED, saying why, and starts nothing."""
    from twisted_iop.node.runtime import NodeRuntime

    config = parse_node_config(
        {"node_id": "node-1", "providers": [{"provider_id": "m", "kind": "mock", "models": ["x"]}]}
    )
    runtime = NodeRuntime(config, Clock())
    response = runtime.answer_instances_request(pb.NodeInstancesRequest(instances=[desired("a")]))
    (status,) = response.instances
    assert status.state == pb.INSTANCE_STATE_REFUSED
    assert status.reason == "this node declares no engine profiles (no engines: in node.yaml)"
    assert [p.provider_id for p in runtime.providers] == ["m"]


def test_the_hello_announces_profiles_and_gpu_slots() -> None:
    """The Node's hello names its profiles with their bounds and free ports, and its GPU slots."""
    from twisted_iop.node.edge_link import EdgeLink
    from twisted_iop.node.runtime import NodeRuntime

    runtime = NodeRuntime(parse_node_config({"node_id": "node-1", "gpus": 1}, {}), Clock())
    runtime.instances = Harness().instances  # the mock and gpu profiles, on a node of 1 GPU slot
    hello = EdgeLink(runtime.config, runtime, Clock()).hello()
    assert [p.name for p in hello.profiles] == ["mock", "gpu"]
    assert hello.profiles[0].free_ports == 2 and hello.profiles[1].gpus_per_instance == 1
    assert (hello.gpus, hello.free_gpus) == (1, 1)


def test_a_parameter_with_one_bound_is_announced_with_finite_bounds() -> None:
    """Only ``min`` declared: the wire's maximum is the largest finite double (JSON has no infinity)."""
    import sys

    data = {
        "node_id": "node-1",
        "engines": [
            {
                "name": "p",
                "kind": "openai",
                "launch": {"command": ["iop-mock-provider", "{n}"]},
                "ports": [1000, 1001],
                "parameters": {"n": {"type": "number", "min": 0.5}, "flag": {"type": "bool", "default": False}},
            }
        ],
    }
    config = parse_node_config(data, {"PATH": str(Path(MOCK_PROVIDER).parent)})
    (profile,) = NodeInstances(config, Clock(), FakeEngines(), lambda providers: None).profile_specs()
    number, flag = profile.parameters
    assert number.has_bounds and number.minimum == 0.5 and number.maximum == sys.float_info.max
    assert not number.has_default
    assert not flag.has_bounds and flag.has_default and flag.default == "false" and flag.type == "bool"
