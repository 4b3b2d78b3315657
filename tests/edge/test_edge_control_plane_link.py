"""The Edge's Control Plane link, dialled by its ClientService, against the real
Control Plane edge-wire protocol over iosim (no sockets, a MemoryReactorClock)."""

from __future__ import annotations

from typing import Any

from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.testing import MemoryReactorClock
from twisted.test import iosim

import twisted_iop
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.edge_wire import EdgeCredentials, EdgeWireFactory
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.control_plane_link import ControlPlaneLink
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_config, healthy, node_hello
from twisted_iop.testing.wires.peers import FakeControlPlane, FakeNodePeer
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.dialer import backoff_delay
from twisted_iop.wire.settings import PeerSettings

CP_PORT = 7443


class Edge:
    """An Edge's registry and link, dialled by its service on a memory reactor.

    The real Control Plane edge-wire factory listens on that reactor;
    :meth:`accept` completes the pending connection to it over iosim.
    """

    def __init__(
        self, credentials: EdgeCredentials = EdgeCredentials(), cp_settings: PeerSettings = PeerSettings(), **cp: Any
    ) -> None:
        self.reactor = MemoryReactorClock()
        config = edge_config(address=f"tcp:host=127.0.0.1:port={CP_PORT}", **cp)
        self.registry = NodeRegistry(config, self.reactor)
        self.status = StatusProvider(self.registry, self.reactor)
        self.commands = CommandRunner(self.registry, self.reactor)
        self.link = ControlPlaneLink(
            config.control_plane, self.registry, self.status, self.commands, self.reactor, rand=lambda: 1.0
        )
        self.cp_registry = EdgeRegistry(self.reactor)
        self.cp_factory = EdgeWireFactory(self.cp_registry, self.reactor, cp_settings, credentials)
        self.reactor.listenTCP(CP_PORT, self.cp_factory)
        self.connections = iosim.ConnectionCompleter(self.reactor)
        self.service = self.link.client_service(TCP4ClientEndpoint(self.reactor, "127.0.0.1", CP_PORT))
        self.service.startService()

    def accept(self) -> iosim.IOPump:
        """Complete the pending connection with the real Control Plane and exchange everything."""
        pump = self.connections.succeedOnce()
        assert pump is not None, "no connection attempt is pending"
        pump.flush()
        return pump

    def accept_fake(self, cp: FakeControlPlane) -> iosim.IOPump:
        """Complete the pending connection with a scripted Control Plane end instead."""
        _, _, factory, _, _ = self.reactor.tcpClients.pop(0)
        self.reactor.connectors.pop(0)
        client = factory.buildProtocol(None)
        pump: iosim.IOPump = iosim.connect(
            cp, iosim.makeFakeServer(cp), client, iosim.makeFakeClient(client), clock=self.reactor
        )
        pump.flush()
        return pump

    def record(self) -> EdgeRecord:
        """The Control Plane's record of edge-a."""
        return self.cp_registry.get("edge-a")

    def kinds(self) -> list[str]:
        """Kinds of the events this Edge relayed that the Control Plane recorded, in order."""
        return [
            e.kind for e in self.record().events.since(0, 1000) if e.kind.startswith(("node.", "outbox.", "command."))
        ]

    def retry_scheduled_in(self) -> float:
        """The delay of the one pending reconnect."""
        [call] = [c for c in self.reactor.getDelayedCalls() if "reconnect" in repr(c)]
        return call.getTime() - self.reactor.seconds()


def results(d: Any) -> list[Any]:
    """Collect the result of a Deferred (which must have fired)."""
    out: list[Any] = []
    d.addBoth(out.append)
    return out


class StatusAnswers(list[tuple[Any, Any]]):
    """A status listener that keeps every (response, error) it hears."""

    def status_answered(self, response: Any, error: Any) -> None:
        """Keep the answer."""
        self.append((response, error))


def test_hello_announces_identity_and_catalog() -> None:
    """Hello (in prepareConnection) carries id, version, labels, credential and catalog; the CP enrolls it."""
    edge = Edge(credentials=EdgeCredentials.from_secrets(per_edge={"edge-a": "k"}), credential="k")
    edge.accept()
    record = edge.record()
    assert record.connected
    assert record.hello.software_version == twisted_iop.__version__
    assert record.hello.protocol_version == f"{PROTOCOL_MAJOR}.0"
    assert record.hello.labels == {"site": "lab"}
    assert "node.drain" in record.command_names
    assert edge.link.is_enrolled and edge.link.enrollments == 1
    assert edge.service.running


