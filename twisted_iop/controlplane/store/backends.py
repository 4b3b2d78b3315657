"""Which store a Control Plane gets, from ``store.backend``."""

from __future__ import annotations

from typing import Any

from twisted_iop.controlplane.store.interface import Store
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.store.settings import MEMORY, SQLITE, StoreSettings
from twisted_iop.controlplane.store.sqlite import SqliteStore


def make_store(settings: StoreSettings, reactor: Any) -> Any:
    """The store ``settings`` describe (not opened yet): a
    :class:`~twisted_iop.controlplane.store.interface.Store` that is also a
    ``Service``."""
    store: Store
    if settings.backend == SQLITE:
        store = SqliteStore(settings, reactor)
    elif settings.backend == MEMORY:
        store = MemoryStore(settings.history_max_bytes)
    else:
        # Cluster mode: Redis keeps events, operations and rollouts through
        # the replicas' journal; the history's chunks are in memory here.
        store = MemoryStore(settings.history_max_bytes)
    return store
