"""One SLO's counts, figures and alerts (pure: no I/O; the time is passed in).

An :class:`SloState` is told what its matching providers did
(:meth:`SloState.record`: ``bad`` of ``total`` requests, and for a latency
metric the sketch of their figures, at a time) and keeps it in buckets
scaled to its window ``W`` (at the default 30 days, the figures in
brackets):

* fine counts, ``W / 43200`` each [1 min], for the last ``W / 120`` [6 h]:
  the burn rates;
* coarse counts, ``W / 720`` each [1 h], for the whole window: the error
  budget;
* for a latency metric, a sketch per ``W / 30`` [1 day]: the percentile
  over the window.

So an SLO keeps at most about 1,100 count buckets and 32 sketches,
whatever the traffic.

**Figures.** The error ratio of a stretch is ``bad / total``; the burn
rate is that over ``1 - target`` (1.0: the budget lasts exactly the
window). ``error_budget_remaining = 1 - (bad / total) / (1 - target)``
over the window (1.0 with no request yet; negative once overspent).

**Alerts** (the SRE workbook's multi-window, multi-burn-rate alerts; the
windows are fractions of ``W``, which at 30 days are the workbook's own):

* ``page``: burn rate over ``W / 720`` [1 h] AND over ``W / 8640`` [5 min]
  both >= 14.4 (2 % of the budget in an hour);
* ``ticket``: over ``W / 120`` [6 h] AND over ``W / 1440`` [30 min] both >= 6
  (5 % of the budget in six hours).

An alert fires when its condition starts holding and resolves when it
stops; :meth:`SloState.evaluate` says which changed.
"""

from __future__ import annotations

from typing import Any, Optional

import attrs

from twisted_iop.controlplane.slo.buckets import CountBuckets, SketchSlices
from twisted_iop.controlplane.slo.spec import ERROR_RATIO, SloSpec, format_duration
from twisted_iop.latency.sketch import LatencySketch

#: Fine buckets per window, and the part of the window they keep.
FINE_PER_WINDOW = 43_200
FINE_KEEP_FRACTION = 1 / 120
#: Coarse buckets per window.
COARSE_PER_WINDOW = 720
#: Latency sketches per window.
SLICES_PER_WINDOW = 30

FIRING = "firing"
RESOLVED = "resolved"
#: Never fired yet.
INACTIVE = "inactive"
ALERT_STATES = (INACTIVE, FIRING, RESOLVED)


@attrs.frozen
class AlertRule:
    """A multi-window burn-rate alert: both windows at or over ``burn_rate``."""

    name: str
    long_fraction: float
    short_fraction: float
    burn_rate: float
    severity: str


PAGE = AlertRule("page", 1 / 720, 1 / 8640, 14.4, "page")
TICKET = AlertRule("ticket", 1 / 120, 1 / 1440, 6.0, "ticket")
RULES = (PAGE, TICKET)


@attrs.define
class AlertState:
    """Where one alert of an SLO is."""

    name: str
    state: str = INACTIVE
    #: When it last fired or resolved (None: never fired).
    since: Optional[float] = None


@attrs.frozen
class AlertChange:
    """An alert that fired or resolved at an evaluation."""

    slo: str
    alert: str
    state: str
    at: float
    long_window: str
    short_window: str
    long_burn_rate: float
    short_burn_rate: float
    threshold: float


@attrs.frozen
class BurnRate:
    """The burn rate over one window."""

    window: str
    seconds: float
    burn_rate: float
    bad: int
    total: int


@attrs.frozen
class SloFigures:
    """What an SLO's view shows, at one time."""

    #: The percentile (seconds) or the error ratio over the window (None: no request yet).
    value: Optional[float]
    #: The share of requests that were good over the window (None: no request yet).
    good_ratio: Optional[float]
    error_budget_remaining: float
    bad: int
    total: int
    burn_rates: tuple[BurnRate, ...]


def burn_rate(bad: int, total: int, target: float) -> float:
    """The error ratio over the allowed one (0 with no request)."""
    if total <= 0:
        return 0.0
    allowed = 1.0 - target
    return (bad / total) / allowed if allowed > 0 else float("inf") if bad else 0.0


