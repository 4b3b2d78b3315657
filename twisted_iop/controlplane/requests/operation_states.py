"""An operation's lifecycle: its states, the rules between them, and the one
place that writes them (pure, no I/O).

An operation (:class:`~twisted_iop.controlplane.fleet.operations.OperationRecord`,
one command dispatched to an edge) moves

    sent -> accepted -> running -> one terminal state

* **In flight only forward.** ``sent``, ``accepted`` and ``running`` only
  move forward; a step may be skipped (an answer ends a ``sent``
  operation at once), a late ``accepted`` after ``running`` changes
  nothing.
* **Terminal is final.** ``succeeded``, ``failed``, ``rejected`` (what the
  edge answered), ``timed_out``, ``edge_disconnected``, ``superseded``
  (the gateway's own verdicts): nothing moves an ended operation.
* **A late outcome, once.** An answer that arrives after the end is kept
  beside the terminal state, only once, and only if it is an answer
  state (succeeded, failed, rejected).
* **Another replica's copy** (cluster mode) is adopted only as far as it
  is a legal successor of the record kept here (:func:`adopt`): never
  backwards, a terminal state stays, a late outcome is kept once.

These functions only decide and record; which transition to ask for is
decided by the gateway's command room (``command_dispatch.py``), from the
answers to its own requests and its own verdicts. Nothing else assigns an
operation's ``state``, ``finished_at``, ``history`` or ``late_outcome``
(``tests/controlplane/test_cp_operation_writers.py`` fails when something
does).
"""

from __future__ import annotations

from typing import Optional, Protocol

import attrs

SENT = "sent"
ACCEPTED = "accepted"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
REJECTED = "rejected"
TIMED_OUT = "timed_out"
EDGE_DISCONNECTED = "edge_disconnected"
#: A newer connection of the edge took over while the command was in flight.
SUPERSEDED = "superseded"

#: The in-flight states, in the only order they may be visited.
IN_FLIGHT_STATES = (SENT, ACCEPTED, RUNNING)
TERMINAL_STATES = frozenset({SUCCEEDED, FAILED, REJECTED, TIMED_OUT, EDGE_DISCONNECTED, SUPERSEDED})
#: States an edge's answer can end a command in (also those of a late outcome).
ANSWER_STATES = frozenset({SUCCEEDED, FAILED, REJECTED})
_RANK = {state: rank for rank, state in enumerate(IN_FLIGHT_STATES)}


@attrs.frozen
class LateOutcome:
    """An edge's answer that arrived after its operation had already ended.

    The operation keeps its terminal state (the Control Plane already told
    its caller); the late answer is kept beside it so nobody is misled.
    """

    state: str  # one of ANSWER_STATES
    reason: str
    result: dict[str, str]
    received_at: float


class OperationRecord(Protocol):
    """What the rules read and write of an operation (an
    :class:`~twisted_iop.controlplane.fleet.operations.OperationRecord`)."""

    state: str
    reason: str
    result: dict[str, str]
    created_at: float
    updated_at: float
    finished_at: Optional[float]
    history: list[tuple[str, float, str]]
    late_outcome: Optional[LateOutcome]


def follows(current: str, state: str) -> bool:
    """Whether an operation in ``current`` may move to ``state``.

    A terminal state follows every in-flight state; an in-flight state
    only a lower one. Nothing follows a terminal state, and nothing
    follows or is a state this module does not name (a malformed record
    read from the store stays as it is).
    """
    rank = _RANK.get(current)
    if rank is None:
        return False
    if state in TERMINAL_STATES:
        return True
    return _RANK.get(state, -1) > rank


def begin(operation: OperationRecord) -> bool:
    """A just-dispatched operation: ``sent`` at its creation, the first entry
    of its history; False (nothing changes) if it has a history already."""
    if operation.history or operation.state != SENT:
        return False
    operation.updated_at = operation.created_at
    operation.history.append((SENT, operation.created_at, ""))
    return True


def advance(
    operation: OperationRecord, state: str, at: float, reason: str = "", result: Optional[dict[str, str]] = None
) -> bool:
    """Move ``operation`` to ``state`` at ``at`` if :func:`follows` allows it;
    return whether it moved. ``reason`` and ``result`` replace the kept
    ones only when given."""
    if not follows(operation.state, state):
        return False
    operation.state = state
    operation.updated_at = at
    if reason:
        operation.reason = reason
    if result:
        operation.result = dict(result)
    if state in TERMINAL_STATES:
        operation.finished_at = at
    operation.history.append((state, at, reason))
    return True


def keep_late_outcome(operation: OperationRecord, outcome: LateOutcome) -> bool:
    """Keep an answer that came after the end: only for an ended operation,
    only the first, only an answer state; return whether it was kept."""
    if (
        operation.state not in TERMINAL_STATES
        or operation.late_outcome is not None
        or outcome.state not in ANSWER_STATES
    ):
        return False
    operation.late_outcome = outcome
    return True


def adopt(kept: OperationRecord, copy: OperationRecord) -> bool:
    """Apply another replica's record of the same operation to ``kept``, only
    as a legal successor; return whether ``kept`` changed.

    A copy whose state :func:`follows` the kept one moves it there: the
    kept record takes its reason, result and update time, its end time
    if it ended, and the entries of its history that carry the kept one
    forward (so the history stays a legal walk, whatever the copy holds).
    A copy that is behind, level, or ends differently what already ended
    leaves the state alone. Its late outcome is kept as
    :func:`keep_late_outcome` allows.
    """
    changed = False
    state = copy.state
    last = kept.state
    if follows(last, state):
        kept.state = state
        kept.reason = copy.reason
        kept.result = dict(copy.result)
        kept.updated_at = copy.updated_at
        for entry in copy.history:
            # Only the entries on the way from the kept state to the copy's.
            if (entry[0] == state or follows(entry[0], state)) and follows(last, entry[0]):
                kept.history.append(entry)
                last = entry[0]
        if last != state:
            kept.history.append((state, copy.updated_at, copy.reason))
        if state in TERMINAL_STATES:
            kept.finished_at = copy.finished_at if copy.finished_at is not None else copy.updated_at
        changed = True
    late = copy.late_outcome
    if late is not None and keep_late_outcome(kept, late):
        changed = True
    return changed
