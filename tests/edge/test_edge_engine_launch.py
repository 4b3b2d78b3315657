"""A launched engine's state as an Edge keeps it: checked, when it takes
work, when it is coming back, and when its change is an event."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.edge.providers.launch import (
    MAX_TIME_MS,
    RETURNING_STATES,
    EngineLaunchInfo,
    checked_launch,
    launch_change,
    launch_takes_work,
)
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.engine_states import ENGINE_STATE_NAMES
from twisted_iop.wire.hello import MAX_TEXT


def test_only_a_ready_or_unlaunched_engine_takes_work() -> None:
    """No launch block: work as before; launched: only while ready."""
    assert launch_takes_work(None)
    assert launch_takes_work(EngineLaunchInfo(pb.ENGINE_STATE_READY))
    assert not any(
        launch_takes_work(EngineLaunchInfo(state)) for state in ENGINE_STATE_NAMES if state != pb.ENGINE_STATE_READY
    )


def test_stopped_failed_and_unknown_engines_are_not_coming_back() -> None:
    """Requests wait for an engine that returns by itself, not for one that waits to be told."""
    assert EngineLaunchInfo(pb.ENGINE_STATE_LOADING).returning
    assert EngineLaunchInfo(pb.ENGINE_STATE_CRASHED).returning
    for state in (pb.ENGINE_STATE_STOPPED, pb.ENGINE_STATE_FAILED, pb.ENGINE_STATE_READY, 99):
        assert not EngineLaunchInfo(state).returning
    assert pb.ENGINE_STATE_READY not in RETURNING_STATES


def test_a_change_is_an_event_once() -> None:
    """A new state, reason or restart count is an event naming the previous state; a repeat is not."""
    crashed = EngineLaunchInfo(pb.ENGINE_STATE_CRASHED, "exited with code 1", restarts=1, next_try_at_ms=5000)
    assert launch_change(None, crashed) == {
        "previous": "unknown",
        "state": "crashed",
        "reason": "exited with code 1",
        "restarts": "1",
        "next_try_at_ms": "5000",
    }
    assert launch_change(crashed, crashed) is None
    assert launch_change(crashed, None) is None
    again = EngineLaunchInfo(pb.ENGINE_STATE_CRASHED, "exited with code 1", restarts=2)
    assert launch_change(crashed, again) == {
        "previous": "crashed",
        "state": "crashed",
        "reason": "exited with code 1",
        "restarts": "2",
    }


@given(
    state=st.integers(0, 2**31 - 1),
    reason=st.text(max_size=5000),
    times=st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)),
)
def test_any_launch_from_a_node_is_checked(state: int, reason: str, times: tuple[int, int]) -> None:
    """An unknown state is kept as such with a reason (and takes no work), reasons are
    cut to the wire's bound, and times no calendar holds are dropped."""
    report = pb.ProviderHealthReport(provider_id="p")
    report.launch.state = state  # type: ignore[assignment]  # the stubs want the enum type; the state is its int value
    report.launch.reason = reason
    report.launch.next_try_at_ms, report.launch.since_ms = times
    launch = checked_launch(report)
    assert launch is not None
    assert len(launch.reason) <= MAX_TEXT
    if state not in ENGINE_STATE_NAMES:
        assert launch.name == "unknown" and "engine state" in launch.reason and not launch_takes_work(launch)
    assert all(0 <= t <= MAX_TIME_MS for t in (launch.next_try_at_ms, launch.since_ms))
    assert checked_launch(pb.ProviderHealthReport(provider_id="p")) is None
