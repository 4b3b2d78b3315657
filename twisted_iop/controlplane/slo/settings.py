"""Settings of SLOs (``slos`` in control-plane.yaml), parsed once.

::

    slos:
      interval_seconds: 10      # how often SLOs are evaluated
      max_slos: 200             # SLOs kept at most (PUT beyond: 409)
      max_streams: 50000        # provider streams whose last reading is kept
      persist_seconds: 60       # how often their buckets are written to the store
      objectives:               # declared at start (a PUT may change them until the next start)
        chat-ttft: {metric: ttft, percentile: 95, objective_seconds: 0.5, model: llama-3-8b}

Errors name the dotted field (``slos.objectives.chat-ttft.percentile``).
"""

from __future__ import annotations

import attrs

from twisted_iop.configuration import ConfigError, Section
from twisted_iop.controlplane.slo.spec import SloSpec, SpecError, parse_spec


@attrs.frozen
class SloSettings:
    """How SLOs are evaluated and bounded, and those declared at start."""

    interval_seconds: float = 10.0
    max_slos: int = 200
    max_streams: int = 50_000
    persist_seconds: float = 60.0
    declared: tuple[SloSpec, ...] = ()


def parse_slos(section: Section) -> SloSettings:
    """``slos``: the interval, the bounds and the declared objectives."""
    section.reject_unknown({"interval_seconds", "max_slos", "max_streams", "persist_seconds", "objectives"})
    default = SloSettings()
    interval = section.number("interval_seconds", default.interval_seconds)
    if not 0.05 <= interval <= 3600:
        raise ConfigError(f"{section.field_path('interval_seconds')}: must be between 0.05 and 3600, not {interval:g}")
    max_slos = section.integer("max_slos", default.max_slos, minimum=1, maximum=10_000)
    objectives = section.section("objectives")
    declared: list[SloSpec] = []
    for name in sorted(objectives.names()):
        entry = objectives.section(name)
        try:
            declared.append(parse_spec(name, entry.mapping()))
        except SpecError as e:
            where = objectives.field_path(name) if e.field == "name" else entry.field_path(e.field)
            raise ConfigError(f"{where}: {e.detail}") from None
    if len(declared) > max_slos:
        raise ConfigError(f"{section.field_path('objectives')}: {len(declared)} objectives, over max_slos {max_slos}")
    return SloSettings(
        interval_seconds=interval,
        max_slos=max_slos,
        max_streams=section.integer("max_streams", default.max_streams, minimum=1, maximum=10_000_000),
        persist_seconds=section.number("persist_seconds", default.persist_seconds),
        declared=tuple(declared),
    )
