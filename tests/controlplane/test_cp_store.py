"""The store: one contract for every backend, the SQLite file's round trip,
its bounds and versions, and a Control Plane restarted on its file."""

from __future__ import annotations

import io
import marshal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, maybeDeferred

from twisted_iop.client import ClientWireClient, ControlPlaneStatusRepository
from twisted_iop.client.cli import parse_arguments, run
from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store import sqlite_schema
from twisted_iop.controlplane.store.interface import HistoryChunk, StoreError
from twisted_iop.controlplane.store.memory import MemoryHistory, MemoryStore, chunk_bytes
from twisted_iop.controlplane.store.settings import Retention, StoreSettings
from twisted_iop.controlplane.store.sqlite import SqliteStore, _edge_row
from twisted_iop.controlplane.store.sqlite_writer import Batch, SqliteWriter
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing import store_contract
from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.wires.peers import HeldEdgePeer, connect_edge

HELLO = EdgeHello(labels={"site": "lab"}, software_version="1.0", protocol_version="1.0", commands=())


def sqlite_settings(path: Path, **overrides: Any) -> StoreSettings:
    """A SQLite store in ``path`` flushing quickly."""
    values: dict[str, Any] = {"backend": "sqlite", "path": str(path / "cp.sqlite"), "flush_interval_seconds": 0.02}
    values.update(overrides)
    return StoreSettings(**values)


@pytest_twisted.async_yield_fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """Each backend a single process can have, opened."""
    if request.param == "memory":
        opened: Any = MemoryStore()
    else:
        opened = SqliteStore(sqlite_settings(tmp_path), reactor)
    opened.open()
    opened.startService()
    yield opened
    await maybeDeferred(opened.stopService)


# -- the history contract, every backend ----------------------------------------------


@pytest.mark.parametrize("check", store_contract.CHECKS, ids=lambda check: check.__name__)
@pytest_twisted.ensureDeferred
async def test_the_history_contract(store: Any, check: Any) -> None:
    """The memory and SQLite stores keep, replace, read and expire history chunks alike."""

    async def settle() -> None:
        if hasattr(store, "flush"):
            store.flush()
            await eventually(lambda: store.health().pending == 0, message="flushed")

    await check(store, store, settle)


#: One operation on the memory history: a write (series, step, start, end, bytes),
#: an expiry (step, before) or a new byte bound.
history_operation = st.one_of(
    st.tuples(
        st.just("write"),
        st.sampled_from(["fleet", "edges/00", "edges/01"]),
        st.sampled_from([15, -30, 60]),
        st.integers(0, 20),
        st.integers(0, 40),
        st.integers(0, 3000),
    ),
    st.tuples(st.just("expire"), st.sampled_from([15, -30, 60]), st.integers(0, 50)),
)


@given(st.lists(history_operation, max_size=60), st.integers(3000, 20_000))
@settings(max_examples=200, deadline=None)
def test_memory_history_keeps_what_a_plain_model_keeps(operations: list[Any], max_bytes: int) -> None:
    """Writes that replace by key, expiry by end and the byte bound (the chunk
    that ended first goes first) leave the chunks a plain dict and sort leave."""
    history = MemoryHistory(max_bytes)
    model: dict[tuple[str, int, float], HistoryChunk] = {}
    writes = 0
    for operation in operations:
        if operation[0] == "write":
            _, series, step, start, length, size = operation
            writes += 1
            # A distinct end per write: the bound's order has no ties to break.
            end = float(start + length) + writes / 1000
            chunk = HistoryChunk(series, step, float(start), end, b"x" * size)
            history.write(chunk)
            model[(series, step, float(start))] = chunk
            while sum(chunk_bytes(c) for c in model.values()) > max_bytes:
                oldest = min(model, key=lambda key: (model[key].end, key))
                del model[oldest]
        else:
            _, step, before = operation
            history.expire(step, before)
            model = {key: c for key, c in model.items() if not (key[1] == step and c.end < before)}
    kept = {
        (c.series, c.step, c.start): c
        for step in (15, -30, 60)
        for c in history.read(["fleet", "edges/00", "edges/01"], step, -1, 1e9)
    }
    assert kept == model
    assert history.bytes == sum(chunk_bytes(c) for c in model.values())
    assert len(history) == len(model)


