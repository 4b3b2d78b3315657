"""The link to Redis: three connections, each with one job.

* the **writer**, whose order is the order of this replica's changes;
* the **reader**, for the blocking stream reads;
* the **lease** connection: the heartbeat (lease, reaping). It alone has a
  reply deadline, so a Redis that stops answering is noticed within
  ``redis_timeout_seconds`` even while the writer has thousands of claims
  queued (a fleet enrolling at once); the writer and reader have none,
  because a deadline measured by a busy reactor fires before replies that
  have long arrived are read, and would cut a healthy connection.

All reconnect by themselves (txredisapi's pool runs a ``ClientService``
per connection, with backoff). While any is down the link is *down*: calls
fail at once with :class:`ClusterUnavailable` instead of queueing, so the
replica can count what it could not write and say it is not ready. Writes
waiting for their reply are bounded (:data:`MAX_PENDING_WRITES`).
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import txredisapi
from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.logger import Logger

from twisted_iop.controlplane.cluster.scripts import Script
from twisted_iop.controlplane.cluster.settings import RedisAddress
from twisted_iop.eventloop.reactor_types import Reactor

#: Longest blocking stream read.
BLOCK_MILLISECONDS = 1000
#: Writes sent and not yet answered; beyond this a write fails at once
#: (Redis is not keeping up or not answering).
MAX_PENDING_WRITES = 200_000


class ClusterUnavailable(Exception):
    """Redis cannot be reached: shared state can be neither read nor written."""

    def __init__(self, detail: str = "") -> None:
        super().__init__("the cluster store (Redis) is unavailable" + (f": {detail}" if detail else ""))


class _Protocol(txredisapi.RedisProtocol):
    """A Redis connection with Nagle's algorithm off: a routed request is a
    small write answered by another replica, and must not wait for an ACK."""

    def connectionMade(self) -> Any:
        set_nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if set_nodelay is not None:
            set_nodelay(True)
        return super().connectionMade()


class _Factory(txredisapi.RedisFactory):
    """A pool of one, logging quietly."""

    noisy = False
    protocol = _Protocol


class RedisLink:
    """Writer and reader connections to one Redis."""

    _log = Logger()

    def __init__(self, address: RedisAddress, reactor: Reactor, timeout_seconds: float) -> None:
        self.address = address
        self._reactor = reactor
        self._timeout = timeout_seconds

        def factory(reply_timeout: Optional[float]) -> _Factory:
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

        self._writer = factory(None)
        self._reader = factory(None)
        self._lease = factory(timeout_seconds)
        self._factories = (self._writer, self._reader, self._lease)
        self._started = False
        #: Writes sent and not answered yet.
        self.pending_writes = 0

    def start(self) -> None:
        """Start connecting (and reconnecting) both connections."""
        if self._started:
            return
        self._started = True
        for f in self._factories:
            f.startConnecting(TCP4ClientEndpoint(self._reactor, self.address.host, self.address.port, timeout=5))

    def stop(self) -> Deferred[Any]:
        """Close the connections and stop reconnecting."""
        return gatherResults([f.disconnect() for f in self._factories], consumeErrors=True)

    @property
    def up(self) -> bool:
        """Whether all three connections are established."""
        return all(f.size for f in self._factories)

    @staticmethod
    def _connection(f: _Factory) -> Optional[Any]:
        for conn in f.pool:
            if conn.connected:
                return conn
        return None

    def _writing(self) -> Optional[Any]:
        if self.pending_writes >= MAX_PENDING_WRITES:
            return None
        return self._connection(self._writer)

    def _counted(self, d: Deferred[Any]) -> Deferred[Any]:
        self.pending_writes += 1

        def done(result: Any) -> Any:
            self.pending_writes -= 1
            return result

        return d.addBoth(done)

    def call(self, *args: Any) -> Deferred[Any]:
        """One command on the writer connection (in order with every other write)."""
        conn = self._writing()
        if conn is None:
            return fail(ClusterUnavailable("not connected, or too many writes waiting"))
        return self._counted(self._command(conn, args))

    def run(self, script: Script, *args: Any) -> Deferred[Any]:
        """Run ``script`` with ``args`` on the writer (EVALSHA, loading it once per connection)."""
        return self._eval(self._writing(), script, args)

    def run_lease(self, script: Script, *args: Any) -> Deferred[Any]:
        """Run ``script`` on the lease connection (the heartbeat's reaping)."""
        return self._eval(self._connection(self._lease), script, args)

    def _eval(self, conn: Optional[Any], script: Script, args: tuple[Any, ...]) -> Deferred[Any]:
        if conn is None:
            return fail(ClusterUnavailable("not connected, or too many writes waiting"))
        try:
            d: Deferred[Any] = conn.eval(script.source, [], [str(a) for a in args])
        except Exception as e:
            return fail(ClusterUnavailable(str(e)))
        return self._counted(d) if conn in self._writer.pool else d

    def lease(self, *args: Any) -> Deferred[Any]:
        """One command on the lease connection (the only one with a reply deadline)."""
        return self._command(self._connection(self._lease), args)

    def read(self, *args: Any) -> Deferred[Any]:
        """One (blocking) command on the reader connection."""
        return self._command(self._connection(self._reader), args)

    @staticmethod
    def _command(conn: Optional[Any], args: tuple[Any, ...]) -> Deferred[Any]:
        if conn is None:
            return fail(ClusterUnavailable("not connected"))
        try:
            d: Deferred[Any] = conn.execute_command(*args)
        except Exception as e:  # the connection went away in this very turn
            return fail(ClusterUnavailable(str(e)))
        return d
