"""Putting back what an earlier process kept, before anything listens.

:func:`restore` hands a :class:`~.interface.KeptState` to the rooms that
own each fact, through their own methods:

* every kept edge becomes known again, **disconnected** (an edge comes
  back by dialing in); one that was still connected when the earlier
  process died (a ``kill -9`` never wrote its disconnect) gets an
  ``edge.disconnected`` event saying so;
* events go back into each edge's buffer and the fleet's, and the
  numbering goes on from the newest number ever given (a resumed
  ``/client`` subscription never sees a number twice);
* operations go back into their edges' buffers, idempotency keys with
  them (a key reused after a restart replays the operation); one still in
  flight when the process ended can never learn its outcome, so the
  command room ends it ``failed`` with :data:`RESTARTED_REASON`;
* rollouts are shown again, and those that had not settled run on.

The buffers' own bounds apply as the events go in. The bounds of
disconnected edges (``registry.disconnected_edges`` and
``disconnected_bytes``) hold the edges that went away last: older ones are
not built at all, only their numbering is remembered (one that dials in
again continues it), and their events stay in the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twisted.logger import Logger

from twisted_iop.controlplane.fleet.event_log import EventBuffer
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.memory import KeptEvent, kept_form
from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store.interface import KeptState

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
    from twisted_iop.controlplane.fleet.registry import EdgeRegistry
    from twisted_iop.controlplane.requests.gateway import EdgeGateway
    from twisted_iop.controlplane.rollouts.service import RolloutService

#: Why an operation in flight when the earlier process ended failed.
RESTARTED_REASON = "the Control Plane restarted before this operation ended"
#: The ``edge.disconnected`` message of an edge connected when the earlier process died.
DIED_CONNECTED_MESSAGE = "the Control Plane stopped without closing this connection (its process ended)"

_log = Logger()


def restore(kept: KeptState, registry: EdgeRegistry, gateway: EdgeGateway, rollouts: RolloutService) -> dict[str, int]:
    """Put ``kept`` back; return what was restored, by kind (for the log line)."""
    events = kept.events
    rollout_events = rollouts.event_buffer
    fleet = registry.fleet_events
    # The fleet's buffer takes the newest run of numbers without a gap, and
    # of it no more than it can hold (older ones would only be dropped).
    fleet_from = max(_newest_run_start(events), len(events) - fleet.capacity)
    fleet_tail = events[fleet_from:]
    tail_start = fleet_tail[0].fleet_sequence if fleet_tail else 0
    by_edge: dict[str, list[EventRecord]] = {}
    for event in events:
        if event.edge_id:
            by_edge.setdefault(event.edge_id, []).append(event)
        elif event.sequence > rollout_events.last_sequence:
            rollout_events.append(event, event.sequence)
    # Kept forms of the fleet's events, shared with their edges' buffers.
    tail_forms: dict[int, KeptEvent] = {}
    # The edges that went away last first, as long as the registry's bounds
    # for disconnected edges hold them: it would forget the older ones at
    # once, so they are not built (their numbering is remembered).
    limits = registry.limits
    records: dict[str, EdgeRecord] = {}
    died_connected = []
    held_bytes = 0
    for edge in reversed(kept.edges):
        full = len(records) >= limits.disconnected_edges or held_bytes > limits.disconnected_bytes
        if full:
            registry.remember_numbering(edge.edge_id, edge.last_sequence, edge.last_edge_sequence)
            continue
        record = registry.known(edge.edge_id, stored_forms.hello_from(edge.hello))
        record.connected_at = edge.connected_at
        record.disconnected_at = edge.disconnected_at if not edge.connected else edge.last_seen
        record.last_seen = edge.last_seen
        record.enrollments = edge.enrollments
        buffer = record.events
        buffer.last_edge_sequence = edge.last_edge_sequence
        for event in by_edge.get(edge.edge_id, ()):
            if event.sequence > buffer.last_sequence:
                # One kept form in both buffers, as a live event is.
                form = kept_form(event)
                buffer.append_kept(form, event.sequence)
                if event.fleet_sequence >= tail_start:
                    tail_forms[event.fleet_sequence] = form
        _continue_numbering(buffer, edge.last_sequence)
        held_bytes += record.kept_bytes()
        records[edge.edge_id] = record
        if edge.connected:
            died_connected.append(edge.edge_id)
    # Counted against the bounds in the order they went away (the oldest first).
    for record in reversed(records.values()):
        registry.keep_disconnected(record)
    for event in fleet_tail:
        shared = tail_forms.get(event.fleet_sequence)
        fleet.append_kept(kept_form(event) if shared is None else shared, event.fleet_sequence)
    _continue_numbering(rollout_events, kept.rollout_event_sequence)
    _continue_numbering(fleet, kept.fleet_sequence)
    operations = 0
    for operation in kept.operations:
        owner = registry.find(operation.edge_id)
        if owner is None or owner.operations.get(operation.operation_id) is not None:
            continue
        owner.operations.add(operation)
        operations += 1
    for edge_id in died_connected:
        if registry.find(edge_id) is not None:
            registry.record(edge_id, "edge.disconnected", message=DIED_CONNECTED_MESSAGE)
            store = registry.store
            if store is not None:
                store.edge_changed(registry.get(edge_id))
    ended = gateway.end_orphaned_operations("", RESTARTED_REASON)
    restored_rollouts = 0
    for value in kept.rollouts:
        try:
            rollout = stored_forms.rollout_from(value)
        except ValueError as e:
            _log.warn("a kept rollout was not restored: {error}", error=str(e))
            continue
        rollouts.restore(rollout)
        restored_rollouts += 1
    return {
        "edges": len(records),
        "events": len(kept.events),
        "operations": operations,
        "operations_ended": ended,
        "rollouts": restored_rollouts,
    }


def _continue_numbering(buffer: EventBuffer, last_sequence: int) -> None:
    """Make the next number of ``buffer`` follow ``last_sequence`` (the newest
    ever given) when its events were all dropped from the store."""
    if len(buffer) == 0 and last_sequence > buffer.last_sequence:
        buffer.last_sequence = last_sequence


def _newest_run_start(events: tuple[EventRecord, ...]) -> int:
    """Where the newest events whose fleet sequences follow each other
    without a gap begin (a buffer's numbers are contiguous; the store's
    per-edge bounds may have left older gaps)."""
    start = len(events)
    while start > 1 and events[start - 2].fleet_sequence == events[start - 1].fleet_sequence - 1:
        start -= 1
    return start - 1 if events else 0
