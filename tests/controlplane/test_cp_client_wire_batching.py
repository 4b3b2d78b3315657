"""The client wire writes the events of one reactor turn together: in order,
bounded, one write per subscriber, and a slow subscriber delays no other."""

from __future__ import annotations

from typing import cast

import attrs
import pytest
from autobahn.websocket.protocol import WebSocketProtocol
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.interfaces import IPushProducer
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.live_event import event_frame, event_payload
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.client_wire import (
    BATCH_BYTES,
    BATCH_EVENTS,
    ClientWireFactory,
    ClientWireSettings,
)
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.ws_frames import binary_frame
from twisted_iop.testing.wires.frames import ws_messages
from twisted_iop.testing.wires.peers import HeldEdgePeer
from twisted_iop.testing.wires.wire import ClientConnection
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb

HELLO = EdgeHello(labels={}, software_version="t", protocol_version="1.0", commands=())


class Counted(ClientConnection):
    """A /client socket that also counts the writes to its transport."""

    def __init__(self, protocol: object) -> None:
        super().__init__(protocol)
        self.writes: list[int] = []
        write = self.transport.write

        def counted(data: bytes) -> None:
            self.writes.append(len(data))
            write(data)

        self.transport.write = counted  # type: ignore[method-assign]  # replaced for this test, to count writes


class Fleet:
    """A registry with one connected edge, a clock, and /client sockets over StringTransports."""

    def __init__(self, settings: ClientWireSettings = ClientWireSettings()) -> None:
        self.clock = Clock()
        self.registry = EdgeRegistry(self.clock)
        self.factory = ClientWireFactory(
            self.registry, attrs.evolve(settings, auto_ping_interval_seconds=0.0), self.clock
        )
        self.registry.connect("edge-a", HeldEdgePeer(), HELLO)

    def subscriber(self) -> Counted:
        """A socket subscribed to the whole fleet, its transport emptied and its writes counted from now."""
        socket_ = Counted(self.factory.buildProtocol(None))
        socket_.send("client_hello_request", pb.ClientHelloRequest(client_name="t", protocol_major=PROTOCOL_MAJOR), 1)
        socket_.send("subscribe_request", pb.SubscribeRequest(), 2)
        socket_.transport.clear()
        socket_.writes.clear()
        return socket_

    def record(self, count: int, message: str = "") -> None:
        """Record ``count`` events of edge-a."""
        for i in range(count):
            self.registry.record("edge-a", "node.note", node_id=f"n{i}", message=message)


def flow(socket_: ClientConnection) -> IPushProducer:
    """The flow control the server side registered on ``socket_``'s transport."""
    producer = socket_.transport.producer
    assert producer is not None
    return cast(IPushProducer, producer)


def event_sequences(socket_: ClientConnection) -> list[int]:
    """The fleet sequences of the events written to ``socket_`` so far."""
    return [m.event.fleet_sequence for m in socket_.received()[0] if m.WhichOneof("body") == "event"]


def test_events_of_one_turn_arrive_in_order_in_one_write() -> None:
    """Events recorded in one turn wait for the next turn, then go out in order in a single write."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    fleet.record(5)
    assert socket_.transport.value() == b""  # nothing before the turn ends
    fleet.clock.advance(0)
    assert event_sequences(socket_) == [2, 3, 4, 5, 6]
    assert len(socket_.writes) == 1
    assert [m.event.node_id for m in socket_.received()[0]] == ["n0", "n1", "n2", "n3", "n4"]


def test_one_turn_call_serves_every_subscriber() -> None:
    """Several subscribers with events in one turn are flushed by one timer call, each by one write."""
    fleet = Fleet()
    sockets = [fleet.subscriber() for _ in range(3)]
    fleet.record(4)
    assert len(fleet.clock.getDelayedCalls()) == 1
    fleet.clock.advance(0)
    for socket_ in sockets:
        assert event_sequences(socket_) == [2, 3, 4, 5]
        assert len(socket_.writes) == 1


def test_an_open_subscriber_loses_nothing_to_a_small_queue() -> None:
    """A turn with more events than the queue's count bound is written at the bound, not dropped."""
    fleet = Fleet(ClientWireSettings(subscriber_queue=3))
    socket_ = fleet.subscriber()
    fleet.record(10)
    fleet.clock.advance(0)
    assert event_sequences(socket_) == list(range(2, 12))
    assert [m.WhichOneof("body") for m in socket_.received()[0]] == ["event"] * 10


