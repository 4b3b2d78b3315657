"""The gateway with plain calls and a fake clock: fan-out, fleet rounds,
status asks across a takeover, and commands (states, late outcomes,
idempotency, forged answers and events)."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.bounds import MAX_STATUS_NODES
from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.requests.command_dispatch import (
    LATE_ANSWERS_PER_CONNECTION,
    ROUTED_GRACE_SECONDS,
    IdempotencyConflict,
)
from twisted_iop.controlplane.requests.errors import SHUTTING_DOWN_REASON, EdgeErrorAnswer, EdgeTimeout, ShuttingDown
from twisted_iop.controlplane.requests.fleet_rounds import FANOUT_SLICE, FleetRound
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.requests.operation_states import LateOutcome
from twisted_iop.controlplane.requests.status_asks import RECOUNT_SHARE
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import HeldEdgePeer, snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerDisconnected
from twisted_iop.wire.status_totals import carried_counts, response_counts, totals_message

CATALOG = (pb.CommandSpec(name="node.drain", target_kind="node"), pb.CommandSpec(name="edge.diagnostics"))
HELLO = EdgeHello(labels={}, software_version="t", protocol_version="1.0", commands=CATALOG)


def fleet(n: int) -> tuple[EdgeGateway, EdgeRegistry, Clock, list[HeldEdgePeer]]:
    """A gateway over a registry of ``n`` connected edges with held peers."""
    clock = Clock()
    registry = EdgeRegistry(clock)
    peers = []
    for i in range(n):
        peer = HeldEdgePeer()
        registry.connect(f"e{i:05d}", peer, HELLO)
        peers.append(peer)
    return EdgeGateway(registry, clock, status_timeout_seconds=5, fleet_max_age_seconds=0), registry, clock, peers


def test_fanout_is_sliced_across_reactor_turns() -> None:
    """Only one slice of requests goes out per reactor turn, with no per-request timers."""
    gateway, _registry, clock, peers = fleet(FANOUT_SLICE * 2 + 10)
    result: list[FleetRound] = []
    gateway.fleet_status().addCallback(result.append)
    # One slice now; the next is scheduled for the next reactor turn, and
    # the round has one deadline timer instead of one per request.
    assert sum(len(p.requests) for p in peers) == FANOUT_SLICE
    assert sorted(call.getTime() for call in clock.getDelayedCalls()) == [0, 5]
    clock.advance(0)
    assert all(len(p.requests) == 1 and p.deadlines == [False] for p in peers)
    for i, peer in enumerate(peers):
        peer.requests[0].callback(pb.EdgeStatusResponse(edge_id=f"e{i:05d}"))
    assert [row.state for row in result[0].rows] == ["ok"] * len(peers)
    assert clock.getDelayedCalls() == []  # the round's deadline was cancelled


def test_round_deadline_cancels_only_the_silent_edges() -> None:
    """At the deadline the unanswered requests are cancelled and become timeout rows."""
    gateway, _registry, clock, peers = fleet(20)
    result: list[FleetRound] = []
    gateway.fleet_status().addCallback(result.append)
    for i, peer in enumerate(peers):
        if i % 5:
            peer.requests[0].callback(pb.EdgeStatusResponse(edge_id=f"e{i:05d}"))
    assert result == []
    clock.advance(5)
    states = [row.state for row in result[0].rows]
    assert states == ["timeout" if i % 5 == 0 else "ok" for i in range(20)]
    assert [p.cancelled for p in peers] == [1 if i % 5 == 0 else 0 for i in range(20)]
    assert result[0].rows[0].error_code == "edge_timeout"


def test_single_status_joins_a_fleet_round() -> None:
    """A status view during a fleet round shares the round's request for that edge."""
    gateway, _registry, _clock, peers = fleet(1)
    rows: list[FleetRound] = []
    gateway.fleet_status().addCallback(rows.append)
    single: list[Any] = []
    gateway.status("e00000").addCallback(single.append)
    assert len(peers[0].requests) == 1
    peers[0].requests[0].callback(pb.EdgeStatusResponse(edge_id="e00000"))
    assert rows[0].rows[0].state == "ok" and single[0].parse().edge_id == "e00000"


def answer_all(peers: list[HeldEdgePeer]) -> None:
    """Answer every pending status request of ``peers``."""
    for i, peer in enumerate(peers):
        for d in peer.requests:
            if not d.called:
                d.callback(pb.EdgeStatusResponse(edge_id=f"e{i:05d}"))


