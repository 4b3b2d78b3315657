"""The Edge's Control Plane link over iosim against a fake Control Plane."""

from __future__ import annotations

from typing import Any

from edge_testing import FakeControlPlane, FakeNodePeer, edge_config, healthy, node_hello
from twisted.internet.task import Clock
from twisted.test import iosim

import twisted_iop
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.control_plane_link import ControlPlaneLink, ControlPlaneProtocol
from twisted_iop.edge.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.dialer import backoff_delay


class Edge:
    """An Edge's registry and link with no sockets."""

    def __init__(self, **control_plane: Any) -> None:
        self.clock = Clock()
        config = edge_config(**control_plane)
        self.registry = NodeRegistry(config, self.clock)
        self.status = StatusProvider(self.registry, self.clock)
        self.commands = CommandRunner(self.registry, self.clock)
        self.link = ControlPlaneLink(
            config.control_plane, self.registry, self.status, self.commands, self.clock, rand=lambda: 1.0
        )

    def connect(self, cp: FakeControlPlane) -> tuple[ControlPlaneProtocol, iosim.IOPump]:
        """Connect a fresh link protocol to ``cp`` and exchange everything."""
        client = self.link.factory().buildProtocol(None)
        assert isinstance(client, ControlPlaneProtocol)
        pump = iosim.connect(cp, iosim.makeFakeServer(cp), client, iosim.makeFakeClient(client))
        return client, pump


def results(d: Any) -> list[Any]:
    """Collect the result of a Deferred (which must have fired)."""
    out: list[Any] = []
    d.addBoth(out.append)
    return out


def test_hello_announces_identity_and_catalog() -> None:
    """Hello carries id, version, labels, credential and the command catalog."""
    edge = Edge(credential="k")
    cp = FakeControlPlane(edge.clock)
    client, pump = edge.connect(cp)
    pump.flush()
    [hello] = cp.hellos
    assert hello.edge_id == "edge-a"
    assert hello.protocol_major == PROTOCOL_MAJOR
    assert hello.software_version == twisted_iop.__version__
    assert hello.credential == "k"
    assert dict(hello.labels) == {"site": "lab"}
    assert "node.drain" in [c.name for c in hello.commands]
    assert client.enrolled and edge.link.is_enrolled


def test_outbox_flushed_in_order_after_hello() -> None:
    """Events from before the connection reach the Control Plane in order after hello."""
    edge = Edge()
    token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    edge.registry.node_ready(token, healthy("mock-a"))
    cp = FakeControlPlane(edge.clock)
    _, pump = edge.connect(cp)
    pump.flush()
    assert [(e.kind, e.edge_sequence) for e in cp.events()] == [("node.pending", 1), ("node.ready", 2)]
    edge.registry.node_closed(token)
    pump.flush()
    assert cp.events()[-1].kind == "node.disconnected"


def test_outbox_overflow_reported_on_flush() -> None:
    """A full outbox drops the oldest and reports outbox.overflow with the count."""
    edge = Edge(outbox_size=2)
    for _ in range(3):
        token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
        edge.registry.node_ready(token, healthy("mock-a"))
        edge.registry.node_closed(token)
    cp = FakeControlPlane(edge.clock)
    _, pump = edge.connect(cp)
    pump.flush()
    kinds = [e.kind for e in cp.events()]
    assert kinds == ["node.ready", "node.disconnected", "outbox.overflow"]
    assert cp.events()[-1].attributes["dropped"] == "7"


def test_status_request_answered_with_same_request_id() -> None:
    """The status answer pairs with the request and lists every configured node."""
    edge = Edge()
    cp = FakeControlPlane(edge.clock)
    _, pump = edge.connect(cp)
    pump.flush()
    got = results(cp.status())
    pump.flush()
    [snapshot] = got
    assert [n.node_id for n in snapshot.nodes] == ["node-1", "node-2"]
    assert not any(n.connected for n in snapshot.nodes)


