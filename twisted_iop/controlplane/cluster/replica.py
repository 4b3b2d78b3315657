"""The replica: this process's part of a cluster of Control Planes.

:class:`ClusterReplica` is the registry's :class:`~twisted_iop.controlplane.registry.Journal`
in cluster mode, and it keeps the registry a mirror of the whole fleet:

* **Claims and fencing.** A hello accepted here is claimed in Redis under
  the connection's fence ``<replica>/<boot>/<token>`` (a new epoch); every
  later change the connection causes is a fenced script (scripts.py).
* **The mirror.** One reader follows the fleet stream: every recorded event
  with the change it stands for (a connection taken, closed, an operation
  changed). Applied in stream order on every replica, it makes their
  registries agree: the last claim in the stream is the edge's connection,
  a routed :class:`RemotePeer` unless it is one of ours. A connection of
  ours that a later claim (elsewhere) superseded is closed with SUPERSEDED.
* **Routing.** The same reader reads this replica's inbox: status asks and
  commands for our edges from other replicas, run through the gateway
  (which alone sends requests to edges), and answers to ours.
* **Operations.** Their states are the gateway's to decide: the one of a
  dead replica's operations that never saw their end is asked of it.
* **Presence.** One lease key per replica, refreshed every heartbeat (so
  the Redis load does not grow with the fleet). A replica whose lease
  expired is reaped by any other: its edges are disconnected (in Redis,
  hence in every mirror) until they enroll again.
* **Redis trouble.** While Redis is unreachable the replica is not ready,
  refuses new hellos (``retry_later``), answers shared views with 503
  ``cluster_unavailable``, keeps its own edges connected, and counts and
  logs what it could not write. When Redis is back it reconciles: each of
  its connections is reasserted (or closed if another replica took the
  edge meanwhile) and the edges it let go while cut off are released.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.bounds import CatalogCache
from twisted_iop.controlplane.cluster import codec, scripts
from twisted_iop.controlplane.cluster.remote import (
    DISCONNECTED,
    ERROR,
    INBOX_LENGTH,
    TIMEOUT,
    RemotePeer,
    Router,
    inbox_entry,
)
from twisted_iop.controlplane.cluster.settings import ClusterConfig
from twisted_iop.controlplane.cluster.store import BLOCK_MILLISECONDS, ClusterUnavailable, RedisLink
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.operations import OperationRecord
from twisted_iop.controlplane.records import EventRecord
from twisted_iop.controlplane.registry import (
    CONNECTED_MESSAGE,
    EdgeHello,
    EdgeNotConnected,
    EdgeRegistry,
    StatusSnapshot,
)
from twisted_iop.controlplane.request_errors import EdgeDisconnected, EdgeTimeout
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerDisconnected, RemoteError

#: Entries read from the streams per read.
READ_COUNT = 2000
#: Pause before reading again after a failed read (Redis down).
READ_RETRY_SECONDS = 0.5
#: At most one warning per this many seconds about writes that failed.
LOST_WRITE_LOG_INTERVAL_SECONDS = 10.0
#: An edge's snapshot is written to Redis at most this often (the first
#: one at once). Other replicas ask the owner for fresh ones; the stored one
#: only seeds a replica that starts, so a fleet round does not cost one
#: Redis write per edge.
SNAPSHOT_WRITE_INTERVAL_SECONDS = 10.0
#: Hellos are refused (``retry_later``) while this many writes wait for Redis.
HELLO_WRITE_BACKLOG = 5000
#: Why an edge is disconnected when its replica stopped without releasing it.
LEFT_MESSAGE = "the Control Plane replica holding this edge stopped"
#: Why an operation ended when the replica that sent it died first.
ORPHANED_REASON = "the Control Plane replica {replica} that sent this command stopped before its answer"
#: Why a routed request for an edge not (or no longer) held here fails.
NOT_HELD_MESSAGE = "the edge's connection is no longer held by this replica"
#: How long a replayed idempotency key waits for its operation to appear.
OPERATION_FETCH_ATTEMPTS = 20
OPERATION_FETCH_PAUSE_SECONDS = 0.05


class Keys:
    """The Redis key layout (docs/scale-out.md), under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.edges = f"{prefix}:edges"
        self.fleet = f"{prefix}:fleet"
        self.fleet_seq = f"{prefix}:fleet_seq"
        self.replicas = f"{prefix}:replicas"

    def edge(self, edge_id: str) -> str:
        """The hash of one edge."""
        return f"{self.prefix}:edge:{edge_id}"

    def events(self, edge_id: str) -> str:
        """The event stream of one edge."""
        return f"{self.prefix}:events:{edge_id}"

    def operations(self, edge_id: str) -> str:
        """The operation index (sorted set) of one edge."""
        return f"{self.prefix}:ops:{edge_id}"

    def operation(self, operation_id: str) -> str:
        """One operation (JSON)."""
        return f"{self.prefix}:op:{operation_id}"

    def alive(self, replica: str) -> str:
        """The lease of one replica."""
        return f"{self.prefix}:alive:{replica}"

    def inbox(self, replica: str) -> str:
        """The request stream of one replica."""
        return f"{self.prefix}:inbox:{replica}"

    def owned(self, replica: str) -> str:
        """The edges one replica holds (a set the scripts keep)."""
        return f"{self.prefix}:owned:{replica}"


