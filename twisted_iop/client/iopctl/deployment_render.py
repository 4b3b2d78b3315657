"""Plain-text rendering of deployments for people (``iopctl deploy``).

As :mod:`twisted_iop.client.iopctl.render`: each function takes a model (of
:mod:`twisted_iop.client.deployments`) and returns text without a
trailing newline.
"""

from __future__ import annotations

from twisted_iop.client.deployments import (
    Deployment,
    DeploymentDeleted,
    DeploymentDryRun,
    DeploymentList,
    DeploymentRoll,
    DeploymentRollup,
)
from twisted_iop.client.iopctl.render import NONE, render_table, time_text

#: Characters of the progress bar.
BAR_WIDTH = 20


def progress_bar(rollup: DeploymentRollup) -> str:
    """``[##########----------] 1/2 ready``."""
    done = BAR_WIDTH * rollup.ready // rollup.desired if rollup.desired else 0
    return f"[{'#' * done}{'-' * (BAR_WIDTH - done)}] {rollup.ready}/{rollup.desired} ready"


def rollup_text(rollup: DeploymentRollup) -> str:
    """The counts that are not zero, besides ready (``progressing 1, failed 1``), or ``-``."""
    parts = [
        f"{name.replace('_', ' ')} {count}"
        for name, count in (
            ("progressing", rollup.progressing),
            ("out_of_sync", rollup.out_of_sync),
            ("failed", rollup.failed),
            ("offline", rollup.offline),
            ("held", rollup.held),
        )
        if count
    ]
    return ", ".join(parts) or NONE


def roll_text(roll: DeploymentRoll) -> str:
    """``rollout paused: 1 reached, 2 pending (paused by alice)``."""
    counts = f"{roll.reached} reached, {roll.pending} pending" + (f", {roll.failed} failed" if roll.failed else "")
    return f"rollout {roll.state}: {counts}" + (f" ({roll.reason})" if roll.reason else "")


def status_line(deployment: Deployment) -> str:
    """One line of ``iopctl deploy status``: the bar, then what is not ready, then a roll not done."""
    rest = rollup_text(deployment.rollup)
    tail = "" if rest == NONE else f"  ({rest})"
    roll = deployment.roll
    if roll is not None and roll.state != "done":
        tail += f"; {roll_text(roll)}"
    return f"{deployment.name} generation {deployment.generation}  {progress_bar(deployment.rollup)}{tail}"


def render_deployments(page: DeploymentList) -> str:
    """One row per deployment: model, profile, edges, generation, ready of desired, the rest."""
    rows = [
        (
            d.name,
            d.spec.get("model", NONE),
            d.spec.get("profile", NONE),
            d.spec.get("edge_selector") or "(every edge)",
            d.generation,
            f"{d.rollup.ready}/{d.rollup.desired}",
            rollup_text(d.rollup),
        )
        for d in page.items
    ]
    table = render_table(["DEPLOYMENT", "MODEL", "PROFILE", "EDGES", "GEN", "READY", "NOT READY"], rows, (4, 5))
    return table + f"\n{page.total} deployments"


def render_deployment(deployment: Deployment) -> str:
    """One deployment: its spec, generation, rollup and each edge's instances."""
    spec = deployment.spec
    parameters = spec.get("parameters") or {}
    lines = [
        f"deployment: {deployment.name} (generation {deployment.generation}, spec hash {deployment.spec_hash})",
        f"model:      {spec.get('model')} with profile {spec.get('profile')}",
        "parameters: " + (", ".join(f"{k}={v}" for k, v in sorted(parameters.items())) or NONE),
        f"edges:      {spec.get('edge_selector') or '(every edge)'}; nodes: {spec.get('node_selector') or '(every node)'}",
        f"replicas:   {spec.get('replicas_per_edge')} per edge, capacity {spec.get('capacity')}, offline {spec.get('offline')}",
        f"updated:    {time_text(deployment.updated_at)} by {deployment.updated_by or NONE}",
        f"rollup:     {progress_bar(deployment.rollup)}; {rollup_text(deployment.rollup)}",
        "rollout:    " + (roll_text(deployment.roll) if deployment.roll is not None else NONE),
    ]
    edges = deployment.edges
    if edges is not None:
        rows = []
        for edge in edges.items:
            if not edge.instances:
                rows.append((edge.edge_id, edge.state, NONE, NONE, NONE, edge.reason or NONE))
            rows.extend(
                (
                    edge.edge_id,
                    edge.state,
                    instance.instance_id,
                    instance.node_id or NONE,
                    instance.state,
                    instance.reason or NONE,
                )
                for instance in edge.instances
            )
        lines += ["", render_table(["EDGE", "STATE", "INSTANCE", "NODE", "INSTANCE STATE", "REASON"], rows)]
        shown = len(edges.items)
        lines.append(
            f"{shown} of {edges.total} edges" + (f"; next: --cursor {edges.next_cursor}" if edges.next_cursor else "")
        )
    return "\n".join(lines)


def render_dry_run(dry: DeploymentDryRun) -> str:
    """What applying would do, per edge and instance, and what cannot be placed and why."""
    summary = dry.summary
    lines = [
        f"dry run of {dry.name} (generation {dry.generation} if applied, spec hash {dry.spec_hash}): "
        f"start {summary.start}, restart {summary.restart}, stay {summary.stay}, stop {summary.stop}, "
        f"cannot place {summary.unplaceable}",
    ]
    rows: list[tuple[str, ...]] = []
    for edge in dry.edges:
        rows.extend((edge.edge_id, c.action, c.instance_id, c.node_id, edge.note or NONE) for c in edge.changes)
        rows.extend((edge.edge_id, "problem", p.instance_id, NONE, p.reason) for p in edge.problems)
        if not edge.changes and not edge.problems:
            rows.append((edge.edge_id, NONE, NONE, NONE, edge.note or NONE))
    if rows:
        lines += ["", render_table(["EDGE", "ACTION", "INSTANCE", "NODE", "NOTE"], rows)]
    else:
        lines.append("no edge is selected")
    return "\n".join(lines)


def render_deleted(deleted: DeploymentDeleted) -> str:
    """``deleted chat (generation 2): its instances stop everywhere``."""
    return f"deleted {deleted.name} (generation {deleted.generation}): its instances stop everywhere"
