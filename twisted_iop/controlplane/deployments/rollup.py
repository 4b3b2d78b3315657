"""The state of a deployment on each edge, and its rollup (pure, no I/O).

An edge selected by a deployment is, for it, exactly one of:

* ``offline``: not connected (with ``offline: skip`` it is not counted as desired);
* ``held``: the edge holds changes and the deployment is not ready there;
* ``failed``: an instance cannot be placed, or its node refused it or its
  engine failed (the reason is the instance's);
* ``out_of_sync``: the edge has not acknowledged the newest desired set
  sent to it, or an instance drifted (its engine exited unasked);
* ``ready``: every instance is ready with the deployment's spec hash;
* ``progressing``: anything else (instances pending, starting, restarting).

The rollup counts edges by state; ``desired`` counts the edges selected
(connected ones only with ``offline: skip``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

import attrs

from twisted_iop.controlplane.deployments.placement import PlacedInstance, Unplaced
from twisted_iop.controlplane.deployments.spec import SKIP
from twisted_iop.wire import control_pb2 as pb

READY = "ready"
PROGRESSING = "progressing"
OUT_OF_SYNC = "out_of_sync"
FAILED = "failed"
OFFLINE = "offline"
HELD = "held"
#: Every state of an edge, in the rollup's order.
EDGE_STATES = (READY, PROGRESSING, OUT_OF_SYNC, FAILED, OFFLINE, HELD)


def state_name(state: int) -> str:
    """An instance state's short name (``ready``, ``refused`` ...)."""
    try:
        return pb.InstanceState.Name(state).removeprefix("INSTANCE_STATE_").lower()
    except ValueError:
        return "unspecified"


@attrs.frozen
class Observation:
    """What an edge last said of its deployments: the version it took, what runs, its hold."""

    version: int
    instances: tuple[pb.InstanceStatus, ...]
    held: bool
    at: float


@attrs.frozen
class InstanceRow:
    """One instance of a deployment on an edge, as views show it."""

    instance_id: str
    node_id: str
    state: str
    reason: str
    spec_hash: str
    generation: int


@attrs.frozen
class EdgeRollup:
    """A deployment on one edge: its state, the generation observed, its instances."""

    edge_id: str
    state: str
    observed_generation: int
    instances: tuple[InstanceRow, ...]
    reason: str = ""


def edge_rollup(
    edge_id: str,
    deployment: str,
    spec_hash: str,
    connected: bool,
    placed: Sequence[PlacedInstance],
    unplaced: Sequence[Unplaced],
    sent_version: int,
    observed: Optional[Observation],
) -> EdgeRollup:
    """The deployment's state on one edge (see the module docstring)."""
    reported: dict[str, pb.InstanceStatus] = {}
    if observed is not None:
        reported = {s.instance_id: s for s in observed.instances if s.deployment == deployment}
    rows: list[InstanceRow] = []
    for instance in placed:
        status = reported.get(instance.instance_id)
        if status is None:
            rows.append(InstanceRow(instance.instance_id, instance.node_id, "pending", "not reported yet", "", 0))
        else:
            rows.append(
                InstanceRow(
                    instance.instance_id,
                    status.node_id,
                    state_name(status.state),
                    status.reason,
                    status.spec_hash,
                    status.generation,
                )
            )
    rows.extend(InstanceRow(missing.instance_id, "", "unplaced", missing.reason, "", 0) for missing in unplaced)
    wanted = {i.instance_id for i in placed}
    for instance_id, status in sorted(reported.items()):
        if instance_id not in wanted and status.state != pb.INSTANCE_STATE_STOPPED:
            rows.append(
                InstanceRow(
                    instance_id,
                    status.node_id,
                    state_name(status.state),
                    status.reason or "being stopped",
                    status.spec_hash,
                    status.generation,
                )
            )
    observed_generation = max((s.generation for s in reported.values()), default=0)
    state, reason = _state(spec_hash, connected, placed, rows, sent_version, observed)
    return EdgeRollup(edge_id, state, observed_generation, tuple(rows), reason)


def _state(
    spec_hash: str,
    connected: bool,
    placed: Sequence[PlacedInstance],
    rows: Sequence[InstanceRow],
    sent_version: int,
    observed: Optional[Observation],
) -> tuple[str, str]:
    if not connected:
        return OFFLINE, "the edge is not connected"
    for row in rows:
        if row.state in ("unplaced", "failed", "refused"):
            return FAILED, f"{row.instance_id}: {row.reason}"
    wanted = {i.instance_id for i in placed}
    ready = all(row.state == READY and row.spec_hash == spec_hash for row in rows if row.instance_id in wanted) and all(
        row.instance_id in wanted for row in rows
    )
    if observed is None or observed.version < sent_version:
        if observed is not None and observed.held and not ready:
            return HELD, "the edge holds changes"
        return OUT_OF_SYNC, "the edge has not acknowledged the newest desired set"
    if ready:
        return READY, ""
    if observed.held:
        return HELD, "the edge holds changes"
    for row in rows:
        if row.state == "drifted":
            return OUT_OF_SYNC, f"{row.instance_id}: {row.reason or 'drifted'}"
    return PROGRESSING, ""


def rollup_counts(states: Iterable[str], offline_policy: str) -> dict[str, int]:
    """``desired`` and the count of edges in each state."""
    counts = dict.fromkeys(EDGE_STATES, 0)
    for state in states:
        counts[state] += 1
    total = sum(counts.values())
    desired = total - counts[OFFLINE] if offline_policy == SKIP else total
    return {"desired": desired, **counts}


def merge_counts(parts: Mapping[str, int], into: dict[str, int]) -> None:
    """Add ``parts`` into ``into`` (for fleet-wide figures)."""
    for key, value in parts.items():
        into[key] = into.get(key, 0) + value
