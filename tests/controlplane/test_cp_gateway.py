"""The gateway's fan-out with plain calls and a fake clock."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from twisted_iop.controlplane.gateway import FANOUT_SLICE, EdgeGateway, StatusRow
from twisted_iop.controlplane.registry import EdgeHello, EdgeRegistry
from twisted_iop.wire import control_pb2 as pb

HELLO = EdgeHello(labels={}, software_version="t", protocol_version="1.0", commands=())


class HeldPeer:
    """A peer whose status answers the test releases by hand."""

    def __init__(self) -> None:
        self.last_received = 0.0
        self.requests: list[Deferred[pb.EdgeStatusResponse]] = []
        self.deadlines: list[bool] = []
        self.cancelled = 0

    def request_status(self, timeout: float, own_deadline: bool = True) -> Deferred[pb.EdgeStatusResponse]:
        def cancel(d: Deferred[Any]) -> None:
            self.cancelled += 1

        d: Deferred[pb.EdgeStatusResponse] = Deferred(cancel)
        self.requests.append(d)
        self.deadlines.append(own_deadline)
        return d

    def request_command(self, request: Any, timeout: float) -> Any:
        raise NotImplementedError

    def disconnect(self, code: Any, message: str) -> None:
        pass


def fleet(n: int) -> tuple[EdgeGateway, Clock, list[HeldPeer]]:
    """A gateway over ``n`` connected edges with held peers."""
    clock = Clock()
    registry = EdgeRegistry(clock)
    peers = []
    for i in range(n):
        peer = HeldPeer()
        registry.connect(f"e{i:05d}", peer, HELLO)
        peers.append(peer)
    return EdgeGateway(registry, clock, status_timeout_seconds=5), clock, peers


def test_fanout_is_sliced_across_reactor_turns() -> None:
    """Only one slice of requests goes out per reactor turn, with no per-request timers."""
    gateway, clock, peers = fleet(FANOUT_SLICE * 2 + 10)
    result: list[list[StatusRow]] = []
    gateway.fleet_status().addCallback(result.append)
    # One slice now; the next is scheduled for the next reactor turn, and
    # the round has one deadline timer instead of one per request.
    assert sum(len(p.requests) for p in peers) == FANOUT_SLICE
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [0, 5]
    clock.advance(0)
    assert all(len(p.requests) == 1 and p.deadlines == [False] for p in peers)
    for i, peer in enumerate(peers):
        peer.requests[0].callback(pb.EdgeStatusResponse(edge_id=f"e{i:05d}"))
    assert [row.state for row in result[0]] == ["ok"] * len(peers)
    assert clock.getDelayedCalls() == []  # the round's deadline was cancelled


def test_round_deadline_cancels_only_the_silent_edges() -> None:
    """At the deadline the unanswered requests are cancelled and become timeout rows."""
    gateway, clock, peers = fleet(20)
    result: list[list[StatusRow]] = []
    gateway.fleet_status().addCallback(result.append)
    for i, peer in enumerate(peers):
        if i % 5:
            peer.requests[0].callback(pb.EdgeStatusResponse(edge_id=f"e{i:05d}"))
    assert result == []
    clock.advance(5)
    states = [row.state for row in result[0]]
    assert states == ["timeout" if i % 5 == 0 else "ok" for i in range(20)]
    assert [p.cancelled for p in peers] == [1 if i % 5 == 0 else 0 for i in range(20)]
    assert result[0][0].error_code == "edge_timeout"


def test_single_status_joins_a_fleet_round() -> None:
    """A status view during a fleet round shares the round's request for that edge."""
    gateway, clock, peers = fleet(1)
    rows: list[list[StatusRow]] = []
    gateway.fleet_status().addCallback(rows.append)
    single: list[Any] = []
    gateway.status("e00000").addCallback(single.append)
    assert len(peers[0].requests) == 1
    peers[0].requests[0].callback(pb.EdgeStatusResponse(edge_id="e00000"))
    assert rows[0][0].state == "ok" and single[0].response.edge_id == "e00000"