# -- the SQLite file -------------------------------------------------------------------


#: When the test events happened (recent: older than the retention age would be dropped).
NOW = time.time()


def _event(edge_id: str, sequence: int, fleet_sequence: int, message: str = "m") -> EventRecord:
    return EventRecord(sequence, fleet_sequence, edge_id, "test.kind", NOW + fleet_sequence, NOW, message=message)


def _operation(edge_id: str, operation_id: str, state: str = "succeeded", key: str = "") -> OperationRecord:
    op = OperationRecord(operation_id, edge_id, "node.drain", "node-1", {}, key, NOW, NOW + 10)
    op.state = state
    return op


@pytest_twisted.ensureDeferred
async def test_what_the_store_was_told_comes_back_when_it_opens_again(tmp_path: Path) -> None:
    """Events, operations, edges and the numbering survive closing and opening the file."""
    registry = EdgeRegistry(reactor)
    first = SqliteStore(sqlite_settings(tmp_path), reactor)
    assert first.open().empty
    first.startService()
    registry.store = first
    record = registry.known("edge-a", HELLO)
    record.last_seen = NOW
    first.edge_changed(record)
    for n in range(1, 4):
        first.event_kept(_event("edge-a", n, n), 100)
    first.operation_changed(_operation("edge-a", "op-1", key="key-1"))
    await first.stopService()
    second = SqliteStore(sqlite_settings(tmp_path), reactor)
    kept = second.open()
    second.startService()
    try:
        assert kept.fleet_sequence == 3
        assert [(e.edge_id, e.sequence, e.fleet_sequence, e.message) for e in kept.events] == [
            ("edge-a", 1, 1, "m"),
            ("edge-a", 2, 2, "m"),
            ("edge-a", 3, 3, "m"),
        ]
        [edge] = kept.edges
        assert (edge.edge_id, edge.connected, edge.last_seen, edge.last_sequence) == ("edge-a", False, NOW, 3)
        assert edge.hello["labels"] == {"site": "lab"}
        [op] = kept.operations
        assert (op.operation_id, op.state, op.idempotency_key) == ("op-1", "succeeded", "key-1")
    finally:
        await second.stopService()


@pytest_twisted.ensureDeferred
async def test_pending_counts_the_batch_the_writer_has_until_it_is_on_disk(tmp_path: Path) -> None:
    """``pending`` (``/readyz``, ``iop_store_pending_changes``) is 0 only once
    what was handed to the writer is committed, not when it leaves the queue."""
    store = SqliteStore(sqlite_settings(tmp_path, flush_interval_seconds=60.0), reactor)
    store.open()
    store.startService()
    gate = threading.Event()
    try:
        writer = store._writer
        assert writer is not None
        # The writer is busy with something else until the gate opens.
        writer.submit(lambda: gate.wait(10.0), lambda _: None, lambda _: None)
        for n in range(1, 4):
            store.event_kept(_event("edge-a", n, n), 100)
        store.flush()
        assert store.health().pending == 3
        await eventually(lambda: writer._jobs.qsize() == 1, message="the batch waiting on the writer")
        assert store.health().pending == 3
        gate.set()
        await eventually(lambda: store.health().pending == 0, message="written")
        with sqlite3.connect(f"file:{tmp_path / 'cp.sqlite'}?mode=ro", uri=True) as connection:
            [(count,)] = connection.execute("SELECT sum(count) FROM events").fetchall()
        assert count == 3
    finally:
        gate.set()
        await store.stopService()


def _writer(path: Path, retention: Retention, history_max_bytes: int = 2**30) -> SqliteWriter:
    connection = sqlite_schema.connect(str(path / "cp.sqlite"))
    return SqliteWriter(connection, retention, history_max_bytes, lambda f, *a: f(*a), lambda: 0.0)


