"""The EdgeRegistry: every Edge the Control Plane knows, and the rules.

The registry does no I/O. Transports hand it a peer (anything with the
:class:`EdgePeer` shape) when an Edge says hello and get back a
**connection token**; every later state change caused by that connection
(close, status reply, command reply, relayed event) passes the token, and a
token that is no longer the edge's current one changes nothing. So a stale
connection can never remove or overwrite the current one.

The registry keeps facts only: what is known of each edge, its events and
its operations. Requests in flight (status, commands) belong to the
:class:`~twisted_iop.controlplane.gateway.EdgeGateway`, which hears about
connection changes and relayed command events through a
:class:`ConnectionObserver`.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Optional, Protocol

import attrs
from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane import bounds, operation_states, records
from twisted_iop.controlplane.operations import LateOutcome, OperationBuffer, OperationRecord
from twisted_iop.controlplane.records import EventBuffer, EventRecord, map_size
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import MAX_COMMAND_ARGUMENTS, MAX_LABELS, MAX_TEXT
from twisted_iop.wire.status_totals import response_counts

#: 9999-12-31T23:59:59.999Z, the last instant ISO 8601 views can show.
MAX_TIME_MS = 253_402_300_799_999

#: Event kind prefixes only the Control Plane records; an edge may not send them.
RESERVED_KIND_PREFIXES = ("operation.", "edge.")
#: At most one ``edge.protocol_violation`` event per edge in this many seconds.
PROTOCOL_VIOLATION_INTERVAL_SECONDS = 60.0


SUPERSEDED_MESSAGE = "a newer connection of this edge took over"
#: The message of every ``edge.connected`` event: one text for all edges
#: (the event names its edge), not one kept per edge.
CONNECTED_MESSAGE = "connected"

#: How much of an offending event kind is quoted in events and logs.
QUOTED_KIND_CHARS = 80


class StatusListener(Protocol):
    """Who hears the end of one status ask (:meth:`EdgePeer.ask_status`)."""

    def status_answered(self, response: Optional[pb.EdgeStatusResponse], error: Optional[Exception]) -> None:
        """The edge's snapshot, or why there is none (exactly one is set)."""


class EdgePeer(Protocol):
    """What the registry needs of a connection: identity and a way to close it."""

    last_received: float

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Ask the edge for a status snapshot; return the ask's request id.

        ``listener.status_answered`` is called exactly once: with the
        snapshot, or with the failure (``CancelledError`` after
        :meth:`cancel_status`). Without ``own_deadline`` no timer is set:
        the caller cancels the ask when it stops waiting.
        """

    def cancel_status(self, request_id: int) -> None:
        """Stop waiting for the status ask ``request_id`` (if it still waits)."""

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command; the answer is awaited until it comes, the caller
        cancels, or the connection ends (the caller owns the deadline)."""

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Close the connection, telling the edge why."""


class UnknownEdge(Exception):
    """No edge with that id is known."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"no edge named {edge_id!r} is known")
        self.edge_id = edge_id


