"""Peers for tests: the scripted Edge a Control Plane test talks to, a
scripted Control Plane and Node for Edge tests, and typed fakes of the
registries' peer Protocols.

:class:`ScriptedEdge` enrolls, answers status and commands as told, relays
events, reconnects and misbehaves on purpose. :class:`FakeControlPlane` is
the Control Plane end of the edge wire, :class:`RawNode` a hand-driven Node
connection. :class:`HeldEdgePeer` and :class:`AnsweringEdgePeer` implement
``controlplane.registry.EdgePeer``, :class:`FakeNodePeer` implements
``edge.registry.NodePeer``: they subclass those Protocols, so mypy fails
when a fake drifts from the interface it stands in for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional, cast

from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint, connectProtocol
from twisted.internet.interfaces import IReactorTime, ITransport
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot, checked_snapshot
from twisted_iop.controlplane.wires.edge_peer import EdgePeer, StatusListener
from twisted_iop.edge.nodes.registry import NodePeer
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol
from twisted_iop.wire.settings import PeerSettings
from twisted_iop.wire.status_totals import with_totals


class TransportAccess:
    """For test protocols: :attr:`tcp`, the connection's transport once it is made."""

    transport: Optional[ITransport]

    @property
    def tcp(self) -> Any:
        """The transport (a test fails if there is none yet); ``Any``, as tests
        call what the TCP or TLS transport has beyond ``ITransport``
        (``getHandle``, ``pauseProducing``, ``abortConnection``)."""
        assert self.transport is not None, "not connected"
        return self.transport


CATALOG = [
    pb.CommandSpec(name="node.drain", description="Stop new leases on a node", target_kind="node"),
    pb.CommandSpec(name="node.undrain", description="Resume new leases on a node", target_kind="node"),
    pb.CommandSpec(name="edge.diagnostics", description="Versions and counters", target_kind=""),
]


def snapshot(edge_id: str, nodes: int = 2, capacity: int = 4, totals: bool = False) -> pb.EdgeStatusResponse:
    """A status response with ``nodes`` connected nodes, one provider each;
    with ``totals``, it carries its totals as a current Edge sends them
    (without, it is what an older Edge sends)."""
    response = pb.EdgeStatusResponse(edge_id=edge_id, generated_at_ms=1_700_000_000_000)
    for i in range(nodes):
        node = response.nodes.add(node_id=f"node-{i + 1}", connected=True, connected_since_ms=1_700_000_000_000)
        node.providers.add(
            provider_id=f"mock-{i + 1}",
            kind="mock",
            models=["llama-3-8b"],
            status=pb.PROVIDER_STATUS_AVAILABLE,
            health=pb.PROVIDER_HEALTH_HEALTHY,
            capacity=capacity,
            in_flight=1,
            queued=2,
            long_context_capacity=1,
            long_context_in_flight=0,
            long_context_queued=1,
        )
    return with_totals(response) if totals else response


def set_engine(
    provider: pb.ProviderSnapshot,
    *,
    running: int = 1,
    waiting: int = 3,
    kv_cache_usage: float = 0.42,
    parallel: int = 1,
    age_ms: int = 1200,
    tokens_per_second: float = 37.5,
    prompt_tokens: int = 1200,
    completion_tokens: int = 3400,
    estimated_prompt_tokens: int = 0,
    estimated_completion_tokens: int = 0,
    saturated: bool = False,
    cooling_down: bool = False,
) -> pb.ProviderSnapshot:
    """Give ``provider`` what an Edge reports of its engine (a reading of
    its load, its tokens, saturation and cool-down), as set; returns it."""
    provider.engine.CopyFrom(
        pb.EngineLoad(
            known=True,
            running=running,
            waiting=waiting,
            kv_cache_usage=kv_cache_usage,
            parallel=parallel,
            age_ms=age_ms,
        )
    )
    provider.tokens_per_second = tokens_per_second
    provider.prompt_tokens = prompt_tokens
    provider.completion_tokens = completion_tokens
    provider.estimated_prompt_tokens = estimated_prompt_tokens
    provider.estimated_completion_tokens = estimated_completion_tokens
    provider.saturated = saturated
    provider.cooling_down = cooling_down
    return provider


