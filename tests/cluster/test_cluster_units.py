"""Unit tests of the cluster parts that need no Redis: codec and router."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.task import Clock

from twisted_iop.controlplane.cluster.remote import RemotePeer, Router
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot, checked_snapshot
from twisted_iop.controlplane.requests.operation_states import LateOutcome
from twisted_iop.controlplane.store import forms as codec
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import CATALOG, snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerDisconnected, RemoteError, RequestTimeout
from twisted_iop.wire.status_totals import response_counts

texts = st.text(max_size=20)
maps = st.dictionaries(texts, texts, max_size=4)


@given(labels=maps, version=texts)
def test_hello_survives_the_store(labels: dict[str, str], version: str) -> None:
    """A hello written and read back is the same hello, catalog included."""
    hello = EdgeHello(labels, version, "1.0", tuple(CATALOG))
    again = codec.hello_from(codec.loads_object(codec.hello_json(hello), "hello"))
    assert again == hello


@given(arguments=maps, result=maps, reason=texts, late=st.booleans())
def test_operation_survives_the_store(
    arguments: dict[str, str], result: dict[str, str], reason: str, late: bool
) -> None:
    """An operation written and read back keeps every field."""
    op = OperationRecord("op-1", "edge-1", "node.drain", "node-1", arguments, "key", 10.0, 20.0)
    op.advance("accepted", 11.0)
    op.advance("succeeded", 12.0, reason, result)
    if late:
        assert op.note_late_outcome(LateOutcome("failed", reason, result, 13.0))
    again = codec.operation_from(codec.loads_object(codec.dumps(codec.operation_dict(op)), "operation"))
    assert codec.operation_dict(again) == codec.operation_dict(op)


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"operation_id": 7}',
        '{"operation_id": "x", "edge_id": "e", "name": "n", "created_at": "soon", "deadline_at": 1, "state": "sent"}',
        '{"operation_id": "x", "edge_id": "e", "name": "n", "created_at": 1, "deadline_at": 1, "state": "sent",'
        ' "history": [["sent", 1]]}',
        '{"operation_id": "x", "edge_id": "e", "name": "n", "created_at": 1, "deadline_at": 1, "state": "sent",'
        ' "arguments": {"a": 1}}',
    ],
)
def test_malformed_operations_are_refused(text: str) -> None:
    """What does not have the written shape raises BadRecord (the reader skips it)."""
    with pytest.raises(codec.BadRecord):
        codec.operation_from(codec.loads_object(text, "operation"))


def test_malformed_events_and_hellos_are_refused() -> None:
    """Events and hellos of the wrong shape raise BadRecord."""
    with pytest.raises(codec.BadRecord):
        codec.event_from({"edge_id": "e", "kind": 3, "occurred_at": 1, "recorded_at": 1}, 1, 1)
    with pytest.raises(codec.BadRecord):
        codec.hello_from({"labels": {}, "commands": "***"})
    with pytest.raises(codec.BadRecord):
        codec.hello_from({"labels": [], "commands": ""})


class _Listener:
    def __init__(self) -> None:
        self.answers: list[tuple[Optional[pb.EdgeStatusResponse], Optional[Exception]]] = []

    def status_answered(self, response: Optional[pb.EdgeStatusResponse], error: Optional[Exception]) -> None:
        self.answers.append((response, error))


class _Outbox:
    def __init__(self, ok: bool = True) -> None:
        self.batches: list[tuple[str, list[dict[str, Any]]]] = []
        self.ok = ok

    def send(self, replica: str, messages: list[dict[str, Any]]) -> Deferred[Any]:
        self.batches.append((replica, messages))
        return succeed(None) if self.ok else fail(ConnectionError("down"))


def _router(ok: bool = True) -> tuple[Router, Clock, _Outbox]:
    clock = Clock()
    outbox = _Outbox(ok)
    return Router("a", clock, outbox.send), clock, outbox


def test_asks_of_one_turn_go_in_one_batch_per_replica() -> None:
    """A fleet round's asks are written once per owner per reactor turn."""
    router, clock, outbox = _router()
    listeners = [_Listener() for _ in range(5)]
    for n, listener in enumerate(listeners):
        owner = "b" if n % 2 else "c"
        router.ask_status(RemotePeer(router, owner, f"{owner}/x/{n}", f"edge-{n}"), 5, False, listener)
    assert outbox.batches == []
    clock.advance(0)
    assert sorted((replica, len(batch)) for replica, batch in outbox.batches) == [("b", 2), ("c", 3)]