def test_concurrent_fleet_views_share_one_round() -> None:
    """Views arriving while a round runs join it: one request per edge, one round for all."""
    gateway, _registry, clock, peers = fleet(3)
    rounds: list[FleetRound] = []
    for _ in range(4):
        gateway.fleet_status().addCallback(rounds.append)
    assert [len(p.requests) for p in peers] == [1, 1, 1]
    answer_all(peers)
    assert len(rounds) == 4 and all(r is rounds[0] for r in rounds)
    assert rounds[0].round_at == clock.seconds()


def test_a_round_is_reused_within_its_max_age_only() -> None:
    """Within the max age of the last round's start its rows are reused; after it a new round runs."""
    gateway, _registry, clock, peers = fleet(2)
    gateway.fleet_max_age_seconds = 1.0
    first: list[FleetRound] = []
    gateway.fleet_status().addCallback(first.append)
    answer_all(peers)
    clock.advance(0.9)
    again: list[FleetRound] = []
    gateway.fleet_status().addCallback(again.append)
    assert again == first and [len(p.requests) for p in peers] == [1, 1]
    clock.advance(0.1)
    fresh: list[FleetRound] = []
    gateway.fleet_status().addCallback(fresh.append)
    assert [len(p.requests) for p in peers] == [2, 2]
    answer_all(peers)
    assert fresh[0] is not first[0] and fresh[0].round_at == first[0].round_at + 1.0


def test_status_in_flight_moves_to_the_new_connection_at_takeover() -> None:
    """A status ask on a superseded connection is re-asked of the new one at once."""
    gateway, registry, _clock, peers = fleet(1)
    waiting: list[Any] = []
    gateway.status("e00000").addBoth(waiting.append)
    old = peers[0]
    new = HeldEdgePeer()
    registry.connect("e00000", new, HELLO)
    assert old.disconnects == [pb.ERROR_CODE_SUPERSEDED]
    assert old.cancelled == 1  # the old request is abandoned, not awaited
    assert len(new.requests) == 1 and waiting == []
    new.requests[0].callback(pb.EdgeStatusResponse(edge_id="from-new"))
    assert isinstance(waiting[0], StatusSnapshot) and waiting[0].parse().edge_id == "from-new"


def test_a_new_status_view_after_takeover_asks_the_new_connection() -> None:
    """A view issued after the takeover never joins an ask of the old connection."""
    gateway, registry, _clock, _peers = fleet(1)
    first: list[Any] = []
    gateway.status("e00000").addBoth(first.append)
    new = HeldEdgePeer()
    registry.connect("e00000", new, HELLO)
    second: list[Any] = []
    gateway.status("e00000").addBoth(second.append)
    assert len(new.requests) == 1  # both share the one ask on the new connection
    assert gateway.status_waiters("e00000") == 2
    new.requests[0].callback(pb.EdgeStatusResponse(edge_id="new"))
    assert first[0] is second[0]


def test_a_fleet_round_survives_a_takeover() -> None:
    """A round's row for a superseded edge is answered by the new connection."""
    gateway, registry, _clock, peers = fleet(2)
    rounds: list[FleetRound] = []
    gateway.fleet_status().addCallback(rounds.append)
    new = HeldEdgePeer()
    registry.connect("e00001", new, HELLO)
    peers[0].requests[0].callback(pb.EdgeStatusResponse(edge_id="e00000"))
    assert rounds == []
    new.requests[0].callback(pb.EdgeStatusResponse(edge_id="new"))
    assert [row.state for row in rounds[0].rows] == ["ok", "ok"]
    assert rounds[0].rows[1].snapshot is not None and rounds[0].rows[1].snapshot.parse().edge_id == "new"


def dispatch(
    gateway: EdgeGateway, key: str = "", timeout: float = 10, target: str = "node-1", edge_id: str = "e00000"
) -> tuple[OperationRecord, list[OperationRecord], bool]:
    """Dispatch node.drain; return the operation, a list its end lands in, and replayed."""
    dispatched = gateway.dispatch(edge_id, "node.drain", target, {}, timeout, key)
    ended: list[OperationRecord] = []
    dispatched.ended.addCallback(ended.append)
    return dispatched.operation, ended, dispatched.replayed


def event_kinds(registry: EdgeRegistry, edge_id: str = "e00000") -> list[str]:
    """Event kinds recorded for one edge, oldest first."""
    return [e.kind for e in registry.get(edge_id).events.since(0, 1000)]


