"""The dialling service shared by every outbound wire: jitter, prepareConnection
failures, and a real Edge re-enrolling after its Control Plane restarts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, cast

import pytest_twisted
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.test import iosim

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.tap import EdgeService
from twisted_iop.testing.harness import eventually, start_control_plane, stop
from twisted_iop.wire.dialer import DialingService, backoff_delay, hold_off_delay

PORT = 7443


class Peer(Protocol):
    """A protocol whose preparation the test finishes by hand."""

    def __init__(self) -> None:
        self.lost = 0
        self.ready: Deferred[None] = Deferred()

    def connectionLost(self, reason: Any = None) -> None:
        """Count the loss and fail a preparation still waiting."""
        self.lost += 1
        if not self.ready.called:
            self.ready.errback(ConnectionError("lost before ready"))


class Dialing:
    """A DialingService on a MemoryReactorClock, its protocols prepared by :meth:`Peer.ready`."""

    def __init__(self, seed: int = 0, initial: float = 0.5, maximum: float = 30.0) -> None:
        self.reactor = MemoryReactorClock()
        self.reactor.listenTCP(PORT, Factory.forProtocol(Protocol))
        self.connections = iosim.ConnectionCompleter(self.reactor)
        self.peers: list[Peer] = []
        self.failures: list[str] = []
        rand = random.Random(seed).random
        factory = Factory.forProtocol(Peer)
        factory.noisy = False
        self.service = DialingService(
            TCP4ClientEndpoint(self.reactor, "127.0.0.1", PORT),
            f"tcp:host=127.0.0.1:port={PORT}",
            factory,
            self._prepare,
            lambda attempt: backoff_delay(attempt, initial, maximum, rand),
            self.reactor,
            lambda failure: self.failures.append(failure.getErrorMessage()),
        )

    def _prepare(self, peer: Peer) -> Deferred[None]:
        self.peers.append(peer)
        return peer.ready

    def next_retry(self) -> float:
        """The delay of the pending reconnect (none pending is a test failure)."""
        [call] = [c for c in self.reactor.getDelayedCalls() if "reconnect" in repr(c)]
        return call.getTime() - self.reactor.seconds()

    def refuse(self) -> float:
        """Refuse the pending connection attempt; return the retry delay chosen."""
        self.connections.failOnce()
        delay = self.next_retry()
        self.reactor.advance(delay)
        return delay


def test_every_retry_is_jittered_with_full_jitter() -> None:
    """Refused attempts retry after rand() * ceiling, the first one included (seeded random, memory clock)."""
    dialing = Dialing(seed=7)
    dialing.service.startService()
    delays = [dialing.refuse() for _ in range(5)]
    expected_rand = random.Random(7)
    expected = [expected_rand.random() * min(30.0, 0.5 * 2**n) for n in range(5)]
    assert delays == expected
    assert delays[0] != 0.5 and 0 <= delays[0] <= 0.5
    assert len(dialing.failures) == 5 and "refused" in dialing.failures[0].lower()


def test_a_fleet_does_not_retry_in_lockstep() -> None:
    """Twenty dialers that lose their peer together pick twenty different first delays."""
    first = []
    for seed in range(20):
        dialing = Dialing(seed=seed)
        dialing.service.startService()
        first.append(dialing.refuse())
    assert len(set(first)) == 20
    assert all(0 <= delay <= 0.5 for delay in first)


def test_hold_off_stays_near_the_maximum() -> None:
    """The hold-off after a permanent refusal is jittered within [max/2, max]."""
    rand = random.Random(3).random
    delays = [hold_off_delay(30, rand) for _ in range(50)]
    assert all(15 <= d <= 30 for d in delays) and len(set(delays)) == 50


def test_connection_lost_while_preparing_is_a_failed_attempt() -> None:
    """A connection lost before prepareConnection finished is retried with backoff, without a logged error."""
    logged: list[LogEvent] = []
    globalLogPublisher.addObserver(cast(ILogObserver, logged.append))
    try:
        dialing = Dialing(seed=1)
        dialing.service.startService()
        pump = dialing.connections.succeedOnce()
        assert pump is not None and len(dialing.peers) == 1
        pump.serverIO.loseConnection()
        pump.flush()
        assert dialing.peers[0].lost == 1
        assert dialing.failures == ["lost before ready"]
        assert 0 <= dialing.next_retry() <= 0.5
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, logged.append))
    assert [e for e in logged if e.get("isError") or e.get("log_failure")] == []


def test_late_loss_of_a_refused_connection_leaves_the_live_one_alone() -> None:
    """A refused connection that closes only after its successor is live does not make the service redial."""
    dialing = Dialing(seed=2)
    dialing.service.startService()
    stale_pump = dialing.connections.succeedOnce()
    assert stale_pump is not None
    dialing.peers[0].ready.errback(ValueError("hello refused"))
    dialing.reactor.advance(dialing.next_retry())
    live_pump = dialing.connections.succeedOnce()
    assert live_pump is not None
    dialing.peers[1].ready.callback(None)
    held: list[Any] = []
    dialing.service.whenConnected().addCallback(held.append)
    assert held == [dialing.peers[1]]
    stale_pump.flush()  # the refused connection's close only now completes
    assert dialing.peers[0].lost == 1
    assert [c for c in dialing.reactor.getDelayedCalls() if "reconnect" in repr(c)] == []
    assert dialing.reactor.tcpClients == []
    dialing.service.stopService()
    live_pump.flush()
    assert dialing.peers[1].lost == 1


def test_endpoint_is_logged_by_its_address() -> None:
    """ClientService's retry line names the endpoint string, not an object repr."""
    logged: list[LogEvent] = []
    globalLogPublisher.addObserver(cast(ILogObserver, logged.append))
    try:
        dialing = Dialing()
        dialing.service.startService()
        dialing.refuse()
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, logged.append))
    [retry] = [e for e in logged if "Scheduling retry" in e.get("log_format", "")]
    assert repr(retry["endpoint"]) == f"tcp:host=127.0.0.1:port={PORT}"


@pytest_twisted.ensureDeferred
async def test_edge_reenrolls_after_the_control_plane_restarts(tmp_path: Path) -> None:
    """A real Edge loses the real Control Plane (stopped), retries, and enrolls again once it is back."""
    cp = await start_control_plane()
    port = cp.edge_wire_port
    config = parse_edge_config(
        {
            "control_plane": {
                "address": f"127.0.0.1:{port}",
                "edge_id": "edge-r",
                "backoff": {"initial_seconds": 0.05, "max_seconds": 0.3},
            },
            "node_server": {"listen": "tcp:0:interface=127.0.0.1"},
            "inference": {"listen": "tcp:0:interface=127.0.0.1"},
            "metrics": {"listen": "tcp:0:interface=127.0.0.1"},
            "nodes": [],
        },
        {},
    )
    edge = EdgeService(config, global_reactor)
    edge.privilegedStartService()
    edge.startService()
    try:
        await eventually(lambda: edge.link.is_enrolled, timeout=5, message="first enrollment")
        await cp.stop()
        await eventually(lambda: not edge.link.is_enrolled, timeout=5, message="the edge noticed")
        cp = await start_control_plane(edge_wire_port=port)

        async def connected() -> bool:
            code, body = await cp.get_json("/edges/edge-r")
            return code == 200 and body["connected"]

        await eventually(connected, timeout=10, message="re-enrolled with the new Control Plane")
        assert edge.link.enrollments == 2
    finally:
        await stop(edge)
        await cp.stop()