def test_events_are_bounded_per_edge_and_for_the_fleet(tmp_path: Path) -> None:
    """Beyond the per-edge and fleet counts the oldest events go, and the newest stay."""
    writer = _writer(tmp_path, Retention(events_per_edge=5, fleet_events=12))
    fleet = 0
    sequences = {"a": 0, "b": 0}
    for _ in range(10):
        batch = Batch()
        for edge_id in ("a", "b"):
            sequences[edge_id] += 1
            fleet += 1
            batch.events.append(_event(edge_id, sequences[edge_id], fleet))
        writer.write(batch)
    kept = sorted(
        (event.edge_id, event.sequence, event.fleet_sequence)
        for (body,) in writer._db.execute("SELECT body FROM events")
        for event in stored_forms.events_of_block(body)
    )
    kept.sort(key=lambda row: row[2])
    assert len(kept) == 10
    assert [s for e, s, _ in kept if e == "a"] == [6, 7, 8, 9, 10]
    assert kept[-1][2] == 20
    assert writer.stored_bytes == sum(writer.edge_event_bytes.values())


def test_the_file_stops_growing_once_the_bounds_are_reached(tmp_path: Path) -> None:
    """Writing on past the bounds reuses the freed pages: the file's size levels off."""
    writer = _writer(tmp_path, Retention(events_per_edge=200, fleet_events=2000))
    path = str(tmp_path / "cp.sqlite")
    fleet = 0
    sizes = []
    for _round in range(40):
        batch = Batch()
        for _ in range(500):
            fleet += 1
            batch.events.append(_event(f"edge-{fleet % 10}", fleet // 10 + 1, fleet, "x" * 200))
        writer.write(batch)
        writer._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
        sizes.append(sqlite_schema.file_bytes(path))
    count = sqlite3.connect(path).execute("SELECT sum(count) FROM events").fetchone()[0]
    assert count <= 2000
    # Unbounded, 40 rounds of 500 events of 200+ bytes would take over 4 MB.
    assert sizes[-1] < 4_000_000, sizes
    assert max(sizes[20:]) <= max(sizes[10:20]) * 1.1, sizes


def test_bytes_bound_drops_the_oldest_events(tmp_path: Path) -> None:
    """Over ``max_bytes`` the oldest events go until the rest fits."""
    writer = _writer(tmp_path, Retention(max_bytes=1024 * 1024, fleet_events=10**6, events_per_edge=10**6))
    fleet = 0
    for _ in range(30):
        batch = Batch()
        for _ in range(100):
            fleet += 1
            batch.events.append(_event(f"edge-{fleet % 7}", fleet, fleet, "y" * 1000))
        writer.write(batch)
    assert writer.stored_bytes <= 1024 * 1024
    oldest = writer._db.execute("SELECT min(last_fleet_sequence) FROM events").fetchone()[0]
    assert oldest > 1000


def test_numbering_goes_on_after_every_event_of_an_edge_aged_out(tmp_path: Path) -> None:
    """When the age bound removes all of an edge's events, its newest number is kept for the next start."""
    writer = _writer(tmp_path, Retention(max_age_seconds=3600.0))
    edge_row = ("edge-a", HELLO, 0, None, None, NOW + 7200, 1, 0, 0)
    old = [e._replace(recorded_at=NOW - 7200) for e in (_event("edge-a", n, n) for n in (1, 2, 3))]
    writer.write(Batch(events=old, edges=[edge_row], now=NOW - 7200))
    writer.write(Batch(edges=[edge_row], now=NOW + 3600))
    assert writer._db.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    writer._db.close()
    store = SqliteStore(sqlite_settings(tmp_path), reactor)
    kept = store.open()
    store.abandon()
    assert [(edge.edge_id, edge.last_sequence) for edge in kept.edges] == [("edge-a", 3)]


def test_finished_operations_beyond_the_per_edge_count_go_first(tmp_path: Path) -> None:
    """Finished operations over the bound are dropped oldest first; open ones never."""
    writer = _writer(tmp_path, Retention(operations_per_edge=3))
    batch = Batch()
    batch.operations.append(("open", "a", 0.0, 0, {}))
    for n in range(1, 8):
        batch.operations.append((f"op-{n}", "a", float(n), 1, {}))
    writer.write(batch)
    kept = [row[0] for row in writer._db.execute("SELECT operation_id FROM operations ORDER BY created_at")]
    assert kept == ["open", "op-5", "op-6", "op-7"]


def test_history_is_bounded_in_bytes(tmp_path: Path) -> None:
    """Over the history's byte bound the chunks that ended first go."""
    writer = _writer(tmp_path, Retention(), history_max_bytes=10_000)
    for n in range(30):
        writer.write(Batch(history=[HistoryChunk(f"edge:{n}", 15, float(n), float(n) + 10, b"z" * 1000)]))
    assert writer.history_bytes <= 10_000
    kept = [row[0] for row in writer._db.execute("SELECT series FROM history ORDER BY end")]
    assert kept[-1] == "edge:29" and "edge:0" not in kept


def test_a_file_from_a_newer_release_is_refused_in_one_line(tmp_path: Path) -> None:
    """A schema version above this release's is refused, and the file left as it was."""
    path = tmp_path / "cp.sqlite"
    sqlite_schema.connect(str(path)).close()
    raw = sqlite3.connect(str(path))
    raw.execute(f"PRAGMA user_version={sqlite_schema.SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(StoreError) as error:
        sqlite_schema.connect(str(path))
    message = str(error.value)
    assert "newer" in message and "\n" not in message and str(path) in message


@pytest.mark.parametrize(
    ("content", "expected"),
    [(b"this is not a database, just text" * 100, "not a usable SQLite file"), (None, "another SQLite file")],
)
def test_a_file_that_is_not_a_store_is_refused(tmp_path: Path, content: bytes | None, expected: str) -> None:
    """Garbage, or another program's SQLite file, is refused with one line and left alone."""
    path = tmp_path / "cp.sqlite"
    if content is None:
        other = sqlite3.connect(str(path))
        other.execute("CREATE TABLE notes (text TEXT)")
        other.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(StoreError, match=expected):
        sqlite_schema.connect(str(path))
    assert path.read_bytes() == before


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """store.path naming a directory is an error naming it."""
    with pytest.raises(StoreError, match="is a directory"):
        sqlite_schema.connect(str(tmp_path))


def test_an_older_file_is_migrated_forward_keeping_its_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file at an older schema version is migrated at open, in one transaction, rows kept."""
    path = str(tmp_path / "cp.sqlite")
    connection = sqlite_schema.connect(path)
    connection.execute("INSERT INTO meta VALUES ('fleet_sequence', '7')")
    connection.close()
    migrations = dict(sqlite_schema.MIGRATIONS)
    migrations[sqlite_schema.SCHEMA_VERSION + 1] = ("ALTER TABLE edges ADD COLUMN note TEXT",)
    monkeypatch.setattr(sqlite_schema, "MIGRATIONS", migrations)
    monkeypatch.setattr(sqlite_schema, "SCHEMA_VERSION", sqlite_schema.SCHEMA_VERSION + 1)
    migrated = sqlite_schema.connect(path)
    assert migrated.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION
    assert "note" in [row[1] for row in migrated.execute("PRAGMA table_info(edges)")]
    assert migrated.execute("SELECT value FROM meta").fetchone()[0] == "7"


def test_a_block_written_before_a_field_was_declared_reads_its_default() -> None:
    """A block names its fields: one without a field declared later reads it
    empty; values of the wrong type, or bytes that are no block, are refused."""
    names, rows = marshal.loads(stored_forms.event_block([_event("edge-a", 1, 1)]))
    at = names.index("node_id")
    older = marshal.dumps((names[:at] + names[at + 1 :], [rows[0][:at] + rows[0][at + 1 :]]), 2)
    [event] = stored_forms.events_of_block(older)
    assert (event.edge_id, event.node_id, event.message) == ("edge-a", "", "m")
    wrong = marshal.dumps((names, [("not a number", *rows[0][1:])]), 2)
    for bad in (wrong, b"\x00garbage", marshal.dumps("a string", 2)):
        with pytest.raises(stored_forms.BadRecord):
            stored_forms.events_of_block(bad)


def _row_with(field: str, value: Any) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    names, rows = marshal.loads(stored_forms.event_block([_event("edge-a", 1, 1), _event("edge-a", 2, 2)]))
    at = names.index(field)
    return names, [rows[0], (*rows[1][:at], value, *rows[1][at + 1 :])]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sequence", -1),
        ("sequence", True),
        ("fleet_sequence", 2.0),
        ("occurred_at", "yesterday"),
        ("occurred_at", None),
        ("kind", 7),
        ("message", b"bytes"),
        ("attributes", {"k": 1}),
        ("attributes", ["k"]),
    ],
)
def test_a_block_with_one_wrong_value_is_refused(field: str, value: Any) -> None:
    """One value of the wrong type (or a negative number) anywhere in a block refuses the block."""
    names, rows = _row_with(field, value)
    with pytest.raises(stored_forms.BadRecord, match=field):
        stored_forms.events_of_block(marshal.dumps((names, rows), 2))


def test_a_block_checks_its_shape_its_edge_and_reads_whole_times() -> None:
    """Rows of another width, names that are not texts, or another edge's event
    are refused; a time written as a whole number reads back as a float."""
    names, rows = _row_with("occurred_at", 5)
    [_, second] = stored_forms.events_of_block(marshal.dumps((names, rows), 2), "edge-a")
    assert second.occurred_at == 5.0 and type(second.occurred_at) is float
    with pytest.raises(stored_forms.BadRecord, match="another edge"):
        stored_forms.events_of_block(marshal.dumps((names, rows), 2), "edge-b")
    wrong_shapes: list[Any] = [
        (names, [rows[0], rows[1][:-1]]),
        (names, [rows[0], list(rows[1])]),
        ((*names[:-1], 3), rows),
    ]
    for bad in wrong_shapes:
        with pytest.raises(stored_forms.BadRecord):
            stored_forms.events_of_block(marshal.dumps(bad, 2))
    assert stored_forms.events_of_block(marshal.dumps((names, []), 2)) == []


def test_a_busy_edge_costs_one_row_per_write(tmp_path: Path) -> None:
    """The events one write has of one edge are one block (one row), cut at the block's bounds."""
    writer = _writer(tmp_path, Retention())
    writer.write(Batch(events=[_event("a", n, n) for n in range(1, 601)] + [_event("b", 1, 601)]))
    rows = writer._db.execute("SELECT edge_id, count FROM events ORDER BY block").fetchall()
    assert rows == [("a", 256), ("b", 1), ("a", 256), ("a", 88)] or rows == [
        ("a", 256),
        ("a", 256),
        ("a", 88),
        ("b", 1),
    ]


# -- a Control Plane restarted on its file -----------------------------------------------


def _store_config(path: Path) -> str:
    return f"store: {{backend: sqlite, path: {path / 'cp.sqlite'}, flush_interval_seconds: 0.05}}\n"


@pytest_twisted.ensureDeferred
async def test_a_restarted_control_plane_shows_what_happened_before(tmp_path: Path) -> None:
    """After a restart: edges known (disconnected), events and operations kept,
    numbers continue, and an idempotency key replays instead of running again."""
    cp = await start_control_plane(config_text=_store_config(tmp_path))
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        code, op = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-once"}
        )
        assert code == 200 and op["state"] == "succeeded"
        code, before = await cp.get_json("/edges/edge-a/events")
        assert code == 200
    finally:
        await cp.stop()
    kinds_before = [e["kind"] for e in before["items"]]
    assert "operation.succeeded" in kinds_before
    last_before = max(e["sequence"] for e in before["items"])
    fleet_before = max(e["fleet_sequence"] for e in before["items"])

    cp = await start_control_plane(config_text=_store_config(tmp_path))
    try:
        code, view = await cp.get_json("/edges/edge-a")
        assert code == 200 and view["connected"] is False
        code, events = await cp.get_json("/edges/edge-a/events")
        kept = [(e["sequence"], e["kind"]) for e in events["items"]]
        assert [k for _, k in kept][: len(kinds_before)] == kinds_before
        assert "edge.disconnected" in [k for _, k in kept]
        code, ops = await cp.get_json("/edges/edge-a/operations")
        assert [(o["operation_id"], o["state"]) for o in ops["items"]] == [(op["operation_id"], "succeeded")]
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        code, again = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-once"}
        )
        assert code == 200 and again["replayed"] is True and again["operation_id"] == op["operation_id"]
        assert edge.commands_seen == []
        code, events = await cp.get_json("/edges/edge-a/events")
        connected = [e for e in events["items"] if e["kind"] == "edge.connected"][-1]
        assert connected["sequence"] > last_before and connected["fleet_sequence"] > fleet_before
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_the_fleet_buffer_takes_the_newest_run_it_can_hold_sharing_the_edges_kept_events(
    tmp_path: Path,
) -> None:
    """Restored: every edge its events; the fleet the newest numbers without a gap,
    no more than ``registry.fleet_events``, each the same kept event as its edge's."""
    writer = _writer(tmp_path, Retention())
    registry = EdgeRegistry(reactor)
    batch = Batch()
    for edge_id in ("edge-a", "edge-b"):
        record = registry.known(edge_id, HELLO)
        record.last_seen = NOW
        batch.edges.append(_edge_row(record))
    # edge-a: fleet numbers 1-3; then a gap (4 was removed); edge-b: 5-14.
    batch.events += [_event("edge-a", n, n) for n in range(1, 4)]
    batch.events += [_event("edge-b", n, n + 4) for n in range(1, 11)]
    batch.meta["fleet_sequence"] = 14
    writer.write(batch)
    writer._db.close()
    cp = await start_control_plane(config_text=_store_config(tmp_path) + "registry: {fleet_events: 5}\n")
    try:
        _, fleet = await cp.get_json("/fleet/events?limit=100")
        assert [e["fleet_sequence"] for e in fleet["items"]] == [10, 11, 12, 13, 14]
        assert fleet["last_sequence"] == 14
        for edge_id, count in (("edge-a", 3), ("edge-b", 10)):
            _, events = await cp.get_json(f"/edges/{edge_id}/events?limit=100")
            assert [e["sequence"] for e in events["items"]] == list(range(1, count + 1))
        # The fleet's newest event is edge-b's newest, as its edge's view shows it.
        _, edge_b = await cp.get_json("/edges/edge-b/events?limit=100")
        newest_of_edge, newest_of_fleet = edge_b["items"][-1], fleet["items"][-1]
        assert newest_of_fleet["edge_id"] == "edge-b" and newest_of_edge["sequence"] == 10
        shared = (set(newest_of_edge) & set(newest_of_fleet)) - {"fleet_sequence"}
        assert {"sequence", "attributes"} <= shared
        assert {k: newest_of_edge[k] for k in shared} == {k: newest_of_fleet[k] for k in shared}
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_edges_past_the_disconnected_bounds_are_not_restored_and_continue_numbering(tmp_path: Path) -> None:
    """Restored on a file with more edges than ``registry.disconnected_edges``: the
    ones that went away last are shown; an older one dialing in numbers on."""
    writer = _writer(tmp_path, Retention())
    registry = EdgeRegistry(reactor)
    batch = Batch()
    fleet = 0
    for i in range(4):
        edge_id = f"edge-{i}"
        record = registry.known(edge_id, HELLO)
        record.last_seen = NOW + i
        batch.edges.append((*_edge_row(record)[:7], 5, 0))
        for n in range(1, 6):
            fleet += 1
            batch.events.append(_event(edge_id, n, fleet))
    batch.meta["fleet_sequence"] = fleet
    writer.write(batch)
    writer._db.close()
    cp = await start_control_plane(config_text=_store_config(tmp_path) + "registry: {disconnected_edges: 2}\n")
    try:
        _, edges = await cp.get_json("/edges")
        assert sorted(e["edge_id"] for e in edges["items"]) == ["edge-2", "edge-3"]
        _, events = await cp.get_json("/edges/edge-3/events")
        assert [e["sequence"] for e in events["items"]] == [1, 2, 3, 4, 5]
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-0")
        _, events = await cp.get_json("/edges/edge-0/events")
        assert [(e["kind"], e["sequence"]) for e in events["items"]] == [("edge.connected", 6)]
        edge.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_an_operation_in_flight_at_the_restart_ends_failed(tmp_path: Path) -> None:
    """An operation the earlier process never saw end is failed, saying why, after the restart."""
    cp = await start_control_plane(config_text=_store_config(tmp_path) + "shutdown: {grace_seconds: 0.1}\n")
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a", command_behaviour="hold")
        posted = ensureDeferred(
            cp.post_json("/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "timeout_seconds": 60})
        )
        await eventually(lambda: edge.held_commands, message="command held")
        store = cp.service.store
        await eventually(lambda: store.health().pending == 0 and store.commits > 0, message="flushed")
        # As a kill -9 would leave it: the file as it is now.
        store.abandon()
    finally:
        await cp.stop()
    code, _ = await posted
    assert code == 503
    cp = await start_control_plane(config_text=_store_config(tmp_path))
    try:
        _, ops = await cp.get_json("/edges/edge-a/operations")
        [op] = ops["items"]
        assert op["state"] == "failed" and "restarted" in op["reason"]
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_store_that_cannot_write_is_reported_and_catches_up(tmp_path: Path) -> None:
    """A failing commit makes /readyz say 503 with the store's error; the batch is written once the disk works."""
    cp = await start_control_plane(config_text=_store_config(tmp_path))
    store = cp.service.store
    writer = store._writer
    real_write = writer.write
    failing = [True]

    def write(batch: Batch) -> Any:
        if failing[0]:
            raise sqlite3.OperationalError("database or disk is full")
        return real_write(batch)

    writer.write = write
    try:
        await connect_edge(cp.edge_wire_port, "edge-a")
        await eventually(lambda: not store.health().writable, message="write failed")
        code, ready = await cp.get_json("/readyz")
        assert code == 503 and ready["store"]["writable"] is False
        assert "disk is full" in ready["store"]["error"]
        metrics = (await (await treq.get(cp.http_url + "/metrics")).text()).splitlines()
        assert "iop_store_writable 0.0" in metrics
        code, out, err = await _iopctl_health(cp.http_url)
        assert code == 1 and "NOT WRITABLE: database or disk is full" in out
        assert err.startswith("iopctl: not_ready: the store cannot write")
        failing[0] = False
        await eventually(lambda: store.health().writable and store.health().pending == 0, message="caught up")
        code, ready = await cp.get_json("/readyz")
        assert code == 200 and ready["store"]["writable"] is True
        code, out, err = await _iopctl_health(cp.http_url)
        assert code == 0 and "sqlite, writing" in out and err == ""
        rows = sqlite3.connect(str(tmp_path / "cp.sqlite")).execute("SELECT edge_id FROM edges").fetchall()
        assert rows == [("edge-a",)]
    finally:
        await cp.stop()


async def _iopctl_health(url: str) -> tuple[int, str, str]:
    """``iopctl health`` against ``url``: exit code, output, errors."""
    args = parse_arguments(["--url", url, "health"])
    out, err = io.StringIO(), io.StringIO()
    repository = ControlPlaneStatusRepository(url, timeout=10)
    code = await run(reactor, args, repository, lambda a: ClientWireClient(url, reactor=reactor), out, err, None)
    return code, out.getvalue(), err.getvalue()


def test_registry_hands_the_store_every_change(tmp_path: Path) -> None:
    """Enrolling, an operation's moves and disconnecting reach the store (what a restart restores)."""
    seen: list[tuple[str, str]] = []

    class Recorder:
        def event_kept(self, event: EventRecord, size: int) -> None:
            seen.append(("event", event.kind))

        def operation_changed(self, operation: OperationRecord) -> None:
            seen.append(("operation", operation.state))

        def edge_changed(self, record: Any) -> None:
            seen.append(("edge", "connected" if record.connected else "disconnected"))

    registry = EdgeRegistry(reactor, RegistryLimits())
    registry.store = Recorder()
    token = registry.connect("edge-a", HeldEdgePeer(), HELLO)
    registry.operations.start_operation(_operation("edge-a", "op-1", state="sent"))
    registry.operations.advance_operation("edge-a", "op-1", "succeeded")
    registry.disconnect("edge-a", token, "gone")
    assert seen == [
        ("event", "edge.connected"),
        ("edge", "connected"),
        ("operation", "sent"),
        ("event", "operation.sent"),
        ("operation", "succeeded"),
        ("event", "operation.succeeded"),
        ("event", "edge.disconnected"),
        ("edge", "disconnected"),
    ]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("store: {backend: disk}", "store.backend: must be one of sqlite, memory, redis, not 'disk'"),
        ("store: {backend: redis}", "store.backend: redis needs cluster.backend: redis"),
        (
            "cluster: {backend: redis}\nstore: {backend: sqlite}",
            "store.backend: sqlite cannot be used with cluster.backend: redis",
        ),
        ("store: {flush_interval_seconds: 120}", "store.flush_interval_seconds: must be between 0.01 and 60 seconds"),
        ("store: {synchronous: sometimes}", "store.synchronous: must be normal or full"),
        ("store: {retention: {events_per_edge: 0}}", "store.retention.events_per_edge"),
        ("store: {retention: {forever: true}}", "store.retention"),
    ],
)
def test_store_settings_errors_name_the_field(text: str, error: str) -> None:
    """A bad store setting is one error naming its dotted field."""
    with pytest.raises(ConfigError) as raised:
        config_from_text(text)
    assert error in str(raised.value)


