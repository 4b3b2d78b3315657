"""Which store a Control Plane gets, from ``store.backend``."""

from __future__ import annotations

from typing import Any

from twisted_iop.controlplane.cluster.settings import ClusterConfig
from twisted_iop.controlplane.store import sqlite_schema
from twisted_iop.controlplane.store.interface import Store
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.store.redis import RedisStore
from twisted_iop.controlplane.store.settings import MEMORY, SQLITE, StoreSettings
from twisted_iop.controlplane.store.sqlite import SqliteStore
from twisted_iop.eventloop.reactor_types import Reactor


def make_store(settings: StoreSettings, reactor: Reactor, cluster: ClusterConfig = ClusterConfig()) -> Any:
    """The store ``settings`` describe (not opened yet): a
    :class:`~twisted_iop.controlplane.store.interface.Store` that is also a
    ``Service``."""
    store: Store
    if settings.backend == SQLITE:
        store = SqliteStore(settings, reactor)
    elif settings.backend == MEMORY:
        store = MemoryStore(settings.history_max_bytes)
    else:
        # Cluster mode: attached to the replica's link once it is made.
        store = RedisStore(cluster.key_prefix, cluster.replica_id, reactor, settings.history_max_bytes)
    return store


def describe_store(settings: StoreSettings) -> str:
    """The store in a few words, once checked (``--check``); raises
    :class:`~twisted_iop.controlplane.store.interface.StoreError`.

    An SQLite file is only read here: checked to be a store of a version
    this release reads, never created or migrated.
    """
    if settings.backend != SQLITE:
        return f"store: {settings.backend}"
    return f"store: sqlite at {settings.path} ({sqlite_schema.inspect(settings.path)})"
