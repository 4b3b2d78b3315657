"""Deployments for tests: an Edge and a Node whose providers all come from deployments.

:func:`start_site` starts such a pair dialing a real Control Plane (the
Control Plane's deployment tests and ``iopctl deploy``'s).

The Node declares the mock engine profile of issue 30 (``iop-mock-provider``
launched on one free port of its own, ``tokens_per_second`` a bounded int);
the Edge's ``nodes:`` entry lists no providers; a fake Control Plane sends
desired sets over the real Edge wire.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import attrs
import yaml
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from twisted_iop.controlplane.deployments.service import DeploymentService
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, HttpSettings, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.rollouts.service import RolloutService
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.deployments.spec import spec_hash
from twisted_iop.edge.tap import EdgeService
from twisted_iop.node.tap import NodeService
from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.launch import FAST_READINESS, FAST_RESTART, free_port
from twisted_iop.testing.harness import (
    MOCK_PROVIDER,
    ControlPlaneHarness,
    eventually,
    start_edge,
    start_node,
    stop,
)
from twisted_iop.testing.wires.peers import CATALOG, AnsweringEdgePeer, FakeControlPlane, FakeControlPlaneServer
from twisted_iop.wire import control_pb2 as pb

#: Bound on a launched engine (a Python process) becoming ready on this machine.
READY_SECONDS = 30.0


def mock_profile(port: int, name: str = "mock") -> dict[str, Any]:
    """The issue's mock engine profile on ports ``[port, port]``, with quick readiness and restarts."""
    return {
        "name": name,
        "kind": "openai",
        "launch": {
            "command": [
                MOCK_PROVIDER,
                "--listen",
                "tcp:{port}:interface=127.0.0.1",
                "--models",
                "{model}",
                "--tokens-per-second",
                "{tokens_per_second}",
            ],
            "readiness": {"path": "/v1/models", **FAST_READINESS},
            "restart": dict(FAST_RESTART),
            "stop": {"signal": "TERM", "timeout_seconds": 5},
        },
        "ports": [port, port],
        "parameters": {"tokens_per_second": {"type": "int", "min": 1, "max": 1000, "default": 50}},
    }


def desired(
    instance_id: str = "chat-1",
    tokens_per_second: Optional[int] = 100,
    deployment: str = "chat",
    generation: int = 1,
    *,
    profile: str = "mock",
    model: str = MODEL,
    parameters: Optional[dict[str, str]] = None,
    capacity: int = 4,
) -> pb.DesiredInstance:
    """One desired instance on node-1: of the mock profile serving the test model with capacity 4
    unless told otherwise (``parameters`` replaces ``tokens_per_second``)."""
    if parameters is None:
        parameters = {"tokens_per_second": str(tokens_per_second)} if tokens_per_second is not None else {}
    return pb.DesiredInstance(
        instance_id=instance_id,
        deployment=deployment,
        generation=generation,
        node_id="node-1",
        profile=profile,
        model=model,
        parameters=parameters,
        capacity=capacity,
        spec_hash=spec_hash(profile, model, parameters, capacity),
    )


@attrs.define
class DeploymentFleet:
    """A fake Control Plane, an Edge and node-1 (profiles only)."""

    cp: FakeControlPlaneServer
    edge: EdgeService
    node: NodeService
    base: str
    version: int = 0

    @property
    def link(self) -> FakeControlPlane:
        """The Edge's current connection at the fake Control Plane."""
        return self.cp.current

    async def send(self, *instances: pb.DesiredInstance) -> pb.EdgeDeploymentsResponse:
        """Send the whole desired set (the next version) over the Edge wire; the Edge's answer."""
        self.version += 1
        request = pb.EdgeDeploymentsRequest(version=self.version, instances=list(instances))
        response: pb.EdgeDeploymentsResponse = await self.link.deployments(request)
        return response

    def status(self, instance_id: str = "chat-1") -> Optional[pb.InstanceStatus]:
        """What the Edge reports of an instance now."""
        return next((s for s in self.edge.deployments.statuses() if s.instance_id == instance_id), None)

    def state(self, instance_id: str = "chat-1") -> str:
        """The instance's state as the Edge reports it ("none" if it reports none)."""
        status = self.status(instance_id)
        return pb.InstanceState.Name(status.state) if status is not None else "none"

    def pid(self, instance_id: str = "chat-1") -> int:
        """The pid of the instance's engine (0 if none runs), from the Node's supervisor."""
        engine = self.node.engines.engines.get(instance_id)
        return engine.pid or 0 if engine is not None else 0

    async def ready(self, instance_id: str = "chat-1") -> None:
        """Wait until the Edge reports the instance READY and its provider takes work."""
        await eventually(
            lambda: (
                self.state(instance_id) == "INSTANCE_STATE_READY"
                and self.edge.registry.provider_takes_work("node-1", instance_id)
            ),
            timeout=READY_SECONDS,
            message=f"instance {instance_id} ready at the Edge",
        )

    async def restart_node(self) -> None:
        """Stop the Node (its engines stop with it) and start it again from the same node.yaml."""
        path = self.node.config.source_path
        assert path is not None
        await stop(self.node)
        self.node = start_node(path)

    async def restart_edge(self) -> None:
        """Stop the Edge and start a new one from the same edge.yaml on the same node port (the
        Node reconnects to it); wait until the Node is ready at the new Edge and it enrolled."""
        port = self.edge.node_port
        path = Path(self.edge.config.source_path or "")
        data = yaml.safe_load(path.read_text())
        data["node_server"]["listen"] = f"tcp:{port}:interface=127.0.0.1"
        await stop(self.edge)
        enrolled = len(self.cp.connections)
        self.edge = await start_edge(write_yaml(path, data))
        await self.edge.inference_server.bound()
        self.base = f"http://127.0.0.1:{self.edge.inference_port}"
        edge = self.edge
        await eventually(lambda: edge.registry.is_ready("node-1"), timeout=15, message="node-1 back at the new Edge")
        await eventually(
            lambda: len(self.cp.connections) > enrolled and self.cp.current.hellos,
            timeout=10,
            message="the new Edge enrolled",
        )

    async def stop(self) -> None:
        """Stop the Node, the Edge and the fake Control Plane."""
        await stop(self.node, self.edge)
        await self.cp.stop()