def test_command_answer_ends_the_operation() -> None:
    """The answer to the gateway's own request ends the operation with its outcome."""
    gateway, _registry, clock, peers = fleet(1)
    operation, ended, replayed = dispatch(gateway)
    assert not replayed and operation.state == operation_states.SENT
    peers[0].answer(outcome=pb.COMMAND_OUTCOME_REJECTED)
    assert ended == [operation] and operation.state == operation_states.REJECTED and operation.reason == "edge says"
    assert clock.getDelayedCalls() == []  # the deadline timer is gone


def test_late_answer_after_timeout_is_kept_as_late_outcome() -> None:
    """timed_out stays; the late answer is recorded beside it with an event."""
    gateway, registry, clock, peers = fleet(1)
    operation, ended, _ = dispatch(gateway, timeout=2)
    clock.advance(2)
    assert ended == [operation] and operation.state == operation_states.TIMED_OUT
    assert peers[0].commands_cancelled == 0  # still listening
    clock.advance(5)
    peers[0].answer(outcome=pb.COMMAND_OUTCOME_SUCCEEDED)
    assert operation.state == operation_states.TIMED_OUT
    assert operation.late_outcome == LateOutcome(operation_states.SUCCEEDED, "edge says", {"k": "v"}, clock.seconds())
    assert event_kinds(registry)[-1] == "operation.late_outcome"


def test_late_listening_is_bounded_per_connection() -> None:
    """Past the bound, the oldest timed-out command stops listening (its request is cancelled)."""
    gateway, _registry, clock, peers = fleet(1)
    for _ in range(LATE_ANSWERS_PER_CONNECTION + 2):
        dispatch(gateway, timeout=1)
    clock.advance(1)
    assert peers[0].commands_cancelled == 2
    assert all(d.called for _, d in peers[0].commands[:2])
    assert not any(d.called for _, d in peers[0].commands[2:])


def test_command_in_flight_ends_superseded_at_takeover() -> None:
    """A newer connection ends the old connection's commands at once, state superseded."""
    gateway, registry, clock, peers = fleet(1)
    operation, ended, _ = dispatch(gateway)
    registry.connect("e00000", HeldEdgePeer(), HELLO)
    assert ended == [operation] and operation.state == operation_states.SUPERSEDED
    assert "newer connection" in operation.reason
    assert peers[0].commands_cancelled == 1
    assert clock.getDelayedCalls() == []


def test_disconnect_ends_the_command_edge_disconnected() -> None:
    """The connection dropping before the answer ends the operation edge_disconnected."""
    gateway, _registry, _clock, peers = fleet(1)
    operation, ended, _ = dispatch(gateway)
    peers[0].commands[0][1].errback(Failure(PeerDisconnected("gone")))
    assert operation.state == operation_states.EDGE_DISCONNECTED and ended == [operation]


def test_a_forged_answer_then_a_disconnect_ends_the_command_edge_disconnected() -> None:
    """A command whose request was consumed by a wrong answer still ends when its connection closes."""
    gateway, registry, clock, peers = fleet(1)
    operation, ended, _ = dispatch(gateway)
    peers[0].answer(command_id="someone-else")
    token = registry.get("e00000").token
    assert token is not None and operation.state == operation_states.SENT
    registry.disconnect("e00000", token, "gone")
    assert operation.state == operation_states.EDGE_DISCONNECTED and ended == [operation]
    assert clock.getDelayedCalls() == []


def test_idempotent_replay_and_conflict() -> None:
    """The same key and command replays (no second dispatch); a different command conflicts."""
    gateway, _registry, _clock, peers = fleet(1)
    operation, ended, replayed = dispatch(gateway, key="k1")
    again, again_ended, again_replayed = dispatch(gateway, key="k1")
    assert again is operation and again_replayed and not replayed
    assert len(peers[0].commands) == 1
    with pytest.raises(IdempotencyConflict) as conflict:
        dispatch(gateway, key="k1", target="node-2")
    assert conflict.value.operation is operation
    with pytest.raises(IdempotencyConflict):
        gateway.dispatch("e00000", "edge.diagnostics", "node-1", {}, 10, "k1")
    with pytest.raises(IdempotencyConflict):
        gateway.dispatch("e00000", "node.drain", "node-1", {"reason": "x"}, 10, "k1")
    peers[0].answer()
    assert ended == again_ended == [operation]


