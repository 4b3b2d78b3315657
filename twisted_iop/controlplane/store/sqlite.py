"""The ``sqlite`` store (the default): one file, durable, nothing to run beside it.

On the reactor, every change is queued in memory, coalesced by key (an
operation, an edge, a rollout, an SLO or a history chunk queued twice is written
once, in its newest state); every ``flush_interval_seconds`` the queue
becomes one :class:`~.sqlite_writer.Batch` for the writer thread, which
commits it in one transaction. So the reactor never waits for the disk,
and what the HTTP API answered as recorded is on disk within about one
interval (0.5 s by default) plus the commit's time.

The queue is bounded in bytes (``max_pending_bytes``): while the disk
cannot keep up beyond it, new events and history chunks are dropped,
counted and logged (operations, edges and rollouts are kept: they are
few and coalesced). A batch that fails (disk full, file removed) is
written again at the next flush; the store reports itself not writable
(``/readyz``, ``iopctl health``) until a commit succeeds.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Optional, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.requests.operation_states import IN_FLIGHT_STATES, TERMINAL_STATES
from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store import sqlite_schema
from twisted_iop.controlplane.store.interface import HistoryChunk, KeptEdge, KeptState, StoreError, StoreHealth
from twisted_iop.controlplane.store.settings import StoreSettings
from twisted_iop.controlplane.store.sqlite_writer import Batch, Committed, EdgeRow, SqliteWriter
from twisted_iop.eventloop.reactor_types import Reactor

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
    from twisted_iop.controlplane.rollouts.states import Rollout

#: What a queued operation, edge or rollout is counted as (they are
#: serialized only at the flush).
QUEUED_RECORD_BYTES = 1024
#: At most one log line about dropped changes per this many seconds.
DROP_LOG_SECONDS = 10.0
#: The operation states a stored operation may be in.
OPERATION_STATES = frozenset(IN_FLIGHT_STATES) | TERMINAL_STATES


class SqliteStore(Service):
    """The SQLite store (``store.backend: sqlite``)."""

    backend = "sqlite"
    name = "store"
    _log = Logger()

    def __init__(self, settings: StoreSettings, reactor: Reactor) -> None:
        self.settings = settings
        self.path = settings.path
        # The running reactor also takes calls from threads; Twisted types
        # the global one without IReactorFromThreads.
        self._from_threads = cast(IReactorFromThreads, reactor)
        self._clock: IReactorTime = reactor
        self._writer: Optional[SqliteWriter] = None
        self._events: list[EventRecord] = []
        self._event_sizes: list[int] = []
        self._operations: dict[str, OperationRecord] = {}
        self._edges: dict[str, EdgeRecord] = {}
        self._rollouts: dict[str, Rollout] = {}
        self._history: dict[tuple[str, int, float], HistoryChunk] = {}
        self._expire: list[tuple[int, float]] = []
        #: SLOs to write (None: to delete), by name.
        self._slos: dict[str, Optional[bytes]] = {}
        #: Deployments to write (None: to delete), by name.
        self._deployments: dict[str, Optional[bytes]] = {}
        self._pending_bytes = 0
        #: A batch that failed, written again first.
        self._retry: Optional[Batch] = None
        self._writing = False
        #: Changes in the batch the writer has now (not yet on disk).
        self._in_flight = 0
        self._loop: Optional[LoopingCall] = None
        self._closing: Optional[Deferred[None]] = None
        self._closed = False
        self.dropped = 0
        self._dropped_logged_at = 0.0
        self._error = ""
        self._last_commit: Optional[float] = None
        #: For /metrics: commits, rows written and trimmed, seconds spent committing.
        self.commits = 0
        self.rows_written = 0
        self.rows_trimmed = 0
        self.commit_seconds = 0.0
        #: Rows of the file skipped at open because they did not parse.
        self.skipped_at_open = 0

    # -- open and close ---------------------------------------------------------------------

    def open(self) -> KeptState:
        """Open the file (made when missing, migrated when older) and read
        back what was kept; raises :class:`StoreError` (one line)."""
        connection = sqlite_schema.connect(self.path, self.settings.synchronous)
        try:
            kept = self._read_kept(connection)
            self._writer = SqliteWriter(
                connection,
                self.settings.retention,
                self.settings.history_max_bytes,
                self._from_threads.callFromThread,
                time.monotonic,
            )
        except sqlite3.DatabaseError as e:
            connection.close()
            raise StoreError(f"store.path {self.path}: cannot be read ({e})") from None
        self._writer.start()
        self._log.info(
            "store {path}: {edges} edges, {events} events, {operations} operations, {rollouts} rollouts kept",
            path=self.path,
            edges=len(kept.edges),
            events=len(kept.events),
            operations=len(kept.operations),
            rollouts=len(kept.rollouts),
        )
        return kept

    def startService(self) -> None:
        super().startService()
        if self._writer is None:
            self.open()
        loop = self._loop = LoopingCall(self.flush)
        loop.clock = self._clock
        loop.start(self.settings.flush_interval_seconds, now=False)

    def stopService(self) -> Deferred[None]:
        """Write everything queued, then close the file."""
        super().stopService()
        return self.close()

    def close(self) -> Deferred[None]:
        """Write everything queued, stop the writer and close (once)."""
        if self._closing is not None:
            return self._closing
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._writer is None:
            self._closing = succeed(None)
            return self._closing
        self._closing = Deferred()
        self._continue_close()
        return self._closing

    def abandon(self) -> None:
        """Stop writing at once, without writing what is queued: the file is
        left as a process killed now would leave it (tests of recovery)."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._closed = True
        self._closing = succeed(None)
        if self._writer is not None:
            self._writer.stop()
            self._writer.join(5.0)

    def _continue_close(self) -> None:
        """The next step of a close: flush until nothing is queued, then end the writer."""
        writer = self._writer
        if writer is None or self._writing or self._closed:
            return
        if self._pending_count() or self._retry is not None:
            self.flush()
            return
        self._closed = True
        closing = self._closing
        assert closing is not None

        def finished(_: object) -> None:
            writer.join(5.0)
            closing.callback(None)

        writer.submit(lambda: None, finished, finished)
        writer.stop()

    # -- the queue ----------------------------------------------------------------------------

    def event_kept(self, event: EventRecord, size: int) -> None:
        """Queue a numbered event."""
        if self._pending_bytes > self.settings.max_pending_bytes:
            self._drop("event")
            return
        self._events.append(event)
        self._event_sizes.append(size)
        self._pending_bytes += size

    def operation_changed(self, operation: OperationRecord) -> None:
        """Queue the operation's current state."""
        if operation.operation_id not in self._operations:
            self._operations[operation.operation_id] = operation
            self._pending_bytes += QUEUED_RECORD_BYTES

    def edge_changed(self, record: EdgeRecord) -> None:
        """Queue the edge's current state."""
        if record.edge_id not in self._edges:
            self._edges[record.edge_id] = record
            self._pending_bytes += QUEUED_RECORD_BYTES

    def rollout_changed(self, rollout: Rollout) -> None:
        """Queue the rollout's current state."""
        if rollout.rollout_id not in self._rollouts:
            self._rollouts[rollout.rollout_id] = rollout
            self._pending_bytes += QUEUED_RECORD_BYTES

    def history_write(self, chunk: HistoryChunk) -> None:
        """Queue a history chunk (replacing a queued one with its key)."""
        key = (chunk.series, chunk.step, chunk.start)
        old = self._history.get(key)
        if old is None and self._pending_bytes > self.settings.max_pending_bytes:
            self._drop("history chunk")
            return
        self._pending_bytes += len(chunk.data) - (0 if old is None else len(old.data))
        self._history[key] = chunk

    def history_expire(self, step: int, before: float) -> None:
        """Queue the expiry of the old chunks of tier ``step``."""
        self._expire.append((step, before))

    def history_read(self, series: Sequence[str], step: int, start: float, end: float) -> Deferred[list[HistoryChunk]]:
        """The kept chunks, with those still queued."""
        queued = [
            chunk
            for chunk in self._history.values()
            if chunk.step == step and chunk.series in series and chunk.end >= start and chunk.start <= end
        ]
        writer = self._writer
        if writer is None or self._closed:
            return succeed(sorted(queued, key=lambda c: (c.series, c.start)))
        d: Deferred[list[HistoryChunk]] = Deferred()

        def read() -> list[HistoryChunk]:
            assert writer is not None
            return writer.read_history(series, step, start, end)

        def merge(stored: list[HistoryChunk]) -> None:
            chunks = {(c.series, c.start): c for c in stored}
            chunks.update({(c.series, c.start): c for c in queued})
            d.callback(sorted(chunks.values(), key=lambda c: (c.series, c.start)))

        writer.submit(read, merge, lambda e: d.errback(StoreError(f"history read failed: {e}")))
        return d

    def slo_write(self, name: str, data: bytes) -> None:
        """Queue an SLO's stored form (replacing a queued one of that name)."""
        self._queue_document(self._slos, name, data)

    def slo_delete(self, name: str) -> None:
        """Queue the deletion of an SLO."""
        self._queue_document(self._slos, name, None)

    def slo_read(self) -> Deferred[dict[str, bytes]]:
        """Every kept SLO, with the queued writes and deletes applied."""
        writer = self._writer
        return self._read_documents(self._slos, writer.read_slos if writer is not None else None, "SLO")

    def deployment_write(self, name: str, data: bytes) -> None:
        """Queue a deployment's stored form (replacing a queued one of that name)."""
        self._queue_document(self._deployments, name, data)

    def deployment_delete(self, name: str) -> None:
        """Queue the deletion of a deployment."""
        self._queue_document(self._deployments, name, None)

    def deployment_read(self) -> Deferred[dict[str, bytes]]:
        """Every kept deployment, with the queued writes and deletes applied."""
        writer = self._writer
        return self._read_documents(
            self._deployments, writer.read_deployments if writer is not None else None, "deployment"
        )

    def _queue_document(self, queue: dict[str, Optional[bytes]], name: str, data: Optional[bytes]) -> None:
        old = queue.get(name)
        self._pending_bytes += (len(data) if data else 0) - (len(old) if old else 0)
        queue[name] = bytes(data) if data is not None else None

    def _read_documents(
        self, queue: dict[str, Optional[bytes]], read: Optional[Callable[[], dict[str, bytes]]], what: str
    ) -> Deferred[dict[str, bytes]]:
        queued = dict(queue)

        def apply(stored: dict[str, bytes]) -> dict[str, bytes]:
            for name, data in queued.items():
                if data is None:
                    stored.pop(name, None)
                else:
                    stored[name] = data
            return stored

        writer = self._writer
        if writer is None or self._closed or read is None:
            return succeed(apply({}))
        d: Deferred[dict[str, bytes]] = Deferred()
        writer.submit(
            read,
            lambda stored: d.callback(apply(stored)),
            lambda e: d.errback(StoreError(f"{what} read failed: {e}")),
        )
        return d

    def _pending_count(self) -> int:
        return (
            len(self._events)
            + len(self._operations)
            + len(self._edges)
            + len(self._rollouts)
            + len(self._history)
            + len(self._expire)
            + len(self._slos)
            + len(self._deployments)
        )

    def _drop(self, what: str) -> None:
        self.dropped += 1
        now = self._clock.seconds()
        if now - self._dropped_logged_at >= DROP_LOG_SECONDS:
            self._dropped_logged_at = now
            self._log.error(
                "store {path}: the disk is not keeping up ({pending} bytes queued, "
                "store.max_pending_bytes {limit}); a {what} was dropped ({dropped} so far)",
                path=self.path,
                pending=self._pending_bytes,
                limit=self.settings.max_pending_bytes,
                what=what,
                dropped=self.dropped,
            )

    # -- flushing -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Hand what is queued to the writer (unless a batch is being written)."""
        writer = self._writer
        if writer is None or self._writing or self._closed:
            return
        batch = self._retry or self._take_batch()
        self._retry = None
        if not len(batch):
            return
        self._writing = True
        self._in_flight = len(batch)
        size = self._pending_bytes

        def written(committed: Committed) -> None:
            self._writing = False
            self._in_flight = 0
            self._pending_bytes = max(0, self._pending_bytes - size)
            self.commits += 1
            self.rows_written += committed.rows
            self.rows_trimmed += committed.trimmed
            self.commit_seconds += committed.seconds
            self._last_commit = self._clock.seconds()
            if self._error:
                self._log.info("store {path}: writing again", path=self.path)
            self._error = ""
            if self._closing is not None:
                self._continue_close()

        def failed(error: BaseException) -> None:
            self._writing = False
            self._in_flight = 0
            message = str(error).splitlines()[0] if str(error) else type(error).__name__
            if self._error != message:
                self._log.error("store {path}: a write failed: {error}", path=self.path, error=message)
            self._error = message
            self._retry = batch
            if self._closing is not None:
                # Stopping: what could not be written now is lost; say how much.
                self._log.error("store {path}: {count} changes not written at stop", path=self.path, count=len(batch))
                self._retry = None
                self._continue_close()

        writer.submit(lambda: writer.write(batch), written, failed)

    def _take_batch(self) -> Batch:
        """Everything queued, serialized where it may still change."""
        # Copies of what may still change (an operation, an edge, a rollout),
        # taken now; their JSON text is written by the writer thread.
        operations = [
            (op.operation_id, op.edge_id, op.created_at, int(op.finished), stored_forms.operation_dict(op))
            for op in self._operations.values()
        ]
        edges = [_edge_row(record) for record in self._edges.values()]
        rollouts = [
            (r.rollout_id, r.created_at, int(r.settled), stored_forms.rollout_dict(r)) for r in self._rollouts.values()
        ]
        batch = Batch(
            events=self._events,
            event_sizes=self._event_sizes,
            operations=operations,
            edges=edges,
            rollouts=rollouts,
            history=list(self._history.values()),
            history_expire=self._expire,
            slos=self._slos,
            deployments=self._deployments,
            now=self._clock.seconds(),
        )
        if self._events:
            batch.meta["fleet_sequence"] = max(e.fleet_sequence for e in self._events)
            rollout_sequences = [e.sequence for e in self._events if not e.edge_id]
            if rollout_sequences:
                batch.meta["rollout_event_sequence"] = max(rollout_sequences)
        self._events = []
        self._event_sizes = []
        self._operations = {}
        self._edges = {}
        self._rollouts = {}
        self._history = {}
        self._expire = []
        self._slos = {}
        self._deployments = {}
        return batch

    # -- health ------------------------------------------------------------------------------

    def health(self) -> StoreHealth:
        """Whether the last write worked, what is queued, the file's size."""
        last = self._last_commit
        return StoreHealth(
            backend=self.backend,
            writable=not self._error and (self._writer is None or self._writer.alive or self._closed),
            error=self._error,
            pending=self._pending_count() + self._in_flight + (len(self._retry) if self._retry is not None else 0),
            pending_bytes=self._pending_bytes,
            dropped=self.dropped,
            last_commit_age=None if last is None else max(0.0, self._clock.seconds() - last),
            path=self.path,
            file_bytes=sqlite_schema.file_bytes(self.path),
            commits=self.commits,
            rows_written=self.rows_written,
            rows_trimmed=self.rows_trimmed,
            commit_seconds=self.commit_seconds,
        )

    # -- reading back -------------------------------------------------------------------------

    def _read_kept(self, db: sqlite3.Connection) -> KeptState:
        meta = dict(db.execute("SELECT key, value FROM meta"))
        # An edge's newest event number: its newest block's, or what its row
        # kept of the blocks the bounds removed.
        newest = dict(db.execute("SELECT edge_id, max(last_sequence) FROM events GROUP BY edge_id"))
        edges = []
        for row in db.execute(
            "SELECT edge_id, hello, connected, connected_at, disconnected_at, last_seen, enrollments, "
            "last_sequence, last_edge_sequence FROM edges ORDER BY last_seen"
        ):
            try:
                hello = stored_forms.loads_object(row[1], f"edge {row[0]}: hello")
                stored_forms.hello_from(hello)
            except stored_forms.BadRecord as e:
                self._skipped(str(e))
                continue
            edges.append(
                KeptEdge(
                    edge_id=row[0],
                    hello=hello,
                    connected=bool(row[2]),
                    connected_at=row[3],
                    disconnected_at=row[4],
                    last_seen=float(row[5]),
                    enrollments=int(row[6]),
                    last_sequence=max(int(row[7]), int(newest.get(row[0]) or 0)),
                    last_edge_sequence=int(row[8]),
                )
            )
        events = []
        for block, edge_id, body in db.execute("SELECT block, edge_id, body FROM events ORDER BY block"):
            try:
                events += stored_forms.events_of_block(body, edge_id)
            except stored_forms.BadRecord as e:
                self._skipped(f"event block {block}: {e}")
        # The blocks of one write are per edge: fleet order is restored here.
        events.sort(key=lambda event: event.fleet_sequence)
        operations = []
        for operation_id, body in db.execute("SELECT operation_id, body FROM operations ORDER BY created_at"):
            try:
                operation = stored_forms.operation_from(stored_forms.loads_object(body, "operation"))
                if operation.state not in OPERATION_STATES:
                    raise stored_forms.BadRecord(f"unknown state {operation.state[:40]!r}")
                operations.append(operation)
            except stored_forms.BadRecord as e:
                self._skipped(f"operation {operation_id}: {e}")
        rollouts = []
        for rollout_id, body in db.execute("SELECT rollout_id, body FROM rollouts ORDER BY created_at"):
            try:
                value = stored_forms.loads_object(body, "rollout")
                stored_forms.rollout_from(value)
                rollouts.append(value)
            except ValueError as e:
                self._skipped(f"rollout {rollout_id}: {e}")
        slos = tuple((str(name), bytes(data)) for name, data in db.execute("SELECT name, data FROM slos ORDER BY name"))
        deployments = tuple(
            (str(name), bytes(data)) for name, data in db.execute("SELECT name, data FROM deployments ORDER BY name")
        )
        return KeptState(
            slos=slos,
            deployments=deployments,
            fleet_sequence=_meta_int(meta, "fleet_sequence"),
            edges=tuple(edges),
            events=tuple(events),
            operations=tuple(operations),
            rollouts=tuple(rollouts),
            rollout_event_sequence=_meta_int(meta, "rollout_event_sequence"),
        )

    def _skipped(self, problem: str) -> None:
        self.skipped_at_open += 1
        self._log.warn(
            "store {path}: skipped a stored row that does not parse: {problem}", path=self.path, problem=problem
        )


def _meta_int(meta: dict[str, str], key: str) -> int:
    try:
        return max(0, int(meta.get(key, "0")))
    except ValueError:
        return 0


def _edge_row(record: EdgeRecord) -> EdgeRow:
    """An edge as its ``edges`` row (its hello as the object, written by the writer)."""
    return (
        record.edge_id,
        record.hello,
        int(record.connected),
        record.connected_at,
        record.disconnected_at,
        record.last_seen,
        record.enrollments,
        record.events.last_sequence,
        record.events.last_edge_sequence,
    )