async def start_deployment_fleet(
    tmp_path: Path, hold: bool = False, profiles: Optional[list[dict[str, Any]]] = None
) -> DeploymentFleet:
    """Start the fake Control Plane, an Edge whose node-1 lists no providers, and node-1 with the
    mock profile (or ``profiles``) and no providers; wait until the node is ready and the Edge enrolled."""
    cp = FakeControlPlaneServer()
    address = await cp.start()
    edge_config = gateway_edge_yaml(
        cp_address=address, second_node=False, capacity=4, inference={"queue_timeout_seconds": 60}
    )
    del edge_config["nodes"][0]["providers"]
    if hold:
        edge_config["deployments"] = {"hold": True}
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
    await edge.inference_server.bound()
    node_config = gateway_node_yaml("node-1", edge.node_port, {})
    del node_config["providers"]
    node_config["engines"] = profiles if profiles is not None else [mock_profile(free_port())]
    node_config["state_directory"] = str(tmp_path / "state")
    node = start_node(write_yaml(tmp_path / "node.yaml", node_config))
    fleet = DeploymentFleet(cp, edge, node, f"http://127.0.0.1:{edge.inference_port}")
    await eventually(lambda: edge.registry.is_ready("node-1"), timeout=10, message="node-1 ready at the Edge")
    await eventually(lambda: cp.connections and cp.current.hellos, timeout=10, message="the Edge enrolled")
    return fleet


@attrs.define
class DeploymentSite:
    """An Edge enrolled at a real Control Plane, and its node-1 (the mock profile only)."""

    edge: EdgeService
    node: NodeService

    @property
    def base(self) -> str:
        """The Edge's inference API."""
        return f"http://127.0.0.1:{self.edge.inference_port}"

    def pid(self, instance_id: str = "chat-1") -> int:
        """The pid of the instance's engine on the Node (0: none runs)."""
        engines = self.node.engines
        engine = engines.engines.get(instance_id) if engines is not None else None
        return (engine.pid or 0) if engine is not None else 0

    def counts(self) -> tuple[int, int, int]:
        """The Node's instance starts, restarts and stops."""
        instances = self.node.runtime.instances
        assert instances is not None
        return (instances.starts, instances.restarts, instances.stops)


async def start_site(tmp_path: Path, cp: ControlPlaneHarness, edge_id: str, site: str) -> DeploymentSite:
    """Start an Edge ``edge_id`` labelled site=``site`` dialing ``cp``, whose node-1 lists no providers,
    and node-1 declaring the mock profile; wait until the node is ready at the Edge."""
    directory = tmp_path / edge_id
    directory.mkdir()
    config = gateway_edge_yaml(cp_address=cp.edge_wire_address, second_node=False, capacity=4)
    config["control_plane"]["edge_id"] = edge_id
    config["control_plane"]["labels"] = {"site": site}
    del config["nodes"][0]["providers"]
    edge = await start_edge(write_yaml(directory / "edge.yaml", config))
    await edge.inference_server.bound()
    node_config = gateway_node_yaml("node-1", edge.node_port, {})
    del node_config["providers"]
    node_config["engines"] = [mock_profile(free_port())]
    node_config["state_directory"] = str(directory / "state")
    node = start_node(write_yaml(directory / "node.yaml", node_config))
    await eventually(lambda: edge.registry.is_ready("node-1"), timeout=10, message=f"node-1 ready at {edge_id}")
    return DeploymentSite(edge, node)


