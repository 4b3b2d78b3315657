"""Reconnect delays shared by the Edge and Node connectors."""

from __future__ import annotations

import random
from typing import Callable


def backoff_delay(
    attempt: int, initial: float, maximum: float, rand: Callable[[], float] = random.random
) -> float:
    """Exponential backoff with full jitter, bounded by ``initial`` and ``maximum``.

    The ceiling doubles per attempt from ``initial`` up to ``maximum``; the
    delay is uniform between ``initial`` and that ceiling, so a fleet of
    Edges restarting together spreads out and never hammers faster than
    ``initial``.
    """
    exponent = max(0, attempt - 1)
    ceiling = maximum if exponent >= 63 else min(maximum, initial * (2.0**exponent))
    return initial + rand() * (ceiling - initial)
