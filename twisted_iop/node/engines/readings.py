"""Bounded reading of what engines export: Prometheus text and JSON figures.

Every figure comes from an engine the Node does not control, so each is
checked: a value that is not a finite number, is negative, or is beyond
:data:`MAX_REQUESTS` (requests) or 1 (a fraction) is treated as not said
at all, never passed on clipped. The bytes are bounded before this point
(the probes read at most ``MAX_PROBE_BODY_BYTES`` of any answer); here
the number of samples looked at is bounded too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from prometheus_client.parser import text_string_to_metric_families

#: More requests than this on one engine is not a reading but a bug or a lie.
MAX_REQUESTS = 1_000_000
#: At most this many samples of one /metrics answer are looked at.
MAX_SAMPLES = 20_000
#: A fraction may exceed 1 by this much (rounding in the engine) and still count as 1.
FRACTION_SLACK = 0.01


def prometheus_samples(body: bytes, names: Iterable[str]) -> dict[str, list[float]]:
    """The values of the samples called one of ``names`` in Prometheus text, by name.

    Every label set of a name is kept (an engine serving several models
    exports one per model). Text that stops parsing part way keeps what
    was read before the bad line; garbage gives ``{}``.
    """
    wanted = set(names)
    found: dict[str, list[float]] = {}
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return found
    seen = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen += 1
                if seen > MAX_SAMPLES:
                    return found
                if sample.name in wanted:
                    found.setdefault(sample.name, []).append(float(sample.value))
    except Exception:
        # The parser raises assorted errors (ValueError, IndexError, ...)
        # on malformed text; an engine's bad line must not lose the reading.
        pass
    return found


def request_count(values: Optional[Iterable[Any]]) -> Optional[int]:
    """The sum of request counts over label sets, or ``None`` if absent or not believable."""
    if values is None:
        return None
    total = 0.0
    any_value = False
    for value in values:
        number = _number(value)
        if number is None or number > MAX_REQUESTS:
            return None
        total += number
        any_value = True
    if not any_value or total > MAX_REQUESTS:
        return None
    return round(total)


def fraction(values: Optional[Iterable[Any]]) -> Optional[float]:
    """The largest of some fractions (0..1) over label sets, or ``None`` if absent or not believable.

    The largest, not the sum: two engines each at 0.6 of their own cache
    are each at 0.6, not at 1.2.
    """
    if values is None:
        return None
    largest: Optional[float] = None
    for value in values:
        number = _number(value)
        if number is None or number > 1.0 + FRACTION_SLACK:
            return None
        number = min(number, 1.0)
        largest = number if largest is None else max(largest, number)
    return largest


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    if not math.isfinite(number) or number < 0:
        return None
    return number


def json_body(body: bytes) -> Any:
    """The parsed JSON of an answer, or ``None`` if it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def metric_values(answers: Mapping[str, bytes], path: str, names: Iterable[str]) -> dict[str, list[float]]:
    """The samples of ``names`` in the answer of ``path``, ``{}`` when that path did not answer."""
    body = answers.get(path)
    return prometheus_samples(body, names) if body is not None else {}


def metrics_load(
    answers: Mapping[str, bytes],
    running: Iterable[str] = (),
    waiting: Iterable[str] = (),
    kv_cache: Iterable[str] = (),
    path: str = "/metrics",
) -> tuple[Optional[int], Optional[int], Optional[float]]:
    """Running, waiting and KV-cache use in a ``/metrics`` answer.

    Each of ``running``, ``waiting`` and ``kv_cache`` names the metrics
    that may carry that figure, newest name first (the first one the
    engine exports is used).
    """
    groups = (tuple(running), tuple(waiting), tuple(kv_cache))
    samples = metric_values(answers, path, [name for group in groups for name in group])

    def first(names: tuple[str, ...]) -> Optional[list[float]]:
        return next((samples[name] for name in names if name in samples), None)

    return request_count(first(groups[0])), request_count(first(groups[1])), fraction(first(groups[2]))
