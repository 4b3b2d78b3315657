"""The link to Redis: one writer connection (whose order is the order of
this replica's changes) and one reader (the blocking stream reads).

Both reconnect by themselves (txredisapi's pool runs a ``ClientService``
per connection, with backoff). While either is down the link is *down*:
calls fail at once with :class:`ClusterUnavailable` instead of queueing,
so the replica can count what it could not write and say it is not ready.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import txredisapi
from twisted.internet.defer import Deferred, fail
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.logger import Logger

from twisted_iop.controlplane.cluster.scripts import Script
from twisted_iop.controlplane.cluster.settings import RedisAddress

#: Longest blocking stream read (the reader's reply timeout is longer).
BLOCK_MILLISECONDS = 1000


class ClusterUnavailable(Exception):
    """Redis cannot be reached: shared state can be neither read nor written."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("the cluster store (Redis) is unavailable" + (f": {detail}" if detail else ""))


class _Factory(txredisapi.RedisFactory):  # type: ignore[misc]
    """A pool of one, logging quietly."""

    noisy = False


class RedisLink:
    """Writer and reader connections to one Redis."""

    _log = Logger()

    def __init__(self, address: RedisAddress, reactor: Any, timeout_seconds: float) -> None:
        self.address = address
        self._reactor = reactor
        self._timeout = timeout_seconds

        def factory(reply_timeout: float) -> _Factory:
            return _Factory(
                uuid.uuid4().hex,
                address.db,
                1,
                isLazy=True,
                password=address.password,
                username=address.username,
                replyTimeout=reply_timeout,
                convertNumbers=False,
            )

        self._writer = factory(timeout_seconds)
        self._reader = factory(timeout_seconds + BLOCK_MILLISECONDS / 1000.0)
        self._started = False

    def start(self) -> None:
        """Start connecting (and reconnecting) both connections."""
        if self._started:
            return
        self._started = True
        for f in (self._writer, self._reader):
            f.startConnecting(TCP4ClientEndpoint(self._reactor, self.address.host, self.address.port, timeout=5))

    def stop(self) -> Deferred[Any]:
        """Close both connections and stop reconnecting."""
        from twisted.internet.defer import gatherResults

        return gatherResults([self._writer.disconnect(), self._reader.disconnect()], consumeErrors=True)

    @property
    def up(self) -> bool:
        """Whether both connections are established."""
        return bool(self._writer.size and self._reader.size)

    @staticmethod
    def _connection(f: _Factory) -> Optional[Any]:
        for conn in f.pool:
            if conn.connected:
                return conn
        return None

    def call(self, *args: Any) -> Deferred[Any]:
        """One command on the writer connection (in order with every other write)."""
        conn = self._connection(self._writer)
        if conn is None:
            return fail(ClusterUnavailable("not connected"))
        try:
            d: Deferred[Any] = conn.execute_command(*args)
        except Exception as e:  # the connection went away in this very turn
            return fail(ClusterUnavailable(str(e)))
        return d

    def run(self, script: Script, *args: Any) -> Deferred[Any]:
        """Run ``script`` with ``args`` (EVALSHA, loading it once per connection)."""
        conn = self._connection(self._writer)
        if conn is None:
            return fail(ClusterUnavailable("not connected"))
        try:
            d: Deferred[Any] = conn.eval(script.source, [], [str(a) for a in args])
        except Exception as e:
            return fail(ClusterUnavailable(str(e)))
        return d

    def read(self, *args: Any) -> Deferred[Any]:
        """One (blocking) command on the reader connection."""
        conn = self._connection(self._reader)
        if conn is None:
            return fail(ClusterUnavailable("not connected"))
        try:
            d: Deferred[Any] = conn.execute_command(*args)
        except Exception as e:
            return fail(ClusterUnavailable(str(e)))
        return d