def set_launch(
    provider: pb.ProviderSnapshot,
    *,
    state: int = pb.ENGINE_STATE_CRASHED,
    reason: str = "exited with code 1",
    restarts: int = 2,
    next_try_at_ms: int = 1_700_000_004_000,
    since_ms: int = 1_700_000_000_000,
    pid: int = 0,
) -> pb.ProviderSnapshot:
    """Give ``provider`` the state of an engine its Node launches (crashed, by default), as set; returns it."""
    provider.launch.CopyFrom(
        pb.EngineLaunch(
            state=state,  # type: ignore[arg-type]  # the stubs want the enum type; the state is its int value
            reason=reason,
            restarts=restarts,
            next_try_at_ms=next_try_at_ms,
            since_ms=since_ms,
            pid=pid,
        )
    )
    return provider


def keep_status(
    registry: EdgeRegistry, edge_id: str, token: int, response: pb.EdgeStatusResponse, at: float = 0.0
) -> Optional[StatusSnapshot]:
    """Keep ``response`` as connection ``token``'s answer, as the gateway does
    (checked, counts shared); the snapshot, or None if ``token`` is stale."""
    kept = checked_snapshot(response, at, share_counts=registry.shared.counts)
    return kept if registry.record_status(edge_id, token, kept) else None


class ScriptedEdge(TransportAccess, FramedPeerProtocol):
    """The edge side of one connection, behaving as its attributes say."""

    def __init__(
        self, edge_id: str, settings: PeerSettings = PeerSettings(), reactor: Reactor = global_reactor
    ) -> None:
        super().__init__(reactor, settings)
        self.edge_id = edge_id
        self.credential = ""
        self.protocol_major = PROTOCOL_MAJOR
        self.catalog = list(CATALOG)
        #: The labels its hello announces (what selectors match).
        self.labels: dict[str, str] = {"site": "test"}
        self.software_version = "test-edge"
        #: Returns the status to answer with, or None to stay silent.
        self.status: Callable[[], Optional[pb.EdgeStatusResponse]] = lambda: snapshot(self.edge_id)
        #: "succeed", "fail", "reject", "silent", "hold" (kept in
        #: ``held_commands`` to answer later with :meth:`answer_held`) or "disconnect".
        self.command_behaviour = "succeed"
        self.held_commands: list[tuple[int, pb.EdgeCommandRequest]] = []
        self.commands_seen: list[pb.EdgeCommandRequest] = []
        self.status_requests = 0
        #: With hold_status, status requests wait here until release_status().
        self.hold_status = False
        self.held: list[int] = []
        self.lost: Deferred[None] = Deferred()
        self.errors: list[pb.Error] = []
        #: When its events happened, by its clock (ms): a fixed time unless told.
        self.event_time_ms: Callable[[], int] = lambda: 1_700_000_000_000

    def hello(self) -> Deferred[pb.EdgeHelloResponse]:
        """Send hello; fire with the Control Plane's answer."""
        request = pb.EdgeHelloRequest(
            edge_id=self.edge_id,
            protocol_major=self.protocol_major,
            protocol_minor=PROTOCOL_MINOR,
            software_version=self.software_version,
            credential=self.credential,
            labels=self.labels,
            commands=self.catalog,
        )
        d = self.request("edge_hello_request", request, 5)
        return d.addCallback(lambda env: env.edge_hello_response)

    def event(self, kind: str, node_id: str = "", command_id: str = "", message: str = "") -> None:
        """Relay one event, stamped with :attr:`event_time_ms`."""
        self.send(
            "edge_event",
            pb.EdgeEvent(
                kind=kind, node_id=node_id, command_id=command_id, message=message, occurred_at_ms=self.event_time_ms()
            ),
        )

    def release_status(self) -> None:
        """Answer every held status request."""
        held, self.held = self.held, []
        for rid in held:
            self.send("edge_status_response", snapshot(self.edge_id), rid)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        rid = envelope.request_id
        if body == "edge_status_request":
            self.status_requests += 1
            if self.hold_status:
                self.held.append(rid)
                return
            answer = self.status()
            if answer is not None:
                self.send("edge_status_response", answer, rid)
        elif body == "edge_command_request":
            command = envelope.edge_command_request
            self.commands_seen.append(command)
            behaviour = self.command_behaviour
            if behaviour == "silent":
                return
            if behaviour == "hold":
                self.held_commands.append((rid, command))
                return
            if behaviour == "disconnect":
                self.tcp.loseConnection()
                return
            self.event("command.accepted", command_id=command.command_id)
            self.event("command.started", command_id=command.command_id)
            outcome = {
                "succeed": pb.COMMAND_OUTCOME_SUCCEEDED,
                "fail": pb.COMMAND_OUTCOME_FAILED,
                "reject": pb.COMMAND_OUTCOME_REJECTED,
            }[behaviour]
            self.send(
                "edge_command_response",
                pb.EdgeCommandResponse(
                    command_id=command.command_id,
                    outcome=outcome,
                    reason="" if behaviour == "succeed" else f"told to {behaviour}",
                    result={"target": command.target},
                ),
                rid,
            )
        elif body == "error":
            self.errors.append(envelope.error)

    def answer_held(
        self,
        outcome: pb.CommandOutcome = pb.COMMAND_OUTCOME_SUCCEEDED,
        reason: str = "",
        command_id: str = "",
        **result: str,
    ) -> None:
        """Answer the oldest held command now (late, if its deadline has passed),
        naming ``command_id`` instead of its own if given."""
        rid, command = self.held_commands.pop(0)
        response = pb.EdgeCommandResponse(
            command_id=command_id or command.command_id, outcome=outcome, reason=reason, result=result
        )
        self.send("edge_command_response", response, rid)

    def peer_disconnected(self, reason: Failure) -> None:
        self.lost.callback(None)


