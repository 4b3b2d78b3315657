"""A deployment's roll: its states, the moves an operator makes, its abort rule (pure, no I/O).

A changed deployment with ``rollout.max_in_flight`` rolls out a few edges at
a time (:mod:`.service`). The roll is in one of:

* ``running``: edges are reached as the ones in flight become ready;
* ``paused``: no further edge is reached (the reached ones keep converging);
* ``cancelled``: ended on request; the edges not reached keep the previous
  generation's spec;
* ``aborted``: ended by itself, its abort criteria met (the reason names the
  failed edges and their share); the edges not reached keep the previous
  spec, the reached ones what they run;
* ``done``: every edge was reached and is ready.

``pause`` moves ``running`` to ``paused``, ``resume`` ``paused`` to
``running``, ``cancel`` either to ``cancelled``. A move on a roll not in
progress raises :class:`NoRoll`; one its state does not allow,
:class:`InvalidMove`. The abort rule is the rollout engine's
(:class:`~twisted_iop.controlplane.rollouts.states.AbortCriteria`), an
"execution" being a reached edge whose change ended: ready or failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Optional

import attrs

from twisted_iop.controlplane.deployments.rollup import FAILED, READY
from twisted_iop.controlplane.rollouts.states import AbortCriteria

RUNNING = "running"
PAUSED = "paused"
CANCELLED = "cancelled"
ABORTED = "aborted"
DONE = "done"
#: Every state of a roll.
ROLL_STATES = (RUNNING, PAUSED, CANCELLED, ABORTED, DONE)
#: The states of a roll in progress (the others ended it).
IN_PROGRESS = frozenset({RUNNING, PAUSED})
#: Per move: the states it may start from, and the state it leads to.
MOVES: dict[str, tuple[frozenset[str], str]] = {
    "pause": (frozenset({RUNNING}), PAUSED),
    "resume": (frozenset({PAUSED}), RUNNING),
    "cancel": (frozenset({RUNNING, PAUSED}), CANCELLED),
}
#: The most failed edges an abort's reason names.
NAMED_EDGES = 10


class NoRoll(Exception):
    """The deployment has no roll in progress."""

    def __init__(self, name: str, state: str) -> None:
        shown = f"its last roll is {state}" if state else "it never rolled out"
        super().__init__(f"deployment {name} has no rollout in progress ({shown})")
        self.state = state


class InvalidMove(Exception):
    """A move the roll's state does not allow (``resume`` of a running roll ...)."""

    def __init__(self, name: str, move: str, state: str) -> None:
        super().__init__(f"the rollout of deployment {name} is {state}: it cannot {move}")
        self.state = state


def moved(name: str, state: str, move: str) -> str:
    """The state ``move`` leads the roll of deployment ``name`` from ``state`` to; raises
    :class:`NoRoll` (not in progress) or :class:`InvalidMove`."""
    starts, to = MOVES[move]
    if state not in IN_PROGRESS:
        raise NoRoll(name, state)
    if state not in starts:
        raise InvalidMove(name, move, state)
    return to


def abort_reason(criteria: AbortCriteria, failed: Sequence[str], ended: int) -> Optional[str]:
    """Why a roll whose ``ended`` reached edges ended (ready or failed), ``failed`` of them failed
    (their ids), aborts; None: it goes on."""
    if criteria.reason(ended, len(failed)) is None:
        return None
    names = ", ".join(failed[:NAMED_EDGES]) + (
        f" and {len(failed) - NAMED_EDGES} more" if len(failed) > NAMED_EDGES else ""
    )
    share = 100.0 * len(failed) / ended if ended else 100.0
    if criteria.any_failure:
        bound = "; rollout.abort.any_failure"
    else:
        bound = f" > rollout.abort.failure_percent {criteria.failure_percent:g}%, min_executed {criteria.min_executed}"
    return f"{len(failed)} of {ended} reached edges failed ({share:.1f}%{bound}): {names}"


@attrs.frozen
class Step:
    """What a running roll does next: abort (with why), reach these edges, end (done), or nothing."""

    abort_reason: Optional[str] = None
    reach: tuple[str, ...] = ()
    done: bool = False


def next_step(
    edges: Sequence[tuple[str, bool]],
    promoted: Set[str],
    states: Mapping[str, str],
    sent_new: Set[str],
    max_in_flight: int,
    wait_offline: bool,
    running: bool,
    abort: Optional[AbortCriteria],
) -> Step:
    """The next step of a roll in progress over ``edges`` ((edge id, connected), in the order
    they are reached): ``promoted`` were reached already, ``states`` are the edges' rollup
    states, ``sent_new`` the reached edges sent the new generation (only those have an outcome
    of the change: a failure of the old spec on an edge just reached is not the change's).

    An edge is in flight while it is not ready, or while it is offline and the deployment
    waits for offline edges (``wait_offline``); the next edges are reached while fewer than
    ``max_in_flight`` reached edges are in flight and the roll runs (not paused); the roll is
    done when every edge is reached and none is in flight."""

    def in_flight(edge_id: str, connected: bool) -> bool:
        if not connected:
            return wait_offline
        return states.get(edge_id, READY) != READY

    if abort is not None:
        judged = [edge_id for edge_id, _ in edges if edge_id in promoted and edge_id in sent_new]
        failed = [edge_id for edge_id in judged if states.get(edge_id) == FAILED]
        ended = sum(1 for edge_id in judged if states.get(edge_id, READY) in (READY, FAILED))
        reason = abort_reason(abort, failed, ended)
        if reason is not None:
            return Step(abort_reason=reason)
    busy = sum(1 for edge_id, connected in edges if edge_id in promoted and in_flight(edge_id, connected))
    reach: list[str] = []
    for edge_id, connected in edges:
        if busy >= max_in_flight or not running:
            break
        if edge_id in promoted:
            continue
        reach.append(edge_id)
        if connected or wait_offline:
            busy += 1
    if reach:
        return Step(reach=tuple(reach))
    return Step(done=busy == 0 and all(edge_id in promoted for edge_id, _ in edges))
