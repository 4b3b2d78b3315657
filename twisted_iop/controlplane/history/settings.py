"""Settings of capacity history (``history`` in control-plane.yaml).

Parsed once by ``controlplane/config.py`` (``parse_history``), whose
errors name the dotted field.
"""

from __future__ import annotations

import attrs

#: The longest a tier may keep its points (400 days).
MAX_KEEP_SECONDS = 400 * 86400


@attrs.frozen
class Tier:
    """One tier: points every ``step_seconds``, kept ``keep_seconds``."""

    step_seconds: float
    keep_seconds: float

    @property
    def step_ms(self) -> int:
        """The step in milliseconds (points' times are integer milliseconds)."""
        return round(self.step_seconds * 1000)

    @property
    def key(self) -> int:
        """The tier's ``step`` in the store's chunk keys: whole seconds, or
        milliseconds for a step under one second (tests)."""
        return self.step_ms // 1000 if self.step_ms % 1000 == 0 else self.step_ms


#: 15 s for 6 h, 1 min for 48 h, 10 min for 30 days.
DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier(15.0, 6 * 3600.0),
    Tier(60.0, 48 * 3600.0),
    Tier(600.0, 30 * 86400.0),
)


@attrs.frozen
class HistorySettings:
    """How capacity history is sampled and kept."""

    enabled: bool = True
    #: Seconds between samples (the first tier's step).
    interval_seconds: float = 15.0
    #: Finest first; each step a whole multiple of the one before, the first the interval.
    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    #: The most series sampled at once; new series beyond it are not started (counted, logged once).
    max_series: int = 50_000
    #: The bound on the bytes of history the store keeps (the oldest chunks go first).
    max_bytes: int = 256 * 1024 * 1024
    #: The most changed snapshots parsed per sample for the per-model and
    #: engine figures (``breakdown.py``); the others keep their last ones
    #: (at 10,000 busy edges each edge's are then at most 40 samples old).
    parse_budget: int = 250
