"""What a Node does to converge: which instances start, stop, restart or stay (pure).

The desired set and what runs are both maps of instance id to spec hash.
An instance whose hash matches what runs **stays**, however often the same
set arrives (a repeated apply, a reconnect of the Edge): converge, never
churn. One asked for and not running starts; one running and no longer
asked for stops; one whose hash changed restarts with its new spec.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class ConvergencePlan:
    """The instance ids of each kind of step, sorted."""

    start: tuple[str, ...] = ()
    stop: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()

    @property
    def changes_nothing(self) -> bool:
        """Whether nothing starts, stops or restarts."""
        return not (self.start or self.stop or self.restart)


def plan_convergence(desired: Mapping[str, str], running: Mapping[str, str]) -> ConvergencePlan:
    """The steps from ``running`` to ``desired`` (both instance id -> spec hash)."""
    return ConvergencePlan(
        start=tuple(sorted(i for i in desired if i not in running)),
        stop=tuple(sorted(i for i in running if i not in desired)),
        restart=tuple(sorted(i for i in desired if i in running and running[i] != desired[i])),
        keep=tuple(sorted(i for i in desired if i in running and running[i] == desired[i])),
    )
