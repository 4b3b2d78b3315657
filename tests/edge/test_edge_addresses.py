"""Several Control Plane addresses: the Edge dials them in a shuffled order and fails over.

Unit tests drive :class:`~twisted_iop.wire.dialer.EndpointRotation` with an
injected random source and fake endpoints, and the Edge's link on a
MemoryReactorClock; the integration tests run two real Control Planes on
127.0.0.1 and an Edge built from edge.yaml.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import pytest
import pytest_twisted
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.interfaces import IProtocol, IProtocolFactory
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher
from twisted.test import iosim

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.edge_wire import EdgeCredentials, EdgeWireFactory
from twisted_iop.edge.commands import CommandRunner
from twisted_iop.edge.config import load_edge_config
from twisted_iop.edge.control_plane_link import ControlPlaneLink
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.edge.tap import EdgeService, Options, makeService
from twisted_iop.testing.configs import edge_config, edge_yaml, write_yaml
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane, stop
from twisted_iop.testing.wires.peers import FakeControlPlane
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.dialer import EndpointRotation, shuffled
from twisted_iop.wire.settings import PeerSettings

#: The Edge's credential in the integration tests (it must never reach a log line).
EDGE_SECRET = "edge-secret-0123"

#: A random source that keeps every list in its configured order (see ``shuffled``).
KEEP_ORDER = 0.999


class Draws:
    """A random source that returns the given values in turn (then repeats the last)."""

    def __init__(self, *values: float) -> None:
        self._values = list(values)

    def __call__(self) -> float:
        return self._values.pop(0) if len(self._values) > 1 else self._values[0]


class FakeEndpoint:
    """An endpoint that records each connect and answers it with a fixed result."""

    def __init__(self, name: str, dialled: list[str]) -> None:
        self.name = name
        self._dialled = dialled

    def connect(self, protocolFactory: IProtocolFactory) -> Deferred[IProtocol]:
        """Record the dial; no connection is made."""
        self._dialled.append(self.name)
        return succeed(None)  # type: ignore[arg-type]  # no protocol: the rotation only counts dials


# -- the order ---------------------------------------------------------------------


@given(st.lists(st.integers(), max_size=20), st.lists(st.floats(0, 1, exclude_max=True), min_size=1))
def test_shuffled_is_a_permutation(items: list[int], draws: list[float]) -> None:
    """Whatever the random source draws, the shuffle keeps every item exactly once."""
    assert sorted(shuffled(items, Draws(*draws))) == sorted(items)


def test_shuffle_follows_the_injected_random() -> None:
    """The order is a function of the random source: a high draw keeps it, low draws move it."""
    assert shuffled(["a", "b", "c"], lambda: KEEP_ORDER) == ["a", "b", "c"]
    # Fisher-Yates from the end: i=2 swaps with int(0.0 * 3) = 0, then i=1 with int(0.0 * 2) = 0.
    assert shuffled(["a", "b", "c"], lambda: 0.0) == ["b", "c", "a"]
    # i=2 keeps c (int(0.9 * 3) = 2), then i=1 swaps with 0 (int(0.4 * 2) = 0).
    assert shuffled(["a", "b", "c"], Draws(0.9, 0.4)) == ["b", "a", "c"]


def test_rotation_dials_the_next_address_on_every_connect() -> None:
    """Each connect() dials the next endpoint of the shuffled order, wrapping around; repr names the next one."""
    dialled: list[str] = []
    endpoints = [(name, FakeEndpoint(name, dialled)) for name in ("cp-1:7443", "cp-2:7443", "cp-3:7443")]
    rotation = EndpointRotation(endpoints, lambda: 0.0)  # type: ignore[arg-type]  # FakeEndpoint has connect, all the rotation calls
    assert rotation.addresses == ("cp-2:7443", "cp-3:7443", "cp-1:7443")
    assert repr(rotation) == "cp-2:7443"
    seen = []
    for _ in range(4):
        rotation.connect(None)  # type: ignore[arg-type]  # no factory: the fake endpoints never build a protocol
        seen.append(rotation.current)
    assert dialled == ["cp-2:7443", "cp-3:7443", "cp-1:7443", "cp-2:7443"]
    assert seen == ["cp-2:7443", "cp-3:7443", "cp-1:7443", "cp-2:7443"]
    assert repr(rotation) == "cp-3:7443"


def test_different_draws_spread_edges_over_the_replicas() -> None:
    """Edges with different random draws start on different replicas of the same list."""
    addresses = [f"cp-{n}:7443" for n in range(4)]
    firsts = {shuffled(addresses, Draws(*draws))[0] for draws in ([0.0], [0.3], [0.6], [KEEP_ORDER])}
    assert len(firsts) > 1


def test_a_rotation_needs_an_endpoint() -> None:
    """An empty list is a programming error, caught at once."""
    with pytest.raises(ValueError, match="at least one endpoint"):
        EndpointRotation([])


# -- the Edge's link on a memory reactor --------------------------------------------

PORTS = (7001, 7002, 7003)


class RotatingEdge:
    """An Edge's link over three Control Plane addresses on a MemoryReactorClock (order kept)."""

    def __init__(self, rand: Callable[[], float] = lambda: KEEP_ORDER) -> None:
        self.reactor = MemoryReactorClock()
        config = edge_config(address=f"127.0.0.1:{PORTS[0]}", backoff={"initial_seconds": 1, "max_seconds": 60})
        registry = NodeRegistry(config, self.reactor)
        commands = CommandRunner(registry, self.reactor)
        self.link = ControlPlaneLink(
            config.control_plane, registry, StatusProvider(registry, self.reactor), commands, self.reactor, rand
        )
        self.cp_registry = EdgeRegistry(self.reactor)
        self.connections = iosim.ConnectionCompleter(self.reactor)
        addresses = [f"tcp:host=127.0.0.1:port={port}" for port in PORTS]
        self.service = self.link.client_service_for(
            addresses, lambda address: TCP4ClientEndpoint(self.reactor, "127.0.0.1", int(address.rsplit("=", 1)[1]))
        )
        self.service.startService()

    def dialling(self) -> int:
        """The port of the one pending connection attempt."""
        [(_, port, *_)] = self.reactor.tcpClients
        return int(port)

    def refuse(self) -> float:
        """Refuse the pending attempt; return the delay of the retry it scheduled."""
        self.connections.failOnce()
        [call] = [c for c in self.reactor.getDelayedCalls() if "reconnect" in repr(c)]
        return call.getTime() - self.reactor.seconds()

    def listen(self, port: int) -> None:
        """A real Control Plane edge-wire factory on ``port``."""
        self.reactor.listenTCP(port, EdgeWireFactory(self.cp_registry, self.reactor, PeerSettings(), EdgeCredentials()))


