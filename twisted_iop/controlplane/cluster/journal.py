"""The journal: this replica's changes, written to Redis in order, each a
script fenced by the connection that caused it.

:class:`Journal` is the registry's
:class:`~twisted_iop.controlplane.fleet.registry.Journal` in cluster mode. It owns:

* **our connections**: each hello accepted here is claimed under a new
  fence ``<replica>/<boot>/<token>`` (:meth:`Journal.claimed`); the claims
  the fleet stream has not brought back yet are *pending* (a later claim
  of ours wins over an earlier one of another replica);
* **the fenced writes**: a release (:meth:`~Journal.released`), a status
  snapshot (at most one per :data:`SNAPSHOT_WRITE_INTERVAL_SECONDS` per
  edge), an event or an operation (:meth:`~Journal.append`); a write that
  does not reach Redis is counted and logged (rate-limited), not retried;
* **reconciling** after Redis comes back: each of our connections is
  reasserted (or closed if another replica took its edge meanwhile), and
  the edges we let go while cut off are released;
* **idempotency keys across replicas** (:meth:`~Journal.reserve_key`) and
  the operation that holds one (:meth:`~Journal.operation`).

Events are not recorded here: they come back through the fleet stream
(``stream_reader.py``), numbered by Redis, in the same order on every replica.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from twisted.internet.defer import Deferred, gatherResults, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster import scripts
from twisted_iop.controlplane.cluster.keys import Keys
from twisted_iop.controlplane.cluster.mirror import ClusterMirror
from twisted_iop.controlplane.cluster.settings import ClusterConfig
from twisted_iop.controlplane.cluster.store import ClusterUnavailable, RedisLink
from twisted_iop.controlplane.fleet.event_record import NO_ATTRIBUTES, EventRecord
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import CONNECTED_MESSAGE, EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.store import forms as codec
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.wire import control_pb2 as pb

#: At most one warning per this many seconds about writes that failed.
LOST_WRITE_LOG_INTERVAL_SECONDS = 10.0
#: An edge's snapshot is written to Redis at most this often (the first
#: one at once). Other replicas ask the owner for fresh ones; the stored one
#: only seeds a replica that starts, so a fleet round does not cost one
#: Redis write per edge.
SNAPSHOT_WRITE_INTERVAL_SECONDS = 10.0
#: How long a replayed idempotency key waits for its operation to appear.
OPERATION_FETCH_ATTEMPTS = 20
OPERATION_FETCH_PAUSE_SECONDS = 0.05


def gather(ds: list[Deferred[Any]]) -> Deferred[list[Any]]:
    """All of ``ds``' results in order (the first failure fails it)."""
    return gatherResults(ds, consumeErrors=True)


