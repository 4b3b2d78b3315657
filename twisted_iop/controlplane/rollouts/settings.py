"""How much and how fast rollouts run: their bounds and defaults (``rollouts.*`` in
control-plane.yaml) and the one dispatch pace shared by every rollout."""

from __future__ import annotations

from typing import Optional

import attrs

from twisted_iop.token_bucket import TokenBucket


@attrs.frozen
class RolloutSettings:
    """Bounds and defaults of rollouts (``rollouts.*`` in control-plane.yaml)."""

    #: Rollouts kept, ended ones included (the oldest ended are forgotten first).
    max_kept: int = 100
    #: Target edges one rollout may have.
    max_targets: int = 20_000
    #: ``strategy.max_in_flight`` when the request does not say.
    default_max_in_flight: int = 50
    #: ``wait_seconds`` when the request does not say, and its bound.
    default_wait_seconds: float = 300.0
    max_wait_seconds: float = 86_400.0
    #: ``strategy.pause_seconds`` at most.
    max_pause_seconds: float = 86_400.0
    #: Operations all rollouts together dispatch per second at most (0: no
    #: bound). Answers come back at the same pace, so this bounds the share
    #: of the event loop rollouts take from the views (about 0.25 ms of CPU
    #: per execution: 1,000/s is a quarter of one core).
    max_dispatch_per_second: float = 1000.0
    #: With ``abort.latency``: how often a watched edge's status is read for its figure after.
    latency_poll_seconds: float = 5.0


class DispatchPace:
    """Every rollout's dispatches together (``max_dispatch_per_second``; 0: no bound): a
    :class:`~twisted_iop.token_bucket.TokenBucket` whose burst is a tenth of a second's worth
    (at least one), so dispatches come in small groups a few milliseconds apart rather than
    all at once."""

    def __init__(self, per_second: float) -> None:
        self._bucket = TokenBucket(per_second, max(1.0, per_second / 10.0)) if per_second > 0 else None

    def allowed(self, now: float) -> Optional[int]:
        """How many may be dispatched now (``None``: no bound)."""
        if self._bucket is None:
            return None
        return int(self._bucket.available(now))

    def took(self, count: int) -> None:
        """``count`` were dispatched."""
        if self._bucket is not None:
            self._bucket.took(count)

    def next_at(self, now: float) -> float:
        """When at least one more may go."""
        if self._bucket is None:
            return now
        return now + self._bucket.wait(now) + 0.001
