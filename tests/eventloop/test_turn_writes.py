"""Writes sent from the write itself, and one write per connection per turn
(``twisted_iop.eventloop.turn_writes``), over real loopback sockets."""

from __future__ import annotations

from typing import Any, cast

import pytest_twisted
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP4ServerEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from twisted_iop.eventloop.turn_writes import TurnBuffer, write_now
from twisted_iop.testing.harness import eventually

REACTOR = global_reactor


class Collect(Protocol):
    """Keeps every byte it receives."""

    def __init__(self) -> None:
        self.received = b""

    def dataReceived(self, data: bytes) -> None:
        self.received += data


async def connected_pair() -> tuple[Any, Collect, Any]:
    """A client connection (its transport), the server end that collects, and the listening port."""
    server_end: Deferred[Collect] = Deferred()

    class Server(Factory):
        def buildProtocol(self, addr: Any) -> Collect:
            collect = Collect()
            server_end.callback(collect)
            return collect

    port = await TCP4ServerEndpoint(REACTOR, 0, interface="127.0.0.1").listen(Server())
    client = await TCP4ClientEndpoint(REACTOR, "127.0.0.1", port.getHost().port).connect(Factory.forProtocol(Protocol))
    collect = await server_end
    return cast(Any, client).transport, collect, port


async def close(transport: Any, port: Any) -> None:
    """Close the client connection and the listener."""
    transport.loseConnection()
    await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_write_now_sends_without_waiting_for_a_writable_poll() -> None:
    """A write on an idle connection leaves from the call itself: nothing is
    queued in the transport and no writer is registered with the reactor."""
    transport, collect, port = await connected_pair()
    try:
        write_now(transport, b"data: one\n\n")
        assert transport not in REACTOR.getWriters()
        await eventually(lambda: collect.received == b"data: one\n\n", timeout=5, message="the bytes")
    finally:
        await close(transport, port)


@pytest_twisted.ensureDeferred
async def test_write_now_keeps_order_behind_queued_bytes() -> None:
    """Bytes already queued in the transport go first: a later write_now joins the queue."""
    transport, collect, port = await connected_pair()
    try:
        transport.write(b"first ")
        write_now(transport, b"second")
        await eventually(lambda: collect.received == b"first second", timeout=5, message="both writes, in order")
    finally:
        await close(transport, port)


def test_write_now_on_another_transport_is_a_plain_write() -> None:
    """An in-memory (or TLS) transport gets an ordinary write."""
    transport = StringTransport()
    write_now(transport, b"abc")
    assert transport.value() == b"abc"


@pytest_twisted.ensureDeferred
async def test_turn_buffer_sends_a_turns_writes_together_at_its_end() -> None:
    """Writes of one turn are held (in order) and sent when the turn ends."""
    transport, collect, port = await connected_pair()
    try:
        buffer = TurnBuffer(transport, REACTOR)
        for part in (b"a", b"b", b"c"):
            buffer.write(part)
        assert buffer.held == 3
        assert collect.received == b""
        await eventually(lambda: buffer.held == 0, timeout=5, message="the turn's end")
        await eventually(lambda: collect.received == b"abc", timeout=5, message="the writes, in order")
    finally:
        await close(transport, port)


@pytest_twisted.ensureDeferred
async def test_turn_buffer_is_bounded_in_bytes() -> None:
    """A write that reaches the bound sends everything held at once."""
    transport, collect, port = await connected_pair()
    try:
        buffer = TurnBuffer(transport, REACTOR, max_bytes=8)
        buffer.write(b"1234")
        assert buffer.held == 4
        buffer.write(b"5678")
        assert buffer.held == 0
        await eventually(lambda: collect.received == b"12345678", timeout=5, message="the bytes")
    finally:
        await close(transport, port)


@pytest_twisted.ensureDeferred
async def test_turn_buffer_flush_and_discard() -> None:
    """flush sends what is held now; discard drops it and cancels the turn's send."""
    transport, collect, port = await connected_pair()
    try:
        buffer = TurnBuffer(transport, REACTOR)
        buffer.write(b"kept ")
        buffer.flush()
        assert buffer.held == 0
        buffer.write(b"dropped ")
        buffer.discard()
        assert buffer.held == 0
        buffer.write(b"last")
        await eventually(lambda: collect.received == b"kept last", timeout=5, message="the kept writes only")
    finally:
        await close(transport, port)


def test_turn_buffer_on_an_in_memory_transport_writes_at_once() -> None:
    """Nothing to save on a transport that is not a socket: each write goes straight through."""
    transport = StringTransport()
    clock = Clock()
    buffer = TurnBuffer(transport, clock)
    buffer.write(b"x")
    assert transport.value() == b"x"
    assert buffer.held == 0
    assert not clock.getDelayedCalls()


@pytest_twisted.ensureDeferred
async def test_framed_peer_sends_its_last_frames_before_it_closes() -> None:
    """A peer with turn writes flushes what it holds before it closes: the
    error frame that says why reaches the other end, after the frames before it."""
    from twisted_iop.wire import control_pb2 as pb
    from twisted_iop.wire.peer import FramedPeerProtocol
    from twisted_iop.wire.settings import PeerSettings

    class Peer(FramedPeerProtocol):
        turn_writes = True

    server_end: Deferred[Collect] = Deferred()

    class Server(Factory):
        def buildProtocol(self, addr: Any) -> Collect:
            collect = Collect()
            server_end.callback(collect)
            return collect

    port = await TCP4ServerEndpoint(REACTOR, 0, interface="127.0.0.1").listen(Server())
    peer = Peer(REACTOR, PeerSettings())
    await TCP4ClientEndpoint(REACTOR, "127.0.0.1", port.getHost().port).connect(Factory.forProtocol(lambda: peer))
    collect = await server_end
    try:
        peer.send("ping", pb.Ping(sent_at_ms=7))
        peer.fail_connection(pb.ERROR_CODE_INTERNAL, "going away")

        def frames() -> list[pb.Envelope]:
            out, data = [], collect.received
            while len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
                length = int.from_bytes(data[:4], "big")
                out.append(pb.Envelope.FromString(data[4 : 4 + length]))
                data = data[4 + length :]
            return out

        received = await eventually(lambda: len(frames()) == 2 and frames(), timeout=5, message="both frames")
        assert [e.WhichOneof("body") for e in received] == ["ping", "error"]
        assert received[1].error.message == "going away"
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_turn_buffer_with_a_delay_waits_for_it() -> None:
    """With ``delay_seconds`` the first write of a batch waits that long for others, then all leave together."""
    transport, collect, port = await connected_pair()
    try:
        clock = Clock()
        buffer = TurnBuffer(transport, clock, delay_seconds=0.002)
        buffer.write(b"one ")
        clock.advance(0.001)
        buffer.write(b"two")
        assert buffer.held == 7
        clock.advance(0.001)
        assert buffer.held == 0
        await eventually(lambda: collect.received == b"one two", timeout=5, message="both writes")
    finally:
        await close(transport, port)