def test_outbox_flushed_in_order_after_hello() -> None:
    """Events from before the connection reach the Control Plane in order after hello, then live."""
    edge = Edge()
    token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    edge.registry.node_ready(token, healthy("mock-a"))
    pump = edge.accept()
    assert edge.kinds() == ["node.pending", "node.ready"]
    edge.registry.node_closed(token)
    pump.flush()
    assert edge.kinds()[-1] == "node.disconnected"


def test_outbox_overflow_reported_on_flush() -> None:
    """A full outbox drops the oldest and reports outbox.overflow with the count."""
    edge = Edge(outbox_size=2)
    for _ in range(3):
        token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
        edge.registry.node_ready(token, healthy("mock-a"))
        edge.registry.node_closed(token)
    edge.accept()
    assert edge.kinds() == ["node.ready", "node.disconnected", "outbox.overflow"]
    overflow = [e for e in edge.record().events.since(0, 100) if e.kind == "outbox.overflow"]
    assert overflow[0].attributes["dropped"] == "7"


def test_outbox_flushed_again_after_reconnect() -> None:
    """Events queued while the link was down are flushed, in order, after the ClientService reconnects."""
    edge = Edge()
    pump = edge.accept()
    edge.link.current.transport.abortConnection()  # type: ignore[union-attr]  # connected by now, over TCP
    pump.flush()
    assert not edge.link.is_enrolled
    token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    edge.registry.node_ready(token, healthy("mock-a"))
    edge.reactor.advance(edge.retry_scheduled_in())
    edge.accept()
    assert edge.link.enrollments == 2
    assert edge.kinds() == ["node.pending", "node.ready"]


def test_status_request_answered_with_same_request_id() -> None:
    """The Control Plane's status request is answered and lists every configured node."""
    edge = Edge()
    pump = edge.accept()
    peer: Any = edge.record().peer
    got = StatusAnswers()
    peer.ask_status(5, True, got)
    pump.flush()
    [(snapshot, error)] = got
    assert error is None
    assert [n.node_id for n in snapshot.nodes] == ["node-1", "node-2"]
    assert not any(n.connected for n in snapshot.nodes)


def test_command_answered_with_events() -> None:
    """A command is answered, its events relayed before the answer; a rejection relays none."""
    edge = Edge()
    token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    edge.registry.node_ready(token, healthy("mock-a"))
    pump = edge.accept()
    peer: Any = edge.record().peer
    request = pb.EdgeCommandRequest(
        command_id="op-1", name="node.drain", target="node-1", arguments={"reason": "test"}, timeout_ms=5000
    )
    got = results(peer.request_command(request))
    pump.flush()
    [response] = got
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
    assert edge.kinds()[-4:] == ["command.accepted", "command.started", "node.drained", "command.succeeded"]
    bad = pb.EdgeCommandRequest(command_id="op-2", name="node.drain", target="node-9", timeout_ms=5000)
    rejected = results(peer.request_command(bad))
    pump.flush()
    assert rejected[0].outcome == pb.COMMAND_OUTCOME_REJECTED
    assert "node-9" in rejected[0].reason
    assert edge.kinds()[-1] == "command.succeeded"  # no events for the rejection


def test_permanent_rejection_holds_off_at_the_maximum() -> None:
    """A wrong credential: the failed prepareConnection is retried after the maximum delay, not sooner."""
    edge = Edge(
        credentials=EdgeCredentials.from_secrets(per_edge={"edge-a": "right"}),
        credential="wrong",
        backoff={"initial_seconds": 0.5, "max_seconds": 30},
    )
    pump = edge.accept()
    pump.flush()
    assert edge.link.permanent_rejection is not None and "bad_credential" in edge.link.permanent_rejection
    assert not edge.link.is_enrolled and edge.link.current is None
    # rand() is 1.0 here: the top of the hold-off, which is the maximum.
    assert edge.retry_scheduled_in() == 30
    assert edge.link.retry_delay(1) == 30
    # Nothing was relayed to a rejecting Control Plane: events stay queued.
    assert edge.cp_registry.find("edge-a") is None
    edge.reactor.advance(30)
    assert len(edge.reactor.tcpClients) == 1, "dialled again after the hold-off"


