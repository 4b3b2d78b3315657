"""A deployment's roll: pause, resume, cancel and abort criteria, through the real Klein app.

The fleet is :class:`~twisted_iop.testing.deployments.SimulatedFleet`: the
real app through StubTreq, the real deployment service and registry on a
Clock, simulated edges that report every instance of their set ready (or
refused when a value is out of the profile's bounds). Every answer is
validated against the OpenAPI document's schemas.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from twisted_iop.controlplane.deployments import roll
from twisted_iop.controlplane.deployments.spec import SpecError, parse_spec
from twisted_iop.controlplane.rollouts.states import AbortCriteria
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.testing.deployments import VIEWER, SimulatedEdge, SimulatedFleet
from twisted_iop.testing.harness import contract_validator
from twisted_iop.wire import control_pb2 as pb

CHAT = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}
CHANGED = {**CHAT, "parameters": {"tokens_per_second": 200}, "rollout": {"max_in_flight": 1}}


def _valid(body: Any) -> Any:
    errors = list(contract_validator("Deployment").iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


async def _rolling(edges: int = 3, changed: dict[str, Any] = CHANGED) -> tuple[SimulatedFleet, list[SimulatedEdge]]:
    """A fleet of ``edges`` lab edges at generation 1, then a change rolling out (edge-1 reached)."""
    fleet = SimulatedFleet()
    peers = [fleet.edge(f"edge-{i}", "lab") for i in range(1, edges + 1)]
    await fleet.call("PUT", "/deployments/chat", CHAT)
    code, body = await fleet.call("PUT", "/deployments/chat", changed)
    assert code == 200, body
    return fleet, peers


def _hashes(edges: list[SimulatedEdge]) -> list[str]:
    return [e.instances[0].spec_hash for e in edges]


def _events(fleet: SimulatedFleet) -> list[tuple[str, str]]:
    return [
        (e.kind, dict(e.attributes)["actor"])
        for e in fleet.registry.fleet_events.since(0, 1000)
        if e.kind.startswith("deployment.")
    ]


def _poll(fleet: SimulatedFleet, times: int = 3) -> None:
    for _ in range(times):
        fleet.clock.advance(2)
        fleet.deployments.poll()


@pytest_twisted.ensureDeferred
async def test_pause_stops_reaching_edges_and_resume_goes_on() -> None:
    """A roll of max_in_flight 1 reached edge-1; paused (by alice), polls reach no other edge (they
    keep the old hash, out_of_sync saying the roll is paused) and the roll shows paused with 1
    reached, 2 pending; resumed, edge-2 is reached at once and the polls finish the roll: done."""
    fleet, edges = await _rolling()
    old, new = _hashes(edges)[1], _hashes(edges)[0]
    code, body = await fleet.call("POST", "/deployments/chat/pause")
    assert code == 200, body
    assert _valid(body)["roll"] == {
        "state": "paused",
        "reason": "paused by alice",
        "from_generation": 1,
        "max_in_flight": 1,
        "reached": 1,
        "pending": 2,
        "failed": 0,
    }
    _poll(fleet)
    assert _hashes(edges) == [new, old, old]
    _, shown = await fleet.call("GET", "/deployments/chat", token=VIEWER)
    waiting = [e for e in _valid(shown)["edges"]["items"] if e["edge_id"] != "edge-1"]
    assert {e["state"] for e in waiting} == {"out_of_sync"}
    assert all("is paused" in e["reason"] for e in waiting)
    code, body = await fleet.call("POST", "/deployments/chat/resume")
    assert code == 200, body
    assert (body["roll"]["state"], body["roll"]["reached"]) == ("running", 2)
    assert _hashes(edges) == [new, new, old]
    _poll(fleet)
    assert _hashes(edges) == [new, new, new]
    _, shown = await fleet.call("GET", "/deployments", token=VIEWER)
    (listed,) = shown["items"]
    assert listed["roll"]["state"] == "done" and (listed["roll"]["reached"], listed["roll"]["pending"]) == (3, 0)
    assert _events(fleet) == [
        ("deployment.created", "alice"),
        ("deployment.updated", "alice"),
        ("deployment.paused", "alice"),
        ("deployment.resumed", "alice"),
        ("deployment.rolled_out", "alice"),
    ]
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_cancel_leaves_the_edges_not_reached_on_the_old_spec_and_a_later_put_rolls_again() -> None:
    """Cancelled after edge-1: edges 2 and 3 keep the old hash for good (polls change nothing), show
    out_of_sync saying the roll was cancelled, the roll shows cancelled with 2 pending; moves on it
    are 409 no_rollout. A later change starts a new roll that reaches them."""
    fleet, edges = await _rolling()
    old, new = _hashes(edges)[1], _hashes(edges)[0]
    code, body = await fleet.call("POST", "/deployments/chat/cancel")
    assert code == 200, body
    assert (body["roll"]["state"], body["roll"]["reached"], body["roll"]["pending"]) == ("cancelled", 1, 2)
    assert "cancelled by alice" in body["roll"]["reason"]
    _poll(fleet)
    assert _hashes(edges) == [new, old, old]
    _, shown = await fleet.call("GET", "/deployments/chat")
    states = {e["edge_id"]: (e["state"], e["reason"]) for e in _valid(shown)["edges"]["items"]}
    assert states["edge-1"] == ("ready", "")
    assert states["edge-2"][0] == "out_of_sync" and "was cancelled" in states["edge-2"][1]
    assert (shown["rollup"]["ready"], shown["rollup"]["out_of_sync"]) == (1, 2)
    for move in ("pause", "resume", "cancel"):
        code, body = await fleet.call("POST", f"/deployments/chat/{move}")
        assert (code, body["error"]["code"]) == (409, "no_rollout"), move
    third = {**CHANGED, "parameters": {"tokens_per_second": 300}}
    code, body = await fleet.call("PUT", "/deployments/chat", third)
    assert body["roll"]["state"] == "running"
    _poll(fleet, 4)
    assert _hashes(edges) == [body["spec_hash"]] * 3
    assert ("deployment.cancelled", "alice") in _events(fleet)
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_the_roll_aborts_by_itself_when_reached_edges_fail_past_the_share() -> None:
    """max_in_flight 2 with abort failure_percent 40, min_executed 2: edge-1 and edge-2 are reached,
    edge-2's node refuses the change (failed). 1 of 2 ended edges failed (50% > 40%): the next poll
    aborts the roll, naming edge-2 and the share; edge-3 is never reached (old hash), edge-1 keeps
    the new one; deployment.aborted is recorded; a move is 409 no_rollout."""
    changed = {**CHANGED, "rollout": {"max_in_flight": 2, "abort": {"failure_percent": 40, "min_executed": 2}}}
    fleet = SimulatedFleet()
    edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2, 3)]
    await fleet.call("PUT", "/deployments/chat", CHAT)
    old = _hashes(edges)[0]
    refusing = edges[1]
    real_running = refusing._running

    def refused() -> list[pb.InstanceStatus]:
        out = real_running()
        for status in out:
            if status.generation == 2:
                status.state, status.spec_hash, status.reason = pb.INSTANCE_STATE_REFUSED, "", "no GPU for it"
        return out

    refusing._running = refused  # type: ignore[method-assign]  # replaced for this test
    code, body = await fleet.call("PUT", "/deployments/chat", changed)
    assert code == 200, body
    assert _valid(body)["spec"]["rollout"]["abort"] == {"failure_percent": 40, "min_executed": 2, "any_failure": False}
    _poll(fleet)
    _, shown = await fleet.call("GET", "/deployments/chat")
    rolled = _valid(shown)["roll"]
    assert (rolled["state"], rolled["reached"], rolled["pending"], rolled["failed"]) == ("aborted", 2, 1, 1)
    assert "1 of 2 reached edges failed (50.0% > rollout.abort.failure_percent 40%" in rolled["reason"]
    assert rolled["reason"].endswith(": edge-2")
    assert _hashes(edges)[0] == body["spec_hash"] and edges[2].instances[0].spec_hash == old
    states = {e["edge_id"]: e["state"] for e in shown["edges"]["items"]}
    assert states == {"edge-1": "ready", "edge-2": "failed", "edge-3": "out_of_sync"}
    assert _events(fleet)[-1] == ("deployment.aborted", "alice")
    code, answer = await fleet.call("POST", "/deployments/chat/resume")
    assert (code, answer["error"]["code"]) == (409, "no_rollout")
    fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_paused_roll_stays_paused_after_a_restart() -> None:
    """Paused after edge-1, the service restarts on the same store: the roll is back paused with its
    reached edge; polls of the new service reach nothing; resumed there, it reaches edge-2."""
    store = MemoryStore()
    fleet = SimulatedFleet(store)
    edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2)]
    await fleet.call("PUT", "/deployments/chat", CHAT)
    old = _hashes(edges)[1]
    await fleet.call("PUT", "/deployments/chat", CHANGED)
    await fleet.call("POST", "/deployments/chat/pause")
    fleet.stop()
    again = SimulatedFleet(store)
    for peer in edges:
        again.registry.connect(peer.edge_id, peer, fleet.registry.get(peer.edge_id).hello)
    _poll(again)
    assert edges[1].instances[0].spec_hash == old
    _, shown = await again.call("GET", "/deployments/chat")
    assert (_valid(shown)["roll"]["state"], shown["roll"]["reached"], shown["roll"]["pending"]) == ("paused", 1, 1)
    code, body = await again.call("POST", "/deployments/chat/resume")
    assert code == 200
    assert edges[1].instances[0].spec_hash == body["spec_hash"]
    again.stop()


@pytest_twisted.ensureDeferred
async def test_roles_and_codes_of_the_moves() -> None:
    """A viewer may not move a roll (403); an unknown deployment is 404; a deployment that never
    rolled is 409 no_rollout; resume of a running roll and pause of a paused one are 409
    invalid_transition; a deployment changed without max_in_flight shows no roll."""
    fleet = SimulatedFleet()
    fleet.edge("edge-1", "lab")
    fleet.edge("edge-2", "lab")
    code, body = await fleet.call("POST", "/deployments/nope/pause")
    assert (code, body["error"]["code"]) == (404, "unknown_deployment")
    _, body = await fleet.call("PUT", "/deployments/chat", CHAT)
    assert body["roll"] is None
    code, body = await fleet.call("POST", "/deployments/chat/pause")
    assert (code, body["error"]["code"]) == (409, "no_rollout")
    await fleet.call("PUT", "/deployments/chat", CHANGED)
    code, body = await fleet.call("POST", "/deployments/chat/pause", token=VIEWER)
    assert (code, body["error"]["code"]) == (403, "forbidden")
    code, body = await fleet.call("POST", "/deployments/chat/resume")
    assert (code, body["error"]["code"]) == (409, "invalid_transition")
    assert (await fleet.call("POST", "/deployments/chat/pause"))[0] == 200
    code, body = await fleet.call("POST", "/deployments/chat/pause")
    assert (code, body["error"]["code"]) == (409, "invalid_transition")
    assert fleet.deployments.get("chat").roll_state == "paused"
    fleet.stop()


def test_abort_criteria_parse_and_need_max_in_flight() -> None:
    """rollout.abort parses into the rollout engine's criteria and back; without max_in_flight,
    with an unknown key or a share above 100 it is an error naming the field."""
    spec = parse_spec("chat", {**CHAT, "rollout": {"max_in_flight": 2, "abort": {"any_failure": True}}})
    assert spec.abort == AbortCriteria(any_failure=True)
    assert parse_spec("chat", spec.as_json()) == spec
    for rollout, field in (
        ({"abort": {"failure_percent": 10}}, "rollout.abort"),
        ({"max_in_flight": 1, "abort": {"min_edges": 1}}, "rollout.abort.min_edges"),
        ({"max_in_flight": 1, "abort": {"failure_percent": 101}}, "rollout.abort.failure_percent"),
    ):
        with pytest.raises(SpecError) as caught:
            parse_spec("chat", {**CHAT, "rollout": rollout})
        assert caught.value.field == field


def test_the_moves_and_the_abort_reason() -> None:
    """pause/resume/cancel lead where the module says and nowhere else; any_failure names the edges."""
    assert roll.moved("chat", roll.RUNNING, "pause") == roll.PAUSED
    assert roll.moved("chat", roll.PAUSED, "resume") == roll.RUNNING
    assert roll.moved("chat", roll.PAUSED, "cancel") == roll.CANCELLED
    with pytest.raises(roll.InvalidMove):
        roll.moved("chat", roll.RUNNING, "resume")
    for ended in (roll.DONE, roll.CANCELLED, roll.ABORTED, ""):
        with pytest.raises(roll.NoRoll):
            roll.moved("chat", ended, "cancel")
    reason = roll.abort_reason(AbortCriteria(any_failure=True), ["edge-9"], 3)
    assert reason == "1 of 3 reached edges failed (33.3%; rollout.abort.any_failure): edge-9"
    assert roll.abort_reason(AbortCriteria(failure_percent=50, min_executed=4), ["edge-9", "edge-8"], 3) is None


class RollMachine(RuleBasedStateMachine):
    """Polls, pauses, resumes, cancels, edges that refuse the change and restarts of the service on
    the same store, in any order: an edge the roll did not reach always runs the old spec; a roll
    not running reaches no edge; a move raises exactly when the state does not allow it; an ended
    roll stays ended; a restart keeps the roll's state and its reached edges."""

    @initialize()
    def start(self) -> None:
        """Four lab edges at generation 1, then a change rolling out one edge at a time."""
        self.store = MemoryStore()
        self.fleet = SimulatedFleet(self.store)
        self.peers = [self.fleet.edge(f"edge-{i}", "lab") for i in (1, 2, 3, 4)]
        service = self.fleet.deployments
        service.put(parse_spec("chat", CHAT), "alice")
        self.old = self.peers[0].instances[0].spec_hash
        abort = {"failure_percent": 50, "min_executed": 2}
        service.put(parse_spec("chat", {**CHANGED, "rollout": {"max_in_flight": 1, "abort": abort}}), "alice")
        self.ended: set[str] = set()

    def _state(self) -> Any:
        return self.fleet.deployments.get("chat")

    @rule()
    def poll(self) -> None:
        """A poll reaches edges only while the roll runs."""
        state = self._state()
        before, running = set(state.promoted), state.roll_state == roll.RUNNING
        self.fleet.clock.advance(2)
        self.fleet.deployments.poll()
        if not running and state.rolling_from is not None:
            assert state.promoted == before

    @rule(move=st.sampled_from(sorted(roll.MOVES)))
    def move(self, move: str) -> None:
        """pause, resume or cancel: done (a resume may end the roll at once), or refused exactly
        when the state does not allow it."""
        state = self._state()
        before = state.roll_state
        starts, to = roll.MOVES[move]
        try:
            getattr(self.fleet.deployments, move)("chat", "alice")
        except roll.NoRoll:
            assert before not in roll.IN_PROGRESS
        except roll.InvalidMove:
            assert before in roll.IN_PROGRESS and before not in starts
        else:
            # A resume moves the roll on at once: it may end it, done or aborted.
            assert before in starts and state.roll_state in (to, roll.DONE, roll.ABORTED)

    @rule(index=st.integers(0, 3))
    def refuse(self, index: int) -> None:
        """Edge ``index``'s node refuses the change from now on."""
        peer = self.peers[index]
        running = type(peer)._running

        def refused() -> list[pb.InstanceStatus]:
            out = running(peer)
            for status in out:
                if status.generation == 2:
                    status.state, status.spec_hash, status.reason = pb.INSTANCE_STATE_REFUSED, "", "refused"
            return out

        peer._running = refused  # type: ignore[method-assign]  # replaced for this test

    @rule()
    def restart(self) -> None:
        """A new service on the same store: the roll's state and reached edges are back."""
        state = self._state()
        kept = (state.roll_state, set(state.promoted))
        self.fleet.stop()
        again = SimulatedFleet(self.store)
        for peer in self.peers:
            again.registry.connect(peer.edge_id, peer, self.fleet.registry.get(peer.edge_id).hello)
        self.fleet = again
        state = self._state()
        assert (state.roll_state, state.promoted) == kept

    @invariant()
    def unreached_edges_run_the_old_spec(self) -> None:
        """An edge the roll did not reach runs the old spec; an ended roll stays ended."""
        state = self._state()
        if state.rolling_from is not None:
            for peer in self.peers:
                if peer.edge_id not in state.promoted:
                    assert peer.instances[0].spec_hash == self.old, peer.edge_id
        assert not self.ended or state.roll_state in self.ended
        if state.roll_state not in roll.IN_PROGRESS:
            self.ended = {state.roll_state}

    def teardown(self) -> None:
        """Stop the service's timer."""
        if hasattr(self, "fleet"):
            self.fleet.stop()


RollMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRollMachine = RollMachine.TestCase


def test_a_running_roll_reaches_the_next_edges_while_fewer_than_max_in_flight_are_in_flight() -> None:
    """Two in flight at most: with a ready and a progressing reached edge, one more is reached;
    a paused roll reaches none; once every edge is reached and ready, the roll is done."""
    edges = [("e1", True), ("e2", True), ("e3", True), ("e4", True)]
    states = {"e1": "ready", "e2": "progressing", "e3": "ready", "e4": "ready"}
    step = roll.next_step(edges, {"e1", "e2"}, states, {"e1", "e2"}, 2, True, True, None)
    assert step == roll.Step(reach=("e3",))
    assert roll.next_step(edges, {"e1", "e2"}, states, set(), 2, True, False, None) == roll.Step()
    every = {"e1", "e2", "e3", "e4"}
    assert roll.next_step(edges, every, dict.fromkeys(every, "ready"), every, 2, True, True, None).done


def test_an_offline_edge_holds_a_slot_with_offline_wait_and_none_with_skip() -> None:
    """A reached edge that is offline counts as in flight when the deployment waits for offline
    edges (nothing more is reached at max_in_flight 1) and not when it skips them."""
    edges = [("e1", False), ("e2", True)]
    wait = roll.next_step(edges, {"e1"}, {"e1": "offline"}, set(), 1, True, True, None)
    skip = roll.next_step(edges, {"e1"}, {"e1": "offline"}, set(), 1, False, True, None)
    assert wait == roll.Step() and skip == roll.Step(reach=("e2",))


def test_only_edges_sent_the_new_generation_count_toward_an_abort() -> None:
    """Failed edges that were not sent the new generation yet do not abort the roll; once they
    were, the failure share past the bound aborts it, naming them."""
    edges = [("e1", True), ("e2", True), ("e3", True)]
    states = {"e1": "failed", "e2": "failed", "e3": "ready"}
    criteria = AbortCriteria(failure_percent=40.0, min_executed=2)
    assert roll.next_step(edges, {"e1", "e2"}, states, set(), 3, True, True, criteria).abort_reason is None
    step = roll.next_step(edges, {"e1", "e2"}, states, {"e1", "e2"}, 3, True, True, criteria)
    assert step.abort_reason is not None and "e1, e2" in step.abort_reason