def test_a_busy_turn_is_written_at_the_batch_bound() -> None:
    """An open subscriber never holds more than BATCH_EVENTS events for the next turn."""
    fleet = Fleet(ClientWireSettings(subscriber_queue=10 * BATCH_EVENTS))
    socket_ = fleet.subscriber()
    fleet.record(BATCH_EVENTS * 2 + 3)
    assert socket_.protocol.queued_events == 3
    assert event_sequences(socket_) == list(range(2, 2 + 2 * BATCH_EVENTS))
    fleet.clock.advance(0)
    assert event_sequences(socket_) == list(range(2, 2 + 2 * BATCH_EVENTS + 3))
    assert socket_.protocol.queued_events == 0 and socket_.protocol.queued_bytes == 0


def test_each_write_is_bounded_in_bytes() -> None:
    """Large events are written in pieces of at most BATCH_BYTES plus one frame, all of them, in order."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    fleet.record(60, message="m" * 3000)
    fleet.clock.advance(0)
    writes = socket_.writes
    assert len(writes) > 1
    assert max(writes) <= BATCH_BYTES + 3100
    assert event_sequences(socket_) == list(range(2, 62))


def test_a_slow_subscriber_does_not_delay_the_others_and_hears_what_it_lost() -> None:
    """A paused subscriber's events wait (bounded) while another gets all of them at the next turn;
    once drained, the slow one is told how many it lost before its next events."""
    fleet = Fleet(ClientWireSettings(subscriber_queue=4))
    slow, fast = fleet.subscriber(), fleet.subscriber()
    flow(slow).pauseProducing()
    fleet.record(10)
    fleet.clock.advance(0)
    assert event_sequences(fast) == list(range(2, 12))
    assert slow.transport.value() == b""
    assert slow.protocol.queued_events == 4
    flow(slow).resumeProducing()
    messages = slow.received()[0]
    lost = messages[0].events_lost
    assert (lost.count, lost.first_sequence, lost.last_sequence, lost.reason) == (6, 2, 7, "slow_consumer")
    assert [m.event.fleet_sequence for m in messages[1:]] == [8, 9, 10, 11]


def test_a_subscriber_paused_with_events_due_is_flushed_on_resume() -> None:
    """A socket that fills after its events were queued for the turn keeps them until it drains."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    fleet.record(3)
    flow(socket_).pauseProducing()
    fleet.clock.advance(0)
    assert socket_.transport.value() == b""
    flow(socket_).resumeProducing()
    assert event_sequences(socket_) == [2, 3, 4]


def test_an_answer_follows_the_events_recorded_before_the_request() -> None:
    """Events waiting for the turn go out before the answer to the client's next message."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    fleet.record(2)
    socket_.send("unsubscribe_request", pb.UnsubscribeRequest(), 7)
    bodies = [(m.WhichOneof("body"), m.request_id) for m in socket_.received()[0]]
    assert bodies == [("event", 0), ("event", 0), ("subscribe_response", 7)]
    fleet.record(1)
    fleet.clock.advance(0)
    assert len(socket_.received()[0]) == 3  # unsubscribed: nothing more


def test_a_closed_socket_drops_its_queued_events() -> None:
    """Events due for a socket that closed before the turn are dropped, not written."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    fleet.record(3)
    socket_.protocol.state = WebSocketProtocol.STATE_CLOSED
    fleet.clock.advance(0)
    assert socket_.transport.value() == b""
    assert socket_.protocol.queued_events == 0 and socket_.protocol.queued_bytes == 0


def test_masked_server_frames_fall_back_to_autobahn() -> None:
    """A socket set to mask server frames gets its events through Autobahn's own framing."""
    fleet = Fleet()
    fleet.factory.setProtocolOptions(maskServerFrames=True)
    socket_ = fleet.subscriber()
    fleet.record(2)
    fleet.clock.advance(0)
    data = socket_.transport.value()
    assert len(socket_.writes) == 2  # one sendMessage each
    assert data[1] & 0x80  # the mask bit
    assert socket_.protocol.queued_events == 0