def test_command_answered_with_events() -> None:
    """A command is answered with the same request id, events relayed before the answer."""
    edge = Edge()
    token = edge.registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    edge.registry.node_ready(token, healthy("mock-a"))
    cp = FakeControlPlane(edge.clock)
    _, pump = edge.connect(cp)
    pump.flush()
    got = results(cp.command("node.drain", "node-1", reason="test"))
    pump.flush()
    [response] = got
    assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED
    kinds = [e.kind for e in cp.events()]
    assert kinds[-4:] == ["command.accepted", "command.started", "node.drained", "command.succeeded"]
    rejected = results(cp.command("node.drain", "node-9", command_id="op-2"))
    pump.flush()
    assert rejected[0].outcome == pb.COMMAND_OUTCOME_REJECTED
    assert "node-9" in rejected[0].reason
    assert cp.events()[-1].kind == "command.succeeded"  # no events for the rejection


def test_permanent_rejection_retries_at_max_delay() -> None:
    """A permanent rejection closes the connection and retries only at the maximum delay."""
    edge = Edge(backoff={"initial_seconds": 0.5, "max_seconds": 30})
    cp = FakeControlPlane(
        edge.clock,
        pb.EdgeHelloResponse(accepted=False, reason="bad credential", reason_code="unauthenticated", permanent=True),
    )
    client, pump = edge.connect(cp)
    pump.flush()
    assert client.closing and not client.enrolled
    assert edge.link.permanent_rejection is not None
    assert edge.link.retry_delay(1) == 30
    # Events stay queued: nothing was relayed to a rejecting Control Plane.
    assert cp.events() == []


def test_transient_rejection_backs_off_exponentially() -> None:
    """A non-permanent rejection uses the exponential backoff (counting sessions)."""
    edge = Edge(backoff={"initial_seconds": 1, "max_seconds": 60})
    for _ in range(3):
        cp = FakeControlPlane(edge.clock, pb.EdgeHelloResponse(accepted=False, reason="busy", permanent=False))
        client, pump = edge.connect(cp)
        pump.flush()
        client.connectionLost()
    assert edge.link.permanent_rejection is None
    # rand() is 1.0 in these tests: the delay is the ceiling, 1 * 2 ** (3 - 1).
    assert edge.link.retry_delay(1) == 4


def test_adopts_control_plane_keepalive() -> None:
    """The hello response's keepalive settings replace the configured ones."""
    edge = Edge()
    cp = FakeControlPlane(
        edge.clock, pb.EdgeHelloResponse(accepted=True, keepalive_interval_ms=2000, keepalive_deadline_ms=6000)
    )
    client, pump = edge.connect(cp)
    pump.flush()
    edge.clock.advance(3)
    client.check_keepalive(edge.clock.seconds())
    pump.flush()
    # The ping was answered, so the peer is not silent: still connected.
    assert not client.closing
    assert client._settings.keepalive_deadline_seconds == 6.0


def test_backoff_bounds() -> None:
    """Backoff stays within [initial, max] and grows by doubling its ceiling."""
    assert backoff_delay(1, 0.5, 30, lambda: 1.0) == 0.5
    assert backoff_delay(4, 0.5, 30, lambda: 1.0) == 4.0
    assert backoff_delay(100, 0.5, 30, lambda: 1.0) == 30
    assert backoff_delay(100, 0.5, 30, lambda: 0.0) == 0.5


def test_superseded_connection_backs_off_to_the_maximum() -> None:
    """Closed as SUPERSEDED, the Edge waits the maximum delay; an accepted hello resets it."""
    edge = Edge()
    cp = FakeControlPlane(edge.clock)
    client, pump = edge.connect(cp)
    pump.flush()
    assert edge.link.retry_delay(1) < edge.link.dial.backoff.max_seconds
    cp.fail_connection(pb.ERROR_CODE_SUPERSEDED, "a newer connection of this edge took over")
    pump.flush()
    assert edge.link.superseded
    assert edge.link.retry_delay(1) == edge.link.dial.backoff.max_seconds
    cp2 = FakeControlPlane(edge.clock)
    _, pump2 = edge.connect(cp2)
    pump2.flush()
    assert not edge.link.superseded
    assert edge.link.retry_delay(1) < edge.link.dial.backoff.max_seconds


def test_shutting_down_keeps_the_normal_backoff() -> None:
    """A Control Plane that is stopping does not push the Edge to the maximum delay."""
    edge = Edge()
    cp = FakeControlPlane(edge.clock)
    _, pump = edge.connect(cp)
    pump.flush()
    cp.fail_connection(pb.ERROR_CODE_SHUTTING_DOWN, "the Control Plane is shutting down")
    pump.flush()
    assert not edge.link.superseded
    assert edge.link.retry_delay(1) < edge.link.dial.backoff.max_seconds
