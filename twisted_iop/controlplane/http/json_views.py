"""JSON renderings of what the registry keeps (see docs/http-api.md).

These functions decide what leaves the process: they copy named fields
only, so nothing the wire carries beyond them (credentials, addresses,
request ids) can reach a view. The views that reuse earlier renderings
(an edge's detail, the fleet page, a snapshot's members) are rendered,
and their renderings kept, by :mod:`twisted_iop.controlplane.http.json_bytes`.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union, cast

from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.event_log import EventBuffer
from twisted_iop.controlplane.fleet.event_record import EVENT_FIELDS, EventRecord, FieldKind
from twisted_iop.controlplane.fleet.operations import OperationBuffer, OperationRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.http.latency_views import models_json, provider_latency_json
from twisted_iop.controlplane.requests.operation_states import LateOutcome
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.engine_states import engine_state_name
from twisted_iop.wire.status_totals import (
    GENERAL_AT,
    HEALTH_AT,
    HEALTH_NAMES,
    HEALTHS,
    LONG_AT,
    STATUS_AT,
    STATUS_NAMES,
    STATUSES,
)

#: The last instant ISO 8601 views show by the fast path (9999-12-31T23:59:59).
_LAST_FAST_SECOND = 253_402_300_799
#: The date-and-time text of the last whole second :func:`iso` rendered:
#: views render thousands of times a second, mostly within one second.
_last_second: list[Any] = [None, ""]
#: The text after the second's, for each millisecond.
_MILLISECONDS = tuple(f"{ms:03d}Z" for ms in range(1000))


def iso(seconds: Optional[float]) -> Optional[str]:
    """``seconds`` since the epoch as ISO 8601 UTC with milliseconds."""
    if seconds is None or seconds <= 0:
        return None
    if seconds < _LAST_FAST_SECOND:
        # What datetime.fromtimestamp does (microseconds rounded half to
        # even, carried into the second), with the second's text reused.
        # (A positive float less its whole part is exact: math.modf's.)
        second = int(seconds)
        micros = round((seconds - second) * 1e6)
        if micros >= 1_000_000:
            second += 1
            micros -= 1_000_000
        cached = _last_second
        if cached[0] != second:
            cached[1] = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
            cached[0] = second
        return cast("str | None", cached[1] + _MILLISECONDS[micros // 1000])
    return iso_by_datetime(seconds)


def iso_by_datetime(seconds: float) -> Optional[str]:
    """:func:`iso` by way of ``datetime`` alone (what its fast path must match)."""
    try:
        moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        # An Edge clock (or a hostile Edge) sent a time no calendar holds.
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def iso_ms(milliseconds: int) -> Optional[str]:
    """Milliseconds since the epoch as ISO 8601 (None for 0)."""
    return iso(milliseconds / 1000.0) if milliseconds > 0 else None


def _none_if_empty(value: str) -> Optional[str]:
    return value or None


def edge_summary(record: EdgeRecord) -> dict[str, Any]:
    """The summary of one edge, as listed by ``GET /edges``."""
    return {
        "edge_id": record.edge_id,
        "connected": record.connected,
        "labels": dict(record.hello.labels),
        "software_version": record.hello.software_version,
        "protocol_version": record.hello.protocol_version,
        "connected_at": iso(record.connected_at),
        "last_seen": iso(record.seen_at()),
        "disconnected_at": iso(record.disconnected_at),
        "enrollments": record.enrollments,
        "commands": record.command_names,
    }


def byte_facts(buffer: Union[EventBuffer, OperationBuffer]) -> dict[str, int]:
    """A buffer's byte budget, its kept bytes and the drops the budget caused."""
    return {"byte_budget": buffer.byte_budget, "bytes": buffer.bytes, "dropped_by_bytes": buffer.dropped_by_bytes}


def _counters(capacity: int, in_flight: int, queued: int) -> dict[str, int]:
    return {"capacity": capacity, "in_flight": in_flight, "queued": queued}


def fraction(value: float) -> Optional[float]:
    """A fraction from the wire in 0..1, to 0.01 %; None when the engine does
    not say (negative) or says nothing a fraction can be (NaN)."""
    # False for NaN and negatives; +inf is clamped to 1, as any value over it.
    return round(min(value, 1.0), 4) if value >= 0.0 else None


def rate(value: float) -> Optional[float]:
    """A rate from the wire to 0.01; None when it is none (NaN, infinite, negative)."""
    # "value - value == 0" is False for NaN and both infinities.
    return round(value, 2) if value >= 0.0 and value - value == 0.0 else None


def engine_json(engine: pb.EngineLoad) -> Optional[dict[str, Any]]:
    """What a provider's engine last said of its own load (None: no reading)."""
    if not engine.known:
        return None
    return {
        "running": engine.running,
        "waiting": engine.waiting,
        "kv_cache_usage": fraction(engine.kv_cache_usage),
        "parallel": engine.parallel or None,
        "age_seconds": engine.age_ms / 1000,
    }


def launch_json(provider: pb.ProviderSnapshot) -> Optional[dict[str, Any]]:
    """The lifecycle of the provider's engine when its Node launches it (None: someone else runs it)."""
    if not provider.HasField("launch"):
        return None
    launch = provider.launch
    return {
        "state": engine_state_name(launch.state),
        "reason": launch.reason,
        "restarts": launch.restarts,
        "next_try_at": iso_ms(launch.next_try_at_ms),
        "since": iso_ms(launch.since_ms),
        "pid": launch.pid or None,
    }


