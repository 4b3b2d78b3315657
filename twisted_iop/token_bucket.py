"""The one token bucket: tokens refilled at a rate up to a burst, at times the caller gives.

Every pace in the project is one of these: the hello rate limit of the
wires (:class:`~twisted_iop.wire.limits.HelloRateLimit`), the hello
admission's fixed cap
(:class:`~twisted_iop.controlplane.wires.hello_admission.HelloAdmission`) and the
rollouts' dispatch pace
(:class:`~twisted_iop.controlplane.rollouts.settings.DispatchPace`). It reads no
clock: the caller passes ``now``, so tests drive it with plain numbers and
its first reading is whenever the caller first asks (a clock may not tell
time before the reactor runs).
"""

from __future__ import annotations

from typing import Optional


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` kept; it starts full."""

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"a token bucket needs a rate and a burst above 0, not {rate} and {burst}")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._updated: Optional[float] = None

    def available(self, now: float) -> float:
        """The tokens there at ``now`` (fractions included)."""
        if self._updated is not None and now > self._updated:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        if self._updated is None or now > self._updated:
            self._updated = now
        return self._tokens

    def take(self, now: float, count: float = 1.0) -> Optional[float]:
        """Take ``count`` tokens: ``None`` if they were there, else the seconds until they are
        (nothing is taken then)."""
        if self.available(now) >= count:
            self._tokens -= count
            return None
        return (count - self._tokens) / self.rate

    def took(self, count: float) -> None:
        """``count`` tokens were spent (after :meth:`available` said how many there were)."""
        self._tokens -= count

    def wait(self, now: float, count: float = 1.0) -> float:
        """Seconds from ``now`` until ``count`` tokens are there (0: they are)."""
        return max(0.0, count - self.available(now)) / self.rate
