"""EdgeRegistry rules with plain calls and an injected clock."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs

from twisted_iop.controlplane.fleet import registry as registry_module
from twisted_iop.controlplane.fleet.event_log import PROTOCOL_VIOLATION_INTERVAL_SECONDS, EventBuffer
from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.fleet.operations import OperationBuffer, OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.requests.operation_states import LateOutcome
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import GENERAL_AT, HEALTH_AT, HEALTHS, LONG_AT, STATUS_AT, STATUSES

HELLO = EdgeHello(labels={}, software_version="t", protocol_version="1.0", commands=(pb.CommandSpec(name="x"),))


def make_registry(**limits: int) -> tuple[EdgeRegistry, Clock]:
    """A registry on a fake clock starting at t=1000."""
    clock = Clock()
    clock.advance(1000)
    return EdgeRegistry(clock, RegistryLimits(**limits)), clock


def kinds(registry: EdgeRegistry, edge_id: str) -> list[str]:
    """Event kinds of one edge, oldest first."""
    return [e.kind for e in registry.get(edge_id).events.since(0, 10000)]


def test_connect_disconnect_keeps_the_edge_known() -> None:
    """A disconnected edge stays known with connected=false and its times."""
    registry, clock = make_registry()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    clock.advance(5)
    assert registry.disconnect("edge-a", token, "bye")
    record = registry.get("edge-a")
    assert not record.connected
    assert record.disconnected_at == 1005
    assert record.connected_at == 1000
    assert kinds(registry, "edge-a") == ["edge.connected", "edge.disconnected"]


def test_newest_wins_and_old_token_is_stale() -> None:
    """A second connect supersedes the first; the first token changes nothing after."""
    registry, _ = make_registry()
    old_peer = HeldEdgePeer()
    old = registry.connect("edge-a", old_peer, HELLO)
    new = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    assert old_peer.disconnects == [pb.ERROR_CODE_SUPERSEDED]
    assert not registry.disconnect("edge-a", old, "late close")
    assert registry.get("edge-a").connected and registry.get("edge-a").token == new
    assert keep_status(registry, "edge-a", old, pb.EdgeStatusResponse()) is None
    assert registry.record_edge_event("edge-a", old, pb.EdgeEvent(kind="node.ready")) is None
    assert kinds(registry, "edge-a") == ["edge.connected", "edge.superseded", "edge.connected"]
    assert registry.connected_count == 1


def test_a_forgotten_edge_dialing_in_again_continues_its_numbering() -> None:
    """An edge forgotten for the bounds comes back with its sequences going on
    (never a number twice), and its own event numbering remembered."""
    registry, _ = make_registry(disconnected_edges=1)
    token = registry.connect("e0", HeldEdgePeer(), HELLO)
    registry.record_edge_event("e0", token, pb.EdgeEvent(kind="node.ready", edge_sequence=7))
    registry.disconnect("e0", token, "gone")
    before = registry.get("e0").events.last_sequence
    assert before == 3
    other = registry.connect("e1", HeldEdgePeer(), HELLO)
    registry.disconnect("e1", other, "gone")
    assert registry.find("e0") is None and registry.forgotten_edges == 1
    token = registry.connect("e0", HeldEdgePeer(), HELLO)
    [connected] = registry.get("e0").events.since(0, 10)
    assert (connected.kind, connected.sequence) == ("edge.connected", before + 1)
    # Its own numbering went on from 7: 9 says one event was lost, 8 would not.
    registry.record_edge_event("e0", token, pb.EdgeEvent(kind="node.ready", edge_sequence=9))
    assert kinds(registry, "e0") == ["edge.connected", "edge.events_lost", "node.ready"]


def test_forgotten_numbering_is_bounded(monkeypatch: Any) -> None:
    """At most FORGOTTEN_NUMBERING forgotten edges are remembered, the oldest go first."""
    monkeypatch.setattr(registry_module, "FORGOTTEN_NUMBERING", 2)
    registry, _ = make_registry()
    for i in range(3):
        registry.remember_numbering(f"e{i}", 10 + i, 0)
    for i, expected in ((0, 0), (1, 11), (2, 12)):
        registry.connect(f"e{i}", HeldEdgePeer(), HELLO)
        assert registry.get(f"e{i}").events.last_sequence == expected + 1


def test_disconnected_edges_are_bounded() -> None:
    """Only the configured number of disconnected edges is remembered."""
    registry, _ = make_registry(disconnected_edges=2)
    for i in range(4):
        token = registry.connect(f"e{i}", HeldEdgePeer(), HELLO)
        registry.disconnect(f"e{i}", token, "gone")
    assert registry.edge_ids() == ["e2", "e3"]


def test_no_disconnected_edge_is_kept_with_a_limit_of_zero() -> None:
    """disconnected_edges: 0 forgets an edge as it disconnects, plain or with a command still open."""
    registry, clock = make_registry(disconnected_edges=0)
    token = registry.connect("plain", HeldEdgePeer(), HELLO)
    registry.disconnect("plain", token, "gone")
    assert registry.edge_ids() == []
    token = registry.connect("busy", HeldEdgePeer(), HELLO)
    op = OperationRecord("op1", "busy", "x", "", {}, "", created_at=clock.seconds(), deadline_at=clock.seconds() + 10)
    registry.operations.start_operation(op)
    registry.disconnect("busy", token, "gone")
    # Its record holds an operation still open: kept while it is open ...
    assert registry.edge_ids() == ["busy"]
    registry.operations.advance_operation("busy", "op1", operation_states.EDGE_DISCONNECTED, "gone")
    # ... and forgotten as soon as it ends, not listed for ever.
    assert registry.edge_ids() == []
    assert registry.known_count == 0


def test_event_buffer_bounds_and_counts_drops() -> None:
    """A full event buffer drops the oldest, counts them and keeps sequences."""
    buffer = EventBuffer(3, 1 << 20)
    registry, _ = make_registry(events_per_edge=3)
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    for i in range(5):
        registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind=f"k{i}"))
    events = registry.get("edge-a").events
    assert [e.sequence for e in events.since(0, 100)] == [4, 5, 6]
    assert events.dropped == 3 and events.first_sequence == 4 and events.last_sequence == 6
    assert [e.sequence for e in events.since(4, 1)] == [5]
    assert buffer.since(0, 10) == []


def test_gaps_in_the_edge_sequence_are_recorded() -> None:
    """A skip in the edge's own numbering, even across reconnects, becomes edge.events_lost."""
    registry, _ = make_registry()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    for sequence in (1, 2):
        registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="node.ready", edge_sequence=sequence))
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)  # the edge reconnects
    registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="node.ready", edge_sequence=5))
    registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="node.ready", edge_sequence=1))  # edge restarted
    registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="node.ready", edge_sequence=2))
    lost = [e for e in registry.get("edge-a").events.since(0, 100) if e.kind == "edge.events_lost"]
    assert [(e.attributes["count"], e.attributes["first_edge_sequence"]) for e in lost] == [("2", "3")]


