"""The EdgeRegistry: every Edge the Control Plane knows, its connections and their tokens.

The registry does no I/O. Transports hand it a peer (anything with the
:class:`EdgePeer` shape) when an Edge says hello and get back a
**connection token**; every later state change caused by that connection
(close, status reply, command reply, relayed event) passes the token, and a
token that is no longer the edge's current one changes nothing. So a stale
connection can never remove or overwrite the current one.

It owns the edges (:class:`EdgeRecord`: connected or not, and which are
forgotten past the bounds), their connections and last snapshots; the
rooms beside it own the rest:

* the event log (:mod:`~twisted_iop.controlplane.fleet.event_log`): every
  event, numbered and bounded, and who listens;
* operations (:mod:`~twisted_iop.controlplane.fleet.operation_log`, as
  ``registry.operations``): kept per edge, their states moved only through
  :mod:`~twisted_iop.controlplane.requests.operation_states`, as the gateway's
  command room decides;
* memory (:mod:`~twisted_iop.controlplane.fleet.memory`): byte budgets, shared
  values and the kept-event layout;
* cluster mode's mirror of other replicas' changes
  (:mod:`~twisted_iop.controlplane.cluster.mirror`).

Requests in flight (status, commands) belong to the
:class:`~twisted_iop.controlplane.requests.gateway.EdgeGateway`, which hears about
connection changes and relayed command events through a
:class:`ConnectionObserver`.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Optional, Protocol, Unpack

import attrs
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord, UnknownEdge
from twisted_iop.controlplane.fleet.event_log import EventBuffer, EventJournal, EventLog
from twisted_iop.controlplane.fleet.event_record import EventRecord, EventTexts
from twisted_iop.controlplane.fleet.memory import RegistryLimits, SharedTables
from twisted_iop.controlplane.fleet.operation_log import KeptOperations, OperationLog
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.edge_peer import EdgePeer
from twisted_iop.wire import control_pb2 as pb

SUPERSEDED_MESSAGE = "a newer connection of this edge took over"
#: Forgotten edges whose numbering is kept: two numbers each, about 320
#: bytes with an edge id of 64 characters (the longest), so at most about
#: 31 MiB; as many edges as a store keeps (``store.retention.edges``).
FORGOTTEN_NUMBERING = 100_000
#: The message of every ``edge.connected`` event: one text for all edges
#: (the event names its edge), not one kept per edge.
CONNECTED_MESSAGE = "connected"


class ConnectionObserver(Protocol):
    """What the owner of in-flight requests hears from the registry."""

    def connection_superseded(self, edge_id: str, old_token: int) -> None:
        """Connection ``old_token`` of ``edge_id`` was replaced by a newer one
        (already current when this is called)."""

    def connection_closed(self, edge_id: str, token: int) -> None:
        """The current connection ``token`` of ``edge_id`` closed."""

    def command_event_relayed(self, edge_id: str, token: int, event: pb.EdgeEvent) -> None:
        """Connection ``token`` (current) relayed an event naming a command."""

    def operation_updated(self, operation: OperationRecord) -> None:
        """Another replica changed ``operation`` (cluster mode: the mirror applied it)."""


class KeptChanges(KeptOperations, Protocol):
    """Where the registry reports what should outlive the process: the
    store (:class:`~twisted_iop.controlplane.store.interface.Store`), which
    also takes every numbered event from the event log and every changed
    operation from the operation log."""

    def event_kept(self, event: EventRecord, size: int) -> None:
        """An event was numbered and kept."""

    def edge_changed(self, record: EdgeRecord) -> None:
        """An edge enrolled, or its connection ended."""


class Journal(EventJournal, Protocol):
    """Where a registry in cluster mode sends its changes (the shared store).

    In cluster mode the registry keeps its connections' state at once, but
    events (and the operations they stand for) are recorded only when the
    store has numbered them: they come back through the fleet stream to
    every replica, this one included (``cluster.mirror``).
    """

    def claimed(self, edge_id: str, token: int, hello: EdgeHello, now: float) -> None:
        """Connection ``token`` of ``edge_id`` was accepted here."""

    def released(self, edge_id: str, token: int, reason: str, now: float) -> None:
        """Connection ``token`` of ``edge_id`` (current here) closed."""

    def status_kept(self, edge_id: str, token: int, snapshot: StatusSnapshot) -> None:
        """Connection ``token`` answered a status ask."""


class EdgeRegistry(Service):
    """All edges and their connections (by token); events and operations beside them."""

    name = "registry"
    _log = Logger()

    def __init__(self, clock: IReactorTime, limits: RegistryLimits = RegistryLimits()) -> None:
        self._clock = clock
        self.limits = limits
        self._edges: dict[str, EdgeRecord] = {}
        #: Disconnected edge ids, oldest disconnect first (for the bounds),
        #: with the bytes each kept when it went away.
        self._disconnected: OrderedDict[str, int] = OrderedDict()
        #: Estimated bytes kept of disconnected edges (their sum).
        self.disconnected_bytes = 0
        #: Disconnected edges forgotten for the count or the byte bound.
        self.forgotten_edges = 0
        #: The numbering of forgotten edges (their newest event sequence and
        #: the newest of the edge's own), oldest first: one that dials in
        #: again continues from it, so no sequence of an edge is given twice
        #: (a store keeps its earlier events; a client may have seen them).
        self._forgotten_numbering: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._tokens = itertools.count(1)
        self.event_log = EventLog(clock, limits)
        self._observers: list[ConnectionObserver] = []
        #: Told of every accepted connection (edge id and token) once it is current.
        self._connect_listeners: list[Callable[[str, int], None]] = []
        self.connected_count = 0
        #: Accepted hellos since start (for metrics).
        self.enrollments_total = 0
        self._journal: Optional[Journal] = None
        #: One copy of each value many edges repeat (labels, hellos, counts).
        self.shared = SharedTables()
        self._operation_limits = (limits.operations_per_edge, limits.operation_bytes_per_edge)
        self._store: Optional[KeptChanges] = None
        #: Every edge's operations (dispatched, moved, stored, recorded as events).
        self.operations = OperationLog(clock, self.event_log, self)

    @property
    def store(self) -> Optional[KeptChanges]:
        """The store that keeps events, operations and edges across restarts."""
        return self._store

    @store.setter
    def store(self, store: Optional[KeptChanges]) -> None:
        self._store = store
        self.event_log.sink = store
        self.operations.store = store

    @property
    def journal(self) -> Optional[Journal]:
        """Cluster mode: the shared store that keeps and numbers what happens here."""
        return self._journal

    @journal.setter
    def journal(self, journal: Optional[Journal]) -> None:
        self._journal = journal
        self.event_log.journal = journal

    @property
    def fleet_events(self) -> EventBuffer:
        """The fleet's event buffer (every edge's events, in fleet sequence)."""
        return self.event_log.fleet

    # -- lookups ------------------------------------------------------------

    def get(self, edge_id: str) -> EdgeRecord:
        """The record of ``edge_id``; raises :class:`UnknownEdge`."""
        record = self._edges.get(edge_id)
        if record is None:
            raise UnknownEdge(edge_id)
        return record

    def find(self, edge_id: str) -> Optional[EdgeRecord]:
        """The record of ``edge_id``, or None."""
        return self._edges.get(edge_id)

    def edges(self) -> Iterable[EdgeRecord]:
        """Every known edge (in no particular order)."""
        return self._edges.values()

    @property
    def known_count(self) -> int:
        """How many edges are known, connected or not."""
        return len(self._edges)

    def edge_ids(self) -> list[str]:
        """Every known edge id, sorted."""
        return sorted(self._edges)

    # -- connections --------------------------------------------------------

    def connect(self, edge_id: str, peer: EdgePeer, hello: EdgeHello) -> int:
        """Record a new accepted connection; return its token.

        The newest connection wins: an older connection of the same edge is
        closed and a ``edge.superseded`` event is recorded.
        """
        now = self._clock.seconds()
        record, token, old = self.take_connection(edge_id, peer, hello, now)
        record.last_seen = now
        record.enrollments += 1
        self.enrollments_total += 1
        journal = self._journal
        if old is not None:
            self._log.info("edge {edge_id} superseded by a newer connection", edge_id=edge_id)
            if journal is None:
                self.event_log.record(edge_id, record.events, "edge.superseded", message=SUPERSEDED_MESSAGE)
            self.supersede(edge_id, *old)
        self._log.info(
            "edge {edge_id} connected (enrollment {enrollments})",
            edge_id=edge_id,
            enrollments=record.enrollments,
        )
        if journal is None:
            self.event_log.record(
                edge_id,
                record.events,
                "edge.connected",
                message=CONNECTED_MESSAGE,
                attributes=self.shared.connected_attributes(record.hello.software_version),
            )
        else:
            # The store records edge.superseded / edge.connected: it alone
            # knows whether another replica held the edge.
            journal.claimed(edge_id, token, record.hello, now)
        if self._store is not None:
            self._store.edge_changed(record)
        for listener in list(self._connect_listeners):
            listener(edge_id, token)
        return token

    def take_connection(
        self, edge_id: str, peer: EdgePeer, hello: EdgeHello, connected_at: float
    ) -> tuple[EdgeRecord, int, Optional[tuple[int, EdgePeer]]]:
        """Make ``peer`` the current connection of ``edge_id`` under a fresh
        token (the edge is known from now on); return the record, the token
        and the connection it replaced (its token and peer, to be
        :meth:`supersede`-d by the caller), if one was current."""
        token = next(self._tokens)
        hello = self.shared.hello(hello)
        record = self._edges.get(edge_id)
        old: Optional[tuple[int, EdgePeer]] = None
        if record is None:
            record = self._new_record(edge_id, hello)
        else:
            self.disconnected_bytes -= self._disconnected.pop(edge_id, 0)
            if record.token is not None and record.peer is not None:
                old = (record.token, record.peer)
                self.connected_count -= 1
        record.hello = hello
        record.token = token
        record.peer = peer
        record.connected_at = connected_at
        record.disconnected_at = None
        self.connected_count += 1
        return record, token, old

    def supersede(self, edge_id: str, old_token: int, old_peer: EdgePeer) -> None:
        """Settle what was in flight on a replaced connection and close it."""
        # Requests in flight on the old connection are settled now, not
        # when its socket finally closes (which a stuck peer may delay).
        for observer in list(self._observers):
            observer.connection_superseded(edge_id, old_token)
        old_peer.disconnect(pb.ERROR_CODE_SUPERSEDED, SUPERSEDED_MESSAGE)

    def disconnect(self, edge_id: str, token: int, reason: str) -> bool:
        """Record that connection ``token`` closed; False if it was stale."""
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return False
        now = self._clock.seconds()
        self._log.info("edge {edge_id} disconnected: {reason}", edge_id=edge_id, reason=reason)
        if self._journal is None:
            self.event_log.record(edge_id, record.events, "edge.disconnected", message=reason)
        else:
            self._journal.released(edge_id, token, reason, now)
        self.mark_disconnected(record, token, now)
        return True

    def mark_disconnected(self, record: EdgeRecord, token: int, now: float) -> None:
        """The current connection ``token`` of ``record`` is gone: the edge
        stays known, disconnected, within the bounds."""
        edge_id = record.edge_id
        record.last_seen = record.seen_at()
        record.token = None
        record.peer = None
        record.disconnected_at = now
        self.connected_count -= 1
        for observer in list(self._observers):
            observer.connection_closed(edge_id, token)
        # A disconnected edge keeps a compact catalog: names, target kinds
        # and argument names, without descriptions.
        record.hello = attrs.evolve(record.hello, commands=bounds.compact_catalog(record.hello.commands))
        self.keep_disconnected(record)
        if self._store is not None:
            self._store.edge_changed(record)

    def keep_disconnected(self, record: EdgeRecord) -> None:
        """Count a disconnected edge against the bounds (forgetting the
        oldest beyond them)."""
        kept = record.kept_bytes()
        self._disconnected[record.edge_id] = kept
        self.disconnected_bytes += kept
        self._forget_excess_disconnected()

    def is_kept_disconnected(self, edge_id: str) -> bool:
        """Whether ``edge_id`` is counted as a disconnected edge."""
        return edge_id in self._disconnected

    def _forget_excess_disconnected(self) -> None:
        """Forget the edges that went away first, beyond the count or byte bound.

        An edge whose record still holds an open operation stays (in the
        order it went away) until that operation ends: then
        :meth:`operation_ended` runs this again, so no edge stays listed
        past the bounds for good.
        """
        limits = self.limits
        excess_count = len(self._disconnected) - limits.disconnected_edges
        excess_bytes = self.disconnected_bytes - limits.disconnected_bytes
        if excess_count <= 0 and excess_bytes <= 0:
            return
        chosen: list[str] = []
        for edge_id, kept in self._disconnected.items():
            if excess_count <= 0 and excess_bytes <= 0:
                break
            record = self._edges.get(edge_id)
            if record is not None and (
                record.token is not None or any(not op.finished for op in record.operations_kept or ())
            ):
                continue
            chosen.append(edge_id)
            excess_count -= 1
            excess_bytes -= kept
        for edge_id in chosen:
            self.disconnected_bytes -= self._disconnected.pop(edge_id)
            record = self._edges.pop(edge_id, None)
            if record is not None:
                self.forgotten_edges += 1
                self.remember_numbering(edge_id, record.events.last_sequence, record.events.last_edge_sequence)

    def remember_numbering(self, edge_id: str, last_sequence: int, last_edge_sequence: int) -> None:
        """Keep where the numbering of ``edge_id`` (not known now) stands, for
        when it dials in again (at most :data:`FORGOTTEN_NUMBERING` edges)."""
        numbering = self._forgotten_numbering
        numbering[edge_id] = (last_sequence, last_edge_sequence)
        numbering.move_to_end(edge_id)
        while len(numbering) > FORGOTTEN_NUMBERING:
            numbering.popitem(last=False)

    def _new_record(self, edge_id: str, hello: EdgeHello) -> EdgeRecord:
        record = EdgeRecord(
            edge_id=edge_id,
            hello=hello,
            events=self.event_log.edge_buffer(),
            operation_limits=self._operation_limits,
        )
        numbering = self._forgotten_numbering.pop(edge_id, None)
        if numbering is not None:
            record.events.last_sequence, record.events.last_edge_sequence = numbering
        self._edges[edge_id] = record
        return record

    def known(self, edge_id: str, hello: EdgeHello) -> EdgeRecord:
        """The record of ``edge_id``, made (disconnected) if it is not known yet."""
        return self._edges.get(edge_id) or self._new_record(edge_id, self.shared.hello(hello))

    # -- status -------------------------------------------------------------

    def record_status(self, edge_id: str, token: int, snapshot: StatusSnapshot) -> bool:
        """Keep a checked snapshot that connection ``token`` answered (or, in
        cluster mode, its owner routed); False if ``token`` is stale."""
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return False
        record.last_seen = max(record.last_seen, snapshot.received_at)
        record.snapshot = snapshot
        if self._journal is not None:
            self._journal.status_kept(edge_id, token, snapshot)
        return True

    # -- observers ---------------------------------------------------------------

    def add_connect_listener(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(edge_id, token)`` for every accepted connection, once it is current
        (the deployments send the edge its desired set)."""
        self._connect_listeners.append(listener)

    def add_observer(self, observer: ConnectionObserver) -> None:
        """Tell ``observer`` about superseded connections and command events."""
        self._observers.append(observer)

    def command_event_relayed(self, edge_id: str, token: int, event: pb.EdgeEvent) -> None:
        """Tell the observers that connection ``token`` relayed a command's event."""
        for observer in list(self._observers):
            observer.command_event_relayed(edge_id, token, event)

    def operation_updated(self, operation: OperationRecord) -> None:
        """Tell the observers that another replica changed ``operation``."""
        for observer in list(self._observers):
            observer.operation_updated(operation)

    # -- events -----------------------------------------------------------------

    def record(
        self,
        edge_id: str,
        kind: str,
        *,
        occurred_at: Optional[float] = None,
        token: Optional[int] = None,
        change: Optional[dict[str, object]] = None,
        operation: Optional[OperationRecord] = None,
        **texts: Unpack[EventTexts],
    ) -> EventRecord:
        """Record an event of the Control Plane's own about ``edge_id``
        (:meth:`EventLog.record <twisted_iop.controlplane.fleet.event_log.EventLog.record>`)."""
        return self.event_log.record(
            edge_id,
            self._edges[edge_id].events,
            kind,
            occurred_at=occurred_at,
            token=token,
            change=change,
            operation=operation,
            **texts,
        )

    def record_edge_event(self, edge_id: str, token: int, event: pb.EdgeEvent) -> Optional[EventRecord]:
        """Record an event relayed by connection ``token``; None if stale or refused.

        Kinds the Control Plane records itself (``operation.*``, ``edge.*``)
        are refused: an edge cannot speak for the Control Plane. Events that
        name a command go to the observers (the gateway decides what they
        may change).
        """
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return None
        record.last_seen = self._clock.seconds()
        recorded = self.event_log.relayed(edge_id, record.events, token, event)
        if recorded is not None and event.command_id:
            self.command_event_relayed(edge_id, token, event)
        return recorded

    # -- operations ------------------------------------------------------------

    def operation_ended(self, record: EdgeRecord) -> None:
        """An operation of ``record`` ended: an edge kept disconnected only
        because it was open may now be forgotten past the bounds."""
        if record.token is None and record.edge_id in self._disconnected:
            self._forget_excess_disconnected()
