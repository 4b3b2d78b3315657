"""What the Control Plane keeps across restarts: one interface, three backends.

A :class:`Store` is told of every change worth keeping as it happens (an
event recorded, an operation changed, an edge enrolled or gone, a rollout
stepped, a chunk of capacity history written, an SLO's
buckets, a deployment) and hands back, when it
opens, what an earlier process kept (:class:`KeptState`). The registry,
the gateway, the rollouts and the history ask nothing else of it, so none
of them knows which backend it has:

* ``memory`` (:mod:`.memory`): nothing survives the process (tests,
  throw-away runs); history is kept in memory within its bounds;
* ``sqlite`` (:mod:`.sqlite`): the embedded default, one file, written
  by one thread in batched transactions (WAL);
* ``redis`` (:mod:`.redis`): cluster mode, where the replicas' journal
  already keeps events, operations and rollouts in Redis; this backend
  keeps the capacity history there too.

Every store is also a ``twisted.application.service.Service``: started
after :meth:`Store.open`, and its stop writes what is queued. Every write
method is called on the reactor thread and must return at once: a backend queues the change (coalesced: the newest state of an
operation, an edge or a rollout replaces a queued older one) and writes it
later, off the reactor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Protocol

import attrs
from twisted.internet.defer import Deferred

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.operations import OperationRecord

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
    from twisted_iop.controlplane.rollouts.states import Rollout


class StoreError(Exception):
    """The store cannot be opened or used (its message is one line for the operator)."""


@attrs.frozen
class HistoryChunk:
    """A stretch of one history series at one tier, as its encoded bytes.

    The key is ``(series, step, start)``: a later write of the same key
    replaces the chunk (the open chunk of a series is written again as it
    grows). ``start`` and ``end`` are the times of its first and last point
    (seconds since the epoch), so a read can pick the chunks that overlap
    a range without decoding them.
    """

    series: str
    #: The tier's step in seconds (15, 60, 600 ...): which tier it belongs to
    #: (negated for the column chunks of every edge, kept in ``history.edge_tiers``).
    step: int
    start: float
    end: float
    data: bytes


class HistoryStore(Protocol):
    """Where capacity history is kept (the history service's only storage)."""

    def history_write(self, chunk: HistoryChunk) -> None:
        """Keep ``chunk``, replacing a kept chunk with the same key."""

    def history_read(self, series: Sequence[str], step: int, start: float, end: float) -> Deferred[list[HistoryChunk]]:
        """The kept chunks of ``series`` at tier ``step`` that overlap
        ``[start, end]`` (writes queued before the call included), ordered
        by series then start."""

    def history_expire(self, step: int, before: float) -> None:
        """Forget the chunks of tier ``step`` whose last point is before ``before``."""


class SloStore(Protocol):
    """Where SLOs are kept: each one's spec, buckets and alerts, as the bytes
    of its stored form (``SloState.as_json``), by name."""

    def slo_write(self, name: str, data: bytes) -> None:
        """Keep SLO ``name`` (replacing what was kept under that name)."""

    def slo_delete(self, name: str) -> None:
        """Forget SLO ``name``."""

    def slo_read(self) -> Deferred[dict[str, bytes]]:
        """Every kept SLO by name (writes and deletes queued before the call included)."""


class DeploymentStore(Protocol):
    """Where deployments are kept: each one's spec, generation and placement,
    as the bytes of its stored form, by name."""

    def deployment_write(self, name: str, data: bytes) -> None:
        """Keep deployment ``name`` (replacing what was kept under that name)."""

    def deployment_delete(self, name: str) -> None:
        """Forget deployment ``name``."""

    def deployment_read(self) -> Deferred[dict[str, bytes]]:
        """Every kept deployment by name (writes and deletes queued before the call included)."""


@attrs.frozen
class KeptEdge:
    """An edge as an earlier process last wrote it."""

    edge_id: str
    #: What it said at hello: ``labels``, ``software_version``,
    #: ``protocol_version`` and its compact catalog, as JSON values.
    hello: dict[str, Any]
    #: Whether it was connected when last written (a process killed while
    #: it was connected never wrote its disconnect).
    connected: bool
    connected_at: Optional[float]
    disconnected_at: Optional[float]
    last_seen: float
    enrollments: int
    #: The newest sequence of its own event numbering, and the newest
    #: ``edge_sequence`` it relayed.
    last_sequence: int
    last_edge_sequence: int


@attrs.frozen
class KeptState:
    """Everything an earlier process kept, as the store hands it back on open."""

    #: The newest fleet sequence ever given (numbering continues after it).
    fleet_sequence: int = 0
    edges: tuple[KeptEdge, ...] = ()
    #: The newest events, oldest first (by fleet sequence).
    events: tuple[EventRecord, ...] = ()
    #: The kept operations, oldest first (by creation).
    operations: tuple[OperationRecord, ...] = ()
    #: The kept rollouts as JSON values (``cluster.rollout_store.rollout_dict``), oldest first.
    rollouts: tuple[dict[str, Any], ...] = ()
    #: The newest sequence of the rollouts' own event buffer.
    rollout_event_sequence: int = 0
    #: The kept SLOs' stored forms by name, when the store read them at open
    #: (SQLite); None: ask :meth:`SloStore.slo_read` (memory, Redis).
    slos: Optional[tuple[tuple[str, bytes], ...]] = None
    #: The kept deployments' stored forms by name, when the store read them at
    #: open (SQLite); None: ask :meth:`DeploymentStore.deployment_read` (memory, Redis).
    deployments: Optional[tuple[tuple[str, bytes], ...]] = None

    @property
    def empty(self) -> bool:
        """Whether nothing was kept (a new store)."""
        return not (
            self.fleet_sequence or self.edges or self.operations or self.rollouts or self.slos or self.deployments
        )


@attrs.frozen
class StoreHealth:
    """Whether the store is writing, for ``/readyz``, ``iopctl`` and ``/metrics``."""

    backend: str
    #: False when the last write failed (disk full, file gone, read-only).
    writable: bool
    #: The last write error, one line ("" when writable).
    error: str = ""
    #: Changes queued and not yet on disk.
    pending: int = 0
    #: Estimated bytes of those changes.
    pending_bytes: int = 0
    #: Changes dropped because the queue was over its byte bound while the
    #: disk could not keep up (each one also counted in a log line).
    dropped: int = 0
    #: Seconds since the last successful commit (None: nothing written yet).
    last_commit_age: Optional[float] = None
    #: The file's path ("" for memory and redis).
    path: str = ""
    #: Bytes of the file and its write-ahead log (0 for memory and redis).
    file_bytes: int = 0
    #: Transactions committed, rows written and rows removed by the
    #: retention bounds since start, and the seconds the commits took.
    commits: int = 0
    rows_written: int = 0
    rows_trimmed: int = 0
    commit_seconds: float = 0.0


class Store(HistoryStore, SloStore, DeploymentStore, Protocol):
    """What the Control Plane keeps across restarts (see the module's docstring)."""

    #: ``memory``, ``sqlite`` or ``redis``.
    backend: str

    def open(self) -> KeptState:
        """Open the store (making it if new) and read back what was kept;
        raises :class:`StoreError`. Called once, before anything listens
        (start-up waits for it: a store that is read is a store that is whole)."""

    def event_kept(self, event: EventRecord, size: int) -> None:
        """An event was recorded (numbered); ``size`` is its estimated bytes in memory."""

    def operation_changed(self, operation: OperationRecord) -> None:
        """An operation was created or changed (its whole current state is kept)."""

    def edge_changed(self, record: EdgeRecord) -> None:
        """An edge enrolled, or its connection ended."""

    def rollout_changed(self, rollout: Rollout) -> None:
        """A rollout was created or changed."""

    def health(self) -> StoreHealth:
        """How the store is doing now."""

    def close(self) -> Deferred[None]:
        """Write what is queued and close (at stop)."""