def test_operation_lifecycle_is_forward_only_and_terminal_is_final() -> None:
    """An operation only moves forward; after a terminal state nothing moves it."""
    registry, clock = make_registry()
    registry.connect("edge-a", HeldEdgePeer(), HELLO)
    op = OperationRecord("op1", "edge-a", "x", "", {}, "", created_at=clock.seconds(), deadline_at=clock.seconds() + 10)
    registry.operations.start_operation(op)
    assert registry.operations.advance_operation("edge-a", "op1", operation_states.RUNNING)
    assert not registry.operations.advance_operation("edge-a", "op1", operation_states.ACCEPTED)  # no going back
    assert registry.operations.advance_operation("edge-a", "op1", operation_states.SUCCEEDED, result={"a": "b"})
    assert not registry.operations.advance_operation("edge-a", "op1", operation_states.TIMED_OUT)
    assert op.state == operation_states.SUCCEEDED and op.result == {"a": "b"}
    assert [h[0] for h in op.history] == ["sent", "running", "succeeded"]
    assert [k for k in kinds(registry, "edge-a") if k.startswith("operation.")] == [
        "operation.sent",
        "operation.running",
        "operation.succeeded",
    ]


def test_relayed_command_events_never_change_an_operation_by_themselves() -> None:
    """The registry records command.* events but leaves operation states alone."""
    registry, clock = make_registry()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    op = OperationRecord("op1", "edge-a", "x", "", {}, "", created_at=clock.seconds(), deadline_at=clock.seconds() + 10)
    registry.operations.start_operation(op)
    registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="command.succeeded", command_id="op1"))
    assert op.state == operation_states.SENT
    assert kinds(registry, "edge-a")[-1] == "command.succeeded"