def test_forged_command_id_in_an_answer_is_never_a_success() -> None:
    """An answer naming another command id is ignored; the operation ends at its deadline."""
    gateway, _registry, clock, peers = fleet(2)
    victim, victim_ended, _ = dispatch(gateway, edge_id="e00000")
    mine, _mine_ended, _ = dispatch(gateway, edge_id="e00001", timeout=3)
    peers[1].answer(command_id=victim.operation_id)
    assert victim.state == operation_states.SENT and mine.state == operation_states.SENT
    clock.advance(3)
    assert mine.state == operation_states.TIMED_OUT and mine.late_outcome is None
    assert victim.state == operation_states.SENT and victim_ended == []
    peers[0].answer()
    assert victim.state == operation_states.SUCCEEDED


@pytest.mark.parametrize("spoofer", ["same", "other"])
def test_spoofed_events_cannot_finish_or_advance_an_operation(spoofer: str) -> None:
    """operation.* events from any edge are dropped; command.* from another edge or connection change nothing."""
    gateway, registry, _clock, peers = fleet(2)
    operation, ended, _ = dispatch(gateway, edge_id="e00000")
    edge_id = "e00000" if spoofer == "same" else "e00001"
    token = registry.get(edge_id).token
    assert token is not None
    for kind in ("operation.succeeded", "operation.failed", "edge.disconnected"):
        registry.record_edge_event(edge_id, token, pb.EdgeEvent(kind=kind, command_id=operation.operation_id))
    assert operation.state == operation_states.SENT and ended == []
    assert event_kinds(registry, edge_id).count("edge.protocol_violation") == 1
    if spoofer == "other":
        registry.record_edge_event(
            edge_id, token, pb.EdgeEvent(kind="command.started", command_id=operation.operation_id)
        )
        assert operation.state == operation_states.SENT
    peers[0].answer()
    assert operation.state == operation_states.SUCCEEDED and ended == [operation]


def test_command_events_advance_only_on_the_connection_the_command_went_out_on() -> None:
    """command.accepted/started move their own operation forward, never from a newer connection."""
    gateway, registry, _clock, _peers = fleet(1)
    operation, _ended, _ = dispatch(gateway)
    token = registry.get("e00000").token
    assert token is not None
    registry.record_edge_event(
        "e00000", token, pb.EdgeEvent(kind="command.accepted", command_id=operation.operation_id)
    )
    registry.record_edge_event(
        "e00000", token, pb.EdgeEvent(kind="command.succeeded", command_id=operation.operation_id)
    )
    assert operation.state == operation_states.ACCEPTED  # a terminal state only comes from the answer
    second = registry.connect("e00000", HeldEdgePeer(), HELLO)
    assert operation.state == operation_states.SUPERSEDED
    other, _, _ = dispatch(gateway)
    registry.record_edge_event("e00000", token, pb.EdgeEvent(kind="command.started", command_id=other.operation_id))
    assert other.state == operation_states.SENT  # a stale connection's event is not even recorded
    registry.record_edge_event("e00000", second, pb.EdgeEvent(kind="command.started", command_id=other.operation_id))
    assert other.state == operation_states.RUNNING


def test_status_of_a_disconnected_edge_fails_at_once() -> None:
    """An edge whose connection closed fails new status views with EdgeNotConnected."""
    gateway, registry, _clock, peers = fleet(1)
    token = registry.get("e00000").token
    assert token is not None
    registry.disconnect("e00000", token, "bye")
    failed: list[Failure] = []
    gateway.status("e00000").addErrback(failed.append)
    assert len(failed) == 1 and failed[0].check(EdgeNotConnected)
    assert peers[0].requests == []


