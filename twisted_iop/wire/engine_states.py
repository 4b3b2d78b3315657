"""A launched engine's states as every daemon spells them (``EngineState`` on the wire).

The Node reports them, the Edge checks and relays them, the Control
Plane shows them; a value this version does not name (a newer Node's, or
garbage) is ``unknown``, which takes no work.
"""

from __future__ import annotations

from twisted_iop.wire import control_pb2 as pb

#: The wire's values by the names the views and logs use.
ENGINE_STATE_NAMES: dict[int, str] = {
    pb.ENGINE_STATE_STARTING: "starting",
    pb.ENGINE_STATE_LOADING: "loading",
    pb.ENGINE_STATE_READY: "ready",
    pb.ENGINE_STATE_DRAINING: "draining",
    pb.ENGINE_STATE_STOPPING: "stopping",
    pb.ENGINE_STATE_CRASHED: "crashed",
    pb.ENGINE_STATE_STOPPED: "stopped",
    pb.ENGINE_STATE_FAILED: "failed",
}
#: Every name a view may show, ``unknown`` last.
ENGINE_STATES: tuple[str, ...] = (*ENGINE_STATE_NAMES.values(), "unknown")


def engine_state_name(value: int) -> str:
    """The name of an ``EngineState`` value; ``unknown`` for one this version does not know."""
    return ENGINE_STATE_NAMES.get(value, "unknown")