def test_reserved_event_kinds_from_an_edge_are_dropped_and_reported_rate_limited() -> None:
    """operation.* and edge.* from an edge are dropped; one protocol_violation event per interval."""
    registry, clock = make_registry()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    op = OperationRecord("op1", "edge-a", "x", "", {}, "", created_at=clock.seconds(), deadline_at=clock.seconds() + 10)
    registry.operations.start_operation(op)
    before = kinds(registry, "edge-a")
    with capturedLogs() as logged:
        for kind in ("operation.succeeded", "edge.connected", "operation.failed"):
            assert registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind=kind, command_id="op1")) is None
    warnings = [e for e in logged if e["log_level"] == LogLevel.warn]
    assert len(warnings) == 1 and warnings[0]["kind"] == "operation.succeeded"  # one warning per connection
    assert op.state == operation_states.SENT
    after = kinds(registry, "edge-a")[len(before) :]
    assert after == ["edge.protocol_violation"]
    violation = registry.get("edge-a").events.since(0, 100)[-1]
    assert violation.attributes == {"kind": "operation.succeeded", "dropped": "1"}
    clock.advance(PROTOCOL_VIOLATION_INTERVAL_SECONDS)
    registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="edge.superseded"))
    violation = registry.get("edge-a").events.since(0, 100)[-1]
    assert violation.kind == "edge.protocol_violation"
    assert violation.attributes == {"kind": "edge.superseded", "dropped": "3"}  # two held back, and this one
    assert registry.record_edge_event("edge-a", token, pb.EdgeEvent(kind="node.ready")) is not None


def test_late_outcome_is_kept_once_and_only_after_the_end() -> None:
    """A late answer is kept beside a finished operation, once, with an event."""
    registry, clock = make_registry()
    registry.connect("edge-a", HeldEdgePeer(), HELLO)
    op = OperationRecord("op1", "edge-a", "x", "", {}, "", created_at=clock.seconds(), deadline_at=clock.seconds() + 10)
    registry.operations.start_operation(op)
    assert not registry.operations.record_late_outcome(
        "edge-a", "op1", operation_states.SUCCEEDED, "", {}
    )  # still in flight
    registry.operations.advance_operation("edge-a", "op1", operation_states.TIMED_OUT, "no answer")
    clock.advance(3)
    assert registry.operations.record_late_outcome("edge-a", "op1", operation_states.SUCCEEDED, "done", {"k": "v"})
    assert not registry.operations.record_late_outcome("edge-a", "op1", operation_states.FAILED, "again", {})
    assert op.state == operation_states.TIMED_OUT
    assert op.late_outcome == LateOutcome(operation_states.SUCCEEDED, "done", {"k": "v"}, 1003.0)
    assert kinds(registry, "edge-a")[-1] == "operation.late_outcome"


def test_operation_buffer_evicts_only_finished() -> None:
    """A full operation buffer evicts the oldest finished operation and its key."""
    buffer = OperationBuffer(2, 1 << 20)
    ops = [OperationRecord(f"op{i}", "e", "x", "", {}, f"key{i}", created_at=i, deadline_at=i + 1) for i in range(3)]
    buffer.add(ops[0])
    buffer.add(ops[1])
    buffer.add(ops[2])
    assert len(buffer) == 3  # nothing finished yet: nothing evicted
    ops[1].advance(operation_states.SUCCEEDED, 5)
    buffer.operation_changed(ops[1])
    assert [o.operation_id for o in buffer] == ["op0", "op2"]
    assert buffer.by_key("key1") is None and buffer.dropped == 1
    assert buffer.by_key("key2") is ops[2]


