"""Limits on hellos: failed hellos per source address, accepted hellos per second.

Both are pure bookkeeping on an injected clock (no I/O):

* :class:`FailedHelloLimiter`: after ``max_failures`` failed hellos (bad
  credential, identity mismatch, unknown node) from one address within
  ``window_seconds``, that address is *blocked* for ``cooldown_seconds``:
  its new connections are closed at once, before any TLS handshake or
  hello. The table holds at most ``max_addresses`` addresses; beyond that
  the least recently touched one is forgotten, so a flood from many
  (spoofed or real) addresses costs bounded memory.
* :class:`HelloRateLimit`: a token bucket of accepted hellos per second
  (burst twice the rate). A hello over the rate is answered
  ``retry_later`` with a hint; hints are handed out one ``1/rate`` slot
  apart, so a herd of refused Edges comes back spread over time instead
  of all at once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, cast

import attrs
from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime, ITCPTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger

from twisted_iop.token_bucket import TokenBucket

#: How often a summary of connections closed at once is logged (at most).
SUMMARY_INTERVAL_SECONDS = 60.0


@attrs.frozen
class FailedHelloLimits:
    """Section ``failed_hellos`` of a listener."""

    max_failures: int = 10
    window_seconds: float = 60.0
    cooldown_seconds: float = 300.0
    max_addresses: int = 10_000


@attrs.define
class _Record:
    failures: list[float]
    blocked_until: float = 0.0


def source_of(addr: Optional[IAddress]) -> Optional[str]:
    """The host of a TCP peer address (None for other transports: nothing to limit)."""
    host = getattr(addr, "host", None)
    return host if isinstance(host, str) else None


class FailedHelloLimiter:
    """Failed hellos per source address, and which addresses are blocked."""

    _log = Logger()

    def __init__(self, clock: IReactorTime, limits: FailedHelloLimits, wire: str) -> None:
        self._clock = clock
        self.limits = limits
        self._wire = wire
        self._records: OrderedDict[str, _Record] = OrderedDict()
        #: Connections closed at once since the last summary line.
        self.refused_since_summary = 0
        #: Every connection closed at once, and every address blocked, since start.
        self.refused_total = 0
        self.blocks_total = 0
        self._summary: Optional[IDelayedCall] = None

    def __len__(self) -> int:
        return len(self._records)

    def is_blocked(self, source: Optional[str]) -> bool:
        """Whether a new connection from ``source`` must be closed at once (counted)."""
        if source is None:
            return False
        record = self._records.get(source)
        if record is None or record.blocked_until <= self._clock.seconds():
            return False
        self.refused_since_summary += 1
        self.refused_total += 1
        if self._summary is None:
            # One summary line per interval, however many were refused.
            self._summary = self._clock.callLater(SUMMARY_INTERVAL_SECONDS, self._summarize)
        return True

    def failed(self, source: Optional[str]) -> None:
        """Record a failed hello from ``source``; block it past the limit."""
        if source is None:
            return
        now = self._clock.seconds()
        record = self._records.pop(source, None)
        if record is None:
            record = _Record([])
        # Re-inserted last: the table evicts the least recently touched.
        self._records[source] = record
        while len(self._records) > self.limits.max_addresses:
            self._records.popitem(last=False)
        horizon = now - self.limits.window_seconds
        record.failures = [t for t in record.failures if t > horizon]
        record.failures.append(now)
        if len(record.failures) >= self.limits.max_failures and record.blocked_until <= now:
            record.blocked_until = now + self.limits.cooldown_seconds
            record.failures.clear()
            self.blocks_total += 1
            # One line per block, never one per attempt; the address itself
            # is not logged (peer addresses stay out of the logs).
            self._log.warn(
                "{wire}: an address was blocked for {cooldown:g}s after {failures} failed hellos "
                "within {window:g}s ({blocked} addresses blocked now)",
                wire=self._wire,
                cooldown=self.limits.cooldown_seconds,
                failures=self.limits.max_failures,
                window=self.limits.window_seconds,
                blocked=self.blocked_count(),
            )

    def blocked_count(self) -> int:
        """How many addresses are blocked now."""
        now = self._clock.seconds()
        return sum(1 for record in self._records.values() if record.blocked_until > now)

    def _summarize(self) -> None:
        self._summary = None
        self._log.info(
            "{wire}: closed {refused} connections at once from blocked addresses "
            "in the last {interval:g}s ({blocked} addresses blocked now)",
            wire=self._wire,
            refused=self.refused_since_summary,
            interval=SUMMARY_INTERVAL_SECONDS,
            blocked=self.blocked_count(),
        )
        self.refused_since_summary = 0

    def stop(self) -> None:
        """Cancel a pending summary (the listener stops)."""
        if self._summary is not None and self._summary.active():
            self._summary.cancel()
        self._summary = None


class RefusedConnection(Protocol):
    """A connection from a blocked address: aborted as soon as it is made."""

    def connectionMade(self) -> None:
        assert self.transport is not None
        cast(ITCPTransport, self.transport).abortConnection()  # a TCP or TLS connection


class HelloRateLimit:
    """Accepted hellos per second (a :class:`~twisted_iop.token_bucket.TokenBucket`, burst
    ``2 * rate``, at least 1), whose refusals' hints are spread one slot apart."""

    def __init__(self, clock: IReactorTime, per_second: float) -> None:
        self._clock = clock
        self.per_second = per_second
        # At least one hello must fit, whatever the rate.
        self._bucket = TokenBucket(per_second, max(1.0, 2.0 * per_second))
        #: When the next refused hello's hint points (spreads a herd out).
        self._next_slot = 0.0
        #: Hellos refused for the rate, since start.
        self.refused_total = 0

    @property
    def burst(self) -> float:
        """The hellos that may pass at once."""
        return self._bucket.burst

    def take(self) -> Optional[float]:
        """Take a token: None if the hello may pass, else seconds to wait first."""
        now = self._clock.seconds()
        wait = self._bucket.take(now)
        if wait is None:
            return None
        self.refused_total += 1
        slot = 1.0 / self.per_second
        self._next_slot = max(self._next_slot, now + wait) + slot
        return self._next_slot - now
