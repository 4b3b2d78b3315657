"""The SQLite file: its tables, its version, and opening it safely.

The file says what it is twice: ``PRAGMA application_id`` marks it as a
Control Plane store (another SQLite file is refused rather than written
to) and ``PRAGMA user_version`` is its schema version. An older version is
migrated forward in one transaction at open; a newer one (written by a
newer release) is refused with one line, so a downgrade never scribbles
over data it does not understand.

Write-ahead logging (``journal_mode=WAL``) lets a reader (``--check``,
the history's reads) look while the writer writes, and makes every commit
atomic: a process killed mid-write leaves the last committed state.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from twisted_iop.controlplane.store.interface import StoreError

#: "IOPc" as a big-endian int: this file is a Control Plane store.
APPLICATION_ID = 0x494F5063
#: The schema this code writes (and reads; older ones are migrated to it).
SCHEMA_VERSION = 3
#: The write-ahead log is truncated to this after a checkpoint.
JOURNAL_SIZE_LIMIT = 64 * 1024 * 1024


#: The statements that take a file from version ``n - 1`` to ``n``.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE edges (
            edge_id TEXT PRIMARY KEY,
            hello TEXT NOT NULL,
            connected INTEGER NOT NULL,
            connected_at REAL,
            disconnected_at REAL,
            last_seen REAL NOT NULL,
            enrollments INTEGER NOT NULL,
            last_sequence INTEGER NOT NULL DEFAULT 0,
            last_edge_sequence INTEGER NOT NULL DEFAULT 0
        )""",
        # Events in blocks: each row holds one edge's events of one write, in
        # order (stored_forms.event_block: the field names, then a row of
        # values per event, in marshal's format 2), so a busy edge costs one
        # row per flush, not one per event.
        # Rows are appended in fleet order (the block number); the other
        # columns are what retention and loading select on.
        """CREATE TABLE events (
            block INTEGER PRIMARY KEY,
            edge_id TEXT NOT NULL,
            first_sequence INTEGER NOT NULL,
            last_sequence INTEGER NOT NULL,
            last_fleet_sequence INTEGER NOT NULL,
            recorded_at REAL NOT NULL,
            count INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            body BLOB NOT NULL
        )""",
        "CREATE INDEX events_by_edge ON events (edge_id, last_sequence)",
        """CREATE TABLE operations (
            operation_id TEXT PRIMARY KEY,
            edge_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            finished INTEGER NOT NULL,
            body TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )""",
        "CREATE INDEX operations_by_edge ON operations (edge_id, created_at)",
        """CREATE TABLE rollouts (
            rollout_id TEXT PRIMARY KEY,
            created_at REAL NOT NULL,
            settled INTEGER NOT NULL,
            body TEXT NOT NULL,
            bytes INTEGER NOT NULL
        )""",
        """CREATE TABLE history (
            series TEXT NOT NULL,
            step INTEGER NOT NULL,
            start REAL NOT NULL,
            end REAL NOT NULL,
            data BLOB NOT NULL,
            PRIMARY KEY (series, step, start)
        ) WITHOUT ROWID""",
        "CREATE INDEX history_by_end ON history (step, end)",
    ),
    # SLOs: each one's spec, buckets and alerts (slo/evaluator.py's stored form), by name.
    2: ("CREATE TABLE slos (name TEXT PRIMARY KEY, data BLOB NOT NULL)",),
    # Deployments: each one's spec, generation and placement (deployments/service.py's stored form), by name.
    3: ("CREATE TABLE deployments (name TEXT PRIMARY KEY, data BLOB NOT NULL)",),
}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


def check_path(path: str) -> Path:
    """``path`` as a Path if a store can live there; raises :class:`StoreError`
    (a directory, an unwritable file or directory)."""
    file = Path(path)
    if file.is_dir():
        raise StoreError(f"store.path {path}: is a directory, not a file")
    if file.exists():
        if not os.access(file, os.R_OK | os.W_OK):
            raise StoreError(f"store.path {path}: not readable and writable by this user")
        return file
    directory = file.parent
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise StoreError(f"store.path {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoreError(f"store.path {path}: cannot create the file (directory {existing} is not writable)")
    return file


def connect(path: str, synchronous: str = "normal", create: bool = True) -> sqlite3.Connection:
    """Open the store at ``path`` (made with its directory when missing and
    ``create``), migrated to :data:`SCHEMA_VERSION`; raises :class:`StoreError`."""
    file = check_path(path)
    if not file.exists() and not create:
        raise StoreError(f"store.path {path}: no such file")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        if not file.exists():
            # Only its owner reads the audit (SQLite gives its -wal and -shm
            # files the mode of the database file).
            os.close(os.open(file, os.O_CREAT | os.O_WRONLY, 0o600))
        connection = sqlite3.connect(str(file), isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as e:
        raise StoreError(f"store.path {path}: cannot open: {e}") from None
    try:
        _prepare(connection, path, synchronous)
    except sqlite3.DatabaseError as e:
        connection.close()
        raise StoreError(f"store.path {path}: not a usable SQLite file ({e})") from None
    except StoreError:
        connection.close()
        raise
    return connection


def _prepare(connection: sqlite3.Connection, path: str, synchronous: str) -> None:
    version = _checked_version(connection, path)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
    connection.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
    connection.execute("PRAGMA busy_timeout=5000")
    if version < SCHEMA_VERSION:
        migrate(connection, version)


def _checked_version(connection: sqlite3.Connection, path: str) -> int:
    """The file's schema version; raises :class:`StoreError` if it is not a
    store, or is of a newer version than this release reads."""
    application_id = connection.execute("PRAGMA application_id").fetchone()[0]
    version: int = connection.execute("PRAGMA user_version").fetchone()[0]
    tables = connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if application_id != APPLICATION_ID and (application_id or tables):
        raise StoreError(f"store.path {path}: is not a twisted-iop Control Plane store (another SQLite file)")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"store.path {path}: written by a newer twisted-iop (schema version {version}; "
            f"this one reads up to {SCHEMA_VERSION}): run the newer release, or move the file away"
        )
    return version


def migrate(connection: sqlite3.Connection, version: int) -> None:
    """Take the file from ``version`` to :data:`SCHEMA_VERSION` in one transaction."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                connection.execute(statement)
        connection.execute(f"PRAGMA application_id={APPLICATION_ID}")
        connection.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise


def inspect(path: str) -> str:
    """What is at ``path``, read only: "new file", or its schema version
    and size; raises :class:`StoreError` for anything :func:`connect`
    would refuse."""
    file = check_path(path)
    if not file.exists():
        return "a new file will be created"
    try:
        connection = sqlite3.connect(f"file:{file}?mode=ro", uri=True)
    except sqlite3.Error as e:
        raise StoreError(f"store.path {path}: cannot open: {e}") from None
    try:
        version = _checked_version(connection, path)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"store.path {path}: not a usable SQLite file ({e})") from None
    finally:
        connection.close()
    size = file_bytes(path)
    migrate_note = f", will be migrated to {SCHEMA_VERSION}" if version < SCHEMA_VERSION else ""
    return f"schema version {version}{migrate_note}, {size} bytes"


def file_bytes(path: str) -> int:
    """Bytes of the file and its write-ahead log (0 when missing)."""
    total = 0
    for suffix in ("", "-wal"):
        with contextlib.suppress(OSError):
            total += os.stat(path + suffix).st_size
    return total
