"""JSON renderings of what the registry keeps (see docs/http-api.md).

These functions decide what leaves the process: they copy named fields
only, so nothing the wire carries beyond them (credentials, addresses,
request ids) can reach a view.

Renderings that many views share are computed once and kept beside the
object they render (weakly, so they go with it): an edge snapshot's JSON,
and a fleet round's per-row counts and totals.
"""

from __future__ import annotations

import bisect
import datetime
import json
import math
import time
from typing import Any, Optional, Union
from weakref import WeakKeyDictionary

import attrs

from twisted_iop.controlplane.fleet_rounds import FleetRound, StatusRow
from twisted_iop.controlplane.operations import LateOutcome, OperationBuffer, OperationRecord
from twisted_iop.controlplane.records import EventBuffer, EventRecord
from twisted_iop.controlplane.registry import EdgeHello, EdgeRecord, StatusSnapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import (
    COUNTS_LEN,
    EMPTY_COUNTS,
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


def iso(seconds: Optional[float]) -> Optional[str]:
    """``seconds`` since the epoch as ISO 8601 UTC with milliseconds."""
    if seconds is None or seconds <= 0:
        return None
    if seconds < _LAST_FAST_SECOND:
        # What datetime.fromtimestamp does (microseconds rounded half to
        # even, carried into the second), with the second's text reused.
        fraction, whole = math.modf(seconds)
        micros = round(fraction * 1e6)
        second = int(whole)
        if micros >= 1_000_000:
            second += 1
            micros -= 1_000_000
        cached = _last_second
        if cached[0] != second:
            cached[1] = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
            cached[0] = second
        return f"{cached[1]}{micros // 1000:03d}Z"
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


def edge_detail(record: EdgeRecord) -> dict[str, Any]:
    """``GET /edges/{id}``: the summary plus snapshot and buffer facts."""
    out = edge_summary(record)
    snapshot = record.snapshot
    out["status"] = {
        "available": snapshot is not None,
        "stale": snapshot is None or not record.connected,
        "received_at": iso(snapshot.received_at) if snapshot else None,
    }
    events = record.events
    out["events"] = {
        "capacity": events.capacity,
        "kept": len(events),
        "dropped": events.dropped,
        "last_sequence": events.last_sequence,
        **byte_facts(events),
    }
    ops = record.operations
    out["operations"] = {"capacity": ops.capacity, "kept": len(ops), "dropped": ops.dropped, **byte_facts(ops)}
    return out


#: Edges whose enrollment-time JSON :func:`edge_detail_json` keeps (the
#: oldest kept is dropped first beyond this).
HELLO_JSON_KEPT = 4096
#: edge id -> (the hello rendered, its three JSON pieces).
_hello_json: dict[str, tuple[EdgeHello, bytes, bytes, bytes]] = {}


def _json_text(value: Optional[str]) -> bytes:
    """An ISO time (ASCII, nothing to escape) or None as JSON."""
    return b"null" if value is None else b'"' + value.encode("ascii") + b'"'


def _hello_pieces(record: EdgeRecord) -> tuple[EdgeHello, bytes, bytes, bytes]:
    """The parts of an edge's JSON that change only when it enrolls: before
    ``connected``, between it and ``connected_at``, and ``commands`` up to
    the status's ``available``."""
    hello = record.hello
    kept = _hello_json.get(record.edge_id)
    if kept is not None and kept[0] is hello:
        return kept
    dumps = _compact_json
    pieces = (
        hello,
        b'{"edge_id":' + dumps(record.edge_id) + b',"connected":',
        b',"labels":'
        + dumps(dict(hello.labels))
        + b',"software_version":'
        + dumps(hello.software_version)
        + b',"protocol_version":'
        + dumps(hello.protocol_version)
        + b',"connected_at":',
        b',"commands":' + dumps(record.command_names) + b',"status":{"available":',
    )
    if kept is None and len(_hello_json) >= HELLO_JSON_KEPT:
        del _hello_json[next(iter(_hello_json))]
    _hello_json[record.edge_id] = pieces
    return pieces


def _compact_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def edge_detail_json(record: EdgeRecord) -> bytes:
    """``GET /edges/{id}``: :func:`edge_detail` as compact JSON bytes.

    What the edge said at enrollment (id, labels, versions, catalog names)
    is rendered once per enrollment and kept; each call renders only the
    times, counters and buffer facts around it. The bytes are those of
    ``json.dumps(edge_detail(record), separators=(",", ":"))``.
    """
    _, head, hello_part, commands_part = _hello_pieces(record)
    snapshot = record.snapshot
    connected = record.connected
    events = record.events
    ops = record.operations
    return b"".join(
        (
            head,
            b"true" if connected else b"false",
            hello_part,
            _json_text(iso(record.connected_at)),
            b',"last_seen":',
            _json_text(iso(record.seen_at())),
            b',"disconnected_at":',
            _json_text(iso(record.disconnected_at)),
            b',"enrollments":%d' % record.enrollments,
            commands_part,
            b"false" if snapshot is None else b"true",
            b',"stale":',
            b"true" if snapshot is None or not connected else b"false",
            b',"received_at":',
            _json_text(iso(snapshot.received_at) if snapshot else None),
            b'},"events":{"capacity":%d,"kept":%d,"dropped":%d,"last_sequence":%d'
            b',"byte_budget":%d,"bytes":%d,"dropped_by_bytes":%d}'
            % (
                events.capacity,
                len(events),
                events.dropped,
                events.last_sequence,
                events.byte_budget,
                events.bytes,
                events.dropped_by_bytes,
            ),
            b',"operations":{"capacity":%d,"kept":%d,"dropped":%d,"byte_budget":%d,"bytes":%d,"dropped_by_bytes":%d}}'
            % (ops.capacity, len(ops), ops.dropped, ops.byte_budget, ops.bytes, ops.dropped_by_bytes),
        )
    )


def byte_facts(buffer: Union[EventBuffer, OperationBuffer]) -> dict[str, int]:
    """A buffer's byte budget, its kept bytes and the drops the budget caused."""
    return {"byte_budget": buffer.byte_budget, "bytes": buffer.bytes, "dropped_by_bytes": buffer.dropped_by_bytes}


def _counters(capacity: int, in_flight: int, queued: int) -> dict[str, int]:
    return {"capacity": capacity, "in_flight": in_flight, "queued": queued}


def provider_json(provider: pb.ProviderSnapshot) -> dict[str, Any]:
    """One provider of a node snapshot."""
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


def snapshot_counts(snapshot: StatusSnapshot) -> tuple[int, ...]:
    """Counts over one edge snapshot as a flat tuple (computed when it arrived)."""
    return snapshot.counts


def add_counts(into: list[int], counts: tuple[int, ...]) -> None:
    """Add ``counts`` into the running sum ``into``."""
    for i, value in enumerate(counts):
        into[i] += value


def _counter_group(counts: Any, at: int) -> dict[str, int]:
    return {"capacity": counts[at], "in_flight": counts[at + 1], "queued": counts[at + 2]}


def counts_json(counts: Any) -> dict[str, Any]:
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


def row_counts_json(counts: Any) -> dict[str, Any]:
    """The per-edge counts of a fleet status row."""
    return {
        "nodes_connected": counts[0],
        "nodes_configured": counts[1],
        "providers": counts[2],
        "general": _counter_group(counts, GENERAL_AT),
        "long_context": _counter_group(counts, LONG_AT),
    }


#: The JSON body of each snapshot (every view of one snapshot shares it).
_rendered_snapshots: WeakKeyDictionary[StatusSnapshot, dict[str, Any]] = WeakKeyDictionary()


def snapshot_json(record: EdgeRecord, snapshot: StatusSnapshot, stale: bool) -> dict[str, Any]:
    """``GET /edges/{id}/status``: an edge snapshot with totals."""
    rendered = _rendered_snapshots.get(snapshot)
    if rendered is None:
        rendered = {
            "generated_at": iso_ms(snapshot.response.generated_at_ms),
            "received_at": iso(snapshot.received_at),
            "nodes": [node_json(n) for n in snapshot.response.nodes],
            "totals": counts_json(snapshot.counts),
        }
        _rendered_snapshots[snapshot] = rendered
    out: dict[str, Any] = {"edge_id": record.edge_id, "connected": record.connected, "stale": stale}
    out.update(rendered)
    return out


@attrs.frozen
class RoundSummary:
    """What every page of one fleet round shares: row counts and totals."""

    row_counts: list[tuple[int, ...]]
    totals: dict[str, Any]


_round_summaries: WeakKeyDictionary[FleetRound, RoundSummary] = WeakKeyDictionary()


def round_summary(round_: FleetRound) -> RoundSummary:
    """Counts of each row and the fleet totals, computed once per round.

    Totals count only fresh rows' nodes and providers; an edge counts as
    connected when it had a connection during the round.
    """
    summary = _round_summaries.get(round_)
    if summary is not None:
        return summary
    row_counts: list[tuple[int, ...]] = []
    edges_connected = 0
    # Fresh rows' counts, each distinct tuple once with how many rows have
    # it (snapshots with equal counts share one tuple): one sum per tuple,
    # not one per row.
    fresh: dict[int, list[Any]] = {}
    for row in round_.rows:
        counts = row.snapshot.counts if row.snapshot is not None else EMPTY_COUNTS
        row_counts.append(counts)
        if row.connected:
            edges_connected += 1
        if row.state == "ok":
            seen = fresh.get(id(counts))
            if seen is None:
                fresh[id(counts)] = [counts, 1]
            else:
                seen[1] += 1
    totals = [0] * COUNTS_LEN
    for counts, rows in fresh.values():
        for i, value in enumerate(counts):
            totals[i] += value * rows
    out = counts_json(totals)
    out["edges_known"] = len(round_.rows)
    out["edges_connected"] = edges_connected
    summary = RoundSummary(row_counts, out)
    _round_summaries[round_] = summary
    return summary


def fleet_row_json(row: StatusRow, counts: tuple[int, ...]) -> dict[str, Any]:
    """One edge's row of ``GET /fleet/status``."""
    record = row.record
    item = {
        "edge_id": record.edge_id,
        "connected": row.connected,
        "state": row.state,
        "error": {"code": row.error_code, "message": row.error_message} if row.error_code else None,
        "received_at": iso(row.snapshot.received_at) if row.snapshot else None,
        "stale": row.state != "ok",
        # The hello's own map, not a copy: the page is encoded at once and
        # the encoder only reads it (a hello is replaced, never changed).
        "labels": record.hello.labels,
    }
    item.update(row_counts_json(counts))
    return item


def fleet_status_json(round_: FleetRound, cursor: str, limit: int, generated_at: float) -> dict[str, Any]:
    """A page of ``GET /fleet/status``: rows after ``cursor``, and the round's totals."""
    summary = round_summary(round_)
    start = bisect.bisect_right(round_.edge_ids, cursor) if cursor else 0
    end = min(start + limit, len(round_.rows))
    items = [fleet_row_json(round_.rows[i], summary.row_counts[i]) for i in range(start, end)]
    next_cursor = items[-1]["edge_id"] if end < len(round_.rows) and items else None
    return {
        "generated_at": iso(generated_at),
        "round_at": iso(round_.round_at),
        "items": items,
        "total": len(round_.rows),
        "next_cursor": next_cursor,
        "totals": summary.totals,
    }


# -- the fleet page as bytes, from fragments ---------------------------------------
#
# A fleet page is most of a round's rendering: 1,000 rows of mostly the same
# shape. :func:`fleet_status_body` writes the bytes that
# ``json.dumps(fleet_status_json(...), separators=(",", ":"))`` writes (a
# Hypothesis test holds the two to the same bytes), from fragments encoded
# once: each label map's JSON (edges share their maps, see
# :meth:`EdgeRegistry.shared_hello`) and each counts tuple's (snapshots
# with equal counts share one tuple).

_encode_text = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
#: Encoded fragments kept at most (per kind; beyond it a table starts
#: over), and the longest kept (a longer one is encoded for each row): so
#: the tables hold at most about 1,024 small maps and their texts.
FRAGMENTS_KEPT = 1024
FRAGMENT_MAX_CHARS = 1024
#: ``id(value) -> (value, its JSON)``: the value is held, so its id is not reused while kept.
_label_fragments: dict[int, tuple[Any, str]] = {}
_count_fragments: dict[int, tuple[Any, str]] = {}


def _fragment(table: dict[int, tuple[Any, str]], value: Any, encode: Any) -> str:
    """The JSON of ``value`` (kept in ``table`` by identity when short)."""
    kept = table.get(id(value))
    if kept is not None and kept[0] is value:
        return kept[1]
    text: str = encode(value)
    if len(text) <= FRAGMENT_MAX_CHARS:
        if len(table) >= FRAGMENTS_KEPT:
            table.clear()
        table[id(value)] = (value, text)
    return text


def _labels_fragment(labels: dict[str, str]) -> str:
    return json.dumps(labels, separators=(",", ":"))


def _counts_fragment(counts: tuple[int, ...]) -> str:
    """The row's counts members, without braces (they end the row)."""
    return json.dumps(row_counts_json(counts), separators=(",", ":"))[1:-1]


def fleet_row_text(row: StatusRow, counts: tuple[int, ...]) -> str:
    """:func:`fleet_row_json` as compact JSON text."""
    record = row.record
    state = row.state
    error = (
        f'{{"code":{_encode_text(row.error_code)},"message":{_encode_text(row.error_message)}}}'
        if row.error_code
        else "null"
    )
    received = iso(row.snapshot.received_at) if row.snapshot else None
    return (
        f'{{"edge_id":{_encode_text(record.edge_id)},"connected":{"true" if row.connected else "false"},'
        f'"state":{_encode_text(state)},"error":{error},'
        f'"received_at":{"null" if received is None else _encode_text(received)},'
        f'"stale":{"false" if state == "ok" else "true"},'
        f'"labels":{_fragment(_label_fragments, record.hello.labels, _labels_fragment)},'
        f"{_fragment(_count_fragments, counts, _counts_fragment)}}}"
    )


def fleet_status_body(round_: FleetRound, cursor: str, limit: int, generated_at: float) -> bytes:
    """:func:`fleet_status_json` encoded as compact JSON bytes, row by row from fragments."""
    summary = round_summary(round_)
    rows = round_.rows
    start = bisect.bisect_right(round_.edge_ids, cursor) if cursor else 0
    end = min(start + limit, len(rows))
    row_counts = summary.row_counts
    items = ",".join([fleet_row_text(rows[i], row_counts[i]) for i in range(start, end)])
    next_cursor = rows[end - 1].record.edge_id if end < len(rows) and end > start else None
    head = json.dumps({"generated_at": iso(generated_at), "round_at": iso(round_.round_at)}, separators=(",", ":"))[:-1]
    tail = json.dumps(
        {"total": len(rows), "next_cursor": next_cursor, "totals": summary.totals}, separators=(",", ":")
    )[1:]
    return f'{head},"items":[{items}],{tail}'.encode("ascii")


def event_json(event: EventRecord) -> dict[str, Any]:
    """One event."""
    return {
        "sequence": event.sequence,
        "fleet_sequence": event.fleet_sequence,
        "edge_id": event.edge_id,
        "kind": event.kind,
        "occurred_at": iso(event.occurred_at),
        "recorded_at": iso(event.recorded_at),
        "node_id": _none_if_empty(event.node_id),
        "provider_id": _none_if_empty(event.provider_id),
        "command_id": _none_if_empty(event.command_id),
        "message": event.message,
        "attributes": dict(event.attributes),
    }


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
