"""Plain-text rendering of rollouts for people (``iopctl rollout``).

As :mod:`twisted_iop.client.iopctl.render`: every function takes a model (here of
:mod:`twisted_iop.client.rollouts`) and returns text without a trailing
newline; none of them prints. :func:`progress_line` is the one line
``iopctl rollout show --watch`` redraws: a bar, the share done and the
counts by execution state.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted_iop.client.iopctl.render import NONE, render_table, time_text
from twisted_iop.client.rollouts import (
    EXECUTION_STATES,
    Rollout,
    RolloutCommand,
    RolloutExecutionPage,
    RolloutPage,
)

#: Characters of the progress bar between its brackets.
BAR_WIDTH = 30


def progress_bar(progress: float, width: int = BAR_WIDTH) -> str:
    """``[#########.....]`` for a share 0..1 (clamped), ``width`` cells inside."""
    share = min(1.0, max(0.0, progress))
    filled = int(share * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def counts_text(counts: Mapping[str, int]) -> str:
    """The non-zero counts as ``succeeded 40, in_flight 10`` (``-`` when all are zero)."""
    parts = [f"{name} {value}" for name, value in counts.items() if value]
    return ", ".join(parts) or NONE


def progress_line(rollout: Rollout) -> str:
    """One line: id, state, bar, percent, ended of targets, batch and the counts."""
    counts = rollout.counts
    batch = f" batch {rollout.batch.number} ({rollout.batch.size})" if rollout.batch is not None else ""
    return (
        f"{rollout.rollout_id} {rollout.state:<9} {progress_bar(rollout.progress)} "
        f"{rollout.progress * 100:5.1f}% {counts.ended}/{rollout.targets}{batch}  {counts_text(counts.as_dict())}"
    )


def command_text(command: RolloutCommand) -> str:
    """``node.drain on node-1 (reason=maintenance)``."""
    text = command.name
    if command.target is not None:
        text += f" on {command.target}"
    elif command.node_selector is not None:
        text += f" on nodes {command.node_selector!r}"
    if command.arguments:
        text += " (" + ", ".join(f"{k}={v}" for k, v in sorted(command.arguments.items())) + ")"
    return text


def _options_text(values: Mapping[str, object]) -> str:
    parts = [f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items() if v is not None]
    return ", ".join(parts) or "server defaults"


def render_rollout(rollout: Rollout) -> str:
    """One rollout: what it runs where, how, its state, counts and progress."""
    strategy = rollout.strategy
    abort = rollout.abort
    abort_text = (
        "any failure"
        if abort.any_failure
        else _options_text({"failure_percent": abort.failure_percent, "min_executed": abort.min_executed})
    )
    if abort.latency is not None:
        latency = abort.latency
        rise = f"{latency.metric} up more than {latency.max_increase_percent:g}% over {latency.min_requests or 50} requests"
        abort_text = rise if abort_text == "server defaults" else f"{abort_text}; {rise}"
    rows = [
        ("rollout", rollout.rollout_id),
        ("state", rollout.state + (f" ({rollout.reason})" if rollout.reason else "")),
        ("command", command_text(rollout.command)),
        ("selector", rollout.selector or "(every edge)"),
        ("targets", str(rollout.targets)),
        (
            "strategy",
            _options_text(
                {
                    "batch_size": strategy.batch_size,
                    "batch_percent": strategy.batch_percent,
                    "max_in_flight": strategy.max_in_flight,
                    "pause_seconds": strategy.pause_seconds,
                    "increase_factor": strategy.increase_factor,
                }
            ),
        ),
        ("abort", abort_text),
        ("timeout", NONE if rollout.timeout_seconds is None else f"{rollout.timeout_seconds:g} s"),
        ("disconnected", rollout.disconnected),
        ("idempotency key", rollout.idempotency_key or NONE),
        ("created", time_text(rollout.created_at)),
        ("started", time_text(rollout.started_at)),
        ("finished", time_text(rollout.finished_at)),
        ("batch", NONE if rollout.batch is None else f"{rollout.batch.number} ({rollout.batch.size} edges)"),
        ("progress", f"{progress_bar(rollout.progress)} {rollout.progress * 100:.1f}%"),
    ]
    width = max(len(label) for label, _ in rows)
    lines = [f"{label.ljust(width)}  {value}" for label, value in rows]
    counts = rollout.counts.as_dict()
    lines.append("")
    lines.append(render_table(list(EXECUTION_STATES), [[counts[s] for s in EXECUTION_STATES]], range(8)))
    return "\n".join(lines)


def render_rollouts(page: RolloutPage) -> str:
    """The rollouts, newest first, one row each."""
    rows = [
        (
            r.rollout_id,
            r.state,
            command_text(r.command),
            r.selector or "(every edge)",
            r.targets,
            f"{r.progress * 100:.0f}%",
            r.counts.failed + r.counts.timed_out,
            time_text(r.created_at),
        )
        for r in page.items
    ]
    table = render_table(
        ["ROLLOUT", "STATE", "COMMAND", "SELECTOR", "TARGETS", "DONE", "FAILED", "CREATED"], rows, numeric=(4, 5, 6)
    )
    shown = f"{len(page.items)} of {page.total} rollouts"
    return table + "\n" + (shown + " (more: --limit)" if page.next_cursor else shown)


def render_executions(page: RolloutExecutionPage) -> str:
    """One row per target edge: state, operations, times and reason."""
    rows = [
        (
            e.edge_id,
            e.state,
            ",".join(e.operation_ids) or NONE,
            time_text(e.started_at),
            time_text(e.finished_at),
            e.reason or "",
        )
        for e in page.items
    ]
    table = render_table(["EDGE", "STATE", "OPERATIONS", "STARTED", "FINISHED", "REASON"], rows)
    return table + f"\n{len(page.items)} executions"