class EdgeNotConnected(Exception):
    """The edge is known but has no current connection."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"edge {edge_id!r} is not connected")
        self.edge_id = edge_id


@attrs.frozen
class RegistryLimits:
    """Bounds on what the registry keeps in memory (counts and estimated bytes).

    docs/security.md ("Memory") derives the worst case from these.
    """

    events_per_edge: int = 1000
    fleet_events: int = 10000
    operations_per_edge: int = 500
    disconnected_edges: int = 10000
    event_bytes_per_edge: int = 1024 * 1024
    fleet_event_bytes: int = 16 * 1024 * 1024
    operation_bytes_per_edge: int = 1024 * 1024
    #: Estimated bytes of everything kept of disconnected edges together;
    #: beyond it the edge that went away first is forgotten.
    disconnected_bytes: int = 256 * 1024 * 1024

    def worst_case(self) -> MemoryBound:
        """The most estimated bytes the registry keeps under these limits
        (docs/security.md, "Memory", quotes these at the defaults)."""
        per_edge = (
            HELLO_LABELS_BYTES
            + 2 * text_bytes(MAX_TEXT)
            + bounds.MAX_CATALOG_BYTES
            + bounds.MAX_SNAPSHOT_BYTES
            + max(self.event_bytes_per_edge, MAX_EVENT_RECORD_BYTES)
            + max(self.operation_bytes_per_edge, MAX_OPERATION_RECORD_BYTES)
        )
        return MemoryBound(
            per_connected_edge=per_edge,
            per_disconnected_edge=per_edge,
            disconnected_total=self.disconnected_bytes + per_edge,
            fleet_events=max(self.fleet_event_bytes, MAX_EVENT_RECORD_BYTES),
        )


def text_bytes(characters: int) -> int:
    """The most a Python string of ``characters`` characters takes (4 bytes each)."""
    return 80 + 4 * characters


def _map_bytes(entries: int, key: int, value: int) -> int:
    """The most a ``str -> str`` map of ``entries`` entries takes."""
    return 64 * entries + 256 + entries * (text_bytes(key) + text_bytes(value))


#: The most one hello's labels take.
HELLO_LABELS_BYTES = _map_bytes(MAX_LABELS, MAX_TEXT, MAX_TEXT)
#: The most one recorded event takes (see :func:`records.event_size`).
MAX_EVENT_RECORD_BYTES = (
    256
    + 3 * 32
    + text_bytes(64)
    + 4 * text_bytes(bounds.MAX_EVENT_ID)
    + text_bytes(bounds.MAX_EVENT_MESSAGE)
    + _map_bytes(bounds.MAX_EVENT_ATTRIBUTES + 1, bounds.MAX_KEY, bounds.MAX_ATTRIBUTE_VALUE)
)
_RESULT_BYTES = _map_bytes(bounds.MAX_RESULT_ENTRIES + 1, bounds.MAX_KEY, bounds.MAX_RESULT_VALUE)
#: The most one finished operation takes: its texts (arguments as the HTTP
#: view admits them), a history of at most five entries, a result and a
#: late outcome.
MAX_OPERATION_RECORD_BYTES = (
    512
    + 3 * 32
    + text_bytes(32)
    + text_bytes(64)
    + 3 * text_bytes(MAX_TEXT)
    + text_bytes(16)
    + text_bytes(64)
    + text_bytes(bounds.MAX_REASON)
    + _map_bytes(MAX_COMMAND_ARGUMENTS, MAX_TEXT, bounds.MAX_ARGUMENT_VALUE)
    + _RESULT_BYTES
    + 5 * (256 + text_bytes(16) + text_bytes(bounds.MAX_REASON))
    + 256
    + text_bytes(16)
    + text_bytes(bounds.MAX_REASON)
    + _RESULT_BYTES
)


@attrs.frozen
class MemoryBound:
    """The most estimated bytes the registry keeps, by part."""

    per_connected_edge: int
    per_disconnected_edge: int
    #: Every disconnected edge together (the budget plus the one edge that
    #: may go past it before the oldest is forgotten).
    disconnected_total: int
    fleet_events: int

    def total(self, connected_edges: int) -> int:
        """The whole registry with ``connected_edges`` edges connected."""
        return self.fleet_events + connected_edges * self.per_connected_edge + self.disconnected_total


@attrs.frozen
class EdgeHello:
    """What an edge said about itself when it enrolled."""

    labels: dict[str, str]
    software_version: str
    protocol_version: str
    commands: tuple[pb.CommandSpec, ...]

    def size(self) -> int:
        """Estimated bytes of what the edge said (labels, version, catalog)."""
        return (
            map_size(self.labels)
            + sys.getsizeof(self.software_version)
            + sys.getsizeof(self.protocol_version)
            + bounds.catalog_size(self.commands)
        )


@attrs.frozen(eq=False)
class StatusSnapshot:
    """The last status an edge sent, and when it arrived (compared by identity).

    It is kept as its serialized bytes (about a fifth of what the parsed
    message and its arena hold) with its counts (:func:`response_counts`),
    taken once, when it arrives: fleet rounds need only the counts, and a
    view that shows the nodes parses the bytes (json_views keeps that
    rendering per snapshot).
    """

    #: The serialized ``EdgeStatusResponse``.
    data: bytes
    received_at: float
    counts: tuple[int, ...]

    @classmethod
    def of(cls, response: pb.EdgeStatusResponse, received_at: float) -> StatusSnapshot:
        """The snapshot of ``response``, received at ``received_at``."""
        return cls(response.SerializeToString(), received_at, response_counts(response))

    @property
    def response(self) -> pb.EdgeStatusResponse:
        """The snapshot parsed from its bytes (a new message on every call)."""
        response = pb.EdgeStatusResponse()
        response.ParseFromString(self.data)
        return response

    def size(self) -> int:
        """Estimated bytes this snapshot keeps: itself, its bytes and its counts."""
        return sys.getsizeof(self) + sys.getsizeof(self.data) + sys.getsizeof(self.counts)


@attrs.define(eq=False)
class EdgeRecord:
    """Everything known about one edge."""

    edge_id: str
    hello: EdgeHello
    events: EventBuffer
    #: The edge's operations (:attr:`operations`); None until first asked
    #: for: most edges never run a command.
    _operations: Optional[OperationBuffer] = None
    #: The capacity and byte budget its operation buffer gets (one tuple
    #: shared by a registry's records).
    operation_limits: tuple[int, int] = (500, 1024 * 1024)
    token: Optional[int] = None
    peer: Optional[EdgePeer] = None
    connected_at: Optional[float] = None
    disconnected_at: Optional[float] = None
    last_seen: float = 0.0
    enrollments: int = 0
    snapshot: Optional[StatusSnapshot] = None
    #: The newest ``edge_sequence`` relayed by this edge (0: none yet).
    last_edge_sequence: int = 0
    #: Events dropped for a reserved kind since the last protocol_violation event.
    violations_unreported: int = 0
    violation_reported_at: Optional[float] = None
    #: The connection whose violation was logged (one warning per connection).
    violation_logged_token: Optional[int] = None

    @property
    def connected(self) -> bool:
        """Whether the edge has a current connection."""
        return self.token is not None

    @property
    def operations(self) -> OperationBuffer:
        """The edge's operation buffer (made on first use)."""
        operations = self._operations
        if operations is None:
            operations = self._operations = OperationBuffer(*self.operation_limits)
        return operations

    @property
    def operations_kept(self) -> Optional[OperationBuffer]:
        """The operation buffer if it was made (fleet-wide walks: none made)."""
        return self._operations

    def seen_at(self) -> float:
        """When the edge was last heard from: any frame of its current
        connection counts, keepalive pings and pongs included."""
        if self.peer is not None:
            return max(self.last_seen, self.peer.last_received)
        return self.last_seen

    def kept_bytes(self) -> int:
        """Estimated bytes the registry keeps for this edge (hello, snapshot, buffers)."""
        snapshot = 0 if self.snapshot is None else self.snapshot.size()
        operations = 0 if self._operations is None else self._operations.bytes
        return self.hello.size() + snapshot + self.events.bytes + operations

    @property
    def command_names(self) -> list[str]:
        """Names in the edge's announced catalog."""
        return [c.name for c in self.hello.commands]