class RegistryMachine(RuleBasedStateMachine):
    """Connect / duplicate connect / stale close / late replies in any order.

    The model: for each edge the newest accepted connection is current; a
    close or reply from any other connection changes nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.registry = EdgeRegistry(self.clock, RegistryLimits(events_per_edge=10000))
        self.tokens: list[tuple[str, int]] = []
        self.current: dict[str, int] = {}
        self.closed: set[int] = set()

    edges = st.sampled_from(["a", "b", "c"])

    @rule(edge=edges)
    def connect(self, edge: str) -> None:
        token = self.registry.connect(edge, HeldEdgePeer(), HELLO)
        self.tokens.append((edge, token))
        self.current[edge] = token

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        edge, token = data.draw(st.sampled_from(self.tokens))
        changed = self.registry.disconnect(edge, token, "closed")
        expected = self.current.get(edge) == token and token not in self.closed
        assert changed == expected
        self.closed.add(token)
        if expected:
            del self.current[edge]

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def late_status(self, data: st.DataObject) -> None:
        edge, token = data.draw(st.sampled_from(self.tokens))
        before = self.registry.get(edge).snapshot
        result = keep_status(self.registry, edge, token, pb.EdgeStatusResponse(edge_id=edge))
        if self.current.get(edge) == token:
            assert result is not None
        else:
            assert result is None and self.registry.get(edge).snapshot is before

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def late_event(self, data: st.DataObject) -> None:
        edge, token = data.draw(st.sampled_from(self.tokens))
        last = self.registry.get(edge).events.last_sequence
        result = self.registry.record_edge_event(edge, token, pb.EdgeEvent(kind="node.ready"))
        if self.current.get(edge) == token:
            assert result is not None and result.sequence == last + 1
        else:
            assert result is None and self.registry.get(edge).events.last_sequence == last

    @rule()
    def tick(self) -> None:
        self.clock.advance(1)

    @invariant()
    def connected_matches_model(self) -> None:
        for record in self.registry.edges():
            assert record.connected == (record.edge_id in self.current)
            if record.connected:
                assert record.token == self.current[record.edge_id]
        assert self.registry.connected_count == len(self.current)

    @invariant()
    def sequences_are_monotonic(self) -> None:
        for record in self.registry.edges():
            seqs = [e.sequence for e in record.events.since(0, 100000)]
            assert seqs == list(range(1, len(seqs) + 1))


TestRegistryMachine = RegistryMachine.TestCase


def test_snapshot_counts_are_computed_when_the_status_arrives() -> None:
    """The kept snapshot carries its counts: nodes, providers by status and health, and the counters."""
    registry, _ = make_registry()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    response = pb.EdgeStatusResponse(edge_id="edge-a")
    up = response.nodes.add(node_id="n1", connected=True)
    up.providers.add(
        provider_id="p1",
        status=pb.PROVIDER_STATUS_AVAILABLE,
        health=pb.PROVIDER_HEALTH_HEALTHY,
        capacity=8,
        in_flight=3,
        queued=1,
        long_context_capacity=2,
        long_context_in_flight=1,
    )
    down = response.nodes.add(node_id="n2", connected=False)
    down.providers.add(provider_id="p2", status=99, health=99, capacity=4)
    snapshot = keep_status(registry, "edge-a", token, response)
    assert snapshot is not None
    counts = snapshot.counts
    assert counts[:3] == (1, 2, 2)
    assert [counts[STATUS_AT[name]] for name in STATUSES] == [1, 0, 1]
    assert [counts[HEALTH_AT[name]] for name in HEALTHS] == [1, 0, 0, 0, 1]
    assert counts[GENERAL_AT : GENERAL_AT + 3] == (12, 3, 1)
    assert counts[LONG_AT : LONG_AT + 3] == (2, 1, 0)
