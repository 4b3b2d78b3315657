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

The buffers' own bounds apply as the events go in, and the disconnected
edges' bounds after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from twisted.logger import Logger

from twisted_iop.controlplane import stored_forms
from twisted_iop.controlplane.event_log import EventBuffer
from twisted_iop.controlplane.event_record import EventRecord
from twisted_iop.controlplane.memory import kept_form
from twisted_iop.controlplane.store.interface import KeptState

if TYPE_CHECKING:
    from twisted_iop.controlplane.gateway import EdgeGateway
    from twisted_iop.controlplane.registry import EdgeRegistry
    from twisted_iop.controlplane.rollouts import RolloutService

#: Why an operation in flight when the earlier process ended failed.
RESTARTED_REASON = "the Control Plane restarted before this operation ended"
#: The ``edge.disconnected`` message of an edge connected when the earlier process died.
DIED_CONNECTED_MESSAGE = "the Control Plane stopped without closing this connection (its process ended)"

_log = Logger()


def restore(kept: KeptState, registry: EdgeRegistry, gateway: EdgeGateway, rollouts: RolloutService) -> dict[str, int]:
    """Put ``kept`` back; return what was restored, by kind (for the log line)."""
    records = {}
    died_connected = []
    for edge in kept.edges:
        record = registry.known(edge.edge_id, stored_forms.hello_from(edge.hello))
        record.connected_at = edge.connected_at
        record.disconnected_at = edge.disconnected_at if not edge.connected else edge.last_seen
        record.last_seen = edge.last_seen
        record.enrollments = edge.enrollments
        record.events.last_edge_sequence = edge.last_edge_sequence
        records[edge.edge_id] = (record, edge.last_sequence)
        if edge.connected:
            died_connected.append(edge.edge_id)
    rollout_events = rollouts.event_buffer
    fleet = registry.fleet_events
    # The fleet's buffer takes the newest run of numbers without a gap, and
    # of it no more than it can hold (older ones would only be dropped).
    events = kept.events
    fleet_from = max(_newest_run_start(events), len(events) - fleet.capacity)
    for index, event in enumerate(events):
        buffer: Optional[EventBuffer]
        if not event.edge_id:
            buffer = rollout_events
        elif event.edge_id in records:
            buffer = records[event.edge_id][0].events
        else:
            buffer = None
        if buffer is not None and event.sequence <= buffer.last_sequence:
            buffer = None
        in_fleet = index >= fleet_from
        if buffer is None and not in_fleet:
            continue
        # One kept form in both buffers, as a live event is.
        form = kept_form(event)
        if buffer is not None:
            buffer.append_kept(form, event.sequence)
        if in_fleet:
            fleet.append_kept(form, event.fleet_sequence)
    for record, last_sequence in records.values():
        _continue_numbering(record.events, last_sequence)
        registry.keep_disconnected(record)
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
