"""Stream reading: the shared fleet applied to this replica's registry.

:class:`StreamReader` makes the registry a mirror of the whole fleet:

* **at join**, it reads every edge from Redis, with its kept events and
  operations and the fleet's events (:meth:`StreamReader.load`);
* **then** one reader follows the fleet stream: every recorded event with
  the change it stands for (a connection taken, closed, an operation
  changed, an event relayed), applied in stream order, so every replica's
  registry agrees. The last claim in the stream is the edge's connection,
  a routed :class:`~twisted_iop.controlplane.cluster.remote.RemotePeer`
  unless it is one of ours; a connection of ours that a later claim
  (elsewhere) superseded is closed with SUPERSEDED by the registry.
* The same blocking read brings this replica's **inbox**; its entries go
  to the inbox room (``inbox.py``).

A record that does not have the written shape is skipped and counted
(``entries_rejected``); a failed read makes the replica not ready and is
retried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Optional

import attrs
from twisted.internet.defer import inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster.journal import Journal, gather
from twisted_iop.controlplane.cluster.keys import Keys, id_number, pairs
from twisted_iop.controlplane.cluster.mirror import ClusterMirror
from twisted_iop.controlplane.cluster.presence import Presence
from twisted_iop.controlplane.cluster.remote import RemotePeer, Router
from twisted_iop.controlplane.cluster.store import BLOCK_MILLISECONDS, RedisLink
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.memory import CatalogCache
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import SnapshotRefused, checked_snapshot
from twisted_iop.controlplane.store import forms as codec
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.wire import control_pb2 as pb

#: Entries read from the streams per read.
READ_COUNT = 2000
#: Pause before reading again after a failed read (Redis down).
READ_RETRY_SECONDS = 0.5


def _stream_event(entry_id: str, fields: dict[str, str], fleet: bool) -> EventRecord:
    """The event of one stream entry: in the fleet stream the entry id is its
    fleet sequence and ``s`` its edge sequence; in an edge's stream the other
    way round (``f``)."""
    event = codec.loads_object(fields.get("e"), "event")
    if fleet:
        return codec.event_from(event, int(fields.get("s", 0)), id_number(entry_id))
    return codec.event_from(event, id_number(entry_id), int(fields.get("f", 0)))


class StreamReader:
    """The store read into the registry: at join, then the fleet stream."""

    _log = Logger()

    def __init__(
        self,
        keys: Keys,
        link: RedisLink,
        clock: IReactorTime,
        registry: EdgeRegistry,
        mirror: ClusterMirror,
        journal: Journal,
        presence: Presence,
        router: Router,
        inbox_entry: Callable[[dict[str, str]], None],
        running: Callable[[], bool],
    ) -> None:
        self.keys = keys
        self.link = link
        self._clock = clock
        self._registry = registry
        self._mirror = mirror
        self._journal = journal
        self._presence = presence
        self._router = router
        self.replica_id = journal.replica_id
        self.fence_prefix = journal.fence_prefix
        #: Where an inbox entry goes (the inbox room).
        self._inbox_entry = inbox_entry
        #: Whether the replica's service runs (reading stops when it does not).
        self._running = running
        #: The current fence of each connected edge, as the stream says.
        self._current: dict[str, str] = {}
        self._catalogs = CatalogCache()
        self._fleet_cursor = "0-0"
        self._inbox_cursor = "0-0"
        self._reading = False
        #: For /metrics and logs.
        self.entries_rejected = 0

    # -- joining: the whole fleet, once ------------------------------------------------

    @inlineCallbacks
    def load(self) -> Any:
        """Read from the streams' current ends on; load every edge, its kept
        events and operations, and the fleet's events. Fires with how many
        edges."""
        self._fleet_cursor = yield self._last_id(self.keys.fleet)
        self._inbox_cursor = yield self._last_id(self.keys.inbox(self.replica_id))
        count = yield self._load()
        return count

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
        hashes = yield gather([self.link.call("HGETALL", self.keys.edge(e)) for e in edge_ids])
        for edge_id, flat in zip(edge_ids, hashes, strict=True):
            try:
                self._load_edge(edge_id, pairs(flat))
            except (codec.BadRecord, ValueError) as e:
                self._rejected(f"edge {edge_id!r}: {e}")
        streams = yield gather(
            [
                self.link.call("XREVRANGE", self.keys.events(e), "+", "-", "COUNT", limits.events_per_edge)
                for e in edge_ids
            ]
        )
        for entries in streams:
            for event in self._stored_events(entries, False):
                self._mirror.apply_event(event, fleet=False)
        fleet = yield self.link.call(
            "XREVRANGE", self.keys.fleet, self._fleet_cursor, "-", "COUNT", limits.fleet_events
        )
        for event in self._stored_events(fleet, True):
            self._mirror.apply_event(event, notify=False)
        indexes = yield gather(
            [self.link.call("ZREVRANGE", self.keys.operations(e), 0, limits.operations_per_edge - 1) for e in edge_ids]
        )
        kept = yield gather(
            [self.link.call("MGET", *[self.keys.operation(str(i)) for i in reversed(ids)]) for ids in indexes if ids]
        )
        for values in kept:
            for text in values or []:
                if text is None:
                    continue
                try:
                    self._mirror.apply_operation(codec.operation_from(codec.loads_object(text, "operation")))
                except codec.BadRecord as e:
                    self._rejected(f"operation: {e}")
        return len(edge_ids)

    def _stored_events(self, entries: Any, fleet: bool) -> Iterator[EventRecord]:
        """The events of a stream read newest first (XREVRANGE), oldest first;
        a malformed one is skipped and counted."""
        for entry_id, fields in reversed(entries or []):
            try:
                yield _stream_event(str(entry_id), pairs(fields), fleet=fleet)
            except (codec.BadRecord, ValueError) as e:
                self._rejected(f"{'fleet event' if fleet else 'event'}: {e}")

    def _load_edge(self, edge_id: str, fields: dict[str, str]) -> None:
        hello = self._hello(fields.get("hello", "{}"))
        snapshot = None
        if fields.get("snapshot"):
            response = pb.EdgeStatusResponse()
            response.ParseFromString(codec.unb64(fields["snapshot"], "snapshot"))
            try:
                snapshot = checked_snapshot(
                    response, float(fields.get("snapshot_at", 0) or 0), share_counts=self._registry.shared.counts
                )
            except SnapshotRefused as e:
                self._rejected(f"snapshot of {edge_id}: {e.problem}")
        enrollments = int(fields.get("enrollments", 0) or 0)
        connected_at = float(fields["connected_at"]) if fields.get("connected_at") else None
        fence, owner = fields.get("fence", ""), fields.get("owner", "")
        if fields.get("connected") == "1" and fence and owner and not fence.startswith(self.fence_prefix):
            self._current[edge_id] = fence
            self._mirror.adopt_remote(
                edge_id, RemotePeer(self._router, owner, fence, edge_id), hello, connected_at or 0.0, enrollments
            )
            record = self._registry.get(edge_id)
            if snapshot is not None:
                record.snapshot = snapshot
            return
        self._mirror.load_edge(
            edge_id,
            hello,
            connected_at,
            float(fields["disconnected_at"]) if fields.get("disconnected_at") else None,
            float(fields.get("last_seen", 0) or 0),
            enrollments,
            snapshot,
        )

    @inlineCallbacks
    def check_history(self) -> Any:
        """After Redis came back: if it lost the fleet's history (its fleet
        sequence is behind what was read), read the stream from its start."""
        stored = yield self.link.call("GET", self.keys.fleet_seq)
        if int(stored or 0) < id_number(self._fleet_cursor):
            self._log.error(
                "cluster: Redis came back without the fleet's history (fleet sequence {stored} < {seen}); "
                "views of other replicas' edges may be stale until this replica restarts",
                stored=int(stored or 0),
                seen=id_number(self._fleet_cursor),
            )
            self._fleet_cursor = "0-0"

    # -- reading: the fleet stream and our inbox -----------------------------------------------

    def start(self) -> None:
        """Start reading (if not reading already and the replica runs)."""
        if not self._reading and self._running():
            self._reading = True
            self._read()

    def _read(self) -> None:
        if not self._running():
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
        self._presence.not_ready("cluster: reading the fleet stream failed: {error}", failure.getErrorMessage())
        self._reading = False
        if self._running():
            self._clock.callLater(READ_RETRY_SECONDS, self._resume_reading)

    def _resume_reading(self) -> None:
        if self._presence.loaded:
            self.start()

    def _entries_read(self, reply: Any) -> None:
        for stream, entries in reply or []:
            stream = str(stream)
            for entry_id, fields in entries or []:
                entry_id = str(entry_id)
                try:
                    if stream == self.keys.fleet:
                        self._fleet_cursor = entry_id
                        self._apply_fleet_entry(entry_id, pairs(fields))
                    else:
                        self._inbox_cursor = entry_id
                        self._inbox_entry(pairs(fields))
                except (codec.BadRecord, ValueError, KeyError) as e:
                    self._rejected(f"stream entry {entry_id}: {e}")
                except Exception:
                    self._log.failure("cluster: applying stream entry {entry_id} failed", entry_id=entry_id)
        self._clock.callLater(0, self._read)

    def _rejected(self, what: str) -> None:
        self.entries_rejected += 1
        self._log.warn("cluster: skipped a malformed record in the store: {what}", what=what[:300])

    # -- applying the fleet stream -------------------------------------------------------------

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
            self._mirror.apply_operation(codec.operation_from(op))
        elif kind == "relayed" and origin != self.replica_id:
            record = self._registry.find(event.edge_id)
            fence = change.get("fence")
            if record is not None and fence == self._current.get(event.edge_id) and record.token is not None:
                sequence = change.get("edge_sequence")
                if isinstance(sequence, int) and sequence > 0:
                    record.events.last_edge_sequence = sequence
                if event.command_id:
                    relayed_by = record.token
                    command_event = pb.EdgeEvent(kind=event.kind, command_id=event.command_id)
        self._mirror.apply_event(event, relayed_by=relayed_by, command_event=command_event)

    def _apply_connect(self, edge_id: str, change: dict[str, Any]) -> None:
        fence, owner, hello_text = change.get("fence"), change.get("owner"), change.get("hello")
        if not isinstance(fence, str) or not isinstance(owner, str) or not isinstance(hello_text, str):
            raise codec.BadRecord("connect change without fence, owner or hello")
        self._current[edge_id] = fence
        self._journal.claim_seen(fence)
        if fence.startswith(self.fence_prefix):
            # One of ours: current here already, or closed (its release follows).
            record = self._registry.find(edge_id)
            enrollments = change.get("enrollments")
            if record is not None and self._journal.holds(edge_id, fence) and isinstance(enrollments, int):
                record.enrollments = enrollments
            return
        if self._journal.claim_pending(edge_id):
            return  # our own claim of this edge comes later in the stream: it wins
        at = change.get("at")
        enrollments = change.get("enrollments")
        hello = self._hello(hello_text)
        was_ours = self._journal.let_go(edge_id)
        self._mirror.adopt_remote(
            edge_id,
            RemotePeer(self._router, owner, fence, edge_id),
            hello,
            float(at) if isinstance(at, (int, float)) else self._clock.seconds(),
            enrollments if isinstance(enrollments, int) else 0,
        )
        if was_ours:
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
            self._mirror.apply_remote_disconnect(
                edge_id, record.token, float(at) if isinstance(at, (int, float)) else self._clock.seconds()
            )
