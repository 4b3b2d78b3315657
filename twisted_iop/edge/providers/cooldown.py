"""Cool-downs of failing providers (no I/O).

A provider *cools down*, taking no new lease for ``cooldown_seconds``,
when a request on it failed before any byte reached the client in a way
another provider may not (refused, reset, the engine overloaded), or when
more than half of its requests failed within ``failure_window_seconds``
with at least ``min_requests`` of them (LiteLLM router's rule: over half
failing in a minute, five seconds). :class:`Cooldowns` keeps each
provider's recent outcomes (bounded) and the end of its cool-down; the
registry asks it, and its timer calls :meth:`Cooldowns.end` when the
time is up (so asking is a look-up, not a clock read).
"""

from __future__ import annotations

from collections import deque
from typing import Optional

import attrs

#: At most this many recent outcomes are kept per provider (older ones drop).
MAX_OUTCOMES = 1024
#: Over this share of failures in the window starts a cool-down.
FAILURE_SHARE = 0.5

_Key = tuple[str, str]


@attrs.frozen
class CooldownRule:
    """How a failing provider cools down (``inference.failover``)."""

    cooldown_seconds: float = 5.0
    failure_window_seconds: float = 60.0
    min_requests: int = 5


@attrs.define
class _Record:
    outcomes: deque[tuple[float, bool]] = attrs.field(factory=lambda: deque(maxlen=MAX_OUTCOMES))


class Cooldowns:
    """Recent outcomes and cool-downs of every provider."""

    def __init__(self, rule: CooldownRule) -> None:
        self.rule = rule
        self._records: dict[_Key, _Record] = {}
        #: Providers cooling down now, with the reason (until :meth:`end`).
        self._cooling: dict[_Key, str] = {}

    def record(self, node_id: str, provider_id: str, failed: bool, now: float, reason: str = "") -> Optional[float]:
        """Count one request's outcome; if it starts a cool-down, return when it ends."""
        record = self._records.setdefault((node_id, provider_id), _Record())
        outcomes = record.outcomes
        outcomes.append((now, failed))
        horizon = now - self.rule.failure_window_seconds
        while outcomes and outcomes[0][0] < horizon:
            outcomes.popleft()
        if not failed or len(outcomes) < self.rule.min_requests:
            return None
        failures = sum(1 for _, f in outcomes if f)
        if failures <= FAILURE_SHARE * len(outcomes):
            return None
        detail = f"{failures} of its last {len(outcomes)} requests failed"
        return self.start(node_id, provider_id, now, f"{detail} (last: {reason})" if reason else detail)

    def start(self, node_id: str, provider_id: str, now: float, reason: str) -> Optional[float]:
        """Start (or extend) a cool-down; return its end, ``None`` when cool-downs are off.

        The caller calls :meth:`end` at that time.
        """
        if self.rule.cooldown_seconds <= 0:
            return None
        key = (node_id, provider_id)
        record = self._records.setdefault(key, _Record())
        self._cooling[key] = reason
        # A fresh start: the failures that caused it do not start another at once.
        record.outcomes.clear()
        return now + self.rule.cooldown_seconds

    def end(self, node_id: str, provider_id: str) -> None:
        """The cool-down is over."""
        self._cooling.pop((node_id, provider_id), None)

    def cooling(self, node_id: str, provider_id: str) -> Optional[str]:
        """The reason while the provider cools down, else ``None``."""
        return self._cooling.get((node_id, provider_id))

    def forget_provider(self, node_id: str, provider_id: str) -> None:
        """The provider was removed from the configuration."""
        self._records.pop((node_id, provider_id), None)
        self._cooling.pop((node_id, provider_id), None)