def test_each_failed_attempt_moves_on_and_the_backoff_keeps_growing() -> None:
    """Refused connects walk the list in order; the delay doubles across it, not per address."""
    edge = RotatingEdge()
    dialled, delays = [], []
    for _ in range(4):
        dialled.append(edge.dialling())
        delays.append(edge.refuse())
        edge.reactor.advance(delays[-1])
    assert dialled == [7001, 7002, 7003, 7001]
    assert delays == pytest.approx([KEEP_ORDER * ceiling for ceiling in (1, 2, 4, 8)])


def test_enrolls_on_the_next_address_and_backoff_resets_after_hello() -> None:
    """After failures, the replica that answers enrolls the Edge; losing it moves on with a fresh backoff."""
    edge = RotatingEdge()
    edge.listen(7002)
    edge.reactor.advance(edge.refuse())  # 7001 is down
    assert edge.dialling() == 7002
    pump = edge.connections.succeedOnce()
    assert pump is not None
    pump.flush()
    assert edge.link.is_enrolled and edge.link.address == "tcp:host=127.0.0.1:port=7002"
    assert edge.cp_registry.get("edge-a").connected
    edge.link.current.transport.abortConnection()  # type: ignore[union-attr]  # connected by now, over TCP
    pump.flush()
    assert not edge.link.is_enrolled
    [call] = [c for c in edge.reactor.getDelayedCalls() if "reconnect" in repr(c)]
    # The first retry after a session: the initial ceiling again, not the fourth.
    assert call.getTime() - edge.reactor.seconds() == pytest.approx(KEEP_ORDER * 1)
    edge.reactor.advance(call.getTime() - edge.reactor.seconds())
    assert edge.dialling() == 7003


def test_retry_later_from_one_replica_delays_the_attempt_on_the_next() -> None:
    """A retry_later hello answer is honoured: the next attempt (to the next address) waits its hint."""
    edge = RotatingEdge()
    busy = FakeControlPlane(
        edge.reactor,
        pb.EdgeHelloResponse(accepted=False, reason="busy", reason_code="retry_later", retry_after_ms=20_000),
    )
    _, port, factory, *_ = edge.reactor.tcpClients.pop(0)
    edge.reactor.connectors.pop(0)
    assert port == 7001
    client = factory.buildProtocol(None)
    pump = iosim.connect(busy, iosim.makeFakeServer(busy), client, iosim.makeFakeClient(client), clock=edge.reactor)
    pump.flush()
    [call] = [c for c in edge.reactor.getDelayedCalls() if "reconnect" in repr(c)]
    assert call.getTime() - edge.reactor.seconds() == 20
    edge.reactor.advance(20)
    assert edge.dialling() == 7002


# -- two real Control Planes on 127.0.0.1 --------------------------------------------


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every log line emitted during the test, formatted."""
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        text = formatEvent(event)
        if text:
            lines.append(text)

    observer = cast(ILogObserver, observe)
    globalLogPublisher.addObserver(observer)
    yield lines
    globalLogPublisher.removeObserver(observer)


def closed_port() -> tuple[socket.socket, int]:
    """A loopback port bound but not listening (connects to it are refused) and kept so."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, sock.getsockname()[1]


