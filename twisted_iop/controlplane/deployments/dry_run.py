"""A dry run's answer: what applying a spec would do on each edge, as ``?dry_run=true`` shows it (pure).

Per edge the spec selects (or the kept deployment selected): whether it is
selected, the changes placement makes (start, restart, stay, stop), the
instances that cannot be placed or that the edge's node would refuse, and
a note when the edge is offline or holds changes; then a summary of them
all. Nothing is kept or sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Optional

from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments.kept import DeploymentState
from twisted_iop.controlplane.deployments.spec import SKIP, DeploymentSpec


def dry_run_answer(
    spec: DeploymentSpec,
    kept: Optional[DeploymentState],
    views: Iterable[pl.EdgeView],
    plan_for: Callable[[pl.EdgeView], pl.EdgePlan],
) -> dict[str, Any]:
    """The dry run of ``spec`` over ``views`` (the edges concerned, in order), ``kept`` being the
    deployment as it stands (None: a new one) and ``plan_for`` the placement with ``spec`` in it."""
    edges = []
    summary = {pl.START: 0, pl.RESTART: 0, pl.STAY: 0, pl.STOP: 0, "unplaceable": 0}
    for view in views:
        selected = pl.selects(spec, view)
        plan = plan_for(view) if selected else pl.EdgePlan(view.edge_id)
        changes = pl.changes(plan, view, spec.name)
        problems = [
            {"instance_id": u.instance_id, "reason": u.reason} for u in plan.unplaced if u.deployment == spec.name
        ]
        problems.extend(
            {"instance_id": i.instance_id, "reason": i.problem}
            for i in plan.instances
            if i.deployment == spec.name and i.problem
        )
        for change in changes:
            summary[change.action] += 1
        summary["unplaceable"] += len(problems)
        edges.append(
            {
                "edge_id": view.edge_id,
                "connected": view.connected,
                "held": view.held,
                "selected": selected,
                "note": _note(spec, view),
                "changes": [{"action": c.action, "instance_id": c.instance_id, "node_id": c.node_id} for c in changes],
                "problems": problems,
            }
        )
    return {
        "name": spec.name,
        "dry_run": True,
        "generation": (kept.generation + (kept.spec != spec)) if kept is not None else 1,
        "spec": spec.as_json(),
        "spec_hash": spec.spec_hash,
        "summary": summary,
        "edges": edges,
    }


def _note(spec: DeploymentSpec, view: pl.EdgeView) -> str:
    if not view.connected:
        return "the edge is offline: " + ("skipped until it is back" if spec.offline == SKIP else "it waits")
    if view.held:
        return "the edge holds changes: they wait for its release"
    return ""
