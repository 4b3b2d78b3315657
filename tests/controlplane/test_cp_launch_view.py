"""What the Control Plane shows of a launched engine: its state, reason, restarts and next
try, checked like every figure from the wire, and never the engine's command or address."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.testing.provider_views import edge_status_body, provider_errors
from twisted_iop.testing.provider_views import shown_provider as _shown
from twisted_iop.testing.wires.peers import set_launch, snapshot
from twisted_iop.wire import control_pb2 as pb


def test_a_crashed_engine_shows_its_reason_restarts_and_next_try() -> None:
    """A crashed engine: its state, reason, restarts, when it is tried next and since when."""
    shown = _shown(set_launch(pb.ProviderSnapshot(provider_id="p1", kind="llamacpp")))
    assert shown["launch"] == {
        "state": "crashed",
        "reason": "exited with code 1",
        "restarts": 2,
        "next_try_at": "2023-11-14T22:13:24.000Z",
        "since": "2023-11-14T22:13:20.000Z",
        "pid": None,
    }


def test_no_launch_is_null_and_a_ready_engine_has_its_pid() -> None:
    """An engine someone else runs has a null launch; a running one shows its pid, no next try."""
    assert _shown(pb.ProviderSnapshot(provider_id="p1"))["launch"] is None
    ready = _shown(
        set_launch(
            pb.ProviderSnapshot(provider_id="p1"),
            state=pb.ENGINE_STATE_READY,
            reason="",
            restarts=0,
            next_try_at_ms=0,
            pid=4242,
        )
    )
    assert ready["launch"]["state"] == "ready" and ready["launch"]["pid"] == 4242
    assert ready["launch"]["next_try_at"] is None


@settings(max_examples=60)
@given(
    state=st.integers(0, 2**31 - 1) | st.sampled_from(list(pb.EngineState.values())),
    reason=st.text(max_size=40),
    restarts=st.integers(0, 2**32 - 1),
    times=st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
    pid=st.integers(0, 2**32 - 1),
)
def test_the_status_view_shows_the_launch_as_the_reference_does(
    state: int, reason: str, restarts: int, times: tuple[int, int], pid: int
) -> None:
    """GET /edges/{id}/status with any launch values from an Edge is byte for byte the
    reference's JSON, valid against the document (an unknown state is "unknown", a time no
    calendar holds is null)."""
    response = snapshot("edge-1", nodes=1)
    set_launch(
        response.nodes[0].providers[0],
        state=state,
        reason=reason,
        restarts=restarts,
        next_try_at_ms=times[0],
        since_ms=times[1],
        pid=pid,
    )
    body = edge_status_body(response, {})
    provider = json.loads(body)["nodes"][0]["providers"][0]
    assert not provider_errors(provider)
    names = {"starting", "loading", "ready", "draining", "stopping", "crashed", "stopped", "failed"}
    assert provider["launch"]["state"] in names | {"unknown"}
