"""The ``memory`` store: nothing outlives the process.

Events, operations, edges and rollouts stay where the registry and the
rollout service keep them anyway (bounded there); this backend only keeps
the capacity history, in memory, within a byte bound (the oldest chunks
go first), the SLOs and the deployments. For tests and throw-away runs; the default is ``sqlite``.
"""

from __future__ import annotations

import sys
from bisect import bisect_left, insort
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.store.interface import HistoryChunk, KeptState, StoreHealth

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
    from twisted_iop.controlplane.rollouts.states import Rollout

#: What one kept chunk costs besides its bytes (the object, its key, the dict slot).
CHUNK_OVERHEAD_BYTES = 200
#: The history's byte bound when none is given.
DEFAULT_HISTORY_BYTES = 256 * 1024 * 1024


def chunk_bytes(chunk: HistoryChunk) -> int:
    """Estimated bytes one kept chunk takes."""
    return CHUNK_OVERHEAD_BYTES + len(chunk.data) + sys.getsizeof(chunk.series)


class MemoryHistory:
    """History chunks in memory by key, bounded in bytes (the chunk that
    ended first is forgotten first). Used by the memory store, and by the
    other stores as the test double of their history part.

    Per tier, the chunks' keys are kept sorted by end (``bisect``): expiry
    cuts the part that ended before, and the byte bound takes the oldest
    of the tiers' first ones, so neither looks at the chunks it keeps (at
    10,000 edges, sorting every chunk at each write once over the bound
    cost more than the write).
    """

    def __init__(self, max_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        self.max_bytes = max_bytes
        self._chunks: dict[tuple[str, int], dict[float, HistoryChunk]] = {}
        #: Per tier (step): ``(end, series, start)`` of each kept chunk, in order.
        self._ends: dict[int, list[tuple[float, str, float]]] = {}
        self.bytes = 0
        #: Chunks forgotten for the byte bound.
        self.evicted = 0

    def __len__(self) -> int:
        return sum(len(chunks) for chunks in self._chunks.values())

    def write(self, chunk: HistoryChunk) -> None:
        """Keep ``chunk`` (replacing the one with its key)."""
        chunks = self._chunks.setdefault((chunk.series, chunk.step), {})
        ends = self._ends.setdefault(chunk.step, [])
        old = chunks.get(chunk.start)
        if old is not None:
            self.bytes -= chunk_bytes(old)
            _remove(ends, (old.end, old.series, old.start))
        chunks[chunk.start] = chunk
        insort(ends, (chunk.end, chunk.series, chunk.start))
        self.bytes += chunk_bytes(chunk)
        if self.bytes > self.max_bytes:
            self._evict()

    def read(self, series: Sequence[str], step: int, start: float, end: float) -> list[HistoryChunk]:
        """The chunks of ``series`` at ``step`` overlapping ``[start, end]``."""
        found: list[HistoryChunk] = []
        for name in sorted(set(series)):
            chunks = self._chunks.get((name, step))
            if not chunks:
                continue
            found.extend(chunk for _, chunk in sorted(chunks.items()) if chunk.end >= start and chunk.start <= end)
        return found

    def expire(self, step: int, before: float) -> None:
        """Forget the chunks of ``step`` that ended before ``before``."""
        ends = self._ends.get(step)
        if not ends:
            return
        cut = bisect_left(ends, (before,))
        for _, series, start in ends[:cut]:
            self._forget(series, step, start)
        del ends[:cut]

    def _forget(self, series: str, step: int, start: float) -> None:
        chunks = self._chunks[(series, step)]
        self.bytes -= chunk_bytes(chunks.pop(start))
        if not chunks:
            del self._chunks[(series, step)]

    def _evict(self) -> None:
        """Forget the chunks that ended first (of any tier) until within the bound."""
        taken = dict.fromkeys(self._ends, 0)
        while self.bytes > self.max_bytes:
            oldest: Optional[tuple[float, str, float]] = None
            oldest_step = 0
            for step, ends in self._ends.items():
                at = taken[step]
                if at < len(ends) and (oldest is None or ends[at] < oldest):
                    oldest, oldest_step = ends[at], step
            if oldest is None:
                break
            taken[oldest_step] += 1
            self._forget(oldest[1], oldest_step, oldest[2])
            self.evicted += 1
        for step, count in taken.items():
            del self._ends[step][:count]


def _remove(ends: list[tuple[float, str, float]], entry: tuple[float, str, float]) -> None:
    at = bisect_left(ends, entry)
    if at < len(ends) and ends[at] == entry:
        del ends[at]


class NothingToRestore(Service):
    """The part of a store that writes no event, operation, edge or rollout
    and hands nothing back at open: the memory store (nothing outlives the
    process) and the Redis one (the replicas' journal keeps them)."""

    name = "store"

    def open(self) -> KeptState:
        """Nothing to read back."""
        return KeptState()

    def event_kept(self, event: EventRecord, size: int) -> None:
        """Not written here."""

    def operation_changed(self, operation: OperationRecord) -> None:
        """Not written here."""

    def edge_changed(self, record: EdgeRecord) -> None:
        """Not written here."""

    def rollout_changed(self, rollout: Rollout) -> None:
        """Not written here."""


class MemoryStore(NothingToRestore):
    """A store that keeps nothing across restarts (``store.backend: memory``)."""

    backend = "memory"

    def __init__(self, history_max_bytes: int = DEFAULT_HISTORY_BYTES) -> None:
        self.history = MemoryHistory(history_max_bytes)
        #: The SLOs, by name (kept only while the process lives).
        self.slos: dict[str, bytes] = {}
        #: The deployments, by name (kept only while the process lives).
        self.deployments: dict[str, bytes] = {}

    def slo_write(self, name: str, data: bytes) -> None:
        """Keep an SLO in memory."""
        self.slos[name] = bytes(data)

    def slo_delete(self, name: str) -> None:
        """Forget an SLO."""
        self.slos.pop(name, None)

    def slo_read(self) -> Deferred[dict[str, bytes]]:
        """The SLOs kept in memory."""
        return succeed(dict(self.slos))

    def deployment_write(self, name: str, data: bytes) -> None:
        """Keep a deployment in memory."""
        self.deployments[name] = bytes(data)

    def deployment_delete(self, name: str) -> None:
        """Forget a deployment."""
        self.deployments.pop(name, None)

    def deployment_read(self) -> Deferred[dict[str, bytes]]:
        """The deployments kept in memory."""
        return succeed(dict(self.deployments))

    def history_write(self, chunk: HistoryChunk) -> None:
        """Keep ``chunk`` in memory."""
        self.history.write(chunk)

    def history_read(self, series: Sequence[str], step: int, start: float, end: float) -> Deferred[list[HistoryChunk]]:
        """The chunks kept in memory."""
        return succeed(self.history.read(series, step, start, end))

    def history_expire(self, step: int, before: float) -> None:
        """Forget the old chunks."""
        self.history.expire(step, before)

    def health(self) -> StoreHealth:
        """Always writable."""
        return StoreHealth(backend=self.backend, writable=True)

    def close(self) -> Deferred[None]:
        """Nothing to write."""
        return succeed(None)