def enrolled_on(cp: ControlPlaneHarness) -> bool:
    """Whether ``cp`` holds edge-a connected."""
    return cp.registry.find("edge-a") is not None and cp.registry.get("edge-a").connected


def start_edge_over(tmp_path: Path, addresses: list[str], rand: Callable[[], float]) -> EdgeService:
    """An Edge in this reactor dialling ``addresses`` (shuffled with ``rand``)."""
    data = edge_yaml("127.0.0.1:1")
    data["control_plane"]["credential"] = EDGE_SECRET
    del data["control_plane"]["address"]
    data["control_plane"]["addresses"] = addresses
    config = load_edge_config(write_yaml(tmp_path / "edge.yaml", data), environ={})
    from twisted.internet import reactor

    service = EdgeService(config, reactor, rand)
    service.privilegedStartService()
    service.startService()
    return service


@pytest_twisted.ensureDeferred
async def test_edge_skips_a_closed_port_and_fails_over_between_real_control_planes(
    tmp_path: Path, log_lines: list[str]
) -> None:
    """First address closed: the Edge enrolls on the second; when that one stops, on the third."""
    sock, port = closed_port()
    first = await start_control_plane()
    second = await start_control_plane()
    edge = None
    try:
        addresses = [f"127.0.0.1:{port}", first.edge_wire_address, second.edge_wire_address]
        edge = start_edge_over(tmp_path, addresses, lambda: KEEP_ORDER)
        assert edge.control_plane.rotation.addresses[0] == f"tcp:host=127.0.0.1:port={port}"
        await eventually(lambda: enrolled_on(first), message="edge-a enrolled on the first Control Plane")
        assert second.registry.find("edge-a") is None
        assert f"connected to the control plane at tcp:host=127.0.0.1:port={first.edge_wire_port}" in "\n".join(
            log_lines
        )
        await first.stop()
        await eventually(lambda: enrolled_on(second), message="edge-a enrolled on the remaining Control Plane")
        assert edge.link.address == f"tcp:host=127.0.0.1:port={second.edge_wire_port}"
        assert edge.link.enrollments == 2
        text = "\n".join(log_lines)
        assert f"enrolled with the control plane at tcp:host=127.0.0.1:port={second.edge_wire_port}" in text
        assert EDGE_SECRET not in text
    finally:
        await stop(edge)
        await first.stop()
        await second.stop()
        sock.close()


@pytest_twisted.ensureDeferred
async def test_edge_skips_a_stopped_control_plane_in_its_shuffled_order(tmp_path: Path) -> None:
    """The shuffled order starts on a stopped replica: the Edge enrolls on the next, then fails over to the last."""
    a, b, c = [await start_control_plane() for _ in range(3)]
    edge = None
    try:
        configured = [c.edge_wire_address, a.edge_wire_address, b.edge_wire_address]
        await a.stop()
        # Draws of 0.0 turn [c, a, b] into [a, b, c] (see test_shuffle_follows_the_injected_random).
        edge = start_edge_over(tmp_path, configured, Draws(0.0, 0.0, KEEP_ORDER))
        assert edge.control_plane.rotation.addresses[0] == f"tcp:host=127.0.0.1:port={a.edge_wire_port}"
        await eventually(lambda: enrolled_on(b), message="edge-a enrolled on the second replica in the order")
        assert c.registry.find("edge-a") is None
        await b.stop()
        await eventually(lambda: enrolled_on(c), message="edge-a enrolled on the remaining replica")
        assert edge.link.enrollments == 2
    finally:
        await stop(edge)
        for cp in (a, b, c):
            await cp.stop()


def test_twistd_options_and_make_service_dial_one_of_the_listed_addresses(tmp_path: Path) -> None:
    """`twistd iop-edge` with control_plane.addresses: the summary names them all; the first dial is one of them."""
    data = edge_yaml("127.0.0.1:1")
    del data["control_plane"]["address"]
    data["control_plane"]["addresses"] = ["127.0.0.1:7801", "127.0.0.1:7802"]
    options = Options()
    options.parseOptions(["--config", write_yaml(tmp_path / "edge.yaml", data)])
    assert "control plane at tcp:host=127.0.0.1:port=7801, tcp:host=127.0.0.1:port=7802" in options.summary(
        options.config
    )
    reactor = MemoryReactorClock()
    service = makeService(options, reactor=reactor)
    assert sorted(service.control_plane.rotation.addresses) == [
        "tcp:host=127.0.0.1:port=7801",
        "tcp:host=127.0.0.1:port=7802",
    ]
    service.privilegedStartService()
    service.startService()
    [(host, port, *_)] = reactor.tcpClients
    assert (host, f"tcp:host={host}:port={port}") == ("127.0.0.1", service.control_plane.rotation.addresses[0])
    service.stopService()