def test_an_answer_ends_its_ask_and_errors_keep_their_kind() -> None:
    """Snapshots parse; timeout, disconnected and error answers map to the wire's errors."""
    router, clock, _outbox = _router()
    listeners = [_Listener() for _ in range(4)]
    ids = [router.ask_status(RemotePeer(router, "b", "b/x/1", "edge-1"), 5, False, lst) for lst in listeners]
    clock.advance(0)
    router.answered_message({"t": "reply", "id": ids[0], "ok": codec.b64(snapshot("edge-1").SerializeToString())})
    router.answered_message({"t": "reply", "id": ids[1], "error": "timeout", "message": "slow"})
    router.answered_message({"t": "reply", "id": ids[2], "error": "disconnected", "message": "gone"})
    router.answered_message({"t": "reply", "id": ids[3], "error": "anything", "message": "odd"})
    router.answered_message({"t": "reply", "id": ids[0], "ok": "twice"})  # not waited for any more: ignored
    response, error = listeners[0].answers[0]
    assert error is None and response is not None and len(response.nodes) == 2
    assert isinstance(listeners[1].answers[0][1], RequestTimeout)
    assert isinstance(listeners[2].answers[0][1], PeerDisconnected)
    assert isinstance(listeners[3].answers[0][1], RemoteError)
    assert all(len(lst.answers) == 1 for lst in listeners)
    assert router.waiting == 0


def test_own_deadline_cancel_and_unsent_batches_end_asks_once() -> None:
    """An ask with its own deadline times out; a cancel ends it with
    CancelledError; a batch that could not be written fails its asks."""
    router, clock, _ = _router()
    timed, cancelled = _Listener(), _Listener()
    router.ask_status(RemotePeer(router, "b", "b/x/1", "edge-1"), 2, True, timed)
    request_id = router.ask_status(RemotePeer(router, "b", "b/x/1", "edge-1"), 2, False, cancelled)
    router.cancel(request_id)
    clock.advance(2)
    assert isinstance(timed.answers[0][1], RequestTimeout) and len(timed.answers) == 1
    assert isinstance(cancelled.answers[0][1], CancelledError) and len(cancelled.answers) == 1

    broken, clock2, _ = _router(ok=False)
    lost = _Listener()
    broken.ask_status(RemotePeer(broken, "b", "b/x/1", "edge-1"), 2, False, lost)
    command = broken.command(RemotePeer(broken, "b", "b/x/1", "edge-1"), pb.EdgeCommandRequest(command_id="c"))
    failures: list[Any] = []
    command.addErrback(failures.append)
    clock2.advance(0)
    assert isinstance(lost.answers[0][1], PeerDisconnected)
    assert failures and failures[0].check(PeerDisconnected)


def test_a_routed_command_answer_and_a_cancelled_command() -> None:
    """A command's answer fires its Deferred; cancelling one forgets it."""
    router, clock, outbox = _router()
    peer = RemotePeer(router, "b", "b/x/1", "edge-1")
    answered = router.command(peer, pb.EdgeCommandRequest(command_id="c1"))
    dropped = router.command(peer, pb.EdgeCommandRequest(command_id="c2"))
    dropped.addErrback(lambda f: None)
    dropped.cancel()
    clock.advance(0)
    ((_, batch),) = outbox.batches
    first = batch[0]
    reply = pb.EdgeCommandResponse(command_id="c1", outcome=pb.COMMAND_OUTCOME_SUCCEEDED)
    router.answered_message({"t": "reply", "id": first["id"], "ok": codec.b64(reply.SerializeToString())})
    results: list[pb.EdgeCommandResponse] = []
    answered.addCallback(results.append)
    assert results and results[0].command_id == "c1"
    assert router.waiting == 0


class _SnapshotListener(_Listener):
    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[StatusSnapshot] = []

    def snapshot_answered(self, snapshot: StatusSnapshot) -> None:
        self.snapshots.append(snapshot)


def test_a_status_answer_with_the_owners_counts_is_kept_without_parsing_again() -> None:
    """An answer carrying well-formed counts becomes a snapshot as is; one
    with malformed counts is parsed and counted here instead."""
    router, clock, _ = _router()
    good, bad = _SnapshotListener(), _SnapshotListener()
    owner_side = checked_snapshot(snapshot("edge-1"), 12.5)
    ids = [router.ask_status(RemotePeer(router, "b", "b/x/1", "edge-1"), 5, False, lst) for lst in (good, bad)]
    clock.advance(0)
    reply = {
        "t": "reply",
        "id": ids[0],
        "ok": codec.b64(owner_side.data),
        "counts": list(owner_side.counts),
        "at": 12.5,
    }
    router.answered_message(reply)
    assert [(s.data, s.counts, s.received_at) for s in good.snapshots] == [(owner_side.data, owner_side.counts, 12.5)]
    assert good.answers == []
    forged = dict(reply, id=ids[1], counts=[-1] * len(owner_side.counts))
    router.answered_message(forged)
    assert bad.snapshots == []
    response, error = bad.answers[0]
    assert error is None and response is not None and response_counts(response) == owner_side.counts