def test_store_defaults_and_environment() -> None:
    """sqlite under the state directory by default; redis in cluster mode; the environment overrides."""
    assert config_from_text("").store.backend == "sqlite"
    assert config_from_text("", {"STATE_DIRECTORY": "/var/lib/x"}).store.path == "/var/lib/x/control-plane.sqlite"
    assert config_from_text("").store.path == "state/control-plane.sqlite"
    assert config_from_text("cluster: {backend: redis}").store.backend == "redis"
    overridden = config_from_text("", {"IOP_STORE_BACKEND": "memory", "IOP_STORE_PATH": "/tmp/x.sqlite"}).store
    assert (overridden.backend, overridden.path) == ("memory", "/tmp/x.sqlite")
    assert config_from_text("history: {max_bytes: 2097152}").store.history_max_bytes == 2097152


#: Capacity history sampled fast (the client tests' tiers), on the SQLite store.
FAST_HISTORY = (
    "history:\n  interval_seconds: 0.2\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 0.4, keep_hours: 1}\n  - {step_seconds: 2, keep_hours: 2}\n"
)


@pytest_twisted.ensureDeferred
async def test_capacity_history_survives_a_restart_on_the_sqlite_store(tmp_path: Path) -> None:
    """The fleet's and an edge's history sampled before a restart is served after it, from the file."""
    config = _store_config(tmp_path) + FAST_HISTORY
    cp = await start_control_plane(config_text=config)
    try:
        await connect_edge(cp.edge_wire_port, "edge-a")
        history = cp.service.history
        await eventually(lambda: history.samples >= 6, timeout=10, message="six samples")
        code, before = await cp.get_json("/fleet/history?from=-60s&series=capacity")
        assert code == 200 and before["points"]
        code, edge_before = await cp.get_json("/edges/edge-a/history?from=-60s&series=capacity")
        assert code == 200 and edge_before["points"]
    finally:
        await cp.stop()
    cp = await start_control_plane(
        config_text=config.replace("interval_seconds: 0.2", "enabled: false\n  interval_seconds: 0.2")
    )
    try:
        code, after = await cp.get_json("/fleet/history?from=-60s&series=capacity")
        assert code == 200
        kept = {tuple(point) for point in after["points"]}
        assert {tuple(point) for point in before["points"]} <= kept
        code, edge_after = await cp.get_json("/edges/edge-a/history?from=-60s&series=capacity")
        assert code == 200
        assert {tuple(p) for p in edge_before["points"]} <= {tuple(p) for p in edge_after["points"]}
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_kept_deployments_come_back_with_the_file_before_anything_listens(tmp_path: Path) -> None:
    """A deployment written to the SQLite file is in what the store hands back when it opens again
    (so the deployment service has it before any view answers), not only from a later read."""
    first = SqliteStore(sqlite_settings(tmp_path), reactor)
    first.open()
    first.startService()
    first.deployment_write("chat", b'{"generation": 2}')
    first.flush()
    await eventually(lambda: first.health().pending == 0, message="flushed")
    await maybeDeferred(first.stopService)
    again = SqliteStore(sqlite_settings(tmp_path), reactor)
    kept = again.open()
    assert kept.deployments == (("chat", b'{"generation": 2}'),)
    assert not kept.empty
