"""A launched engine's state as its Node reported it, checked (pure).

A Node that runs a provider's engine itself (a ``launch`` block in its
node.yaml) sends the engine's state with the provider's health
(``ProviderHealthReport.launch``). The Edge keeps it with the health in
its :class:`~twisted_iop.edge.nodes.registry.NodeRegistry` and relays it in
the snapshot; the one owner of the fact is the Node's supervisor. A
provider whose engine is launched takes leases only while it is
``ready`` (:func:`launch_takes_work`); one without a launch block (an
engine someone else runs) as before.

Every value from the Node is checked: an ``EngineState`` this Edge does
not know (a newer Node's, or garbage) counts as ``unknown`` (no work)
with a reason saying what came, reasons are cut at the wire's text
bound, and times outside what a calendar holds are dropped.
"""

from __future__ import annotations

from typing import Optional

import attrs

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.engine_states import ENGINE_STATE_NAMES, engine_state_name
from twisted_iop.wire.hello import MAX_TEXT

#: Milliseconds since the epoch beyond which a Node's time is not believed (year 9999).
MAX_TIME_MS = 253_402_300_799_000
#: States from which an engine becomes ready again by itself (``stopped``
#: and ``failed`` wait to be told).
RETURNING_STATES = frozenset(
    {
        pb.ENGINE_STATE_DRAINING,
        pb.ENGINE_STATE_STOPPING,
        pb.ENGINE_STATE_STARTING,
        pb.ENGINE_STATE_LOADING,
        pb.ENGINE_STATE_CRASHED,
    }
)


@attrs.frozen
class EngineLaunchInfo:
    """A launched engine's state, checked."""

    state: int
    reason: str = ""
    restarts: int = 0
    next_try_at_ms: int = 0
    since_ms: int = 0
    pid: int = 0

    @property
    def name(self) -> str:
        """The state's name (``unknown`` for a value this Edge does not know)."""
        return engine_state_name(self.state)

    @property
    def ready(self) -> bool:
        """Whether it may take leases."""
        return self.state == pb.ENGINE_STATE_READY

    @property
    def returning(self) -> bool:
        """Whether it is on its way back to ready by itself."""
        return self.state in RETURNING_STATES

    def to_wire(self) -> pb.EngineLaunch:
        """The snapshot's form."""
        return pb.EngineLaunch(
            state=self.state,  # type: ignore[arg-type]  # the stubs want the enum type; the state is its int value
            reason=self.reason,
            restarts=self.restarts,
            next_try_at_ms=self.next_try_at_ms,
            since_ms=self.since_ms,
            pid=self.pid,
        )


def checked_launch(report: pb.ProviderHealthReport) -> Optional[EngineLaunchInfo]:
    """The engine state a health report carries, checked; ``None`` when the Node does not launch it."""
    if not report.HasField("launch"):
        return None
    launch = report.launch
    reason = launch.reason[:MAX_TEXT]
    state = int(launch.state)
    if state not in ENGINE_STATE_NAMES:
        detail = "node reported no engine state" if state == 0 else f"node reported unknown engine state {state}"
        reason = f"{detail}: {reason}"[:MAX_TEXT] if reason else detail
    return EngineLaunchInfo(
        state=state,
        reason=reason,
        restarts=launch.restarts,
        next_try_at_ms=_time_ms(launch.next_try_at_ms),
        since_ms=_time_ms(launch.since_ms),
        pid=launch.pid,
    )


def launch_change(old: Optional[EngineLaunchInfo], new: Optional[EngineLaunchInfo]) -> Optional[dict[str, str]]:
    """The attributes of a ``provider.launch_changed`` event when the engine's
    state, reason or restarts changed from ``old`` to ``new``; else ``None``."""
    if new is None or (
        old is not None and (old.state, old.reason, old.restarts) == (new.state, new.reason, new.restarts)
    ):
        return None
    attributes = {
        "previous": old.name if old is not None else "unknown",
        "state": new.name,
        "reason": new.reason,
        "restarts": str(new.restarts),
    }
    if new.next_try_at_ms:
        attributes["next_try_at_ms"] = str(new.next_try_at_ms)
    return attributes


def launch_takes_work(launch: Optional[EngineLaunchInfo]) -> bool:
    """Whether a provider with this engine state may take leases: not launched, or ready."""
    return launch is None or launch.ready


def launch_may_serve(launch: Optional[EngineLaunchInfo]) -> bool:
    """Whether a provider with this engine state serves now or will by itself: not
    launched, ready, or on its way back (``stopped`` and ``failed`` do not come back)."""
    return launch is None or launch.ready or launch.returning


def _time_ms(value: int) -> int:
    return value if 0 < value <= MAX_TIME_MS else 0