class GatewayMachine(RuleBasedStateMachine):
    """Dispatch, answers (own, forged, late), deadlines, takeovers, disconnects,
    spoofed events and status views in any order.

    The model: an operation ends exactly once, its callers hear of it exactly
    once, a terminal state other than the gateway's own verdicts comes only
    from the answer on the connection the command went out on, and nothing
    stays tracked for a connection that is gone.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.registry = EdgeRegistry(self.clock)
        self.gateway = EdgeGateway(self.registry, self.clock, status_timeout_seconds=5, fleet_max_age_seconds=0)
        self.peers: dict[int, HeldEdgePeer] = {}
        self.ops: list[tuple[OperationRecord, int, list[OperationRecord]]] = []
        self.answered_on: dict[str, int] = {}
        self.views: list[list[Any]] = []

    @initialize()
    def enroll(self) -> None:
        self.connect()

    def connect(self) -> int:
        peer = HeldEdgePeer()
        token = self.registry.connect("e", peer, HELLO)
        self.peers[token] = peer
        return token

    @property
    def token(self) -> Optional[int]:
        return self.registry.get("e").token

    @rule()
    def takeover(self) -> None:
        self.connect()

    @precondition(lambda self: self.token is not None)
    @rule(wire_first=st.booleans())
    def disconnect(self, wire_first: bool = True) -> None:
        """The wire fails pending requests, then tells the registry (or the other way round)."""
        token = self.token
        assert token is not None
        peer = self.peers[token]

        def fail_pending() -> None:
            for d in peer.requests + [d for _, d in peer.commands]:
                if not d.called:
                    d.errback(PeerDisconnected("gone"))

        if wire_first:
            fail_pending()
        self.registry.disconnect("e", token, "gone")
        fail_pending()

    @precondition(lambda self: self.token is not None)
    @rule(timeout=st.sampled_from([1, 3]))
    def dispatch(self, timeout: int) -> None:
        token = self.token
        assert token is not None
        dispatched = self.gateway.dispatch("e", "node.drain", "n", {}, timeout)
        ended: list[OperationRecord] = []
        dispatched.ended.addCallback(ended.append)
        self.ops.append((dispatched.operation, token, ended))

    def pending_commands(self) -> list[tuple[int, int]]:
        return [
            (token, i) for token, peer in self.peers.items() for i, (_, d) in enumerate(peer.commands) if not d.called
        ]

    @precondition(lambda self: self.pending_commands())
    @rule(data=st.data(), forged=st.booleans(), outcome=st.sampled_from([1, 2, 3, 7]))
    def answer(self, data: st.DataObject, forged: bool, outcome: int) -> None:
        token, index = data.draw(st.sampled_from(self.pending_commands()))
        request, _ = self.peers[token].commands[index]
        before = self.registry.operations.get("e", request.command_id)
        was_finished = before is not None and before.finished
        self.peers[token].answer(index, outcome=outcome, command_id="forged" if forged else "")
        if not forged and not was_finished:
            self.answered_on[request.command_id] = token

    @precondition(lambda self: self.ops)
    @rule(data=st.data(), kind=st.sampled_from(["operation.succeeded", "command.accepted", "command.started"]))
    def spoof_event(self, data: st.DataObject, kind: str) -> None:
        token = self.token
        if token is None:
            return
        operation = data.draw(st.sampled_from(self.ops))[0]
        self.registry.record_edge_event("e", token, pb.EdgeEvent(kind=kind, command_id=operation.operation_id))

    @precondition(lambda self: self.token is not None)
    @rule()
    def status_view(self) -> None:
        view: list[Any] = []
        self.gateway.status("e").addBoth(view.append)
        self.views.append(view)

    @rule(data=st.data())
    def answer_status(self, data: st.DataObject) -> None:
        pending = [(t, d) for t, p in self.peers.items() for d in p.requests if not d.called]
        if pending:
            data.draw(st.sampled_from(pending))[1].callback(pb.EdgeStatusResponse(edge_id="e"))

    @rule(seconds=st.sampled_from([0.5, 1, 5]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def operations_end_once_and_only_from_their_own_answer(self) -> None:
        for operation, token, ended in self.ops:
            assert len(ended) == (1 if operation.finished else 0)
            terminal = [h[0] for h in operation.history if h[0] in operation_states.TERMINAL_STATES]
            assert len(terminal) <= 1
            if operation.state in operation_states.ANSWER_STATES:
                assert self.answered_on.get(operation.operation_id) == token
            if operation.late_outcome is not None:
                assert operation.state in (operation_states.TIMED_OUT,)

    @invariant()
    def nothing_is_tracked_for_a_gone_connection(self) -> None:
        current = self.token
        assert self.gateway.tokens_in_flight() <= {current}
        for view in self.views:
            assert len(view) <= 1

    def teardown(self) -> None:
        # Every view and operation ends once its connection is gone and time passes.
        token = self.token
        if token is not None:
            self.disconnect()
        self.clock.advance(10)
        assert all(len(view) == 1 for view in self.views)
        assert all(operation.finished for operation, _, _ in self.ops)
        assert self.gateway.tokens_in_flight() == frozenset()
        assert self.gateway.in_flight() == {"status": 0, "command": 0}


TestGatewayMachine = GatewayMachine.TestCase


def test_shut_down_gives_every_waiting_caller_its_answer() -> None:
    """A stop ends held commands failed and fails status and fleet callers with ShuttingDown; new ones are refused."""
    gateway, _registry, clock, peers = fleet(2)
    dispatched = gateway.dispatch("e00000", "node.drain", "node-1", {}, 60.0)
    status = gateway.status("e00001")
    round_ = gateway.fleet_status()
    # One command waiter, two status asks (the round shares e00001's), one round.
    assert gateway.waiting_callers() == 4
    outcomes: list[list[Any]] = [[], [], []]
    waits: tuple[Deferred[Any], ...] = (dispatched.ended, status, round_)
    for d, outcome in zip(waits, outcomes, strict=True):
        d.addBoth(outcome.append)
    gateway.shut_down()
    assert gateway.waiting_callers() == 0
    [operation], [status_failure], [round_failure] = outcomes
    assert operation.state == operation_states.FAILED and operation.reason == SHUTTING_DOWN_REASON
    assert status_failure.check(ShuttingDown) and round_failure.check(ShuttingDown)
    assert peers[0].commands_cancelled == 1
    # New requests are refused at once.
    with pytest.raises(ShuttingDown):
        gateway.dispatch("e00000", "node.drain", "node-1", {}, 60.0)
    refused: list[Any] = []
    gateway.status("e00000").addErrback(refused.append)
    gateway.fleet_status().addErrback(refused.append)
    assert [f.check(ShuttingDown) for f in refused] == [ShuttingDown, ShuttingDown]
    clock.advance(120)
    assert operation.state == operation_states.FAILED


def test_a_status_group_answers_each_edge_once_under_one_deadline() -> None:
    """A group ask: an answer, a silent edge ended at the one deadline, and an
    unknown edge, each answered exactly once; no deadline of its own per ask."""
    gateway, _registry, clock, peers = fleet(2)
    answers: list[tuple[int, Optional[StatusSnapshot], Optional[Exception]]] = []
    gateway.status_group(["e00000", "e00001", "nobody"], lambda i, s, e: answers.append((i, s, e)))
    assert [a[0] for a in answers] == [2] and isinstance(answers[0][2], EdgeNotConnected)
    assert peers[0].deadlines == [False] and peers[1].deadlines == [False]
    peers[0].requests[0].callback(pb.EdgeStatusResponse(edge_id="e00000"))
    assert answers[1][0] == 0 and answers[1][1] is not None and answers[1][2] is None
    clock.advance(gateway.status_timeout_seconds)
    assert [a[0] for a in answers] == [2, 0, 1]
    assert isinstance(answers[2][2], EdgeTimeout)
    assert peers[1].cancelled == 1
    clock.advance(60)
    assert len(answers) == 3


def _asked(draw: float, response: pb.EdgeStatusResponse) -> tuple[EdgeGateway, EdgeRegistry, list[Any], list[Failure]]:
    """One status ask of one edge answered with ``response``, recounting
    when ``draw`` falls under RECOUNT_SHARE."""
    clock = Clock()
    registry = EdgeRegistry(clock)
    peer = HeldEdgePeer()
    registry.connect("e00000", peer, HELLO)
    gateway = EdgeGateway(registry, clock, draw=lambda: draw)
    kept: list[Any] = []
    failed: list[Failure] = []
    gateway.status("e00000").addCallbacks(kept.append, failed.append)
    peer.requests[0].callback(response)
    return gateway, registry, kept, failed


def test_carried_totals_are_kept_as_the_snapshots_counts() -> None:
    """An answer with totals is kept with those totals as its counts,
    recounted or not; the kept bytes are the snapshot without them."""
    for draw in (0.0, 0.99):
        response = snapshot("e00000", nodes=3, totals=True)
        carried = carried_counts(response)
        gateway, _registry, kept, failed = _asked(draw, response)
        assert not failed and kept[0].counts == carried == response_counts(response)
        assert kept[0].data == snapshot("e00000", nodes=3).SerializeToString()
        assert gateway.status_refused == {}


def test_an_answer_whose_totals_do_not_add_up_is_refused() -> None:
    """Totals that cannot be the snapshot's (here: a node more than it has)
    refuse the answer on every answer, sampled or not, and are counted."""
    response = snapshot("e00000", nodes=2)
    response.totals.CopyFrom(totals_message(response_counts(snapshot("e00000", nodes=3))))
    gateway, registry, kept, failed = _asked(0.99, response)
    assert not kept and failed[0].check(EdgeErrorAnswer) and "nodes" in str(failed[0].value)
    assert gateway.status_refused == {"totals": 1}
    assert registry.get("e00000").snapshot is None


def test_a_recount_refuses_totals_that_add_up_but_are_wrong() -> None:
    """Totals consistent in themselves but not the providers' (capacity
    doubled) pass unless the answer is recounted; a recount refuses them."""

    def wrong() -> pb.EdgeStatusResponse:
        response = snapshot("e00000", nodes=2, capacity=4)
        response.totals.CopyFrom(totals_message(response_counts(snapshot("e00000", nodes=2, capacity=8))))
        return response

    gateway, _registry, kept, failed = _asked(0.99, wrong())
    assert kept and not failed
    gateway, _registry, kept, failed = _asked(RECOUNT_SHARE / 2, wrong())
    assert not kept and "differ" in str(failed[0].value)
    assert gateway.status_refused == {"totals": 1}


def test_an_answer_over_its_bounds_is_counted_as_refused() -> None:
    """A snapshot over a bound is refused before its totals are read."""
    response = pb.EdgeStatusResponse(edge_id="e00000")
    for _ in range(MAX_STATUS_NODES + 1):
        response.nodes.add(node_id="n")
    gateway, _registry, kept, failed = _asked(0.0, response)
    assert not kept and failed[0].check(EdgeErrorAnswer)
    assert gateway.status_refused == {"bounds": 1}


def test_operations_of_a_dead_replica_end_failed_through_the_gateway() -> None:
    """Cluster mode: the gateway ends the open operations a dead replica sent
    (failed, saying why) and tells callers waiting here; others' stay open,
    and this replica's command metrics do not count them."""
    gateway, registry, _clock, _peers = fleet(1)
    theirs = OperationRecord("op-b", "e00000", "node.drain", "n", {}, "", 1.0, 10.0, replica="b")
    others = OperationRecord("op-c", "e00000", "node.drain", "n", {}, "", 1.0, 10.0, replica="c")
    registry.operations.start_operation(theirs)
    registry.operations.start_operation(others)
    ended: list[OperationRecord] = []
    gateway.wait_for(theirs).addCallback(ended.append)
    assert gateway.end_orphaned_operations("b", "replica b stopped") == 1
    assert theirs.state == operation_states.FAILED and theirs.reason == "replica b stopped"
    assert ended == [theirs] and others.state == operation_states.SENT
    assert gateway.end_orphaned_operations("b", "again") == 0
    assert gateway.operations_ended == {}
    assert event_kinds(registry)[-1] == "operation.failed"