class Journal:
    """This replica's connections and its fenced writes to the shared store."""

    _log = Logger()

    def __init__(
        self,
        config: ClusterConfig,
        keys: Keys,
        link: RedisLink,
        clock: IReactorTime,
        registry: EdgeRegistry,
        mirror: ClusterMirror,
        fence_prefix: str,
    ) -> None:
        self.config = config
        self.replica_id = config.replica_id
        self.keys = keys
        self.link = link
        self._clock = clock
        self._registry = registry
        self._mirror = mirror
        #: Every fence of this process starts with this.
        self.fence_prefix = fence_prefix
        #: Our connections, current here: edge id -> (token, fence).
        self.local: dict[str, tuple[int, str]] = {}
        #: Fences we claimed whose claim the fleet stream has not brought back yet.
        self._pending_claims: set[str] = set()
        #: When each of our edges' snapshot was last written.
        self._snapshot_written: dict[str, float] = {}
        #: For /metrics and logs.
        self.writes_lost = 0
        self._lost_logged_at: Optional[float] = None
        self._lost_unlogged = 0

    # -- what every script is given, and how writes fail ----------------------------------

    def common(self) -> tuple[object, ...]:
        """The first four arguments of every script (prefix, replica, bounds)."""
        limits = self._registry.limits
        return (self.keys.prefix, self.replica_id, limits.events_per_edge, self.config.fleet_stream_length)

    @staticmethod
    def event_json(
        edge_id: str, kind: str, now: float, message: str, attributes: Optional[Mapping[str, str]] = None
    ) -> str:
        """An event this replica records itself, as a script takes it."""
        return codec.event_text(
            EventRecord(0, 0, edge_id, kind, now, now, message=message, attributes=attributes or NO_ATTRIBUTES)
        )

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

    # -- our connections, as the other rooms see them ------------------------------------------

    def holds(self, edge_id: str, fence: str) -> bool:
        """Whether ``fence`` is our current connection of ``edge_id``."""
        local = self.local.get(edge_id)
        return local is not None and local[1] == fence

    def claim_seen(self, fence: str) -> None:
        """The fleet stream brought back the claim under ``fence``."""
        self._pending_claims.discard(fence)

    def claim_pending(self, edge_id: str) -> bool:
        """Whether our claim of ``edge_id`` is still to come in the fleet stream
        (then it is later than any claim read now, and wins)."""
        local = self.local.get(edge_id)
        return local is not None and local[1] in self._pending_claims

    def let_go(self, edge_id: str) -> bool:
        """Another replica's claim of ``edge_id`` won: it is no longer ours
        (the edge wire closes our connection). Whether it was ours."""
        return self.local.pop(edge_id, None) is not None

    # -- the registry's journal -----------------------------------------------------------------

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
                *self.common(),
                edge_id,
                fence,
                self.replica_id,
                codec.hello_json(hello),
                now,
                self.event_json(
                    edge_id,
                    "edge.connected",
                    now,
                    CONNECTED_MESSAGE,
                    {"software_version": hello.software_version, "replica": self.replica_id},
                ),
                self.event_json(edge_id, "edge.superseded", now, "a newer connection of this edge took over"),
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
                *self.common(),
                edge_id,
                fence,
                now,
                self.event_json(edge_id, "edge.disconnected", now, reason),
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
                scripts.STATUS, *self.common(), edge_id, fence, codec.b64(snapshot.data), snapshot.received_at
            ),
        )

    def append(
        self, event: EventRecord, token: Optional[int], change: dict[str, Any], operation: Optional[OperationRecord]
    ) -> None:
        """Record an event (and the operation it stands for) in the store."""
        event_text = codec.event_text(event)
        if operation is not None:
            if not operation.replica:
                operation.replica = self.replica_id
            op_text = codec.dumps(codec.operation_dict(operation))
            self._write(
                "an operation",
                self.link.run(
                    scripts.OPERATION,
                    *self.common(),
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
            self.link.run(scripts.EVENT, *self.common(), event.edge_id, fence, event_text, codec.dumps(change)),
        )

    # -- reconciling after Redis comes back ---------------------------------------------------

    @inlineCallbacks
    def reassert(self, now: float) -> Any:
        """Each of our connections is claimed again; one another replica took
        meanwhile is closed here (SUPERSEDED). Fires with how many were."""
        superseded = 0
        held = [
            (edge_id, token, fence, record)
            for edge_id, (token, fence) in list(self.local.items())
            if (record := self._registry.find(edge_id)) is not None and record.token == token
        ]
        answers = yield gather(
            [
                self.link.run(
                    scripts.REASSERT,
                    *self.common(),
                    edge_id,
                    fence,
                    self.replica_id,
                    codec.hello_json(record.hello),
                    now,
                    self.event_json(edge_id, "edge.connected", now, CONNECTED_MESSAGE, {"reconciled": "true"}),
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
        return superseded

    @inlineCallbacks
    def release_let_go(self, now: float) -> Any:
        """The edges Redis says are ours that we no longer hold (closed while
        it was away) are released. Fires with how many were."""
        owned = yield self.link.call("SMEMBERS", self.keys.owned(self.replica_id))
        let_go = [str(edge_id) for edge_id in owned or [] if str(edge_id) not in self.local]
        fences = yield gather([self.link.call("HGET", self.keys.edge(edge_id), "fence") for edge_id in let_go])
        released = 0
        for edge_id, fence in zip(let_go, fences, strict=True):
            if fence and str(fence).startswith(self.fence_prefix):
                done = yield self.link.run(
                    scripts.RELEASE,
                    *self.common(),
                    edge_id,
                    str(fence),
                    now,
                    self.event_json(
                        edge_id, "edge.disconnected", now, "disconnected while the cluster store was unreachable"
                    ),
                )
                released += int(done or 0)
        return released

    # -- idempotency keys and operations across replicas ---------------------------------------

    def reserve_key(self, edge_id: str, key: str, operation_id: str) -> Deferred[str]:
        """Take ``key`` for a new operation; fires with '' (taken) or the id that holds it."""
        ttl_ms = int(self.config.idempotency_ttl_seconds * 1000)
        d = self.link.run(scripts.RESERVE_KEY, *self.common(), edge_id, key, operation_id, ttl_ms)
        return d.addCallback(lambda held: str(held or ""))

    @inlineCallbacks
    def operation(self, edge_id: str, operation_id: str) -> Any:
        """The operation ``operation_id``, from the mirror or (just written elsewhere) from Redis."""
        for _ in range(OPERATION_FETCH_ATTEMPTS):
            kept = self._registry.operations.get(edge_id, operation_id)
            if kept is not None:
                return kept
            text = yield self.link.call("GET", self.keys.operation(operation_id))
            if text is not None:
                self._mirror.apply_operation(codec.operation_from(codec.loads_object(text, "operation")))
                kept = self._registry.operations.get(edge_id, operation_id)
                if kept is not None:
                    return kept
            yield deferLater(self._clock, OPERATION_FETCH_PAUSE_SECONDS)
        raise ClusterUnavailable(f"operation {operation_id} holds the idempotency key but could not be read")
