"""What the views :mod:`twisted_iop.controlplane.http.json_bytes` writes as bytes
must equal: each view as a plain dict, written the obvious way (no kept
renderings, totals summed row by row), and :func:`compact`, the
``json.dumps`` the bytes must match."""

from __future__ import annotations

import bisect
import json
from typing import Any

from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.http.json_views import (
    byte_facts,
    counts_json,
    edge_summary,
    iso,
    iso_ms,
    node_json,
    row_counts_json,
)
from twisted_iop.controlplane.http.latency_views import edge_latency_json, latency_json, models_json
from twisted_iop.controlplane.requests.fleet_rounds import FleetRound, StatusRow
from twisted_iop.wire.status_totals import COUNTS_LEN, EMPTY_COUNTS


def compact(value: object) -> bytes:
    """``value`` as compact JSON bytes (what every view is answered as)."""
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


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


def _counts(row: StatusRow) -> tuple[int, ...]:
    return row.snapshot.counts if row.snapshot is not None else EMPTY_COUNTS


def fleet_row_json(row: StatusRow) -> dict[str, Any]:
    """One edge's row of ``GET /fleet/status``."""
    record = row.record
    item = {
        "edge_id": record.edge_id,
        "connected": row.connected,
        "state": row.state,
        "error": {"code": row.error_code, "message": row.error_message} if row.error_code else None,
        "received_at": iso(row.snapshot.received_at) if row.snapshot else None,
        "stale": row.state != "ok",
        "labels": dict(record.hello.labels),
    }
    item.update(row_counts_json(_counts(row)))
    item["latency"] = edge_latency_json(row.snapshot.parse()) if row.snapshot is not None else latency_json(None)
    return item


def fleet_totals(round_: FleetRound) -> dict[str, Any]:
    """The round's totals: fresh rows' counts summed row by row, and its edges."""
    totals = [0] * COUNTS_LEN
    for row in round_.rows:
        if row.state == "ok":
            totals = [a + b for a, b in zip(totals, _counts(row), strict=True)]
    out = counts_json(totals)
    out["edges_known"] = len(round_.rows)
    out["edges_connected"] = sum(1 for row in round_.rows if row.connected)
    return out


def fleet_status_json(round_: FleetRound, cursor: str, limit: int, generated_at: float) -> dict[str, Any]:
    """A page of ``GET /fleet/status``: rows after ``cursor``, and the round's totals."""
    start = bisect.bisect_right(round_.edge_ids, cursor) if cursor else 0
    chosen = round_.rows[start : start + limit]
    more = start + limit < len(round_.rows)
    return {
        "generated_at": iso(generated_at),
        "round_at": iso(round_.round_at),
        "items": [fleet_row_json(row) for row in chosen],
        "total": len(round_.rows),
        "next_cursor": chosen[-1].record.edge_id if more and chosen else None,
        "totals": fleet_totals(round_),
    }


def snapshot_json(record: EdgeRecord, snapshot: StatusSnapshot, stale: bool) -> dict[str, Any]:
    """``GET /edges/{id}/status``: an edge snapshot with totals."""
    response = snapshot.parse()
    return {
        "edge_id": record.edge_id,
        "connected": record.connected,
        "stale": stale,
        "generated_at": iso_ms(response.generated_at_ms),
        "received_at": iso(snapshot.received_at),
        "nodes": [node_json(n) for n in response.nodes],
        "totals": counts_json(snapshot.counts),
        "models": models_json(response),
    }