def provider_json(provider: pb.ProviderSnapshot) -> dict[str, Any]:
    """One provider of a node snapshot: its admission counters and what its
    engine says (every figure from the wire bounded: never NaN or infinite)."""
    return {
        "provider_id": provider.provider_id,
        "kind": provider.kind,
        "models": list(provider.models),
        "status": STATUS_NAMES.get(provider.status, "unavailable"),
        "health": HEALTH_NAMES.get(provider.health, "unknown"),
        "health_reason": provider.health_reason,
        "general": _counters(provider.capacity, provider.in_flight, provider.queued),
        "long_context": _counters(
            provider.long_context_capacity,
            provider.long_context_in_flight,
            provider.long_context_queued,
        ),
        "engine": engine_json(provider.engine),
        "tokens_per_second": rate(provider.tokens_per_second),
        "tokens": {
            "prompt": provider.prompt_tokens,
            "completion": provider.completion_tokens,
            "estimated": {
                "prompt": provider.estimated_prompt_tokens,
                "completion": provider.estimated_completion_tokens,
            },
        },
        "saturated": provider.saturated,
        "cooling_down": provider.cooling_down,
        "launch": launch_json(provider),
        "latency": provider_latency_json(provider),
    }


def node_json(node: pb.EdgeNodeSnapshot) -> dict[str, Any]:
    """One node of an edge snapshot."""
    return {
        "node_id": node.node_id,
        "connected": node.connected,
        "drained": node.drained,
        "connected_since": iso_ms(node.connected_since_ms),
        "last_seen": iso_ms(node.last_seen_ms),
        "labels": dict(node.labels),
        "providers": [provider_json(p) for p in node.providers],
    }


def _counter_group(counts: Sequence[int], at: int) -> dict[str, int]:
    return {"capacity": counts[at], "in_flight": counts[at + 1], "queued": counts[at + 2]}


def counts_json(counts: Sequence[int]) -> dict[str, Any]:
    """Totals in their JSON shape (see docs/http-api.md)."""
    return {
        "nodes_connected": counts[0],
        "nodes_configured": counts[1],
        "providers": counts[2],
        "providers_by_status": {name: counts[STATUS_AT[name]] for name in STATUSES},
        "providers_by_health": {name: counts[HEALTH_AT[name]] for name in HEALTHS},
        "general": _counter_group(counts, GENERAL_AT),
        "long_context": _counter_group(counts, LONG_AT),
    }


def row_counts_json(counts: Sequence[int]) -> dict[str, Any]:
    """The per-edge counts of a fleet status row."""
    return {
        "nodes_connected": counts[0],
        "nodes_configured": counts[1],
        "providers": counts[2],
        "providers_by_health": {name: counts[HEALTH_AT[name]] for name in HEALTHS},
        "general": _counter_group(counts, GENERAL_AT),
        "long_context": _counter_group(counts, LONG_AT),
    }


def snapshot_members(snapshot: StatusSnapshot) -> dict[str, Any]:
    """What every view of one snapshot shows alike: its times, nodes and
    totals (from one parse of its kept bytes)."""
    response = snapshot.parse()
    return {
        "generated_at": iso_ms(response.generated_at_ms),
        "received_at": iso(snapshot.received_at),
        "nodes": [node_json(n) for n in response.nodes],
        "totals": counts_json(snapshot.counts),
        "models": models_json(response),
    }


def _event_member(kind: FieldKind) -> Callable[[Any], object]:
    """How a field of ``kind`` is shown in an event's JSON."""
    if kind is FieldKind.TIME:
        return iso
    if kind is FieldKind.OPTIONAL_TEXT:
        return _none_if_empty
    if kind is FieldKind.MAP:
        return dict
    return _same


def _same(value: object) -> object:
    return value


#: Each member of an event's JSON, from the one declaration of its fields.
_EVENT_MEMBERS = tuple((name, _event_member(kind)) for name, kind in EVENT_FIELDS)


def event_json(event: EventRecord) -> dict[str, Any]:
    """One event."""
    return {name: show(value) for (name, show), value in zip(_EVENT_MEMBERS, event, strict=True)}


def operation_json(operation: OperationRecord) -> dict[str, Any]:
    """One operation with its history."""
    return {
        "operation_id": operation.operation_id,
        "edge_id": operation.edge_id,
        "name": operation.name,
        "target": operation.target,
        "arguments": dict(operation.arguments),
        "idempotency_key": _none_if_empty(operation.idempotency_key),
        "state": operation.state,
        "reason": operation.reason,
        "result": dict(operation.result),
        "created_at": iso(operation.created_at),
        "updated_at": iso(operation.updated_at),
        "finished_at": iso(operation.finished_at),
        "deadline_at": iso(operation.deadline_at),
        "history": [{"state": s, "at": iso(at), "reason": r} for s, at, r in operation.history],
        "late_outcome": late_outcome_json(operation.late_outcome),
        "requested_by": _none_if_empty(operation.requested_by),
    }


def late_outcome_json(outcome: Optional[LateOutcome]) -> Optional[dict[str, Any]]:
    """An answer that came after its operation ended (None when there was none)."""
    if outcome is None:
        return None
    return {
        "state": outcome.state,
        "reason": outcome.reason,
        "result": dict(outcome.result),
        "received_at": iso(outcome.received_at),
    }


def command_spec_json(spec: pb.CommandSpec) -> dict[str, Any]:
    """One command of an edge's catalog."""
    return {
        "name": spec.name,
        "description": spec.description,
        "target_kind": spec.target_kind,
        "arguments": [{"name": a.name, "description": a.description, "required": a.required} for a in spec.arguments],
    }