def test_a_routed_command_is_sent_on_the_local_connection_and_answered() -> None:
    """Cluster mode: a command another replica dispatched goes out on this
    replica's connection; its answer comes back as is, and no operation is
    made or changed here."""
    gateway, registry, _clock, peers = fleet(1)
    request = pb.EdgeCommandRequest(command_id="theirs", name="node.drain", target="n", timeout_ms=1000)
    answers: list[pb.EdgeCommandResponse] = []
    gateway.run_routed_command("e00000", request).addCallback(answers.append)
    assert [sent for sent, _ in peers[0].commands] == [request]
    peers[0].answer()
    assert [a.command_id for a in answers] == ["theirs"]
    assert registry.get("e00000").operations.newest_first() == []


def test_a_routed_command_gives_up_past_its_deadline_and_its_grace() -> None:
    """A routed command unanswered past its own deadline and the grace fails
    (its request cancelled); one for an edge not connected here fails at once."""
    gateway, _registry, clock, peers = fleet(1)
    request = pb.EdgeCommandRequest(command_id="theirs", name="node.drain", target="n", timeout_ms=1000)
    failed: list[Failure] = []
    gateway.run_routed_command("e00000", request).addErrback(failed.append)
    clock.advance(1 + ROUTED_GRACE_SECONDS - 0.5)
    assert failed == []
    clock.advance(1)
    assert len(failed) == 1 and peers[0].commands_cancelled == 1
    gateway.run_routed_command("nobody", request).addErrback(failed.append)
    assert failed[1].check(EdgeNotConnected)
