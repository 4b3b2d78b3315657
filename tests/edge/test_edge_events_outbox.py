"""Event relay: sequences, edge timestamps, bounded outbox and overflow report."""

from __future__ import annotations

from twisted.internet.task import Clock

from twisted_iop.edge.events import EventRelay
from twisted_iop.wire import control_pb2 as pb


def test_events_are_numbered_and_stamped() -> None:
    """Each event has the next sequence and the edge clock's time in ms."""
    clock = Clock()
    clock.advance(12.5)
    relay = EventRelay(clock, 10)
    sent: list[pb.EdgeEvent] = []
    relay.attach(sent.append)
    relay.emit("node.ready", node_id="n1")
    clock.advance(1)
    relay.emit("node.disconnected", node_id="n1")
    assert [(e.edge_sequence, e.occurred_at_ms, e.kind) for e in sent] == [
        (1, 12500, "node.ready"),
        (2, 13500, "node.disconnected"),
    ]


def test_outbox_flushes_in_order_on_attach() -> None:
    """Events emitted while detached are delivered in order when attached."""
    relay = EventRelay(Clock(), 10)
    for i in range(3):
        relay.emit("k", message=str(i))
    assert relay.outbox_length == 3
    sent: list[pb.EdgeEvent] = []
    assert relay.attach(sent.append) == 3
    assert [e.message for e in sent] == ["0", "1", "2"]
    relay.emit("live")
    assert sent[-1].kind == "live" and relay.outbox_length == 0


def test_overflow_is_counted_and_reported() -> None:
    """Overflow keeps the newest events and ends the flush with outbox.overflow."""
    relay = EventRelay(Clock(), 2)
    for i in range(5):
        relay.emit("k", message=str(i))
    sent: list[pb.EdgeEvent] = []
    relay.attach(sent.append)
    assert [e.message for e in sent[:2]] == ["3", "4"]
    overflow = sent[2]
    assert overflow.kind == "outbox.overflow"
    assert overflow.attributes["dropped"] == "3"
    assert overflow.attributes["first_dropped_sequence"] == "1"
    assert overflow.attributes["last_dropped_sequence"] == "3"
    assert overflow.edge_sequence == 6
    assert relay.dropped_total == 3
    # The count is reported once only.
    relay.detach()
    later: list[pb.EdgeEvent] = []
    relay.attach(later.append)
    assert later == []


def test_detach_queues_again() -> None:
    """After detach events wait in the outbox."""
    relay = EventRelay(Clock(), 5)
    sent: list[pb.EdgeEvent] = []
    relay.attach(sent.append)
    relay.detach()
    relay.emit("k")
    assert sent == [] and relay.outbox_length == 1


def test_outbox_is_bounded_in_bytes_and_reports_the_drop() -> None:
    """Large events fill the outbox's byte budget before its count; the oldest
    are dropped and the flush ends with outbox.overflow."""
    budget = 64 * 1024
    relay = EventRelay(Clock(), 1000, budget)
    for _ in range(40):
        relay.emit("node.note", message="m" * 4000)
    assert relay.outbox_length < 40 and relay.outbox_bytes <= budget
    sent: list[pb.EdgeEvent] = []
    relay.attach(sent.append)
    assert relay.outbox_bytes == 0
    overflow = sent[-1]
    assert overflow.kind == "outbox.overflow"
    assert int(overflow.attributes["dropped"]) == 40 - (len(sent) - 1) == relay.dropped_total
    assert sent[0].edge_sequence == int(overflow.attributes["last_dropped_sequence"]) + 1