class SloState:
    """One SLO: its spec, its buckets and its alerts (see the module docstring)."""

    def __init__(self, spec: SloSpec, created_at: float) -> None:
        self.spec = spec
        self.created_at = created_at
        window = spec.window_seconds
        self.fine = CountBuckets(window / FINE_PER_WINDOW, window * FINE_KEEP_FRACTION)
        self.coarse = CountBuckets(window / COARSE_PER_WINDOW, window)
        self.slices: Optional[SketchSlices] = (
            None if spec.metric == ERROR_RATIO else SketchSlices(window / SLICES_PER_WINDOW, window)
        )
        self.alerts = {rule.name: AlertState(rule.name) for rule in RULES}
        #: When it was last told of requests, and last evaluated.
        self.updated_at: Optional[float] = None
        self.evaluated_at: Optional[float] = None

    # -- what happened -----------------------------------------------------------------

    def record(self, at: float, bad: int, total: int, sketch: Optional[LatencySketch] = None) -> None:
        """``bad`` of ``total`` requests ended by ``at`` (with their sketch, for a latency metric)."""
        if total <= 0:
            return
        self.fine.add(at, bad, total)
        self.coarse.add(at, bad, total)
        if sketch is not None and self.slices is not None and sketch.count:
            self.slices.add(at, sketch)
        self.updated_at = at if self.updated_at is None else max(self.updated_at, at)

    def respecified(self, spec: SloSpec, now: float) -> SloState:
        """This SLO with a changed ``spec``: its counts and alerts kept when they
        still mean the same (same metric, objective, model, selector and
        window: only a new name or spelling), else begun again from ``now``."""
        old = self.spec
        same = (old.metric, old.target, old.objective_seconds, old.window_seconds, old.model, old.edge_selector) == (
            spec.metric,
            spec.target,
            spec.objective_seconds,
            spec.window_seconds,
            spec.model,
            spec.edge_selector,
        )
        if same:
            self.spec = spec
            return self
        fresh = SloState(spec, now)
        for name, alert in self.alerts.items():
            if alert.state == FIRING:
                # It resolves at the next evaluation unless the new spec's counts say otherwise.
                fresh.alerts[name] = AlertState(name, FIRING, alert.since)
        return fresh

    # -- figures -----------------------------------------------------------------------

    def windows(self, rule: AlertRule) -> tuple[float, float]:
        """The long and short windows of ``rule`` for this SLO, in seconds."""
        window = self.spec.window_seconds
        return window * rule.long_fraction, window * rule.short_fraction

    def burn(self, now: float, seconds: float) -> BurnRate:
        """The burn rate over the last ``seconds``."""
        buckets = self.fine if seconds <= self.fine.span else self.coarse
        bad, total = buckets.sums(now, seconds)
        return BurnRate(format_duration(seconds), seconds, burn_rate(bad, total, self.spec.target), bad, total)

    def figures(self, now: float) -> SloFigures:
        """The value, budget and burn rates at ``now``."""
        spec = self.spec
        bad, total = self.coarse.sums(now, spec.window_seconds)
        value: Optional[float]
        if spec.metric == ERROR_RATIO:
            value = bad / total if total else None
        else:
            assert self.slices is not None and spec.percentile is not None
            value = self.slices.merged(now, spec.window_seconds).quantile(spec.percentile / 100.0)
        rates = [self.burn(now, seconds) for rule in RULES for seconds in self.windows(rule)]
        return SloFigures(
            value=value,
            good_ratio=(total - bad) / total if total else None,
            error_budget_remaining=1.0 - burn_rate(bad, total, spec.target),
            bad=bad,
            total=total,
            burn_rates=tuple(rates),
        )

    # -- alerts ------------------------------------------------------------------------

    def evaluate(self, now: float) -> list[AlertChange]:
        """Fire or resolve each alert by its condition at ``now``; the changes."""
        self.evaluated_at = now
        changes: list[AlertChange] = []
        for rule in RULES:
            long_seconds, short_seconds = self.windows(rule)
            long_rate = self.burn(now, long_seconds)
            short_rate = self.burn(now, short_seconds)
            holds = long_rate.burn_rate >= rule.burn_rate and short_rate.burn_rate >= rule.burn_rate
            alert = self.alerts[rule.name]
            firing = alert.state == FIRING
            if holds == firing:
                continue
            alert.state = FIRING if holds else RESOLVED
            alert.since = now
            changes.append(
                AlertChange(
                    self.spec.name,
                    rule.name,
                    alert.state,
                    now,
                    long_rate.window,
                    short_rate.window,
                    long_rate.burn_rate,
                    short_rate.burn_rate,
                    rule.burn_rate,
                )
            )
        return changes

    # -- the stored form ---------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        """Everything to keep across a restart (the spec, buckets and alerts)."""
        return {
            "name": self.spec.name,
            "spec": self.spec.as_json(),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "fine": self.fine.as_json(),
            "coarse": self.coarse.as_json(),
            "slices": None if self.slices is None else self.slices.as_json(),
            "alerts": {name: [a.state, a.since] for name, a in self.alerts.items()},
        }

    @classmethod
    def from_json(cls, spec: SloSpec, value: Any) -> SloState:
        """The state :meth:`as_json` made, with ``spec`` (parsed from it by the
        caller); ValueError when ``value`` is not that."""
        try:
            state = cls(spec, float(value["created_at"]))
            fine = CountBuckets.from_json(value["fine"])
            coarse = CountBuckets.from_json(value["coarse"])
            if (fine.step, fine.span, coarse.step, coarse.span) == (
                state.fine.step,
                state.fine.span,
                state.coarse.step,
                state.coarse.span,
            ):
                state.fine, state.coarse = fine, coarse
                if state.slices is not None and value.get("slices") is not None:
                    slices = SketchSlices.from_json(value["slices"])
                    if (slices.step, slices.span) == (state.slices.step, state.slices.span):
                        state.slices = slices
            updated = value.get("updated_at")
            state.updated_at = None if updated is None else float(updated)
            for name, (alert_state, since) in value["alerts"].items():
                if name in state.alerts and alert_state in ALERT_STATES:
                    state.alerts[name] = AlertState(name, alert_state, None if since is None else float(since))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a stored SLO: {e!r}") from None
        return state