#: The catalog of an Edge that takes desired sets (it announces edge.hold).
DEPLOYING_CATALOG = (*CATALOG, pb.CommandSpec(name="edge.hold", description="hold changes"))


class SimulatedEdge(AnsweringEdgePeer):
    """An Edge as the Control Plane's deployment service sees it, without sockets (HTTP tests and
    bench/deployments.py): ``nodes`` nodes declaring the mock profile (tokens_per_second 1..1000);
    it takes every desired set at once and reports its instances ready, or refused when a value
    is out of bounds."""

    def __init__(self, edge_id: str, nodes: int = 1) -> None:
        super().__init__(edge_id)
        self.nodes = nodes
        self.version = 0
        self.instances: list[pb.DesiredInstance] = []
        self.held = False
        self.status = self._status

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Take the set (an older version is ignored) and answer what runs."""
        self.deployment_sets.append(request)
        if request.version >= self.version:
            self.version = request.version
            self.instances = list(request.instances)
        return succeed(
            pb.EdgeDeploymentsResponse(observed_version=self.version, instances=self._running(), held=self.held)
        )

    def _running(self) -> list[pb.InstanceStatus]:
        out = []
        for instance in self.instances:
            tps = int(instance.parameters.get("tokens_per_second", "50"))
            refused = not 1 <= tps <= 1000
            out.append(
                pb.InstanceStatus(
                    instance_id=instance.instance_id,
                    deployment=instance.deployment,
                    generation=instance.generation,
                    node_id=instance.node_id,
                    spec_hash="" if refused else instance.spec_hash,
                    state=pb.INSTANCE_STATE_REFUSED if refused else pb.INSTANCE_STATE_READY,
                    reason="parameter tokens_per_second: above its maximum 1000" if refused else "",
                )
            )
        return out

    def _status(self) -> pb.EdgeStatusResponse:
        response = pb.EdgeStatusResponse(edge_id=self.edge_id, generated_at_ms=1_700_000_000_000)
        for n in range(1, self.nodes + 1):
            node = response.nodes.add(node_id=f"node-{n}", connected=True, connected_since_ms=1_700_000_000_000)
            profile = node.profiles.add(name="mock", kind="openai", free_ports=10)
            profile.parameters.add(
                name="tokens_per_second", type="int", has_bounds=True, minimum=1, maximum=1000, has_default=True
            )
        response.observed_deployments_version = self.version
        response.instances.extend(self._running())
        response.held = self.held
        return response


#: The tokens of :class:`SimulatedFleet`'s app: alice, an operator, and victor, a viewer.
OPERATOR = "operator-secret"
VIEWER = "viewer-secret"


class SimulatedFleet:
    """The Control Plane's deployments without sockets (the real Klein app through StubTreq, the real
    services and registry on a Clock, :class:`SimulatedEdge` peers): a registry, a deployment service on a clock with a store, and the app with operator and viewer tokens."""

    def __init__(self, store: Optional[MemoryStore] = None) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.registry = EdgeRegistry(self.clock)
        self.gateway = EdgeGateway(self.registry, self.clock)
        self.store = store if store is not None else MemoryStore()
        self.rollouts = RolloutService(self.registry, self.gateway, self.clock)
        self.deployments = DeploymentService(
            self.registry, self.gateway, self.store, self.rollouts.event_buffer, self.clock
        )
        self.deployments.startService()
        tokens = ApiTokens(
            (
                ApiToken("alice", "operator", token_digest(OPERATOR.encode())),
                ApiToken("victor", "viewer", token_digest(VIEWER.encode())),
            )
        )
        api = ControlPlaneHttp(
            self.registry,
            self.gateway,
            self.clock,
            ListenerReadiness([]),
            HttpSettings(tokens=tokens),
            rollouts=self.rollouts,
            deployments=self.deployments,
        )
        self.treq = StubTreq(api.app.resource())
        self.edges: dict[str, SimulatedEdge] = {}

    def edge(self, edge_id: str, site: str) -> SimulatedEdge:
        """Connect a simulated edge labelled site=``site``."""
        peer = self.edges[edge_id] = SimulatedEdge(edge_id)
        hello = EdgeHello(
            labels={"site": site}, software_version="t", protocol_version="1.0", commands=DEPLOYING_CATALOG
        )
        self.registry.connect(edge_id, peer, hello)
        return peer

    async def call(
        self, method: str, path: str, body: Optional[dict[str, Any]] = None, token: str = OPERATOR
    ) -> tuple[int, Any]:
        """One request; the status code and the JSON body."""
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        send = getattr(self.treq, method.lower())
        response = await send("http://cp" + path, headers=headers, data=data)
        return response.code, json.loads(await response.content())

    def stop(self) -> None:
        """Stop the service's timer."""
        self.deployments.stopService()
