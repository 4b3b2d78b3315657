"""The replica: this process's part of a cluster of Control Planes.

:class:`ClusterReplica` is the service that composes the rooms of cluster
mode around one registry and one gateway; each room owns its part:

* **presence** (``presence.py``): the lease and registration, the
  heartbeat, readiness, reaping dead replicas, leaving on a clean stop;
* **journal** (``journal.py``): our connections and their fences, every
  fenced write of this replica's changes (it is the registry's
  ``journal``), reconciling after Redis comes back, idempotency keys;
* **stream reading** (``stream_reader.py``): the fleet loaded at join, then
  the fleet stream applied to the registry in stream order, so every
  replica's registry is a mirror of the fleet;
* **inbox** (``inbox.py``): status asks and commands other replicas routed
  here, run through the gateway, and the answers to ours.

What the facade itself does: start and stop, whether a hello may be
accepted, and the two sequences that span rooms: joining (register, let go
of what an earlier run held, load, read) and reconciling (register, check
the fleet's history, reassert, release, read). An operation left open by a
dead replica is ended by the gateway, asked here; nothing in cluster mode
sets an operation's state itself.

**Redis trouble.** While Redis is unreachable the replica is not ready,
refuses new hellos (``retry_later``), answers shared views with 503
``cluster_unavailable``, keeps its own edges connected, and counts and logs
what it could not write. When Redis is back it reconciles.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane.cluster.inbox import Inbox
from twisted_iop.controlplane.cluster.journal import Journal
from twisted_iop.controlplane.cluster.keys import Keys
from twisted_iop.controlplane.cluster.mirror import ClusterMirror
from twisted_iop.controlplane.cluster.presence import Presence
from twisted_iop.controlplane.cluster.remote import Router
from twisted_iop.controlplane.cluster.settings import ClusterConfig
from twisted_iop.controlplane.cluster.store import RedisLink
from twisted_iop.controlplane.cluster.stream_reader import StreamReader
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.eventloop.reactor_types import Reactor

#: Hellos are refused (``retry_later``) while this many writes wait for Redis.
HELLO_WRITE_BACKLOG = 5000
#: Why an operation ended when the replica that sent it died first.
ORPHANED_REASON = "the Control Plane replica {replica} that sent this command stopped before its answer"


class ClusterReplica(Service):
    """This replica's link to the shared fleet (cluster mode only)."""

    name = "cluster"
    _log = Logger()

    def __init__(
        self,
        config: ClusterConfig,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        clock: IReactorTime,
        link: Optional[RedisLink] = None,
    ) -> None:
        self.config = config
        self.replica_id = config.replica_id
        self.keys = Keys(config.key_prefix)
        self._registry = registry
        self._gateway = gateway
        self._clock = clock
        # Only a running reactor comes without ``link``.
        self.link = link or RedisLink(config.redis, cast(Reactor, clock), config.redis_timeout_seconds)
        self.boot = uuid.uuid4().hex[:12]
        #: Every fence of this process starts with this.
        self.fence_prefix = f"{self.replica_id}/{self.boot}/"
        #: Where what the other replicas changed is applied to the registry.
        self.mirror = ClusterMirror(registry)
        self.journal = Journal(config, self.keys, self.link, clock, registry, self.mirror, self.fence_prefix)
        self.presence = Presence(
            config,
            self.keys,
            self.link,
            clock,
            self.boot,
            self.journal.common,
            self._join,
            self._reconcile,
            self._orphaned,
        )
        self.inbox = Inbox(self.keys, self.link, clock, gateway, self.journal)
        self.reader = StreamReader(
            self.keys,
            self.link,
            clock,
            registry,
            self.mirror,
            self.journal,
            self.presence,
            self.inbox.router,
            self.inbox.entry,
            lambda: bool(self.running),
        )
        registry.journal = self.journal

    # -- what the rest of the Control Plane reads ----------------------------------------

    @property
    def loaded(self) -> bool:
        """The start-up load finished (the mirror holds the fleet)."""
        return self.presence.loaded

    @property
    def available(self) -> bool:
        """Loaded and connected to Redis: ready, accepting hellos, serving views."""
        return self.presence.available

    @property
    def accepting(self) -> bool:
        """Whether hellos may be accepted: loaded, Redis reachable, and not
        too many writes waiting for Redis (a hello herd is spread out with
        ``retry_later`` instead of piling claims up behind one another)."""
        return self.available and self.link.up and self.link.pending_writes < HELLO_WRITE_BACKLOG

    @property
    def local(self) -> dict[str, tuple[int, str]]:
        """Our connections, current here: edge id -> (token, fence)."""
        return self.journal.local

    @property
    def router(self) -> Router:
        """This replica's routed requests (for /metrics)."""
        return self.inbox.router

    @property
    def writes_lost(self) -> int:
        """Writes to the store that failed: fenced writes and lease renewals."""
        return self.journal.writes_lost + self.presence.renewals_failed

    @property
    def entries_rejected(self) -> int:
        """Malformed records read from the store and skipped."""
        return self.reader.entries_rejected

    @property
    def reaped_edges(self) -> int:
        """Edges of dead replicas this replica disconnected."""
        return self.presence.reaped_edges

    def reserve_key(self, edge_id: str, key: str, operation_id: str) -> Deferred[str]:
        """Take ``key`` for a new operation; fires with '' (taken) or the id that holds it."""
        return self.journal.reserve_key(edge_id, key, operation_id)

    async def reserve_operation(self, edge_id: str, key: str) -> str:
        """Take the idempotency ``key`` cluster-wide for a new operation of ``edge_id``.

        The one path of every dispatch with a key in cluster mode (a POSTed
        command, a rollout's execution): returns the id to create the
        operation under, or ``""`` when this replica already holds an
        operation with that key or another one took it first (its operation
        is then fetched into the mirror, so the dispatch replays it instead
        of sending the command twice). Fails when Redis cannot be reached.
        """
        record = self._registry.find(edge_id)
        if record is None or record.operations.by_key(key) is not None:
            return ""
        operation_id = uuid.uuid4().hex
        holder = await self.reserve_key(edge_id, key, operation_id)
        if holder:
            await self.operation(edge_id, holder)
            return ""
        return operation_id

    def operation(self, edge_id: str, operation_id: str) -> Deferred[Any]:
        """The operation ``operation_id``, from the mirror or (just written elsewhere) from Redis."""
        d: Deferred[Any] = self.journal.operation(edge_id, operation_id)
        return d

    # -- the service -------------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._log.info(
            "cluster replica {replica} joining through {redis} (keys under {prefix}:)",
            replica=self.replica_id,
            redis=str(self.config.redis),
            prefix=self.keys.prefix,
        )
        self.link.start()
        self.presence.start()

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        self.presence.stop()
        self.presence.set_ready(False)
        self.router.fail_all("the Control Plane is stopping")
        d = self.presence.leave()
        stopped = Deferred[Any]()

        def close(_: object) -> None:
            self.link.stop().addBoth(lambda _: stopped.callback(None))

        if d is None:
            close(None)
        else:
            d.addBoth(close)
        return stopped

    # -- joining and reconciling: sequences across the rooms ------------------------------------

    @inlineCallbacks
    def _join(self) -> Any:
        """Register, let go of what an earlier run of this replica held, load the fleet, start reading."""
        yield self.presence.register()
        yield self.presence.reap(
            self.replica_id, self.fence_prefix, "the Control Plane replica holding this edge restarted"
        )
        count = yield self.reader.load()
        self.presence.set_ready(True)
        self.reader.start()
        self._log.info(
            "cluster replica {replica} joined: {count} edges known ({connected} connected)",
            replica=self.replica_id,
            count=count,
            connected=self._registry.connected_count,
        )

    @inlineCallbacks
    def _reconcile(self) -> Any:
        """Our connections are reasserted, edges we let go meanwhile released."""
        yield self.presence.register()
        yield self.reader.check_history()
        now = self._clock.seconds()
        superseded = yield self.journal.reassert(now)
        released = yield self.journal.release_let_go(now)
        self.presence.set_ready(True)
        self.reader.start()
        self._log.info(
            "cluster store {redis} reachable again: {kept} edges reasserted, {superseded} superseded, "
            "{released} released; {lost} writes were lost while it was away",
            redis=str(self.config.redis),
            kept=len(self.local),
            superseded=superseded,
            released=released,
            lost=self.writes_lost,
        )

    def _orphaned(self, replica: str) -> None:
        """A dead replica's operations that never saw their end: the gateway
        ends them ``failed``, saying why (their answers went to the dead one)."""
        ended = self._gateway.end_orphaned_operations(replica, ORPHANED_REASON.format(replica=replica))
        if ended:
            self._log.warn(
                "cluster: {count} operations sent by replica {replica} ended failed (it stopped before their answers)",
                count=ended,
                replica=replica,
            )
