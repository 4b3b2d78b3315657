"""An SLO as an operator writes it, parsed once (pure, no I/O).

One parser (:func:`parse_spec`) for ``PUT /slos/{name}`` bodies and the
``slos:`` section of control-plane.yaml; a bad value raises
:class:`SpecError` naming the field, which each caller words its own way
(a 400 naming the field, a ConfigError naming the dotted path).

An SLO is:

* ``metric``: ``ttft`` (time to first token), ``tpot`` (time per output
  token), ``duration`` (the whole request) or ``error_ratio``;
* for a latency metric, ``percentile`` and ``objective_seconds``: "95 % of
  requests at or under 0.5 s" is ``percentile: 95, objective_seconds: 0.5``
  (the target is 0.95; a request over the objective is bad);
* for ``error_ratio``, ``objective_ratio``: the share of requests that may
  fail (0.01: 99 % succeed; the target is 0.99; a failed request is bad);
* ``model`` (required): the model whose requests count;
* ``edge_selector`` (optional): the edges whose providers count (the label
  selector language of ``/edges``; empty: every edge);
* ``window`` (default ``30d``): the compliance window (``10m`` to ``400d``;
  units ``s``, ``m``, ``h``, ``d``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from twisted_iop.label_selectors import Selector, SelectorError, parse_selector

TTFT = "ttft"
TPOT = "tpot"
DURATION = "duration"
ERROR_RATIO = "error_ratio"
#: The latency metrics (counted from the providers' cumulative sketches).
LATENCY_METRICS = (TTFT, TPOT, DURATION)
METRICS = (*LATENCY_METRICS, ERROR_RATIO)

DEFAULT_WINDOW = "30d"
#: The shortest and longest compliance windows.
MIN_WINDOW_SECONDS = 600.0
MAX_WINDOW_SECONDS = 400 * 86400.0
#: The longest model name and selector text accepted.
MAX_MODEL_CHARS = 256
MAX_SELECTOR_CHARS = 1024
#: An SLO's name: what ``/slos/{name}`` says.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")
KNOWN_FIELDS = frozenset(
    {"metric", "percentile", "objective_seconds", "objective_ratio", "model", "edge_selector", "window"}
)


class SpecError(ValueError):
    """A bad SLO field: ``field`` is its name, the message says what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.detail = message


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot name an SLO, or None."""
    if NAME_PATTERN.match(name) is None:
        shown = name if len(name) <= 80 else name[:80] + "..."
        return f"SLO name {shown!r} is malformed: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
    return None


def parse_duration(text: str) -> float:
    """Seconds of a duration like ``5m``, ``6h`` or ``30d``; ValueError if it is not one."""
    match = _DURATION.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"must be a duration like 5m, 6h or 30d (units s, m, h, d), not {str(text)[:40]!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """A duration in the largest unit that divides it (``3600`` -> ``1h``; ``0.4`` -> ``0.4s``)."""
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and math.isclose(seconds / size, round(seconds / size), abs_tol=1e-9):
            return f"{round(seconds / size)}{unit}"
    return f"{seconds:.3g}s"


@attrs.frozen
class SloSpec:
    """One SLO (see the module docstring)."""

    name: str
    metric: str
    model: str
    #: For a latency metric: the percentile (95) and the objective in seconds.
    percentile: Optional[float] = None
    objective_seconds: Optional[float] = None
    #: For ``error_ratio``: the share of requests that may fail.
    objective_ratio: Optional[float] = None
    #: The label selector text ("": every edge), as parsed (normalized).
    edge_selector: str = ""
    window: str = DEFAULT_WINDOW
    window_seconds: float = 30 * 86400.0

    @property
    def target(self) -> float:
        """The share of requests that must be good (0.95 for p95; 0.99 for a 1 % error ratio)."""
        if self.metric == ERROR_RATIO:
            assert self.objective_ratio is not None
            return 1.0 - self.objective_ratio
        assert self.percentile is not None
        return self.percentile / 100.0

    @property
    def selector(self) -> Selector:
        """The edge selector, parsed (it parsed when the spec was made)."""
        return parse_selector(self.edge_selector)

    def as_json(self) -> dict[str, Any]:
        """The spec as ``PUT`` takes it back (and as views show it)."""
        body: dict[str, Any] = {"metric": self.metric, "model": self.model}
        if self.metric == ERROR_RATIO:
            body["objective_ratio"] = self.objective_ratio
        else:
            body["percentile"] = self.percentile
            body["objective_seconds"] = self.objective_seconds
        body["edge_selector"] = self.edge_selector
        body["window"] = self.window
        return body


def _number(body: Mapping[str, Any], field: str, low: float, high: float, what: str) -> float:
    value = body.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(field, f"must be a number {what}")
    if not low < value < high:
        raise SpecError(field, f"must be a number {what}, not {value:g}")
    return float(value)


def parse_spec(name: str, body: Mapping[str, Any]) -> SloSpec:
    """The SLO ``name`` that ``body`` describes; raises :class:`SpecError` naming the field."""
    problem = name_problem(name)
    if problem is not None:
        raise SpecError("name", problem)
    unknown = sorted(str(key) for key in body if key not in KNOWN_FIELDS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(KNOWN_FIELDS))})")
    metric = body.get("metric")
    if metric not in METRICS:
        raise SpecError("metric", f"must be one of {', '.join(METRICS)}, not {str(metric)[:40]!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS:
        raise SpecError("model", f"is required: the model's name, a string of 1 to {MAX_MODEL_CHARS} characters")
    selector_text = body.get("edge_selector")
    if selector_text is None:
        selector_text = ""
    if not isinstance(selector_text, str) or len(selector_text) > MAX_SELECTOR_CHARS:
        raise SpecError("edge_selector", f"must be a label selector string of at most {MAX_SELECTOR_CHARS} characters")
    try:
        selector = parse_selector(selector_text)
    except SelectorError as e:
        raise SpecError("edge_selector", str(e)) from None
    window = body.get("window", DEFAULT_WINDOW)
    try:
        window_seconds = parse_duration(window)
    except ValueError as e:
        raise SpecError("window", str(e)) from None
    if not MIN_WINDOW_SECONDS <= window_seconds <= MAX_WINDOW_SECONDS:
        raise SpecError("window", f"must be between 10m and 400d, not {window}")
    common = {
        "name": name,
        "metric": metric,
        "model": model,
        "edge_selector": str(selector),
        "window": window.strip(),
        "window_seconds": window_seconds,
    }
    if metric == ERROR_RATIO:
        for field in ("percentile", "objective_seconds"):
            if field in body:
                raise SpecError(field, "is for latency metrics; error_ratio takes objective_ratio")
        ratio = _number(body, "objective_ratio", 0.0, 1.0, "between 0 and 1 (exclusive): the share that may fail")
        return SloSpec(objective_ratio=ratio, **common)
    if "objective_ratio" in body:
        raise SpecError("objective_ratio", f"is for error_ratio; {metric} takes percentile and objective_seconds")
    percentile = _number(body, "percentile", 0.0, 100.0, "between 0 and 100 (exclusive), e.g. 95")
    objective = _number(body, "objective_seconds", 0.0, 3600.0, "of seconds above 0 and under 3600")
    return SloSpec(percentile=percentile, objective_seconds=objective, **common)
