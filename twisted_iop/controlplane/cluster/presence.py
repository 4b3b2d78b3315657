"""Presence: whether this replica is in the cluster and ready, and who else is.

:class:`Presence` owns:

* **the lease and the registration**: one lease key per replica, set with
  its time to live and refreshed on every heartbeat (so the Redis load
  does not grow with the fleet), and the replica's entry in the registry
  of replicas;
* **the heartbeat**, quick while joining, then every ``heartbeat_seconds``;
  it notices Redis trouble (not ready, ``available`` false) and, while
  the replica is not ready, has it join or reconcile (callbacks of the
  :class:`~twisted_iop.controlplane.cluster.replica.ClusterReplica`);
* **reaping**: a replica whose lease expired is reaped by any other (its
  edges are disconnected, in Redis and hence in every mirror, until they
  enroll again); the one that removes its registration also ends the
  operations it left open (through the gateway) and removes its inbox;
* **leaving** on a clean stop: what is still ours is reaped, then the
  lease, registration and inbox go, so no one waits for the lease to
  expire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster import scripts
from twisted_iop.controlplane.cluster.keys import Keys, pairs
from twisted_iop.controlplane.cluster.settings import ClusterConfig
from twisted_iop.controlplane.cluster.store import ClusterUnavailable, RedisLink

#: Why an edge is disconnected when its replica stopped without releasing it.
LEFT_MESSAGE = "the Control Plane replica holding this edge stopped"
#: The first beats' pace while joining (at most; the configured one if quicker).
JOINING_BEAT_SECONDS = 0.5


class Presence:
    """This replica's lease, heartbeat and readiness; the reaping of others."""

    _log = Logger()

    def __init__(
        self,
        config: ClusterConfig,
        keys: Keys,
        link: RedisLink,
        clock: IReactorTime,
        boot: str,
        common: Callable[[], tuple[object, ...]],
        join: Callable[[], Deferred[Any]],
        reconcile: Callable[[], Deferred[Any]],
        orphaned: Callable[[str], None],
    ) -> None:
        self.config = config
        self.replica_id = config.replica_id
        self.keys = keys
        self.link = link
        self._clock = clock
        self.boot = boot
        #: The first arguments of every script (the journal's).
        self._common = common
        #: Run while not ready: join (not loaded yet) or reconcile (Redis was away).
        self._join = join
        self._reconcile = reconcile
        #: Told the id of a dead replica this one unregistered.
        self._orphaned = orphaned
        #: The start-up load finished (the mirror holds the fleet).
        self.loaded = False
        #: Loaded and connected to Redis: ready, accepting hellos, serving views.
        self.available = False
        self._reconciling = False
        self._renewing = False
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = clock
        #: For /metrics and logs: lease renewals that failed, edges of dead replicas reaped.
        self.renewals_failed = 0
        self.reaped_edges = 0

    def start(self) -> None:
        """Start the heartbeat (quick until joined)."""
        self._heartbeat.start(min(self.config.heartbeat_seconds, JOINING_BEAT_SECONDS), now=False)

    def stop(self) -> None:
        """Stop the heartbeat: the lease is no longer renewed, and expires
        unless :meth:`leave` removes it first (then others reap this replica)."""
        if self._heartbeat.running:
            self._heartbeat.stop()

    def set_ready(self, ready: bool) -> None:
        """Joined or reconciled (ready: the fleet is loaded and Redis reachable), or stopping (not)."""
        if ready:
            self.loaded = True
        self.available = ready

    def not_ready(self, message: str, error: str = "") -> None:
        """The store is away for this replica: not ready until reconciled (logged once)."""
        if self.available:
            self.available = False
            self._log.warn(message, redis=str(self.config.redis), error=error)

    # -- the heartbeat ----------------------------------------------------------------

    def _beat(self) -> None:
        if self._heartbeat.interval != self.config.heartbeat_seconds and self.loaded:
            # The first beats come quickly (joining); then the configured pace.
            self._heartbeat.stop()
            self._heartbeat.start(self.config.heartbeat_seconds, now=False)
        if not self.link.up:
            self.not_ready("cluster store {redis} unreachable: not ready; local edges stay connected")
            return
        if (not self.loaded or not self.available) and not self._reconciling:
            self._reconciling = True
            joining = self._join() if not self.loaded else self._reconcile()
            joining.addErrback(self._join_failed)
            joining.addBoth(self._reconciled)
        if self._renewing:
            return  # the last renewal is still waiting for Redis
        # Renewed on every beat, also while joining or reconciling (loading
        # a large fleet may take longer than the lease).
        self._renewing = True
        d = self._renew()
        d.addErrback(self._lease_failed)
        d.addBoth(self._renewed)

    def _renewed(self, _: object) -> None:
        self._renewing = False

    def _lease_failed(self, failure: Failure) -> None:
        """The heartbeat could not renew the lease: the store is away for us."""
        self.renewals_failed += 1
        self.not_ready(
            "cluster: could not renew this replica's lease ({error}): not ready until it is reconciled",
            failure.getErrorMessage(),
        )

    def _reconciled(self, _: object) -> None:
        self._reconciling = False

    def _join_failed(self, failure: Failure) -> None:
        if failure.check(ClusterUnavailable, ConnectionError, TimeoutError):
            self._log.warn("cluster: could not join yet: {error}", error=failure.getErrorMessage())
        else:
            self._log.failure("cluster: joining failed", failure)

    # -- the lease, and the others' -------------------------------------------------------

    @inlineCallbacks
    def register(self) -> Any:
        """Set this replica's lease and registration (every heartbeat, at join and reconcile)."""
        ttl_ms = int(self.config.lease_ttl_seconds * 1000)
        yield self.link.lease("SET", self.keys.alive(self.replica_id), self.boot, "PX", ttl_ms)
        yield self.link.lease("HSET", self.keys.replicas, self.replica_id, self.boot)

    @inlineCallbacks
    def _renew(self) -> Any:
        """Refresh our lease; reap replicas whose lease expired."""
        yield self.register()
        replicas = pairs((yield self.link.lease("HGETALL", self.keys.replicas)))
        for replica in replicas:
            if replica == self.replica_id:
                continue
            alive = yield self.link.lease("EXISTS", self.keys.alive(replica))
            if str(alive) == "0":
                yield self.reap(replica, "", f"the Control Plane replica {replica} holding this edge stopped answering")
                removed = yield self.link.lease("HDEL", self.keys.replicas, replica)
                if str(removed) == "1":
                    # Only the replica that removed it ends what it left
                    # open, and removes what it kept in Redis.
                    self._orphaned(replica)
                    yield self.link.lease("DEL", self.keys.inbox(replica), self.keys.owned(replica))

    @inlineCallbacks
    def reap(self, replica: str, keep: str, message: str) -> Any:
        """Disconnect (in Redis) the edges ``replica`` holds, but those whose
        fence starts with ``keep``; fires with how many."""
        count = yield self.link.run_lease(scripts.REAP, *self._common(), replica, keep, self._clock.seconds(), message)
        count = int(count or 0)
        if count:
            self.reaped_edges += count
            self._log.warn(
                "cluster: replica {replica} is gone; {count} of its edges are disconnected until they enroll again",
                replica=replica,
                count=count,
            )
        return count

    def leave(self) -> Optional[Deferred[Any]]:
        """A clean stop: our edges were released by the edge wire's own
        closes; whatever is still ours (a release that did not get through)
        is reaped after them on the same ordered connection; then the lease,
        the registration and the inbox go, so no one waits for the lease
        to expire. None when Redis is away (nothing can be removed)."""
        if not self.link.up:
            return None
        d = self.link.run(scripts.REAP, *self._common(), self.replica_id, "", self._clock.seconds(), LEFT_MESSAGE)
        for command in (
            ("DEL", self.keys.alive(self.replica_id)),
            ("HDEL", self.keys.replicas, self.replica_id),
            ("DEL", self.keys.inbox(self.replica_id)),
        ):
            d.addBoth(self._lease_command, command)
        d.addErrback(lambda _: None)
        return d

    def _lease_command(self, _: object, command: tuple[str, ...]) -> Deferred[Any]:
        return self.link.lease(*command)