def test_compression_other_than_ours_falls_back_to_autobahn() -> None:
    """A factory whose compression choice is not the wire's own (it might
    negotiate compression) has its events written by Autobahn, one message each."""
    fleet = Fleet()
    fleet.factory.setProtocolOptions(perMessageCompressionAccept=lambda offers: None)
    socket_ = fleet.subscriber()
    fleet.record(2)
    fleet.clock.advance(0)
    assert len(socket_.writes) == 2  # one sendMessage each
    assert event_sequences(socket_) == [2, 3]


def test_a_client_offering_compression_gets_plain_frames() -> None:
    """A client that offers permessage-deflate is not granted it, and its
    events arrive as uncompressed frames written together."""
    fleet = Fleet()
    socket_ = ClientConnection(
        fleet.factory.buildProtocol(None), b"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    )
    assert b"permessage-deflate" not in socket_.handshake_response.lower()
    socket_.send("client_hello_request", pb.ClientHelloRequest(client_name="t", protocol_major=PROTOCOL_MAJOR), 1)
    socket_.send("subscribe_request", pb.SubscribeRequest(), 2)
    socket_.transport.clear()
    fleet.record(3, message="compressible " * 20)
    fleet.clock.advance(0)
    data = socket_.transport.value()
    assert data[0] == 0x82  # final, binary, no RSV1 (compressed) bit
    assert event_sequences(socket_) == [2, 3, 4]


def _autobahn_frame(payload: bytes) -> bytes:
    """What Autobahn's sendMessage writes for ``payload`` on a server socket."""
    fleet = Fleet()
    socket_ = fleet.subscriber()
    socket_.protocol.sendMessage(payload, isBinary=True)
    return bytes(socket_.transport.value())


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_binary_frame_is_autobahns_frame(size: int) -> None:
    """Our frame of a payload is byte for byte the frame Autobahn writes, at every length encoding."""
    payload = bytes(i % 251 for i in range(size))
    assert binary_frame(payload) == _autobahn_frame(payload)


@given(st.binary(max_size=300))
def test_binary_frames_parse_back(payload: bytes) -> None:
    """Any payload framed by binary_frame reads back as that one binary message."""
    envelope = pb.ClientEnvelope(event=pb.FleetEvent(message=payload.hex()))
    messages, close_code = ws_messages(binary_frame(envelope.SerializeToString()))
    assert close_code is None and messages == [envelope]


def test_each_event_is_framed_once_for_all_subscribers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Subscribers flushed in one turn share each event's serialization."""
    import twisted_iop.controlplane.wires.client_wire as client_wire

    fleet = Fleet()
    sockets = [fleet.subscriber() for _ in range(3)]
    framed: list[int] = []
    frame = client_wire.event_frame

    def counting(event: EventRecord) -> bytes:
        framed.append(event.fleet_sequence)
        return frame(event)

    monkeypatch.setattr(client_wire, "event_frame", counting)
    fleet.record(4)
    fleet.clock.advance(0)
    assert len(framed) == 4
    for socket_ in sockets:
        assert event_sequences(socket_) == [2, 3, 4, 5]
    # A later turn frames its own events anew: nothing of the last turn is reused.
    fleet.record(2)
    fleet.clock.advance(0)
    assert len(framed) == 6
    for socket_ in sockets:
        assert event_sequences(socket_) == [2, 3, 4, 5, 6, 7]


@settings(max_examples=200, deadline=None)
@given(message=st.one_of(st.integers(0, 200), st.integers(65_000, 66_000)), attributes=st.integers(0, 3))
def test_an_event_frame_is_the_frame_of_its_message(message: int, attributes: int) -> None:
    """Framing an event in one step gives the frame of its message, for every length
    (small frames with their prefix from a table, and 16- and 64-bit lengths)."""
    event = EventRecord(
        1,
        2,
        "edge-a",
        "node.note",
        1.0,
        2.0,
        message="m" * message,
        attributes={f"k{i}": "v" for i in range(attributes)},
    )
    assert event_frame(event) == binary_frame(event_payload(event))