async def connect_edge(
    port: int, edge_id: str, hello: bool = True, reactor: Reactor = global_reactor, **attributes: Any
) -> tuple[ScriptedEdge, Optional[pb.EdgeHelloResponse]]:
    """Connect a scripted edge to ``127.0.0.1:port`` and (optionally) say hello."""
    edge = ScriptedEdge(edge_id, reactor=reactor)
    for name, value in attributes.items():
        setattr(edge, name, value)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), edge)
    response = await edge.hello() if hello else None
    return edge, response


# -- the Control Plane and Node ends of the wires ---------------------------------


class FakeControlPlane(TransportAccess, FramedPeerProtocol):
    """A tiny Control Plane end of the Edge wire, driven by the test.

    It answers hello with ``hello_response`` and records every other
    envelope (events, unsolicited messages) in ``received``.
    """

    def __init__(self, clock: IReactorTime, hello_response: Optional[pb.EdgeHelloResponse] = None) -> None:
        super().__init__(clock, PeerSettings())
        self.hello_response = hello_response or pb.EdgeHelloResponse(accepted=True, server_version="fake")
        self.hellos: list[pb.EdgeHelloRequest] = []
        self.received: list[pb.Envelope] = []
        self.lost: Deferred[None] = Deferred()
        self.hello_seen: Deferred[pb.EdgeHelloRequest] = Deferred()

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """Answer hello; record the rest."""
        if body == "edge_hello_request":
            self.hellos.append(envelope.edge_hello_request)
            self.send("edge_hello_response", self.hello_response, envelope.request_id)
            if not self.hello_seen.called:
                self.hello_seen.callback(envelope.edge_hello_request)
            return
        self.received.append(envelope)

    def peer_disconnected(self, reason: Any) -> None:
        """Fire ``lost``."""
        if not self.lost.called:
            self.lost.callback(None)

    def events(self) -> list[pb.EdgeEvent]:
        """Every relayed event so far, in arrival order."""
        return [e.edge_event for e in self.received if e.WhichOneof("body") == "edge_event"]

    def status(self) -> Deferred[pb.EdgeStatusResponse]:
        """Ask the Edge for a snapshot."""
        d = self.request("edge_status_request", pb.EdgeStatusRequest(), timeout=5)
        return d.addCallback(lambda envelope: envelope.edge_status_response)

    def command(
        self, name: str, target: str = "", command_id: str = "op-1", **arguments: str
    ) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command; fire with the Edge's answer."""
        request = pb.EdgeCommandRequest(
            command_id=command_id, name=name, target=target, arguments=arguments, timeout_ms=5000
        )
        d = self.request("edge_command_request", request, timeout=5)
        return d.addCallback(lambda envelope: envelope.edge_command_response)

    def deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Send the Edge its whole desired set; fire with its answer."""
        d = self.request("edge_deployments_request", request, timeout=5)
        return d.addCallback(lambda envelope: envelope.edge_deployments_response)


class FakeControlPlaneServer:
    """Listens on a free port; keeps the newest Edge connection."""

    def __init__(self) -> None:
        self.connections: list[FakeControlPlane] = []
        self.port: Any = None

    async def start(self) -> str:
        """Listen; return ``127.0.0.1:PORT``."""
        server = self

        class _Factory(Factory):
            def buildProtocol(self, addr: Any) -> FakeControlPlane:
                protocol = FakeControlPlane(global_reactor)
                server.connections.append(protocol)
                return protocol

        self.port = await TCP4ServerEndpoint(global_reactor, 0, interface="127.0.0.1").listen(_Factory())
        return f"127.0.0.1:{self.port.getHost().port}"

    @property
    def current(self) -> FakeControlPlane:
        """The newest Edge connection."""
        return self.connections[-1]

    def events(self) -> list[pb.EdgeEvent]:
        """Every event relayed over every connection."""
        return [e for c in self.connections for e in c.events()]

    async def stop(self) -> None:
        """Stop listening and drop connections."""
        for c in self.connections:
            c.close()
        await self.port.stopListening()


class RawNode(TransportAccess, FramedPeerProtocol):
    """A hand-driven Node connection (for duplicate and rejected connections)."""

    def __init__(self) -> None:
        super().__init__(global_reactor, PeerSettings())
        self.lost: Deferred[None] = Deferred()
        self.errors: list[pb.Error] = []

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """Keep the error frames the Edge sends before closing."""
        if body == "error":
            self.errors.append(envelope.error)

    def peer_disconnected(self, reason: Any) -> None:
        """Fire ``lost``."""
        self.lost.callback(None)

    def hello(self, node_id: str, credential: str = "") -> Deferred[pb.NodeHelloResponse]:
        """Say hello; fire with the Edge's answer."""
        hello = pb.NodeHelloRequest(node_id=node_id, protocol_major=PROTOCOL_MAJOR, credential=credential)
        return self.request("node_hello_request", hello, timeout=5).addCallback(
            lambda envelope: envelope.node_hello_response
        )

    def ready(self, *provider_ids: str) -> None:
        """Send NodeReady with healthy providers."""
        reports = [pb.ProviderHealthReport(provider_id=p, health=pb.PROVIDER_HEALTH_HEALTHY) for p in provider_ids]
        self.send("node_ready", pb.NodeReady(providers=reports))