EventListener = Callable[[EventRecord], None]


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


class Journal(Protocol):
    """Where a registry in cluster mode sends its changes (the shared store).

    In cluster mode the registry keeps its connections' state at once, but
    events (and the operations they stand for) are recorded only when the
    store has numbered them: they come back through the fleet stream to
    every replica, this one included (:meth:`EdgeRegistry.apply_event`).
    """

    def claimed(self, edge_id: str, token: int, hello: EdgeHello, now: float) -> None:
        """Connection ``token`` of ``edge_id`` was accepted here."""

    def released(self, edge_id: str, token: int, reason: str, now: float) -> None:
        """Connection ``token`` of ``edge_id`` (current here) closed."""

    def status_kept(self, edge_id: str, token: int, snapshot: StatusSnapshot) -> None:
        """Connection ``token`` answered a status ask."""

    def append(
        self,
        event: EventRecord,
        token: Optional[int],
        change: dict[str, Any],
        operation: Optional[OperationRecord],
    ) -> None:
        """Record ``event`` (fenced by ``token`` when a connection caused it)."""


class EdgeRegistry(Service):
    """All edges, their connections (by token), events and operations."""

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
        self._tokens = itertools.count(1)
        self.fleet_events = EventBuffer(limits.fleet_events, limits.fleet_event_bytes)
        self._listeners: list[EventListener] = []
        self._observers: list[ConnectionObserver] = []
        self.connected_count = 0
        #: Accepted hellos since start (for metrics).
        self.enrollments_total = 0
        #: Cluster mode: the shared store that numbers and keeps the events.
        self.journal: Optional[Journal] = None
        #: One copy of each label map, snapshot counts and ``edge.connected``
        #: attributes that many edges repeat (bounded: :class:`bounds.SharedValues`).
        self._shared_labels = bounds.SharedValues(bounds.SHARED_LABEL_MAPS)
        self._shared_hellos = bounds.SharedValues(bounds.SHARED_CATALOGS)
        self._operation_limits = (limits.operations_per_edge, limits.operation_bytes_per_edge)
        self._shared_counts = bounds.SharedValues()
        self._shared_attributes = bounds.SharedValues(bounds.SHARED_ATTRIBUTES)

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

    def shared_hello(self, hello: EdgeHello) -> EdgeHello:
        """``hello`` with its texts interned and its label map shared with
        every edge that announced an equal one (small maps only); with a
        shared map, the hello itself is shared with every edge that said
        the same (same labels, versions and catalog copy).

        Shared maps and hellos are never changed: a hello is replaced,
        never edited, and views copy the map or only read it.
        """
        # Most hellos of a fleet repeat an earlier one: found by value
        # first, before any text is interned or any size estimated (only
        # small maps and hellos with small catalogs are ever kept).
        labels_key = frozenset(hello.labels.items())
        kept_labels: Optional[dict[str, str]] = self._shared_labels.get(labels_key)
        if kept_labels is not None:
            key = (id(kept_labels), hello.software_version, hello.protocol_version, id(hello.commands))
            kept: Optional[EdgeHello] = self._shared_hellos.get(key)
            if kept is not None:
                return kept
        labels = {sys.intern(key): sys.intern(value) for key, value in hello.labels.items()}
        if map_size(labels) > bounds.SHARED_LABELS_BYTES:
            return attrs.evolve(
                hello,
                labels=labels,
                software_version=sys.intern(hello.software_version),
                protocol_version=sys.intern(hello.protocol_version),
            )
        labels = self._shared_labels.shared(labels_key, labels)
        software_version = sys.intern(hello.software_version)
        protocol_version = sys.intern(hello.protocol_version)
        if sum(spec.ByteSize() for spec in hello.commands) > bounds.SHARED_CATALOG_BYTES:
            # A shared hello keeps its catalog: only catalogs as small as
            # those the catalog cache shares (so the table holds at most
            # as many bytes of catalogs as that cache).
            return attrs.evolve(
                hello, labels=labels, software_version=software_version, protocol_version=protocol_version
            )
        # The kept hello holds its map and catalog, so while it is kept no
        # other object can have their ids: equal keys mean the same objects.
        key = (id(labels), software_version, protocol_version, id(hello.commands))
        kept = self._shared_hellos.get(key)
        if kept is not None:
            return kept
        return self._shared_hellos.shared(
            key,
            attrs.evolve(hello, labels=labels, software_version=software_version, protocol_version=protocol_version),
        )

    def connect(self, edge_id: str, peer: EdgePeer, hello: EdgeHello) -> int:
        """Record a new accepted connection; return its token.

        The newest connection wins: an older connection of the same edge is
        closed and a ``edge.superseded`` event is recorded.
        """
        now = self._clock.seconds()
        token = next(self._tokens)
        hello = self.shared_hello(hello)
        record = self._edges.get(edge_id)
        old_peer: Optional[EdgePeer] = None
        old_token: Optional[int] = None
        if record is None:
            record = self._new_record(edge_id, hello)
        else:
            self.disconnected_bytes -= self._disconnected.pop(edge_id, 0)
            if record.token is not None:
                old_peer = record.peer
                old_token = record.token
                self.connected_count -= 1
        record.hello = hello
        record.token = token
        record.peer = peer
        record.connected_at = now
        record.disconnected_at = None
        record.last_seen = now
        record.enrollments += 1
        self.enrollments_total += 1
        self.connected_count += 1
        if old_peer is not None and old_token is not None:
            self._log.info("edge {edge_id} superseded by a newer connection", edge_id=edge_id)
            if self.journal is None:
                self.record(edge_id, "edge.superseded", message=SUPERSEDED_MESSAGE)
            self._superseded(edge_id, old_token, old_peer)
        self._log.info(
            "edge {edge_id} connected (enrollment {enrollments})",
            edge_id=edge_id,
            enrollments=record.enrollments,
        )
        if self.journal is None:
            self.record(
                edge_id,
                "edge.connected",
                message=CONNECTED_MESSAGE,
                attributes=self._shared_attributes.get(hello.software_version)
                or self._shared_attributes.shared(hello.software_version, {"software_version": hello.software_version}),
            )
        else:
            # The store records edge.superseded / edge.connected: it alone
            # knows whether another replica held the edge.
            self.journal.claimed(edge_id, token, hello, now)
        return token

    def _superseded(self, edge_id: str, old_token: int, old_peer: EdgePeer) -> None:
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
        if self.journal is None:
            self.record(edge_id, "edge.disconnected", message=reason)
        else:
            self.journal.released(edge_id, token, reason, now)
        self._mark_disconnected(record, token, now)
        return True

    def _mark_disconnected(self, record: EdgeRecord, token: int, now: float) -> None:
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
        kept = record.kept_bytes()
        self._disconnected[edge_id] = kept
        self.disconnected_bytes += kept
        self._forget_excess_disconnected()

    def _forget_excess_disconnected(self) -> None:
        """Forget the edges that went away first, beyond the count or byte bound.

        An edge whose record still holds an open operation stays (in the
        order it went away) until that operation ends: then
        :meth:`advance_operation` runs this again, so no edge stays listed
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
            if self._edges.pop(edge_id, None) is not None:
                self.forgotten_edges += 1

    # -- status -------------------------------------------------------------

    def record_status(
        self,
        edge_id: str,
        token: int,
        response: pb.EdgeStatusResponse,
        data: Optional[bytes] = None,
        counts: Optional[tuple[int, ...]] = None,
    ) -> Optional[StatusSnapshot]:
        """Keep a status reply from connection ``token``; None if stale.

        ``data`` is the response serialized and ``counts`` its counts,
        when the caller has them already (the gateway has checked both).
        """
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return None
        now = self._clock.seconds()
        record.last_seen = now
        if counts is None:
            counts = response_counts(response)
        if data is None:
            data = response.SerializeToString()
        record.snapshot = StatusSnapshot(data, now, self._shared_counts.shared(counts, counts))
        if self.journal is not None:
            self.journal.status_kept(edge_id, token, record.snapshot)
        return record.snapshot

    def keep_snapshot(self, edge_id: str, token: int, snapshot: StatusSnapshot) -> bool:
        """Keep a snapshot already checked and counted (cluster mode: a routed
        answer the owner checked); False if ``token`` is stale."""
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return False
        record.last_seen = max(record.last_seen, snapshot.received_at)
        record.snapshot = snapshot
        if self.journal is not None:
            self.journal.status_kept(edge_id, token, snapshot)
        return True

    # -- observers and listeners ---------------------------------------------

    def add_observer(self, observer: ConnectionObserver) -> None:
        """Tell ``observer`` about superseded connections and command events."""
        self._observers.append(observer)

    # -- events ---------------------------------------------------------------

    def add_listener(self, listener: EventListener) -> None:
        """Call ``listener`` with every event recorded from now on."""
        self._listeners.append(listener)

    def remove_listener(self, listener: EventListener) -> None:
        """Stop calling ``listener``."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def record(
        self,
        edge_id: str,
        kind: str,
        *,
        occurred_at: Optional[float] = None,
        node_id: str = "",
        provider_id: str = "",
        command_id: str = "",
        message: str = "",
        attributes: Optional[dict[str, str]] = None,
        token: Optional[int] = None,
        change: Optional[dict[str, Any]] = None,
        operation: Optional[OperationRecord] = None,
    ) -> EventRecord:
        """Append an event to the edge's buffer and the fleet buffer.

        In cluster mode the event goes to the journal instead (fenced by
        ``token`` when a connection caused it, with the ``change`` or the
        ``operation`` it stands for) and is appended when the fleet stream
        brings it back numbered; the record returned has sequence 0.
        """
        now = self._clock.seconds()
        return self._record(
            self._edges[edge_id],
            edge_id,
            kind,
            now if occurred_at is None else occurred_at,
            now,
            node_id,
            provider_id,
            command_id,
            message,
            attributes,
            token,
            change,
            operation,
        )

    def _record(
        self,
        record: EdgeRecord,
        edge_id: str,
        kind: str,
        occurred_at: float,
        now: float,
        node_id: str,
        provider_id: str,
        command_id: str,
        message: str,
        attributes: Optional[dict[str, str]],
        token: Optional[int],
        change: Optional[dict[str, Any]],
        operation: Optional[OperationRecord],
    ) -> EventRecord:
        """:meth:`record` once the edge's record and the time are known."""
        journal = self.journal
        if journal is not None:
            # In cluster mode the store numbers the event (sequence 0 until then).
            event = EventRecord(
                0, 0, edge_id, kind, occurred_at, now, node_id, provider_id, command_id, message, attributes
            )
            journal.append(event, token, change or {"kind": "event"}, operation)
            return event
        events = record.events
        fleet = self.fleet_events
        sequence = events.last_sequence + 1
        fleet_sequence = fleet.last_sequence + 1
        event = EventRecord(
            sequence,
            fleet_sequence,
            edge_id,
            kind,
            occurred_at,
            now,
            node_id,
            provider_id,
            command_id,
            message,
            attributes,
        )
        # One kept form for both buffers.
        kept = records.kept_form(event)
        events.append_kept(kept, sequence)
        fleet.append_kept(kept, fleet_sequence)
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:
                self._log.failure("event listener failed")
        return event

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
        now = self._clock.seconds()
        record.last_seen = now
        edge_sequence = event.edge_sequence
        self._check_edge_sequence(record, edge_sequence, token)
        # Never stored whole: over-long texts are cut, extra attributes
        # dropped, and the event says so (attribute truncated: "true").
        kind, node_id, provider_id, command_id, message, attributes, _ = bounds.clip_event(event)
        if kind.startswith(RESERVED_KIND_PREFIXES):
            # The kind as sent (the clipped one may end in "...").
            self._protocol_violation(record, token, event.kind, now)
            return None
        # An Edge's clock is its own: a time outside the calendar (or none)
        # is recorded as the time the event arrived.
        occurred_ms = event.occurred_at_ms
        recorded = self._record(
            record,
            edge_id,
            kind,
            occurred_ms / 1000.0 if 0 < occurred_ms < MAX_TIME_MS else now,
            now,
            node_id,
            provider_id,
            command_id,
            message,
            attributes,
            token,
            None if self.journal is None else {"kind": "relayed", "edge_sequence": edge_sequence},
            None,
        )
        if command_id:
            for observer in list(self._observers):
                observer.command_event_relayed(edge_id, token, event)
        return recorded

    def _protocol_violation(self, record: EdgeRecord, token: int, kind: str, now: float) -> None:
        """Count a refused event; say so in one rate-limited event and one warning."""
        quoted = kind[:QUOTED_KIND_CHARS]
        record.violations_unreported += 1
        if record.violation_logged_token != token:
            record.violation_logged_token = token
            self._log.warn(
                "edge {edge_id} sent an event of kind {kind!r}, which only the Control Plane records; "
                "dropped (further ones are counted, not logged)",
                edge_id=record.edge_id,
                kind=quoted,
            )
        last = record.violation_reported_at
        if last is not None and now - last < PROTOCOL_VIOLATION_INTERVAL_SECONDS:
            return
        dropped, record.violations_unreported = record.violations_unreported, 0
        record.violation_reported_at = now
        self.record(
            record.edge_id,
            "edge.protocol_violation",
            message=f"dropped {dropped} event(s) of kinds reserved for the Control Plane (operation.*, edge.*)",
            attributes={"kind": quoted, "dropped": str(dropped)},
            token=token,
        )

    def _check_edge_sequence(self, record: EdgeRecord, sequence: int, token: int) -> None:
        """Record ``edge.events_lost`` when the edge's own sequence skips.

        Events written to a connection that dies before they are read are
        lost on the wire; the Edge numbers its events, so the gap shows here
        (also across reconnects). A lower number means the Edge restarted.
        """
        last = record.last_edge_sequence
        if sequence <= 0:
            return
        record.last_edge_sequence = sequence
        if last and sequence > last + 1:
            missing = sequence - last - 1
            self.record(
                record.edge_id,
                "edge.events_lost",
                message=f"{missing} events from the edge never arrived (edge sequences {last + 1}-{sequence - 1})",
                attributes={
                    "count": str(missing),
                    "first_edge_sequence": str(last + 1),
                    "last_edge_sequence": str(sequence - 1),
                },
                token=token,
            )

    # -- operations -----------------------------------------------------------

    def start_operation(self, operation: OperationRecord) -> None:
        """Keep a just-dispatched operation (state ``sent``)."""
        record = self.get(operation.edge_id)
        operation_states.begin(operation)
        record.operations.add(operation)
        self._operation_event(operation)

    def operation(self, edge_id: str, operation_id: str) -> Optional[OperationRecord]:
        """The kept operation ``operation_id`` of ``edge_id``, or None."""
        record = self._edges.get(edge_id)
        return None if record is None else record.operations.get(operation_id)

    def advance_operation(
        self,
        edge_id: str,
        operation_id: str,
        state: str,
        reason: str = "",
        result: Optional[dict[str, str]] = None,
    ) -> bool:
        """Move an operation forward; False if it is unknown or did not move.

        Operation states are the Control Plane's own record: only the
        gateway calls this, from its own requests' outcomes.
        """
        record = self._edges.get(edge_id)
        if record is None:
            return False
        operation = record.operations.get(operation_id)
        if operation is None:
            return False
        kept_result = None if result is None else bounds.clip_result(result)
        if not operation.advance(state, self._clock.seconds(), bounds.clip_reason(reason), kept_result):
            return False
        self._operation_event(operation)
        record.operations.operation_changed(operation)
        if operation.finished and record.token is None and edge_id in self._disconnected:
            self._forget_excess_disconnected()
        return True

    def record_late_outcome(
        self, edge_id: str, operation_id: str, state: str, reason: str, result: dict[str, str]
    ) -> bool:
        """Keep an edge's answer that came after the operation ended."""
        operation = self.operation(edge_id, operation_id)
        if operation is None:
            return False
        now = self._clock.seconds()
        reason = bounds.clip_reason(reason)
        if not operation.note_late_outcome(LateOutcome(state, reason, bounds.clip_result(result), now)):
            return False
        self._edges[edge_id].operations.operation_changed(operation)
        self.record(
            edge_id,
            "operation.late_outcome",
            operation=operation,
            node_id=self._node_of(operation),
            command_id=operation_id,
            message=f"{operation.name} answered {state} after it ended {operation.state}"
            + (f": {reason}" if reason else ""),
            attributes={
                "name": operation.name,
                "target": operation.target,
                "state": operation.state,
                "late_state": state,
            },
        )
        return True

    def _node_of(self, operation: OperationRecord) -> str:
        """The node an operation targets ("" if its command does not target a node).

        A command aimed at a node is filed under that node too, so views
        and subscribers filtering by node see what was done to it.
        """
        record = self._edges[operation.edge_id]
        targets_node = any(spec.name == operation.name and spec.target_kind == "node" for spec in record.hello.commands)
        return operation.target if targets_node else ""

    def _operation_event(self, operation: OperationRecord) -> None:
        self.record(
            operation.edge_id,
            "operation." + operation.state,
            node_id=self._node_of(operation),
            command_id=operation.operation_id,
            message=f"{operation.name} {operation.state}" + (f": {operation.reason}" if operation.reason else ""),
            attributes={"name": operation.name, "target": operation.target, "state": operation.state},
            operation=operation,
        )

    def fleet_operations(self) -> list[OperationRecord]:
        """Every kept operation of every edge, newest first."""
        ops = [op for record in self._edges.values() for op in record.operations_kept or ()]
        ops.sort(key=lambda op: (op.created_at, op.operation_id), reverse=True)
        return ops

    # -- cluster mode: the mirror of what other replicas changed --------------------

    def _new_record(self, edge_id: str, hello: EdgeHello) -> EdgeRecord:
        record = EdgeRecord(
            edge_id=edge_id,
            hello=hello,
            events=EventBuffer(self.limits.events_per_edge, self.limits.event_bytes_per_edge),
            operation_limits=self._operation_limits,
        )
        self._edges[edge_id] = record
        return record

    def adopt_remote(
        self, edge_id: str, peer: EdgePeer, hello: EdgeHello, connected_at: float, enrollments: int
    ) -> int:
        """Another replica accepted a connection of ``edge_id`` (cluster mode).

        The edge becomes connected here through ``peer`` (a routed peer)
        under a fresh local token; a connection that was current here (a
        local one or another routed one) is superseded: what was in flight
        on it is settled and a local one is closed with SUPERSEDED. No
        event is recorded: the replica that accepted the hello did.
        """
        token = next(self._tokens)
        record = self._edges.get(edge_id)
        old_peer: Optional[EdgePeer] = None
        old_token: Optional[int] = None
        hello = self.shared_hello(hello)
        if record is None:
            record = self._new_record(edge_id, hello)
        else:
            self.disconnected_bytes -= self._disconnected.pop(edge_id, 0)
            if record.token is not None:
                old_peer, old_token = record.peer, record.token
                self.connected_count -= 1
        record.hello = hello
        record.token = token
        record.peer = peer
        record.connected_at = connected_at
        record.disconnected_at = None
        record.last_seen = max(record.last_seen, connected_at)
        record.enrollments = enrollments
        self.connected_count += 1
        if old_peer is not None and old_token is not None:
            self._superseded(edge_id, old_token, old_peer)
        return token

    def apply_remote_disconnect(self, edge_id: str, token: int, at: float) -> bool:
        """The routed connection ``token`` of ``edge_id`` closed on its replica."""
        record = self._edges.get(edge_id)
        if record is None or record.token != token:
            return False
        self._mark_disconnected(record, token, at)
        return True

    def load_edge(
        self,
        edge_id: str,
        hello: EdgeHello,
        connected_at: Optional[float],
        disconnected_at: Optional[float],
        last_seen: float,
        enrollments: int,
        snapshot: Optional[StatusSnapshot],
    ) -> EdgeRecord:
        """A disconnected edge as the shared store keeps it (cluster mode, at start-up)."""
        record = self._edges.get(edge_id) or self._new_record(edge_id, hello)
        record.hello = attrs.evolve(self.shared_hello(hello), commands=bounds.compact_catalog(hello.commands))
        record.connected_at = connected_at
        record.disconnected_at = disconnected_at
        record.last_seen = last_seen
        record.enrollments = enrollments
        if snapshot is not None:
            record.snapshot = snapshot
        if record.token is None and edge_id not in self._disconnected:
            kept = record.kept_bytes()
            self._disconnected[edge_id] = kept
            self.disconnected_bytes += kept
            self._forget_excess_disconnected()
        return record

    def apply_event(
        self,
        event: EventRecord,
        fleet: bool = True,
        relayed_by: Optional[int] = None,
        command_event: Optional[pb.EdgeEvent] = None,
        notify: bool = True,
    ) -> bool:
        """Append an event numbered by the shared store (cluster mode).

        Events already kept (by sequence) are skipped, so reading a stretch
        of the stream twice changes nothing. Listeners hear it when it is
        new to the fleet buffer; a command event relayed by the current
        connection (``relayed_by``) goes to the observers, as on the
        replica that received it.
        """
        record = self._edges.get(event.edge_id)
        kept = records.kept_form(event)
        if record is not None and event.sequence > record.events.last_sequence:
            record.events.append_kept(kept, event.sequence)
        if not fleet or event.fleet_sequence <= self.fleet_events.last_sequence:
            return False
        self.fleet_events.append_kept(kept, event.fleet_sequence)
        if notify:
            for listener in list(self._listeners):
                try:
                    listener(event)
                except Exception:
                    self._log.failure("event listener failed")
        if record is not None and relayed_by is not None and command_event is not None and record.token == relayed_by:
            for observer in list(self._observers):
                observer.command_event_relayed(event.edge_id, relayed_by, command_event)
        return True

    def apply_operation(self, operation: OperationRecord) -> bool:
        """An operation as another replica recorded it (cluster mode); False if its edge is unknown."""
        record = self._edges.get(operation.edge_id)
        if record is None:
            return False
        kept = record.operations.get(operation.operation_id)
        if kept is None:
            record.operations.add(operation)
            kept = operation
        else:
            kept.state = operation.state
            kept.reason = operation.reason
            kept.result = operation.result
            kept.updated_at = operation.updated_at
            kept.finished_at = operation.finished_at
            kept.history = operation.history
            kept.late_outcome = operation.late_outcome
            record.operations.operation_changed(kept)
        for observer in list(self._observers):
            observer.operation_updated(kept)
        return True
