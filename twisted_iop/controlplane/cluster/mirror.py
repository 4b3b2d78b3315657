"""Cluster mode: this replica's registry as a mirror of what the others changed.

Every replica's :class:`~twisted_iop.controlplane.fleet.registry.EdgeRegistry`
holds the whole fleet. What another replica changed comes back through
the shared fleet stream (read by the replica's stream room) and is
applied here, in stream order, the same way on every replica:

* a connection another replica accepted (:meth:`ClusterMirror.adopt_remote`)
  or that closed there (:meth:`apply_remote_disconnect`);
* an edge as the store keeps it, at start-up (:meth:`load_edge`);
* an event numbered by the store (:meth:`apply_event`);
* an operation as its dispatching replica recorded it
  (:meth:`apply_operation`: only as a legal successor of what is kept,
  through :func:`operation_states.adopt`).

The mirror changes the registry only through its public methods; it
does no I/O.
"""

from __future__ import annotations

from typing import Optional

import attrs

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.edge_peer import EdgePeer
from twisted_iop.wire import control_pb2 as pb


class ClusterMirror:
    """Applies other replicas' changes to one replica's registry."""

    def __init__(self, registry: EdgeRegistry) -> None:
        self._registry = registry

    def adopt_remote(
        self, edge_id: str, peer: EdgePeer, hello: EdgeHello, connected_at: float, enrollments: int
    ) -> int:
        """Another replica accepted a connection of ``edge_id``.

        The edge becomes connected here through ``peer`` (a routed peer)
        under a fresh local token; a connection that was current here (a
        local one or another routed one) is superseded: what was in flight
        on it is settled and a local one is closed with SUPERSEDED. No
        event is recorded: the replica that accepted the hello did.
        """
        registry = self._registry
        record, token, old = registry.take_connection(edge_id, peer, hello, connected_at)
        record.last_seen = max(record.last_seen, connected_at)
        record.enrollments = enrollments
        if old is not None:
            registry.supersede(edge_id, *old)
        return token

    def apply_remote_disconnect(self, edge_id: str, token: int, at: float) -> bool:
        """The routed connection ``token`` of ``edge_id`` closed on its replica."""
        registry = self._registry
        record = registry.find(edge_id)
        if record is None or record.token != token:
            return False
        registry.mark_disconnected(record, token, at)
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
        """A disconnected edge as the shared store keeps it (at start-up)."""
        registry = self._registry
        record = registry.known(edge_id, hello)
        record.hello = attrs.evolve(registry.shared.hello(hello), commands=bounds.compact_catalog(hello.commands))
        record.connected_at = connected_at
        record.disconnected_at = disconnected_at
        record.last_seen = last_seen
        record.enrollments = enrollments
        if snapshot is not None:
            record.snapshot = snapshot
        if record.token is None and not registry.is_kept_disconnected(edge_id):
            registry.keep_disconnected(record)
        return record

    def apply_event(
        self,
        event: EventRecord,
        fleet: bool = True,
        relayed_by: Optional[int] = None,
        command_event: Optional[pb.EdgeEvent] = None,
        notify: bool = True,
    ) -> bool:
        """Append an event numbered by the shared store.

        Events already kept (by sequence) are skipped, so reading a stretch
        of the stream twice changes nothing. Listeners hear it when it is
        new to the fleet buffer; a command event relayed by the current
        connection (``relayed_by``) goes to the observers, as on the
        replica that received it.
        """
        registry = self._registry
        record = registry.find(event.edge_id)
        if not registry.event_log.apply(event, None if record is None else record.events, fleet, notify):
            return False
        if record is not None and command_event is not None and relayed_by is not None and record.token == relayed_by:
            registry.command_event_relayed(event.edge_id, relayed_by, command_event)
        return True

    def apply_operation(self, operation: OperationRecord) -> bool:
        """An operation as another replica recorded it; False if its edge is unknown."""
        registry = self._registry
        record = registry.find(operation.edge_id)
        if record is None:
            return False
        kept = record.operations.get(operation.operation_id)
        if kept is None:
            record.operations.add(operation)
            kept = operation
        elif operation_states.adopt(kept, operation):
            # Only as a legal successor of what is kept (never backwards).
            record.operations.operation_changed(kept)
        registry.operation_updated(kept)
        return True