async def raw_node(port: int) -> RawNode:
    """Connect a :class:`RawNode` to an Edge's node port."""
    node = RawNode()
    await connectProtocol(TCP4ClientEndpoint(global_reactor, "127.0.0.1", port), node)
    return node


# -- fakes of the registries' peers (no connection) -----------------------------------


class HeldEdgePeer(EdgePeer):
    """A peer whose status answers the test releases by hand."""

    def __init__(self) -> None:
        self.last_received = 0.0
        self.requests: list[Deferred[pb.EdgeStatusResponse]] = []
        self.deadlines: list[bool] = []
        self.cancelled = 0
        self.commands: list[tuple[pb.EdgeCommandRequest, Deferred[pb.EdgeCommandResponse]]] = []
        self.commands_cancelled = 0
        self.disconnects: list[pb.ErrorCode] = []
        self.deployments: list[tuple[pb.EdgeDeploymentsRequest, Deferred[pb.EdgeDeploymentsResponse]]] = []

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Keep the ask as a Deferred in ``requests`` (its request id is its index + 1)."""

        def cancel(d: Deferred[Any]) -> None:
            self.cancelled += 1

        def failed(failure: Failure) -> None:
            listener.status_answered(None, cast(Exception, failure.value))

        d: Deferred[pb.EdgeStatusResponse] = Deferred(cancel)
        d.addCallbacks(lambda response: listener.status_answered(response, None), failed)
        self.requests.append(d)
        self.deadlines.append(own_deadline)
        return len(self.requests)

    def cancel_status(self, request_id: int) -> None:
        """Cancel the ask's Deferred (the listener hears CancelledError)."""
        self.requests[request_id - 1].cancel()

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        def cancel(d: Deferred[Any]) -> None:
            self.commands_cancelled += 1

        d: Deferred[pb.EdgeCommandResponse] = Deferred(cancel)
        self.commands.append((request, d))
        return d

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Keep the desired set in ``deployments``; its Deferred waits to be answered."""
        d: Deferred[pb.EdgeDeploymentsResponse] = Deferred()
        self.deployments.append((request, d))
        return d

    def answer(self, index: int = -1, outcome: int = pb.COMMAND_OUTCOME_SUCCEEDED, command_id: str = "") -> None:
        """Answer command ``index`` (its own command_id unless one is given; any
        ``outcome`` number, unknown ones included)."""
        request, d = self.commands[index]
        d.callback(
            pb.EdgeCommandResponse(
                command_id=command_id or request.command_id,
                outcome=cast(Any, outcome),
                reason="edge says",
                result={"k": "v"},
            )
        )

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Like a socket that does not close: the requests stay pending."""
        self.disconnects.append(code)