def test_transient_rejection_backs_off_exponentially() -> None:
    """Non-permanent rejections are failed attempts: ClientService's count grows the backoff."""
    edge = Edge(backoff={"initial_seconds": 1, "max_seconds": 60})
    delays = []
    for _ in range(3):
        cp = FakeControlPlane(edge.reactor, pb.EdgeHelloResponse(accepted=False, reason="busy", permanent=False))
        pump = edge.accept_fake(cp)
        cp.transport.loseConnection()  # type: ignore[union-attr]  # connected by now
        pump.flush()
        delays.append(edge.retry_scheduled_in())
        edge.reactor.advance(delays[-1])
    assert edge.link.permanent_rejection is None
    # rand() is 1.0 in these tests: each delay is its ceiling, 1 * 2 ** (attempt - 1).
    assert delays == [1, 2, 4]


def test_adopts_control_plane_keepalive() -> None:
    """The hello response's keepalive settings replace the configured ones."""
    edge = Edge(cp_settings=PeerSettings(keepalive_interval_seconds=2, keepalive_deadline_seconds=6))
    pump = edge.accept()
    client: Any = edge.link.current
    assert client._settings.keepalive_deadline_seconds == 6.0
    edge.reactor.advance(3)
    client.check_keepalive(edge.reactor.seconds())
    pump.flush()
    # The ping was answered, so the peer is not silent: still connected.
    assert not client.closing


def test_backoff_bounds() -> None:
    """Backoff is full jitter: between 0 and a ceiling that doubles per attempt up to the maximum."""
    assert backoff_delay(1, 0.5, 30, lambda: 1.0) == 0.5
    assert backoff_delay(4, 0.5, 30, lambda: 1.0) == 4.0
    assert backoff_delay(100, 0.5, 30, lambda: 1.0) == 30
    assert backoff_delay(100, 0.5, 30, lambda: 0.0) == 0.0
    assert backoff_delay(1, 0.5, 30, lambda: 0.5) == 0.25


def test_superseded_connection_backs_off_to_the_maximum() -> None:
    """Closed as SUPERSEDED by the real Control Plane, the Edge waits the maximum; acceptance resets it."""
    edge = Edge()
    pump = edge.accept()
    assert edge.link.retry_delay(1) < edge.link.dial.backoff.max_seconds
    # Another process with this edge id enrolls: the Control Plane supersedes ours.
    other = Edge()
    rival = edge.cp_factory.buildProtocol(None)
    rival_link = other.link.factory().buildProtocol(None)
    rival_pump = iosim.connect(rival, iosim.makeFakeServer(rival), rival_link, iosim.makeFakeClient(rival_link))
    other.link.prepare_connection(rival_link)  # type: ignore[arg-type]  # the factory builds a ControlPlaneProtocol
    rival_pump.flush()
    pump.flush()
    assert edge.link.superseded and not edge.link.is_enrolled
    assert edge.retry_scheduled_in() == edge.link.dial.backoff.max_seconds
    edge.reactor.advance(edge.link.dial.backoff.max_seconds)
    edge.accept()
    assert not edge.link.superseded
    assert edge.link.retry_delay(1) < edge.link.dial.backoff.max_seconds


def test_shutting_down_keeps_the_normal_backoff() -> None:
    """A Control Plane that is stopping does not push the Edge to the maximum delay."""
    edge = Edge()
    pump = edge.accept()
    edge.cp_factory.close_all("the Control Plane is shutting down")
    pump.flush()
    assert not edge.link.superseded and not edge.link.is_enrolled
    assert edge.retry_scheduled_in() == edge.link.dial.backoff.initial_seconds


def test_stopping_the_service_closes_the_link() -> None:
    """Stopping the dialling service closes the live connection and dials no more."""
    edge = Edge()
    pump = edge.accept()
    stopped = results(edge.service.stopService())
    pump.flush()
    assert stopped == [None]
    assert edge.link.current is None and not edge.record().connected
    edge.reactor.advance(60)
    assert edge.reactor.tcpClients == []