def _pairs(flat: Any) -> dict[str, str]:
    """A Redis flat ``[k1, v1, k2, v2 ...]`` reply as a dict."""
    if not isinstance(flat, list) or len(flat) % 2:
        raise codec.BadRecord("not a list of field/value pairs")
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _id_number(entry_id: str) -> int:
    return int(str(entry_id).split("-", 1)[0])


def _stream_event(entry_id: str, fields: dict[str, str], fleet: bool) -> EventRecord:
    """The event of one stream entry: in the fleet stream the entry id is its
    fleet sequence and ``s`` its edge sequence; in an edge's stream the other
    way round (``f``)."""
    event = codec.loads_object(fields.get("e"), "event")
    if fleet:
        return codec.event_from(event, int(fields.get("s", 0)), _id_number(entry_id))
    return codec.event_from(event, _id_number(entry_id), int(fields.get("f", 0)))


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
        self.link = link or RedisLink(config.redis, clock, config.redis_timeout_seconds)
        self.boot = uuid.uuid4().hex[:12]
        #: Every fence of this process starts with this.
        self.fence_prefix = f"{self.replica_id}/{self.boot}/"
        #: Our connections, current here: edge id -> (token, fence).
        self.local: dict[str, tuple[int, str]] = {}
        #: Fences we claimed whose claim the fleet stream has not brought back yet.
        self._pending_claims: set[str] = set()
        #: The current fence of each connected edge, as the stream says.
        self._current: dict[str, str] = {}
        #: When each of our edges' snapshot was last written.
        self._snapshot_written: dict[str, float] = {}
        self.router = Router(self.replica_id, clock, self._send_inbox)
        self._catalogs = CatalogCache()
        self._fleet_cursor = "0-0"
        self._inbox_cursor = "0-0"
        #: The start-up load finished (the mirror holds the fleet).
        self.loaded = False
        #: Loaded and connected to Redis: ready, accepting hellos, serving views.
        self.available = False
        self._reconciling = False
        self._renewing = False
        self._reading = False
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = clock
        #: For /metrics and logs.
        self.writes_lost = 0
        self.entries_rejected = 0
        self.reaped_edges = 0
        self._lost_logged_at: Optional[float] = None
        self._lost_unlogged = 0
        registry.journal = self

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
        self._heartbeat.start(min(self.config.heartbeat_seconds, 0.5), now=False)

    def stopService(self) -> Deferred[Any]:
        super().stopService()
        if self._heartbeat.running:
            self._heartbeat.stop()
        self.available = False
        self.router.fail_all("the Control Plane is stopping")
        d = self._leave() if self.link.up else None
        stopped = Deferred[Any]()

        def close(_: Any) -> None:
            self.link.stop().addBoth(lambda _: stopped.callback(None))

        if d is None:
            close(None)
        else:
            d.addBoth(close)
        return stopped

    def _leave(self) -> Deferred[Any]:
        """A clean stop: our edges were released by the edge wire's own
        closes; whatever is still ours (a release that did not get through)
        is reaped after them on the same ordered connection; then the lease,
        the registration and the inbox go, so no one waits for the lease
        to expire."""
        d = self.link.run(scripts.REAP, *self._common(), self.replica_id, "", self._clock.seconds(), LEFT_MESSAGE)
        for command in (
            ("DEL", self.keys.alive(self.replica_id)),
            ("HDEL", self.keys.replicas, self.replica_id),
            ("DEL", self.keys.inbox(self.replica_id)),
        ):
            d.addBoth(self._lease_command, command)
        d.addErrback(lambda _: None)
        return d

    def _lease_command(self, _: Any, command: tuple[str, ...]) -> Deferred[Any]:
        return self.link.lease(*command)

    @property
    def accepting(self) -> bool:
        """Whether hellos may be accepted: loaded, Redis reachable, and not
        too many writes waiting for Redis (a hello herd is spread out with
        ``retry_later`` instead of piling claims up behind one another)."""
        return self.available and self.link.up and self.link.pending_writes < HELLO_WRITE_BACKLOG

    # -- heartbeat: joining, leases, reaping, noticing Redis trouble ----------------------

    def _beat(self) -> None:
        if self._heartbeat.interval != self.config.heartbeat_seconds and self.loaded:
            # The first beats come quickly (joining); then the configured pace.
            self._heartbeat.stop()
            self._heartbeat.start(self.config.heartbeat_seconds, now=False)
        if not self.link.up:
            if self.available:
                self.available = False
                self._log.warn(
                    "cluster store {redis} unreachable: not ready; local edges stay connected",
                    redis=str(self.config.redis),
                )
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

    def _renewed(self, _: Any) -> None:
        self._renewing = False

    def _lease_failed(self, failure: Failure) -> None:
        """The heartbeat could not renew the lease: the store is away for us."""
        self.writes_lost += 1
        if self.available:
            self.available = False
            self._log.warn(
                "cluster: could not renew this replica's lease ({error}): not ready until it is reconciled",
                error=failure.getErrorMessage(),
            )

    def _reconciled(self, _: Any) -> None:
        self._reconciling = False

    def _join_failed(self, failure: Failure) -> None:
        if failure.check(ClusterUnavailable, ConnectionError, TimeoutError):
            self._log.warn("cluster: could not join yet: {error}", error=failure.getErrorMessage())
        else:
            self._log.failure("cluster: joining failed", failure)

    @inlineCallbacks
    def _register(self) -> Any:
        """Set this replica's lease and registration (every heartbeat, at join and reconcile)."""
        ttl_ms = int(self.config.lease_ttl_seconds * 1000)
        yield self.link.lease("SET", self.keys.alive(self.replica_id), self.boot, "PX", ttl_ms)
        yield self.link.lease("HSET", self.keys.replicas, self.replica_id, self.boot)

    @inlineCallbacks
    def _renew(self) -> Any:
        """Refresh our lease; reap replicas whose lease expired."""
        yield self._register()
        replicas = _pairs((yield self.link.lease("HGETALL", self.keys.replicas)))
        for replica in replicas:
            if replica == self.replica_id:
                continue
            alive = yield self.link.lease("EXISTS", self.keys.alive(replica))
            if str(alive) == "0":
                yield self._reap(
                    replica, "", f"the Control Plane replica {replica} holding this edge stopped answering"
                )
                removed = yield self.link.lease("HDEL", self.keys.replicas, replica)
                if str(removed) == "1":
                    # Only the replica that removed it ends what it left
                    # open, and removes what it kept in Redis.
                    self._end_orphaned_operations(replica)
                    yield self.link.lease("DEL", self.keys.inbox(replica), self.keys.owned(replica))

    def _end_orphaned_operations(self, replica: str) -> None:
        """Operations a dead replica dispatched and never saw end: the gateway
        ends them ``failed``, saying why (their answers went to the dead one)."""
        ended = self._gateway.end_orphaned_operations(replica, ORPHANED_REASON.format(replica=replica))
        if ended:
            self._log.warn(
                "cluster: {count} operations sent by replica {replica} ended failed (it stopped before their answers)",
                count=ended,
                replica=replica,
            )

    @inlineCallbacks
    def _reap(self, replica: str, keep: str, message: str) -> Any:
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

    @inlineCallbacks
    def _join(self) -> Any:
        """Register, let go of what an earlier run of this replica held, load the fleet, start reading."""
        yield self._register()
        yield self._reap(self.replica_id, self.fence_prefix, "the Control Plane replica holding this edge restarted")
        self._fleet_cursor = yield self._last_id(self.keys.fleet)
        self._inbox_cursor = yield self._last_id(self.keys.inbox(self.replica_id))
        count = yield self._load()
        self.loaded = True
        self.available = True
        self._start_reading()
        self._log.info(
            "cluster replica {replica} joined: {count} edges known ({connected} connected)",
            replica=self.replica_id,
            count=count,
            connected=self._registry.connected_count,
        )

    @inlineCallbacks
    def _last_id(self, stream: str) -> Any:
        newest = yield self.link.call("XREVRANGE", stream, "+", "-", "COUNT", 1)
        if isinstance(newest, list) and newest:
            return str(newest[0][0])
        return "0-0"

    @inlineCallbacks
    def _load(self) -> Any:
        """Read every edge, its kept events and operations, and the fleet's events."""
        limits = self._registry.limits
        edge_ids = yield self.link.call("SMEMBERS", self.keys.edges)
        edge_ids = sorted(str(e) for e in (edge_ids or []))
        hashes = yield _gather([self.link.call("HGETALL", self.keys.edge(e)) for e in edge_ids])
        for edge_id, flat in zip(edge_ids, hashes, strict=True):
            try:
                self._load_edge(edge_id, _pairs(flat))
            except (codec.BadRecord, ValueError) as e:
                self._rejected(f"edge {edge_id!r}: {e}")
        streams = yield _gather(
            [
                self.link.call("XREVRANGE", self.keys.events(e), "+", "-", "COUNT", limits.events_per_edge)
                for e in edge_ids
            ]
        )
        for entries in streams:
            for entry_id, fields in reversed(entries or []):
                try:
                    event = _stream_event(str(entry_id), _pairs(fields), fleet=False)
                except (codec.BadRecord, ValueError) as e:
                    self._rejected(f"event: {e}")
                    continue
                self._registry.apply_event(event, fleet=False)
        fleet = yield self.link.call(
            "XREVRANGE", self.keys.fleet, self._fleet_cursor, "-", "COUNT", limits.fleet_events
        )
        for entry_id, fields in reversed(fleet or []):
            try:
                event = _stream_event(str(entry_id), _pairs(fields), fleet=True)
            except (codec.BadRecord, ValueError) as e:
                self._rejected(f"fleet event: {e}")
                continue
            self._registry.apply_event(event, notify=False)
        indexes = yield _gather(
            [self.link.call("ZREVRANGE", self.keys.operations(e), 0, limits.operations_per_edge - 1) for e in edge_ids]
        )
        kept = yield _gather(
            [self.link.call("MGET", *[self.keys.operation(str(i)) for i in reversed(ids)]) for ids in indexes if ids]
        )
        for values in kept:
            for text in values or []:
                if text is None:
                    continue
                try:
                    self._registry.apply_operation(codec.operation_from(codec.loads_object(text, "operation")))
                except codec.BadRecord as e:
                    self._rejected(f"operation: {e}")
        return len(edge_ids)

    def _load_edge(self, edge_id: str, fields: dict[str, str]) -> None:
        hello = self._hello(fields.get("hello", "{}"))
        snapshot = None
        if fields.get("snapshot"):
            response = pb.EdgeStatusResponse()
            response.ParseFromString(codec.unb64(fields["snapshot"], "snapshot"))
            snapshot = StatusSnapshot.of(response, float(fields.get("snapshot_at", 0) or 0))
        enrollments = int(fields.get("enrollments", 0) or 0)
        connected_at = float(fields["connected_at"]) if fields.get("connected_at") else None
        fence, owner = fields.get("fence", ""), fields.get("owner", "")
        if fields.get("connected") == "1" and fence and owner and not fence.startswith(self.fence_prefix):
            self._current[edge_id] = fence
            self._registry.adopt_remote(
                edge_id, RemotePeer(self.router, owner, fence, edge_id), hello, connected_at or 0.0, enrollments
            )
            record = self._registry.get(edge_id)
            if snapshot is not None:
                record.snapshot = snapshot
            return
        self._registry.load_edge(
            edge_id,
            hello,
            connected_at,
            float(fields["disconnected_at"]) if fields.get("disconnected_at") else None,
            float(fields.get("last_seen", 0) or 0),
            enrollments,
            snapshot,
        )

    # -- reconciling after Redis comes back --------------------------------------------------

    @inlineCallbacks
    def _reconcile(self) -> Any:
        """Our connections are reasserted, edges we let go meanwhile released."""
        yield self._register()
        stored = yield self.link.call("GET", self.keys.fleet_seq)
        if int(stored or 0) < _id_number(self._fleet_cursor):
            self._log.error(
                "cluster: Redis came back without the fleet's history (fleet sequence {stored} < {seen}); "
                "views of other replicas' edges may be stale until this replica restarts",
                stored=int(stored or 0),
                seen=_id_number(self._fleet_cursor),
            )
            self._fleet_cursor = "0-0"
        now = self._clock.seconds()
        superseded = 0
        held = [
            (edge_id, token, fence, record)
            for edge_id, (token, fence) in list(self.local.items())
            if (record := self._registry.find(edge_id)) is not None and record.token == token
        ]
        answers = yield _gather(
            [
                self.link.run(
                    scripts.REASSERT,
                    *self._common(),
                    edge_id,
                    fence,
                    self.replica_id,
                    codec.hello_json(record.hello),
                    now,
                    self._event_json(edge_id, "edge.connected", now, CONNECTED_MESSAGE, {"reconciled": "true"}),
                )
                for edge_id, _, fence, record in held
            ]
        )
        for (edge_id, token, fence, record), answer in zip(held, answers, strict=True):
            self._pending_claims.discard(fence)
            if self.local.get(edge_id) != (token, fence) or record.token != token:
                continue  # closed or superseded meanwhile
            if str(answer) == "0":
                superseded += 1
                self.local.pop(edge_id, None)
                peer = record.peer
                self._registry.disconnect(edge_id, token, "superseded while the cluster store was unreachable")
                if peer is not None:
                    peer.disconnect(pb.ERROR_CODE_SUPERSEDED, "a newer connection of this edge took over")
        owned = yield self.link.call("SMEMBERS", self.keys.owned(self.replica_id))
        let_go = [str(edge_id) for edge_id in owned or [] if str(edge_id) not in self.local]
        fences = yield _gather([self.link.call("HGET", self.keys.edge(edge_id), "fence") for edge_id in let_go])
        released = 0
        for edge_id, fence in zip(let_go, fences, strict=True):
            if fence and str(fence).startswith(self.fence_prefix):
                done = yield self.link.run(
                    scripts.RELEASE,
                    *self._common(),
                    edge_id,
                    str(fence),
                    now,
                    self._event_json(
                        edge_id, "edge.disconnected", now, "disconnected while the cluster store was unreachable"
                    ),
                )
                released += int(done or 0)
        self.available = True
        self._start_reading()
        self._log.info(
            "cluster store {redis} reachable again: {kept} edges reasserted, {superseded} superseded, "
            "{released} released; {lost} writes were lost while it was away",
            redis=str(self.config.redis),
            kept=len(self.local),
            superseded=superseded,
            released=released,
            lost=self.writes_lost,
        )

    # -- the journal: this replica's changes, written in order --------------------------------

    def _common(self) -> tuple[Any, ...]:
        limits = self._registry.limits
        return (self.keys.prefix, self.replica_id, limits.events_per_edge, self.config.fleet_stream_length)

    def _event_json(
        self, edge_id: str, kind: str, now: float, message: str, attributes: Optional[dict[str, str]] = None
    ) -> str:
        return codec.event_json(edge_id, kind, now, now, message=message, attributes=attributes)

    def _write(self, what: str, d: Deferred[Any]) -> None:
        d.addErrback(self._lost, what)

    def _lost(self, failure: Failure, what: str) -> None:
        """A write that did not reach Redis: counted, logged (rate-limited), reconciled later.

        A connection that dropped makes the link down (the heartbeat then
        says not ready and reconciles when it is back); an error reply
        (a script refusing what it was given) is counted and logged only.
        """
        self.writes_lost += 1
        now = self._clock.seconds()
        if self._lost_logged_at is not None and now - self._lost_logged_at < LOST_WRITE_LOG_INTERVAL_SECONDS:
            self._lost_unlogged += 1
            return
        self._log.warn(
            "cluster: could not write {what} to the cluster store ({error}); {lost} writes lost so far "
            "({unlogged} not logged); connections are reconciled when it is back, events are not",
            what=what,
            error=failure.getErrorMessage(),
            lost=self.writes_lost,
            unlogged=self._lost_unlogged,
        )
        self._lost_logged_at = now
        self._lost_unlogged = 0

    def _fence(self, edge_id: str, token: Optional[int]) -> Optional[str]:
        local = self.local.get(edge_id)
        if token is None or local is None or local[0] != token:
            return None
        return local[1]

    def claimed(self, edge_id: str, token: int, hello: EdgeHello, now: float) -> None:
        """A hello accepted here: claim the edge under a new epoch."""
        fence = f"{self.fence_prefix}{token}"
        self.local[edge_id] = (token, fence)
        self._snapshot_written.pop(edge_id, None)
        self._pending_claims.add(fence)
        self._write(
            "a connection",
            self.link.run(
                scripts.CLAIM,
                *self._common(),
                edge_id,
                fence,
                self.replica_id,
                codec.hello_json(hello),
                now,
                self._event_json(
                    edge_id,
                    "edge.connected",
                    now,
                    CONNECTED_MESSAGE,
                    {"software_version": hello.software_version, "replica": self.replica_id},
                ),
                self._event_json(edge_id, "edge.superseded", now, "a newer connection of this edge took over"),
            ),
        )

    def released(self, edge_id: str, token: int, reason: str, now: float) -> None:
        """A connection of ours closed."""
        fence = self._fence(edge_id, token)
        if fence is None:
            return
        del self.local[edge_id]
        self._pending_claims.discard(fence)
        self._snapshot_written.pop(edge_id, None)
        self._write(
            "a disconnect",
            self.link.run(
                scripts.RELEASE,
                *self._common(),
                edge_id,
                fence,
                now,
                self._event_json(edge_id, "edge.disconnected", now, reason),
            ),
        )

    def status_kept(self, edge_id: str, token: int, snapshot: StatusSnapshot) -> None:
        """A status answer on one of our connections (a routed one is the owner's to write)."""
        fence = self._fence(edge_id, token)
        if fence is None:
            return
        written = self._snapshot_written.get(edge_id)
        if written is not None and snapshot.received_at - written < SNAPSHOT_WRITE_INTERVAL_SECONDS:
            return
        self._snapshot_written[edge_id] = snapshot.received_at
        self._write(
            "a status snapshot",
            self.link.run(
                scripts.STATUS, *self._common(), edge_id, fence, codec.b64(snapshot.data), snapshot.received_at
            ),
        )

    def append(
        self, event: EventRecord, token: Optional[int], change: dict[str, Any], operation: Optional[OperationRecord]
    ) -> None:
        """Record an event (and the operation it stands for) in the store."""
        event_text = codec.event_json(
            event.edge_id,
            event.kind,
            event.occurred_at,
            event.recorded_at,
            event.node_id,
            event.provider_id,
            event.command_id,
            event.message,
            event.attributes,
        )
        if operation is not None:
            if not operation.replica:
                operation.replica = self.replica_id
            op_text = codec.dumps(codec.operation_dict(operation))
            self._write(
                "an operation",
                self.link.run(
                    scripts.OPERATION,
                    *self._common(),
                    event.edge_id,
                    operation.operation_id,
                    op_text,
                    operation.created_at,
                    event_text,
                    self._registry.limits.operations_per_edge,
                ),
            )
            return
        fence = ""
        if token is not None:
            fence = self._fence(event.edge_id, token) or ""
            if not fence:
                return  # a routed connection's events are its owner's to record
            change = dict(change, fence=fence)
        self._write(
            "an event",
            self.link.run(scripts.EVENT, *self._common(), event.edge_id, fence, event_text, codec.dumps(change)),
        )

    # -- idempotency keys and operations across replicas ---------------------------------------

    def reserve_key(self, edge_id: str, key: str, operation_id: str) -> Deferred[str]:
        """Take ``key`` for a new operation; fires with '' (taken) or the id that holds it."""
        ttl_ms = int(self.config.idempotency_ttl_seconds * 1000)
        d = self.link.run(scripts.RESERVE_KEY, *self._common(), edge_id, key, operation_id, ttl_ms)
        return d.addCallback(lambda held: str(held or ""))

    @inlineCallbacks
    def operation(self, edge_id: str, operation_id: str) -> Any:
        """The operation ``operation_id``, from the mirror or (just written elsewhere) from Redis."""
        for _ in range(OPERATION_FETCH_ATTEMPTS):
            kept = self._registry.operation(edge_id, operation_id)
            if kept is not None:
                return kept
            text = yield self.link.call("GET", self.keys.operation(operation_id))
            if text is not None:
                self._registry.apply_operation(codec.operation_from(codec.loads_object(text, "operation")))
                kept = self._registry.operation(edge_id, operation_id)
                if kept is not None:
                    return kept
            yield deferLater(self._clock, OPERATION_FETCH_PAUSE_SECONDS)
        raise ClusterUnavailable(f"operation {operation_id} holds the idempotency key but could not be read")

    # -- reading: the fleet stream and our inbox -----------------------------------------------

    def _start_reading(self) -> None:
        if not self._reading and self.running:
            self._reading = True
            self._read()

    def _read(self) -> None:
        if not self.running:
            self._reading = False
            return
        d = self.link.read(
            "XREAD",
            "COUNT",
            READ_COUNT,
            "BLOCK",
            BLOCK_MILLISECONDS,
            "STREAMS",
            self.keys.fleet,
            self.keys.inbox(self.replica_id),
            self._fleet_cursor,
            self._inbox_cursor,
        )
        d.addCallbacks(self._entries_read, self._read_failed)

    def _read_failed(self, failure: Failure) -> None:
        if self.available:
            self.available = False
            self._log.warn("cluster: reading the fleet stream failed: {error}", error=failure.getErrorMessage())
        self._reading = False
        if self.running:
            self._clock.callLater(READ_RETRY_SECONDS, self._resume_reading)

    def _resume_reading(self) -> None:
        if self.loaded:
            self._start_reading()

    def _entries_read(self, reply: Any) -> None:
        for stream, entries in reply or []:
            stream = str(stream)
            for entry_id, fields in entries or []:
                entry_id = str(entry_id)
                try:
                    if stream == self.keys.fleet:
                        self._fleet_cursor = entry_id
                        self._apply_fleet_entry(entry_id, _pairs(fields))
                    else:
                        self._inbox_cursor = entry_id
                        self._inbox_entry(_pairs(fields))
                except (codec.BadRecord, ValueError, KeyError) as e:
                    self._rejected(f"stream entry {entry_id}: {e}")
                except Exception:
                    self._log.failure("cluster: applying stream entry {entry_id} failed", entry_id=entry_id)
        self._clock.callLater(0, self._read)

    def _rejected(self, what: str) -> None:
        self.entries_rejected += 1
        self._log.warn("cluster: skipped a malformed record in the store: {what}", what=what[:300])

    def _apply_fleet_entry(self, entry_id: str, fields: dict[str, str]) -> None:
        event = _stream_event(entry_id, fields, fleet=True)
        change = codec.loads_object(fields.get("c", "{}"), "change")
        origin = fields.get("o", "")
        kind = change.get("kind")
        relayed_by: Optional[int] = None
        command_event: Optional[pb.EdgeEvent] = None
        if kind == "connect":
            self._apply_connect(event.edge_id, change)
        elif kind == "disconnect":
            self._apply_disconnect(event.edge_id, change)
        elif kind == "operation" and origin != self.replica_id:
            op = change.get("op")
            if not isinstance(op, dict):
                raise codec.BadRecord("operation change without an operation")
            self._registry.apply_operation(codec.operation_from(op))
        elif kind == "relayed" and origin != self.replica_id:
            record = self._registry.find(event.edge_id)
            fence = change.get("fence")
            if record is not None and fence == self._current.get(event.edge_id) and record.token is not None:
                sequence = change.get("edge_sequence")
                if isinstance(sequence, int) and sequence > 0:
                    record.last_edge_sequence = sequence
                if event.command_id:
                    relayed_by = record.token
                    command_event = pb.EdgeEvent(kind=event.kind, command_id=event.command_id)
        self._registry.apply_event(event, relayed_by=relayed_by, command_event=command_event)

    def _apply_connect(self, edge_id: str, change: dict[str, Any]) -> None:
        fence, owner, hello_text = change.get("fence"), change.get("owner"), change.get("hello")
        if not isinstance(fence, str) or not isinstance(owner, str) or not isinstance(hello_text, str):
            raise codec.BadRecord("connect change without fence, owner or hello")
        self._current[edge_id] = fence
        self._pending_claims.discard(fence)
        if fence.startswith(self.fence_prefix):
            # One of ours: current here already, or closed (its release follows).
            record = self._registry.find(edge_id)
            local = self.local.get(edge_id)
            enrollments = change.get("enrollments")
            if record is not None and local is not None and local[1] == fence and isinstance(enrollments, int):
                record.enrollments = enrollments
            return
        local = self.local.get(edge_id)
        if local is not None and local[1] in self._pending_claims:
            return  # our own claim of this edge comes later in the stream: it wins
        at = change.get("at")
        enrollments = change.get("enrollments")
        hello = self._hello(hello_text)
        self.local.pop(edge_id, None)
        self._registry.adopt_remote(
            edge_id,
            RemotePeer(self.router, owner, fence, edge_id),
            hello,
            float(at) if isinstance(at, (int, float)) else self._clock.seconds(),
            enrollments if isinstance(enrollments, int) else 0,
        )
        if local is not None:
            self._log.info(
                "edge {edge_id} enrolled on replica {owner}; its connection here was closed",
                edge_id=edge_id,
                owner=owner,
            )

    def _hello(self, text: str) -> EdgeHello:
        """A hello read from the store, its catalog shared with every equal one
        (as the edge wire shares the catalogs of the hellos it accepts)."""
        hello = codec.hello_from(codec.loads_object(text, "hello"))
        return attrs.evolve(hello, commands=self._catalogs.detached(hello.commands))

    def _apply_disconnect(self, edge_id: str, change: dict[str, Any]) -> None:
        fence = change.get("fence")
        if not isinstance(fence, str) or self._current.get(edge_id) != fence:
            return
        del self._current[edge_id]
        if fence.startswith(self.fence_prefix):
            # Ours: closed here already, or reaped while we were cut off
            # from Redis (the next reconcile reasserts it).
            return
        record = self._registry.find(edge_id)
        at = change.get("at")
        if (
            record is not None
            and record.token is not None
            and isinstance(record.peer, RemotePeer)
            and record.peer.fence == fence
        ):
            self._registry.apply_remote_disconnect(
                edge_id, record.token, float(at) if isinstance(at, (int, float)) else self._clock.seconds()
            )

    # -- the inbox: routed requests for our edges, answers to ours ----------------------------------

    def _send_inbox(self, replica: str, messages: list[dict[str, Any]]) -> Deferred[Any]:
        return self.link.call(
            "XADD", self.keys.inbox(replica), "MAXLEN", "~", INBOX_LENGTH, "*", "m", inbox_entry(messages)
        )

    def _inbox_entry(self, fields: dict[str, str]) -> None:
        messages = codec.loads_list(fields.get("m", "[]"), "inbox entry")
        asks: list[dict[str, Any]] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            kind = message.get("t")
            if kind == "reply":
                self.router.answered_message(message)
            elif kind == "status":
                asks.append(message)
            elif kind == "command":
                self._routed_command(message)
        if asks:
            self._routed_statuses(asks)

    def _local_edge(self, message: dict[str, Any]) -> Optional[str]:
        edge_id, fence = message.get("edge"), message.get("fence")
        if not isinstance(edge_id, str) or not isinstance(fence, str):
            return None
        local = self.local.get(edge_id)
        if local is None or local[1] != fence:
            return None
        return edge_id

    def _routed_statuses(self, messages: list[dict[str, Any]]) -> None:
        """Status asks routed here (a whole inbox entry's, under one deadline)."""
        asked: list[dict[str, Any]] = []
        for message in messages:
            if self._local_edge(message) is None:
                self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            else:
                asked.append(message)

        def answered(index: int, snapshot: Optional[StatusSnapshot], error: Optional[Exception]) -> None:
            message = asked[index]
            if error is None:
                assert snapshot is not None
                self.router.answer(message, None, snapshot=snapshot)
            elif isinstance(error, EdgeTimeout):
                self.router.answer(message, None, TIMEOUT, str(error))
            elif isinstance(error, (EdgeDisconnected, EdgeNotConnected)):
                self.router.answer(message, None, DISCONNECTED, str(error))
            else:
                self.router.answer(message, None, ERROR, str(error))

        if asked:
            self._gateway.status_group([str(m["edge"]) for m in asked], answered)

    def _routed_command(self, message: dict[str, Any]) -> None:
        """A command routed here: the gateway runs it on our connection; the
        edge's answer, or why there is none, goes back to its dispatcher."""
        edge_id = self._local_edge(message)
        if edge_id is None:
            self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            return
        request = pb.EdgeCommandRequest()
        try:
            request.ParseFromString(codec.unb64(str(message.get("request", "")), "command"))
        except Exception:
            self.router.answer(message, None, ERROR, "the routed command did not parse")
            return

        def answered(response: pb.EdgeCommandResponse) -> None:
            self.router.answer(message, response.SerializeToString())

        def failed(failure: Failure) -> None:
            if failure.check(RemoteError):
                self.router.answer(message, None, ERROR, failure.getErrorMessage())
            elif failure.check(EdgeNotConnected):
                self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            else:
                reason = "edge disconnected before answering" if failure.check(PeerDisconnected) else "no answer"
                self.router.answer(message, None, DISCONNECTED, reason)

        self._gateway.run_routed_command(edge_id, request).addCallbacks(answered, failed)


def _gather(ds: list[Deferred[Any]]) -> Deferred[list[Any]]:
    return gatherResults(ds, consumeErrors=True)
