"""Plain-text rendering of SLOs for people (``iopctl slo``).

As :mod:`twisted_iop.client.iopctl.render`: each function takes a model (of
:mod:`twisted_iop.client.slos`) and returns text without a trailing
newline.
"""

from __future__ import annotations

from typing import Optional

from twisted_iop.client.iopctl.render import NONE, render_table, time_text
from twisted_iop.client.slos import Slo, SloList


def objective_text(slo: Slo) -> str:
    """``ttft p95 <= 0.5s`` or ``error_ratio <= 1%``."""
    spec = slo.spec
    if spec.metric == "error_ratio":
        return f"error_ratio <= {(spec.objective_ratio or 0) * 100:g}%"
    return f"{spec.metric} p{spec.percentile:g} <= {spec.objective_seconds:g}s"


def value_text(slo: Slo) -> str:
    """The value over the window: seconds as ms, a ratio as a percentage (``-`` before any request)."""
    if slo.value is None:
        return NONE
    if slo.value_unit == "ratio":
        return f"{slo.value * 100:.2f}%"
    return f"{slo.value * 1000:.0f} ms"


def _percent(value: Optional[float]) -> str:
    return NONE if value is None else f"{value * 100:.1f}%"


def render_slos(page: SloList) -> str:
    """One row per SLO: objective, model, window, value, budget left, alerts firing."""
    rows = [
        (
            slo.name,
            objective_text(slo),
            slo.spec.model,
            slo.spec.edge_selector or "(every edge)",
            slo.spec.window or NONE,
            value_text(slo),
            _percent(slo.error_budget_remaining),
            ",".join(slo.firing) or NONE,
        )
        for slo in page.items
    ]
    table = render_table(["SLO", "OBJECTIVE", "MODEL", "EDGES", "WINDOW", "VALUE", "BUDGET", "FIRING"], rows, (5, 6))
    return table + f"\n{page.total} SLOs"


def render_slo(slo: Slo) -> str:
    """One SLO: its spec and figures, the burn rate per window and each alert."""
    lines = [
        f"slo:         {slo.name}",
        f"objective:   {objective_text(slo)} for {slo.spec.model} on {slo.spec.edge_selector or '(every edge)'}",
        f"window:      {slo.spec.window} (target {slo.target * 100:g}% good)",
        f"value:       {value_text(slo)} over the window; {_percent(slo.good_ratio)} good "
        f"({slo.requests - slo.bad_requests} of {slo.requests})",
        f"budget left: {_percent(slo.error_budget_remaining)}",
        f"evaluated:   {time_text(slo.evaluated_at)}",
        "",
        render_table(
            ["WINDOW", "BURN RATE", "REQUESTS"],
            [(r.window, f"{r.burn_rate:.2f}", r.requests) for r in slo.burn_rates],
            numeric=(1, 2),
        ),
        "",
        render_table(
            ["ALERT", "STATE", "SINCE", "WINDOWS", "AT"],
            [
                (
                    a.name,
                    a.state,
                    time_text(a.since),
                    f"{a.long_window} and {a.short_window}",
                    f">= {a.burn_rate_threshold:g}",
                )
                for a in slo.alerts
            ],
        ),
    ]
    return "\n".join(lines)
