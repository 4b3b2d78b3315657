"""The SQLite store's writer: one thread, one connection, one transaction per batch.

Why one thread of our own rather than ``twisted.enterprise.adbapi``:
SQLite takes one writer at a time, so a pool of connections would only
queue on the file's lock; adbapi runs each interaction on the reactor's
shared thread pool (DNS lookups wait behind a slow commit) and would hand
us one call per write, where we want one transaction per batch. So the
reactor queues changes (:class:`~.sqlite.SqliteStore`), and every flush
interval hands a whole :class:`Batch` to this thread, which writes it in
one transaction, applies the retention bounds in the same transaction,
and reports back on the reactor (``callFromThread``). Reads for the
history go through the same thread, after the writes queued before them.

Events are written in **blocks**: the events one write has of one edge
are one row (at most :data:`BLOCK_EVENTS` events, :data:`BLOCK_BYTES`
bytes), so an edge relaying a burst costs one row per flush instead of
one per event: the row's insert and its index entries, the most of what
SQLite spends per row, are shared by the block (``bench/event_instructions.py
--compare-stores``). Retention drops whole blocks.

Retention, enforced as the writes happen (the oldest go first):

* events: per edge by count (the blocks all of whose events are older
  than the newest N) and bytes (the oldest block, never the last), for
  the fleet by count, with operations and rollouts by bytes together, and
  by age;
* operations: finished ones per edge by count, and by age;
* rollouts: settled ones by count and age; edges by count (the one not
  seen for longest first, its events and operations with it) and age;
* history: chunks by their tier's keep time (asked by the history) and
  by bytes.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Optional

import attrs
from twisted.logger import Logger

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.memory import event_size
from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store.interface import HistoryChunk
from twisted_iop.controlplane.store.settings import Retention
from twisted_iop.controlplane.wires.edge_hello import EdgeHello

#: Writes one block of an edge's events.
INSERT_BLOCK = (
    "INSERT INTO events (edge_id, first_sequence, last_sequence, last_fleet_sequence, recorded_at, count, bytes, body) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
#: A block holds at most this many events, and at most this many estimated bytes.
BLOCK_EVENTS = 256
BLOCK_BYTES = 256 * 1024
#: Age-based retention runs at most this often (it scans from the oldest).
AGE_PASS_SECONDS = 60.0
#: Rows deleted per statement when trimming by bytes or age.
TRIM_ROWS = 1000

#: An ``edges`` row with its hello as the object (many edges share one:
#: its JSON is written once per batch, here, not on the reactor).
EdgeRow = tuple[str, EdgeHello, int, Optional[float], Optional[float], float, int, int, int]
#: An ``operations`` row: operation_id, edge_id, created_at, finished, and
#: the operation as JSON values (a copy taken on the reactor, dumped here).
OperationRow = tuple[str, str, float, int, dict[str, Any]]
#: A ``rollouts`` row: rollout_id, created_at, settled, the rollout as JSON values.
RolloutRow = tuple[str, float, int, dict[str, Any]]


@attrs.define
class Batch:
    """Everything queued since the last flush (changes coalesced by key)."""

    events: list[EventRecord] = attrs.field(factory=list)
    #: Each event's estimated bytes (counted against the bounds), as the
    #: event log measured it when it kept the event.
    event_sizes: list[int] = attrs.field(factory=list)
    operations: list[OperationRow] = attrs.field(factory=list)
    edges: list[EdgeRow] = attrs.field(factory=list)
    rollouts: list[RolloutRow] = attrs.field(factory=list)
    history: list[HistoryChunk] = attrs.field(factory=list)
    #: ``(step, before)`` expiries asked by the history.
    history_expire: list[tuple[int, float]] = attrs.field(factory=list)
    #: SLOs to keep (their stored form) or forget (None), by name.
    slos: dict[str, Optional[bytes]] = attrs.field(factory=dict)
    #: Deployments to keep (their stored form) or forget (None), by name.
    deployments: dict[str, Optional[bytes]] = attrs.field(factory=dict)
    #: The meta values to keep (the numbering's high-water marks).
    meta: dict[str, int] = attrs.field(factory=dict)
    #: The wall-clock time of the flush (for age retention).
    now: float = 0.0

    def __len__(self) -> int:
        return (
            len(self.events)
            + len(self.operations)
            + len(self.edges)
            + len(self.rollouts)
            + len(self.history)
            + len(self.history_expire)
            + len(self.slos)
            + len(self.deployments)
        )


@attrs.frozen
class Committed:
    """What one batch did (told to the reactor)."""

    rows: int
    seconds: float
    #: Rows removed by the retention bounds in this batch.
    trimmed: int


class Job:
    """One thing for the writer thread to do, and whom to tell."""

    __slots__ = ("done", "failed", "work")

    def __init__(
        self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[BaseException], None]
    ) -> None:
        self.work = work
        self.done = done
        self.failed = failed


class SqliteWriter:
    """The writer thread and the tables' bookkeeping (every method but
    :meth:`submit` and :meth:`stop` runs on the thread)."""

    _log = Logger()

    def __init__(
        self,
        connection: sqlite3.Connection,
        retention: Retention,
        history_max_bytes: int,
        call_from_thread: Callable[..., None],
        clock: Callable[[], float],
    ) -> None:
        self._db = connection
        self._retention = retention
        self._history_max_bytes = history_max_bytes
        self._call_from_thread = call_from_thread
        self._clock = clock
        self._jobs: queue.SimpleQueue[Optional[Job]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="iop-store-writer", daemon=True)
        #: Bytes of the stored forms of events, operations and rollouts.
        self.stored_bytes = 0
        self.edge_event_bytes: dict[str, int] = defaultdict(int)
        self.history_bytes = 0
        self._last_age_pass = 0.0
        self._count_bytes()

    def _count_bytes(self) -> None:
        db = self._db
        for edge_id, total in db.execute("SELECT edge_id, sum(bytes) FROM events GROUP BY edge_id"):
            self.edge_event_bytes[edge_id] = int(total)
        self.stored_bytes = sum(self.edge_event_bytes.values())
        for table in ("operations", "rollouts"):
            self.stored_bytes += int(db.execute(f"SELECT coalesce(sum(bytes), 0) FROM {table}").fetchone()[0])
        self.history_bytes = int(db.execute("SELECT coalesce(sum(length(data)), 0) FROM history").fetchone()[0])

    # -- the reactor's side ------------------------------------------------------------

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def submit(
        self, work: Callable[[], Any], done: Callable[[Any], None], failed: Callable[[BaseException], None]
    ) -> None:
        """Run ``work`` on the thread after what was submitted before; tell
        ``done`` (its result) or ``failed`` on the reactor."""
        self._jobs.put(Job(work, done, failed))

    def stop(self) -> None:
        """Finish the jobs submitted, close the connection, end the thread (returns at once)."""
        self._jobs.put(None)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the thread to end (tests and the stop)."""
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self._thread.is_alive()

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            try:
                result = job.work()
            except BaseException as e:
                self._call_from_thread(job.failed, e)
            else:
                self._call_from_thread(job.done, result)
        try:
            self._db.execute("PRAGMA optimize")
            self._db.close()
        except sqlite3.Error:
            pass

    def write(self, batch: Batch) -> Committed:
        """Write ``batch`` and apply the bounds, in one transaction."""
        started = self._clock()
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            trimmed = self._write(batch)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._count_bytes()
            raise
        return Committed(len(batch), self._clock() - started, trimmed)

    def _write(self, batch: Batch) -> int:
        db = self._db
        trimmed = 0
        touched: dict[str, int] = {}
        if batch.events:
            events, sizes = batch.events, batch.event_sizes
            if len(sizes) != len(events):
                # A batch made without the log's measures (tools, tests).
                sizes = [event_size(e) for e in events]
            rows = []
            edge_bytes = self.edge_event_bytes
            for edge_id, block, size in _blocks(events, sizes):
                first, last = block[0], block[-1]
                rows.append(
                    (
                        edge_id,
                        first.sequence,
                        last.sequence,
                        last.fleet_sequence,
                        last.recorded_at,
                        len(block),
                        size,
                        stored_forms.event_block(block),
                    )
                )
                edge_bytes[edge_id] += size
                touched[edge_id] = last.sequence
                self.stored_bytes += size
            db.executemany(INSERT_BLOCK, rows)
        if batch.edges:
            hellos: dict[int, str] = {}

            def hello_text(hello: EdgeHello) -> str:
                text = hellos.get(id(hello))
                if text is None:
                    text = hellos[id(hello)] = stored_forms.hello_json(hello)
                return text

            db.executemany(
                """INSERT INTO edges VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)
                ON CONFLICT (edge_id) DO UPDATE SET hello = excluded.hello, connected = excluded.connected,
                    connected_at = excluded.connected_at, disconnected_at = excluded.disconnected_at,
                    last_seen = excluded.last_seen, enrollments = excluded.enrollments,
                    last_edge_sequence = excluded.last_edge_sequence""",
                [(row[0], hello_text(row[1]), *row[2:7], row[8]) for row in batch.edges],
            )
        ops_touched: set[str] = set()
        for operation_id, edge_id, created_at, finished, value in batch.operations:
            body = stored_forms.dumps(value)
            self.stored_bytes += len(body) - self._old_bytes("operations", "operation_id", operation_id)
            db.execute(
                "INSERT OR REPLACE INTO operations VALUES (?, ?, ?, ?, ?, ?)",
                (operation_id, edge_id, created_at, finished, body, len(body)),
            )
            if finished:
                ops_touched.add(edge_id)
        for rollout_id, created_at, settled, state in batch.rollouts:
            body = stored_forms.dumps(state)
            self.stored_bytes += len(body) - self._old_bytes("rollouts", "rollout_id", rollout_id)
            db.execute(
                "INSERT OR REPLACE INTO rollouts VALUES (?, ?, ?, ?, ?)",
                (rollout_id, created_at, settled, body, len(body)),
            )
        for chunk in batch.history:
            old = db.execute(
                "SELECT length(data) FROM history WHERE series = ? AND step = ? AND start = ?",
                (chunk.series, chunk.step, chunk.start),
            ).fetchone()
            self.history_bytes += len(chunk.data) - (old[0] if old else 0)
            db.execute(
                "INSERT OR REPLACE INTO history VALUES (?, ?, ?, ?, ?)",
                (chunk.series, chunk.step, chunk.start, chunk.end, chunk.data),
            )
        for name, data in batch.slos.items():
            if data is None:
                db.execute("DELETE FROM slos WHERE name = ?", (name,))
            else:
                db.execute("INSERT OR REPLACE INTO slos VALUES (?, ?)", (name, data))
        for name, data in batch.deployments.items():
            if data is None:
                db.execute("DELETE FROM deployments WHERE name = ?", (name,))
            else:
                db.execute("INSERT OR REPLACE INTO deployments VALUES (?, ?)", (name, data))
        for key, number in batch.meta.items():
            db.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                "CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                (key, str(number)),
            )
        trimmed += self._trim_events(touched)
        trimmed += self._trim_operations(ops_touched)
        if batch.rollouts:
            trimmed += self._trim_rollouts()
        if batch.edges:
            trimmed += self._trim_edges()
        for step, before in batch.history_expire:
            trimmed += self._delete_history("WHERE step = ? AND end < ?", (step, before))
        trimmed += self._trim_history()
        trimmed += self._trim_bytes()
        if batch.now - self._last_age_pass >= AGE_PASS_SECONDS:
            self._last_age_pass = batch.now
            trimmed += self._trim_age(batch.now - self._retention.max_age_seconds)
        return trimmed

    def _old_bytes(self, table: str, key: str, value: str) -> int:
        row = self._db.execute(f"SELECT bytes FROM {table} WHERE {key} = ?", (value,)).fetchone()
        return int(row[0]) if row else 0

    # -- retention ----------------------------------------------------------------------

    def _delete_events(self, where: str, arguments: Sequence[Any]) -> int:
        """Delete blocks of events (counting their bytes off); how many blocks.

        An edge's newest number is read from its newest block when it opens
        again; the edge's row keeps the newest number of what is deleted, so
        numbering goes on after every block of an edge is gone (written here,
        when blocks go, rather than at every write).
        """
        removed = self._db.execute(
            f"DELETE FROM events {where} RETURNING edge_id, bytes, last_sequence", arguments
        ).fetchall()
        edge_bytes = self.edge_event_bytes
        newest: dict[str, int] = {}
        for edge_id, size, last_sequence in removed:
            edge_bytes[edge_id] -= size
            self.stored_bytes -= size
            newest[edge_id] = max(newest.get(edge_id, 0), last_sequence)
        if newest:
            self._db.executemany(
                "UPDATE edges SET last_sequence = max(last_sequence, ?) WHERE edge_id = ?",
                [(sequence, edge_id) for edge_id, sequence in newest.items()],
            )
        return len(removed)

    def _trim_events(self, touched: dict[str, int]) -> int:
        retention = self._retention
        trimmed = 0
        for edge_id, last in touched.items():
            if last > retention.events_per_edge:
                # Blocks all of whose events are older than the newest N.
                trimmed += self._delete_events(
                    "WHERE edge_id = ? AND last_sequence <= ?", (edge_id, last - retention.events_per_edge)
                )
            while self.edge_event_bytes[edge_id] > retention.event_bytes_per_edge:
                # The edge's oldest block, unless it is its last.
                oldest = self._db.execute(
                    "SELECT block FROM events WHERE edge_id = ? ORDER BY last_sequence LIMIT 2", (edge_id,)
                ).fetchall()
                if len(oldest) < 2:
                    break
                trimmed += self._delete_events("WHERE block = ?", (oldest[0][0],))
        newest = self._db.execute("SELECT max(last_fleet_sequence) FROM events").fetchone()[0]
        if newest is not None and newest > retention.fleet_events:
            # Blocks all of whose events are older than the fleet's newest N.
            trimmed += self._delete_events(
                "WHERE block IN (SELECT block FROM events WHERE last_fleet_sequence <= ? ORDER BY block LIMIT ?)",
                (newest - retention.fleet_events, TRIM_ROWS * 10),
            )
        return trimmed

    def _trim_operations(self, edges: set[str]) -> int:
        keep = self._retention.operations_per_edge
        trimmed = 0
        for edge_id in edges:
            removed = self._db.execute(
                "DELETE FROM operations WHERE operation_id IN (SELECT operation_id FROM operations "
                "WHERE edge_id = ? AND finished = 1 ORDER BY created_at DESC LIMIT -1 OFFSET ?) RETURNING bytes",
                (edge_id, keep),
            ).fetchall()
            self.stored_bytes -= sum(size for (size,) in removed)
            trimmed += len(removed)
        return trimmed

    def _trim_rollouts(self) -> int:
        removed = self._db.execute(
            "DELETE FROM rollouts WHERE rollout_id IN (SELECT rollout_id FROM rollouts WHERE settled = 1 "
            "ORDER BY created_at DESC LIMIT -1 OFFSET ?) RETURNING bytes",
            (self._retention.rollouts,),
        ).fetchall()
        self.stored_bytes -= sum(size for (size,) in removed)
        return len(removed)

    def _trim_edges(self) -> int:
        gone = [
            edge_id
            for (edge_id,) in self._db.execute(
                "SELECT edge_id FROM edges WHERE connected = 0 ORDER BY last_seen DESC LIMIT -1 OFFSET ?",
                (max(0, self._retention.edges - self._connected_count()),),
            ).fetchall()
        ]
        return self._forget_edges(gone)

    def _connected_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM edges WHERE connected = 1").fetchone()[0])

    def _forget_edges(self, edge_ids: list[str]) -> int:
        trimmed = 0
        for edge_id in edge_ids:
            self._db.execute("DELETE FROM edges WHERE edge_id = ?", (edge_id,))
            trimmed += 1 + self._delete_events("WHERE edge_id = ?", (edge_id,))
            removed = self._db.execute(
                "DELETE FROM operations WHERE edge_id = ? RETURNING bytes", (edge_id,)
            ).fetchall()
            self.stored_bytes -= sum(size for (size,) in removed)
            trimmed += len(removed)
            self.edge_event_bytes.pop(edge_id, None)
        return trimmed

    def _delete_history(self, where: str, arguments: Sequence[Any]) -> int:
        removed = self._db.execute(f"DELETE FROM history {where} RETURNING length(data)", arguments).fetchall()
        self.history_bytes -= sum(size for (size,) in removed)
        return len(removed)

    def _trim_history(self) -> int:
        trimmed = 0
        while self.history_bytes > self._history_max_bytes:
            removed = self._delete_history(
                "WHERE (series, step, start) IN (SELECT series, step, start FROM history ORDER BY end LIMIT ?)",
                (TRIM_ROWS,),
            )
            if not removed:
                break
            trimmed += removed
        return trimmed

    def _trim_bytes(self) -> int:
        """Events first (oldest), then finished operations (oldest), beyond ``max_bytes``."""
        trimmed = 0
        limit = self._retention.max_bytes
        while self.stored_bytes > limit:
            removed = self._delete_events(
                "WHERE block IN (SELECT block FROM events ORDER BY block LIMIT ?)", (TRIM_ROWS,)
            )
            if not removed:
                ops = self._db.execute(
                    "DELETE FROM operations WHERE operation_id IN (SELECT operation_id FROM operations "
                    "WHERE finished = 1 ORDER BY created_at LIMIT ?) RETURNING bytes",
                    (TRIM_ROWS,),
                ).fetchall()
                self.stored_bytes -= sum(size for (size,) in ops)
                if not ops:
                    break
                removed = len(ops)
            trimmed += removed
        return trimmed

    def _trim_age(self, before: float) -> int:
        trimmed = 0
        while True:
            removed = self._delete_events(
                "WHERE block IN (SELECT block FROM events ORDER BY block LIMIT ?) AND recorded_at < ?",
                (TRIM_ROWS, before),
            )
            trimmed += removed
            if removed < TRIM_ROWS:
                break
        ops = self._db.execute(
            "DELETE FROM operations WHERE finished = 1 AND created_at < ? RETURNING bytes", (before,)
        ).fetchall()
        self.stored_bytes -= sum(size for (size,) in ops)
        rollouts = self._db.execute(
            "DELETE FROM rollouts WHERE settled = 1 AND created_at < ? RETURNING bytes", (before,)
        ).fetchall()
        self.stored_bytes -= sum(size for (size,) in rollouts)
        gone = [
            edge_id
            for (edge_id,) in self._db.execute(
                "SELECT edge_id FROM edges WHERE connected = 0 AND last_seen < ?", (before,)
            ).fetchall()
        ]
        return trimmed + len(ops) + len(rollouts) + self._forget_edges(gone)

    # -- reads -----------------------------------------------------------------------------

    def read_history(self, series: Sequence[str], step: int, start: float, end: float) -> list[HistoryChunk]:
        """The chunks of ``series`` at ``step`` overlapping ``[start, end]``."""
        chunks: list[HistoryChunk] = []
        for name in sorted(set(series)):
            rows = self._db.execute(
                "SELECT start, end, data FROM history WHERE series = ? AND step = ? AND start <= ? AND end >= ? "
                "ORDER BY start",
                (name, step, end, start),
            )
            chunks.extend(HistoryChunk(name, step, row[0], row[1], bytes(row[2])) for row in rows)
        return chunks

    def read_slos(self) -> dict[str, bytes]:
        """Every kept SLO's stored form, by name."""
        return {str(name): bytes(data) for name, data in self._db.execute("SELECT name, data FROM slos")}

    def read_deployments(self) -> dict[str, bytes]:
        """Every kept deployment's stored form, by name."""
        return {str(name): bytes(data) for name, data in self._db.execute("SELECT name, data FROM deployments")}


def _blocks(events: Sequence[EventRecord], sizes: Sequence[int]) -> list[tuple[str, list[EventRecord], int]]:
    """The events of one write grouped by edge, in order, cut into blocks of
    at most :data:`BLOCK_EVENTS` events and :data:`BLOCK_BYTES` bytes; each
    with its edge and bytes. Blocks come in the order of their first event
    (so block numbers follow fleet order, write by write)."""
    open_blocks: dict[str, tuple[list[EventRecord], list[int]]] = {}
    blocks: list[tuple[str, list[EventRecord], list[int]]] = []
    for event, size in zip(events, sizes, strict=True):
        edge_id = event.edge_id
        current = open_blocks.get(edge_id)
        if current is None or len(current[0]) >= BLOCK_EVENTS or current[1][0] + size > BLOCK_BYTES:
            current = open_blocks[edge_id] = ([], [0])
            blocks.append((edge_id, current[0], current[1]))
        current[0].append(event)
        current[1][0] += size
    return [(edge_id, block, total[0]) for edge_id, block, total in blocks]
