"""Settings of capacity history (``history`` in control-plane.yaml).

Parsed once, by :func:`parse_history` (called by ``controlplane/config.py``),
whose errors name the dotted field.
"""

from __future__ import annotations

import attrs

from twisted_iop.configuration import ConfigError, Section

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


#: The fleet and each model fleet-wide: 15 s for 6 h, 1 min for 48 h, 10 min for 30 days.
DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier(15.0, 6 * 3600.0),
    Tier(60.0, 48 * 3600.0),
    Tier(600.0, 30 * 86400.0),
)
#: Each edge and each model on it: sampled every 30 s (every other interval)
#: and kept 1 h, 5 min for 48 h, 1 h for 30 days (a view of 1 h, 6 h, 24 h
#: and 7 d gets 120, 72, 288 and 168 points).
DEFAULT_EDGE_TIERS: tuple[Tier, ...] = (
    Tier(30.0, 3600.0),
    Tier(600.0, 48 * 3600.0),
    Tier(3600.0, 30 * 86400.0),
)


@attrs.frozen
class HistorySettings:
    """How capacity history is sampled and kept."""

    enabled: bool = True
    #: Seconds between samples (the first tier's step).
    interval_seconds: float = 15.0
    #: The fleet's and the models' (fleet-wide) tiers: finest first; each
    #: step a whole multiple of the one before, the first the interval.
    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    #: Each edge's and each model's on an edge (the same rules, but the first
    #: step may be a whole multiple of the interval: the edges are sampled at
    #: that step); by default :data:`DEFAULT_EDGE_TIERS` at the default
    #: interval, else ``tiers``.
    edge_tiers: tuple[Tier, ...] = attrs.field(
        default=attrs.Factory(
            lambda self: DEFAULT_EDGE_TIERS if self.interval_seconds == 15.0 else self.tiers, takes_self=True
        )
    )
    #: The most series sampled at once; new series beyond it are not started (counted, logged once).
    max_series: int = 50_000
    #: The bound on the bytes of history the store keeps (the oldest chunks go first).
    max_bytes: int = 256 * 1024 * 1024
    #: The most changed snapshots parsed per sample of the edges for the
    #: per-model and engine figures (``breakdown.py``); the others keep their
    #: last ones (at 10,000 busy edges each edge's are then at most 40
    #: samples of the edges old: 20 minutes at the default edge tiers).
    parse_budget: int = 250


#: The most tiers ``history.tiers`` may list.
MAX_HISTORY_TIERS = 6


def parse_history(section: Section) -> HistorySettings:
    """``history``: the sampling interval, the tiers and the bounds.

    ``tiers`` (the fleet and each model) and ``edge_tiers`` (each edge and
    each model on an edge) are lists of ``{step_seconds, keep_hours}`` or
    ``{step_seconds, keep_days}``; the first tier's step is the interval
    (it defaults to it; for ``edge_tiers`` it may be a whole multiple of
    it: edges are sampled every that many seconds), and each step is a
    whole multiple of the one before. At the default interval each list
    has its default; at another, ``tiers`` is required and ``edge_tiers``
    defaults to ``tiers``.
    """
    section.reject_unknown(
        {"enabled", "interval_seconds", "tiers", "edge_tiers", "max_series", "max_bytes", "parse_budget"}
    )
    default = HistorySettings()
    interval = section.number("interval_seconds", default.interval_seconds)
    if interval < 0.1 or interval > 3600:
        raise ConfigError(f"{section.field_path('interval_seconds')}: must be between 0.1 and 3600, not {interval:g}")
    if round(interval * 1000) != interval * 1000:
        raise ConfigError(f"{section.field_path('interval_seconds')}: must be a whole number of milliseconds")
    tiers: tuple[Tier, ...]
    if section.has("tiers"):
        tiers = _parse_tiers(section, "tiers", interval, first_multiple=False)
    elif interval == default.interval_seconds:
        tiers = default.tiers
    else:
        raise ConfigError(
            f"{section.field_path('tiers')}: required when interval_seconds is not {default.interval_seconds:g} "
            "(the first tier's step is the interval)"
        )
    if section.has("edge_tiers"):
        edge_tiers = _parse_tiers(section, "edge_tiers", interval, first_multiple=True)
    elif interval == default.interval_seconds:
        edge_tiers = default.edge_tiers
    else:
        edge_tiers = tiers
    return HistorySettings(
        enabled=section.boolean("enabled", default.enabled),
        interval_seconds=interval,
        tiers=tiers,
        edge_tiers=edge_tiers,
        max_series=section.integer("max_series", default.max_series, minimum=1, maximum=10_000_000),
        max_bytes=section.integer("max_bytes", default.max_bytes, minimum=1024 * 1024, maximum=2**40),
        parse_budget=section.integer("parse_budget", default.parse_budget, minimum=1, maximum=10_000_000),
    )


def _parse_tiers(section: Section, name: str, interval: float, first_multiple: bool) -> tuple[Tier, ...]:
    """One list of tiers (``tiers`` or ``edge_tiers``), its errors naming the field;
    with ``first_multiple`` the first step may be a whole multiple of the interval."""
    raw = section.raw(name)
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{section.field_path(name)}: must be a list of {{step_seconds, keep_hours or keep_days}}")
    if len(raw) > MAX_HISTORY_TIERS:
        raise ConfigError(f"{section.field_path(name)}: at most {MAX_HISTORY_TIERS} tiers")
    parsed: list[Tier] = []
    for index, item in enumerate(raw):
        entry = Section(item, f"{section.field_path(name)}[{index}]")
        entry.reject_unknown({"step_seconds", "keep_hours", "keep_days"})
        step = entry.number("step_seconds", interval if index == 0 else 0.0)
        if entry.has("keep_hours") == entry.has("keep_days"):
            raise ConfigError(f"{entry.field_path('keep_hours')}: give exactly one of keep_hours and keep_days")
        keep = (
            entry.number("keep_hours", 0.0) * 3600.0
            if entry.has("keep_hours")
            else entry.number("keep_days", 0.0) * 86400.0
        )
        if keep > MAX_KEEP_SECONDS:
            raise ConfigError(f"{entry.field_path('keep_days')}: at most {MAX_KEEP_SECONDS // 86400} days")
        step_ms = round(step * 1000)
        interval_ms = round(interval * 1000)
        if index == 0 and first_multiple and (step_ms < interval_ms or step_ms % interval_ms):
            raise ConfigError(
                f"{entry.field_path('step_seconds')}: the first tier's step is the interval "
                f"(history.interval_seconds: {interval:g}) or a whole multiple of it, not {step:g}"
            )
        if index == 0 and not first_multiple and step_ms != interval_ms:
            raise ConfigError(
                f"{entry.field_path('step_seconds')}: the first tier's step is the interval "
                f"(history.interval_seconds: {interval:g}), not {step:g}"
            )
        if index > 0:
            finer = parsed[-1]
            if step_ms <= finer.step_ms or step_ms % finer.step_ms:
                raise ConfigError(
                    f"{entry.field_path('step_seconds')}: must be a whole multiple (2 or more) "
                    f"of the tier before ({finer.step_seconds:g}), not {step:g}"
                )
        if keep < step * 2:
            raise ConfigError(f"{entry.field_path('keep_hours')}: must keep at least two steps")
        parsed.append(Tier(step_ms / 1000, keep))
    return tuple(parsed)
