"""Settings of the store (``store`` in control-plane.yaml), parsed once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

from twisted_iop.configuration import ConfigError, EnvironmentConfigError, Section

MEMORY = "memory"
SQLITE = "sqlite"
REDIS = "redis"
#: What ``store.backend`` may say (``redis`` comes with ``cluster.backend: redis``).
BACKENDS = (SQLITE, MEMORY, REDIS)

#: The file's name in the state directory.
FILE_NAME = "control-plane.sqlite"
#: systemd's ``StateDirectory=`` sets this to the directory it made.
ENV_STATE_DIRECTORY = "STATE_DIRECTORY"
#: Overrides ``store.path``.
ENV_STORE_PATH = "IOP_STORE_PATH"
#: Overrides ``store.backend``.
ENV_STORE_BACKEND = "IOP_STORE_BACKEND"
#: Where the file goes when neither the config nor systemd says: under the
#: working directory.
DEFAULT_DIRECTORY = "state"


def default_path(environ: Mapping[str, str]) -> str:
    """``$STATE_DIRECTORY/control-plane.sqlite`` under systemd, else
    ``state/control-plane.sqlite`` under the working directory."""
    state = environ.get(ENV_STATE_DIRECTORY, "").split(":")[0]
    return str(Path(state or DEFAULT_DIRECTORY) / FILE_NAME)


@attrs.frozen
class Retention:
    """How much the store keeps on disk (beyond any bound the oldest go first)."""

    #: Events of one edge, by count and by bytes (of their stored form).
    events_per_edge: int = 1000
    event_bytes_per_edge: int = 1024 * 1024
    #: Events of the whole fleet.
    fleet_events: int = 1_000_000
    #: Finished operations of one edge (open ones are never dropped).
    operations_per_edge: int = 500
    #: Anything older than this (events, finished operations, settled
    #: rollouts, edges gone and not seen since) is dropped.
    max_age_seconds: float = 30 * 86400.0
    #: Events, operations and rollouts together, in bytes of their stored form.
    max_bytes: int = 1024 * 1024 * 1024
    #: Known edges (the ones not seen for longest go first).
    edges: int = 100_000
    #: Rollouts (the oldest settled ones go first).
    rollouts: int = 1000


@attrs.frozen
class StoreSettings:
    """Where and how the Control Plane keeps what happened (``store``)."""

    backend: str = SQLITE
    #: The SQLite file (sqlite only).
    path: str = attrs.field(factory=lambda: default_path(os.environ))
    #: How often queued changes are committed: a change the HTTP API
    #: answered as recorded is on disk within about this long (plus the
    #: commit's own time); a ``kill -9`` loses at most this window.
    flush_interval_seconds: float = 0.5
    #: Changes queued while the disk cannot keep up, in estimated bytes;
    #: beyond it new ones are dropped (counted, logged, ``/readyz`` says so).
    max_pending_bytes: int = 64 * 1024 * 1024
    #: ``fsync`` at every commit (``full``), or let the write-ahead log
    #: reach the disk at its checkpoints (``normal``: a crashed process
    #: loses nothing committed; a power cut may lose the last commits;
    #: neither corrupts the file).
    synchronous: str = "normal"
    retention: Retention = Retention()
    #: The capacity history's chunks, in bytes (the chunk that ended first
    #: goes first); set from ``history.max_bytes``.
    history_max_bytes: int = 512 * 1024 * 1024


def parse_store(section: Section, environ: Mapping[str, str], cluster_backend: str) -> StoreSettings:
    """``store``: the backend and its bounds. In cluster mode the backend is
    ``redis`` (the replicas share Redis); saying otherwise is an error."""
    section.reject_unknown(
        {"backend", "path", "flush_interval_seconds", "max_pending_bytes", "synchronous", "retention"}
    )
    backend_env = environ.get(ENV_STORE_BACKEND, "")
    default_backend = REDIS if cluster_backend == REDIS else SQLITE
    backend = backend_env or section.string("backend", default_backend)
    if backend not in BACKENDS:
        where = f"environment variable {ENV_STORE_BACKEND}" if backend_env else section.field_path("backend")
        error = EnvironmentConfigError if backend_env else ConfigError
        raise error(f"{where}: must be one of {', '.join(BACKENDS)}, not {backend[:40]!r}")
    if (backend == REDIS) != (cluster_backend == REDIS):
        raise ConfigError(
            f"{section.field_path('backend')}: {backend} "
            + (
                "needs cluster.backend: redis (the replicas share Redis)"
                if backend == REDIS
                else "cannot be used with cluster.backend: redis (the replicas keep everything in Redis)"
            )
        )
    path_env = environ.get(ENV_STORE_PATH, "")
    path = path_env or section.string("path", "") or default_path(environ)
    if "\0" in path:
        raise ConfigError(f"{section.field_path('path')}: contains a NUL character")
    synchronous = section.string("synchronous", "normal")
    if synchronous not in ("normal", "full"):
        raise ConfigError(f"{section.field_path('synchronous')}: must be normal or full, not {synchronous[:40]!r}")
    flush = section.number("flush_interval_seconds", 0.5)
    if not 0.01 <= flush <= 60:
        raise ConfigError(f"{section.field_path('flush_interval_seconds')}: must be between 0.01 and 60 seconds")
    return StoreSettings(
        backend=backend,
        path=path,
        flush_interval_seconds=flush,
        max_pending_bytes=section.integer("max_pending_bytes", 64 * 1024 * 1024, minimum=1024 * 1024, maximum=2**40),
        synchronous=synchronous,
        retention=parse_retention(section.section("retention")),
    )


def parse_retention(section: Section) -> Retention:
    """``store.retention``: counts, age and bytes."""
    section.reject_unknown(
        {
            "events_per_edge",
            "event_bytes_per_edge",
            "fleet_events",
            "operations_per_edge",
            "max_age_days",
            "max_bytes",
            "edges",
            "rollouts",
        }
    )
    default = Retention()
    return Retention(
        events_per_edge=section.integer("events_per_edge", default.events_per_edge, minimum=1, maximum=10**7),
        event_bytes_per_edge=section.integer(
            "event_bytes_per_edge", default.event_bytes_per_edge, minimum=4096, maximum=2**40
        ),
        fleet_events=section.integer("fleet_events", default.fleet_events, minimum=1, maximum=10**9),
        operations_per_edge=section.integer(
            "operations_per_edge", default.operations_per_edge, minimum=1, maximum=10**6
        ),
        max_age_seconds=section.number("max_age_days", default.max_age_seconds / 86400.0) * 86400.0,
        max_bytes=section.integer("max_bytes", default.max_bytes, minimum=1024 * 1024, maximum=2**44),
        edges=section.integer("edges", default.edges, minimum=1, maximum=10**7),
        rollouts=section.integer("rollouts", default.rollouts, minimum=1, maximum=10**6),
    )