class AnsweringEdgePeer(EdgePeer):
    """A peer that answers status and commands at once (status: what ``status()`` makes)."""

    def __init__(self, edge_id: str) -> None:
        self.edge_id = edge_id
        self.status: Callable[[], pb.EdgeStatusResponse] = lambda: snapshot(edge_id)
        self.last_received = 0.0
        self.commands: list[pb.EdgeCommandRequest] = []
        self.status_requests = 0
        self.disconnects: list[pb.ErrorCode] = []
        self.deployment_sets: list[pb.EdgeDeploymentsRequest] = []

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Answer at once."""
        self.status_requests += 1
        listener.status_answered(self.status(), None)
        return 0

    def cancel_status(self, request_id: int) -> None:
        """Nothing waits: every ask was answered at once."""

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        self.commands.append(request)
        return succeed(pb.EdgeCommandResponse(command_id=request.command_id, outcome=pb.COMMAND_OUTCOME_SUCCEEDED))

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Take the set at once (nothing runs): record it and acknowledge its version."""
        self.deployment_sets.append(request)
        return succeed(pb.EdgeDeploymentsResponse(observed_version=request.version))

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Record the close."""
        self.disconnects.append(code)


class FakeNodePeer(NodePeer):
    """A NodePeer that records closes and answers probes when told to."""

    def __init__(self) -> None:
        self.closed = 0
        self.probes: list[Deferred[pb.NodeProbeResponse]] = []
        self.answer: Optional[pb.NodeProbeResponse] = None
        #: Provider commands sent, each with the Deferred the test answers.
        self.provider_commands: list[
            tuple[pb.NodeProviderCommandRequest, Deferred[pb.NodeProviderCommandResponse]]
        ] = []
        #: Desired sets sent, each with the Deferred the test answers.
        self.instance_requests: list[tuple[pb.NodeInstancesRequest, Deferred[pb.NodeInstancesResponse]]] = []

    def close(self) -> None:
        """Record the close."""
        self.closed += 1

    def supersede(self) -> None:
        """Record the close (a supersede is a close with a reason)."""
        self.closed += 1

    def probe(self, timeout: float) -> Deferred[pb.NodeProbeResponse]:
        """Answer at once with ``answer`` if set, else wait for the test."""
        d: Deferred[pb.NodeProbeResponse] = Deferred()
        if self.answer is not None:
            d.callback(self.answer)
        else:
            self.probes.append(d)
        return d

    def provider_command(
        self, request: pb.NodeProviderCommandRequest, timeout: float
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Record the command; the test answers its Deferred."""
        d: Deferred[pb.NodeProviderCommandResponse] = Deferred()
        self.provider_commands.append((request, d))
        return d

    def instances(self, request: pb.NodeInstancesRequest, timeout: float) -> Deferred[pb.NodeInstancesResponse]:
        """Record the desired set; the test answers its Deferred."""
        d: Deferred[pb.NodeInstancesResponse] = Deferred()
        self.instance_requests.append((request, d))
        return d


class RecordingNodePeer(FakeNodePeer):
    """A ready Node connection that records every envelope the Edge sends it."""

    closing = False

    def __init__(self) -> None:
        super().__init__()
        #: (body, message) of each envelope sent, in order.
        self.sent: list[tuple[str, Any]] = []

    def send(self, body: str, message: Any, request_id: int = 0) -> None:
        """Record one envelope."""
        self.sent.append((body, message))

    @property
    def inference_requests(self) -> list[pb.InferenceRequest]:
        """The inference requests sent here, in order."""
        return [message for body, message in self.sent if body == "inference_request"]
