"""Keepalive over many connections: one timer per factory, not one per connection.

:class:`KeepaliveSweeper` runs the keepalive check of every connection of
a factory (or of one dialed link) from one ``LoopingCall``, skipping those
heard from within the keepalive interval without a call: 10,000
connections cost one timer and, in a busy fleet, few calls. Each
connection's own check (ping when quiet, drop past the deadline) is
:meth:`twisted_iop.wire.peer.FramedPeerProtocol.check_keepalive`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall

from twisted_iop.wire.settings import PeerSettings


class KeptAlive(Protocol):
    """What the sweeper needs of a connection (a ``FramedPeerProtocol`` is one)."""

    @property
    def last_received(self) -> float:
        """When the connection last received anything (``clock.seconds()``)."""

    def check_keepalive(self, now: float) -> None:
        """Ping the peer if it is quiet, drop it if it is past its deadline."""


class KeepaliveSweeper:
    """One timer that runs keepalive checks over a set of connections."""

    def __init__(
        self,
        clock: IReactorTime,
        settings: PeerSettings,
        connections: Callable[[], Iterable[KeptAlive]],
    ) -> None:
        self._clock = clock
        self._connections = connections
        self._interval = settings.keepalive_interval_seconds
        # Check often enough that a silent peer is dropped close to its
        # deadline, never slower than once a second.
        step = min(settings.keepalive_interval_seconds, settings.keepalive_deadline_seconds) / 3.0
        self._step = max(0.05, min(step, 1.0))
        self._loop = LoopingCall(self.sweep)
        self._loop.clock = clock

    def start(self) -> None:
        """Start sweeping (idempotent)."""
        if not self._loop.running:
            self._loop.start(self._step, now=False)

    def stop(self) -> None:
        """Stop sweeping (idempotent)."""
        if self._loop.running:
            self._loop.stop()

    def sweep(self) -> None:
        """Run one keepalive check over every connection."""
        now = self._clock.seconds()
        # Connections heard from within the interval need nothing: skip
        # them without a call, which is most of them in a busy fleet.
        quiet_since = now - self._interval
        for connection in list(self._connections()):
            if connection.last_received > quiet_since:
                continue
            connection.check_keepalive(now)
