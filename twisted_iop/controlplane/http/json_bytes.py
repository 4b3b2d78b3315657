"""The Control Plane's busiest JSON views written as bytes, and every cache
the views keep.

``GET /edges/{id}`` and ``GET /fleet/status`` are answered far more often
than what they show changes. Each view is declared here once, as a tuple
of :class:`Member`: its name, how its value is read from the view's
subject, how it is written, and whether it is written on every rendering,
once per key or once per distinct value. A :class:`Template` compiles a
declaration (:mod:`~twisted_iop.controlplane.http.json_templates`) into a ``%`` template of the view's text, with a placeholder
for each value written on every rendering, and into Python functions that
read and write those values (their source is :attr:`Template.source`): a
rendering is one call and one ``%``, with no call per member. Nothing else
knows the order of the members. The bytes are those of
``json.dumps(view, separators=(",", ":"))`` of the dict renderers in
:mod:`twisted_iop.testing.json_reference` (Hypothesis tests hold them equal).

The tricks, and what each saves (``timeit`` on the process clock, CPython
3.11, best of 9; this renderer against ``json.dumps`` of the reference
dict renderer):

* ``GET /edges/{id}``: what an edge said when it enrolled (its id, labels,
  versions, catalog names) is written into the edge's template once per
  enrollment; a request writes only the times and counters: 3.7 us
  against 11.1 us.
* ``GET /fleet/status``: the rows are written by one compiled loop; each
  distinct label map and counts tuple (edges share them, see
  :meth:`EdgeRegistry.shared_hello`) is written once and kept by value,
  and looked up once per page (by identity within the call, which holds
  every row); the round's totals are summed and written once per round,
  each distinct counts tuple once with its number of rows. A page of
  1,000 rows with 10 label maps and 3 counts tuples: 1.4 ms (1.6 ms for
  a round's first page, with its totals) against 7.6 ms (1.0 ms of it
  the reference's plain totals).
* ``GET /edges/{id}/status``: the members every view of one snapshot
  shares (its times, nodes and totals) are written once per snapshot, from
  one parse of its bytes, by the compiled :data:`NODE` and
  :data:`PROVIDER` views, and kept as bytes that each view splices after
  the edge's own members. 8 nodes of 4 providers, each with an engine
  reading (15 KB): 1.5 us a view of a kept snapshot against 88 us for
  ``json.dumps`` of the kept dicts this replaced; a snapshot's first view
  255 us against 330 us for the reference's dicts and ``json.dumps``
  (187 us against 250 us without engine readings).

Every cache belongs to one :class:`JsonBytesRenderer` (the HTTP app's);
each is bounded in count and bytes, and none is kept at module level:

* an edge's template, per edge record (weakly: it goes with the record),
  written again when the edge enrolls anew: at most
  :data:`EDGE_TEMPLATES_KEPT`, and :data:`EDGE_TEMPLATES_BYTES` in all;
* the JSON of each distinct label map and counts tuple of the fleet rows,
  keyed by the value itself (equal values write equal bytes, so no entry
  can stand for another value): at most :data:`~twisted_iop.controlplane.http.json_templates.FRAGMENTS_KEPT` per
  member, none over :data:`~twisted_iop.controlplane.http.json_templates.FRAGMENT_MAX_BYTES`;
* a fleet round's totals, per round (weakly): at most :data:`ROUNDS_KEPT`;
* a snapshot's shared members as JSON bytes, per snapshot (weakly): at
  most :data:`SNAPSHOTS_KEPT`, and :data:`SNAPSHOTS_BYTES` of them in all;
* a fleet row's ``latency`` object, per distinct latency key of the
  snapshots (``snapshots.latency_key``: a snapshot without figures costs
  nothing, and a new snapshot with the figures of the last one no parse),
  or per snapshot (weakly) when its key is unknown: at most
  :data:`LATENCIES_KEPT` of each (about 0.3 KiB an entry).

The oldest entry goes first when a bound is reached;
:meth:`JsonBytesRenderer.kept` says what each cache holds.
"""

from __future__ import annotations

import bisect
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any, Optional

import attrs

from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.http.json_templates import (
    Keep,
    Kept,
    Member,
    Template,
    WeakTable,
    write_bool,
    write_int,
    write_json,
    write_number,
    write_optional_int,
    write_present,
    write_raw,
    write_received_at,
    write_text,
    write_texts,
    write_time,
    write_time_ms,
)
from twisted_iop.controlplane.http.json_views import counts_json, fraction, rate, row_counts_json, snapshot_members
from twisted_iop.controlplane.http.latency_views import (
    edge_latency_json,
    latency_json,
    models_json,
    provider_latency_json,
)
from twisted_iop.controlplane.requests.fleet_rounds import FleetRound, StatusRow
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.engine_states import engine_state_name
from twisted_iop.wire.status_totals import COUNTS_LEN, EMPTY_COUNTS, HEALTH_NAMES, STATUS_NAMES

#: Edge templates kept at most, and their bytes in all (a template is
#: about 0.5 KiB; an edge with a large catalog or label map takes more).
EDGE_TEMPLATES_KEPT = 4096
EDGE_TEMPLATES_BYTES = 4 * 1024 * 1024
#: Fleet rounds whose totals are kept (callers page through the newest),
#: and the bytes of those totals in all (about 0.4 KiB a round).
ROUNDS_KEPT = 4
ROUND_TOTALS_BYTES = 64 * 1024
#: Snapshots whose shared members are kept, and the bytes of their JSON in all.
SNAPSHOTS_KEPT = 1024
SNAPSHOTS_BYTES = 8 * 1024 * 1024
#: Fleet rows' ``latency`` objects kept (one per snapshot, about 0.25 KiB each), and their bytes in all.
LATENCIES_KEPT = 16_384
LATENCIES_BYTES = 4 * 1024 * 1024
#: A row without a snapshot: no figures.
_NO_LATENCY = write_json(latency_json(None))

_BUFFER_COUNTS = (
    Member("capacity", "capacity", write_int),
    Member("kept", len, write_int),
    Member("dropped", "dropped", write_int),
)
_BYTE_FACTS = (
    Member("byte_budget", "byte_budget", write_int),
    Member("bytes", "bytes", write_int),
    Member("dropped_by_bytes", "dropped_by_bytes", write_int),
)


def _status_stale(record: EdgeRecord) -> bool:
    return record.snapshot is None or not record.connected


#: ``GET /edges/{id}``, of an :class:`EdgeRecord`; its key is the edge's
#: enrollment (its hello).
EDGE_DETAIL = (
    Member("edge_id", "edge_id", write_text, Keep.PER_KEY),
    Member("connected", "connected", write_bool),
    Member("labels", "hello.labels", write_json, Keep.PER_KEY),
    Member("software_version", "hello.software_version", write_text, Keep.PER_KEY),
    Member("protocol_version", "hello.protocol_version", write_text, Keep.PER_KEY),
    Member("connected_at", "connected_at", write_time),
    Member("last_seen", EdgeRecord.seen_at, write_time),
    Member("disconnected_at", "disconnected_at", write_time),
    Member("enrollments", "enrollments", write_int),
    Member("commands", "command_names", write_json, Keep.PER_KEY),
    Member(
        "status",
        None,
        (
            Member("available", "snapshot", write_present),
            Member("stale", _status_stale, write_bool),
            Member("received_at", "snapshot", write_received_at),
        ),
    ),
    Member(
        "events",
        "events",
        (*_BUFFER_COUNTS, Member("last_sequence", "last_sequence", write_int), *_BYTE_FACTS),
    ),
    Member("operations", "operations", (*_BUFFER_COUNTS, *_BYTE_FACTS)),
)


def _row_error(row: StatusRow) -> Optional[dict[str, str]]:
    return {"code": row.error_code, "message": row.error_message} if row.error_code else None


def _row_stale(row: StatusRow) -> bool:
    return row.state != "ok"


def _row_counts(row: StatusRow) -> tuple[int, ...]:
    snapshot = row.snapshot
    return snapshot.counts if snapshot is not None else EMPTY_COUNTS


def _write_row_counts(counts: tuple[int, ...]) -> bytes:
    # The members of row_counts_json, spliced into the row.
    return write_json(row_counts_json(counts))[1:-1]


#: One edge's row of ``GET /fleet/status``, of its :class:`StatusRow`.
FLEET_ROW = (
    Member("edge_id", "record.edge_id", write_text),
    Member("connected", "connected", write_bool),
    Member("state", "state", write_text),
    Member("error", _row_error, write_json),
    Member("received_at", "snapshot", write_received_at),
    Member("stale", _row_stale, write_bool),
    Member("labels", "record.hello.labels", write_json, Keep.PER_VALUE),
    Member(None, _row_counts, _write_row_counts, Keep.PER_VALUE),
)


@attrs.frozen
class _FleetPage:
    """What one page of ``GET /fleet/status`` shows (its rows and totals written)."""

    generated_at: float
    round_at: float
    items: bytes
    total: int
    next_cursor: Optional[str]
    totals: bytes


#: A page of ``GET /fleet/status``, of a :class:`_FleetPage`.
FLEET_PAGE = (
    Member("generated_at", "generated_at", write_time),
    Member("round_at", "round_at", write_time),
    Member("items", "items", write_raw),
    Member("total", "total", write_int),
    Member("next_cursor", "next_cursor", write_json),
    Member("totals", "totals", write_raw),
)


def _fleet_totals(round_: FleetRound) -> dict[str, Any]:
    """The round's totals: the counts of its fresh rows, and its edges.

    An edge counts as connected when it had a connection during the round.
    """
    # Snapshots with equal counts share one tuple: one sum per distinct
    # tuple, times its rows, not one sum per row (counted in C, without a
    # call per row).
    fresh = Counter(
        [
            EMPTY_COUNTS if (snapshot := row.snapshot) is None else snapshot.counts
            for row in round_.rows
            if row.state == "ok"
        ]
    )
    totals = [0] * COUNTS_LEN
    for counts, rows in fresh.items():
        for i, value in enumerate(counts):
            totals[i] += value * rows
    out = counts_json(totals)
    out["edges_known"] = len(round_.rows)
    out["edges_connected"] = sum(1 for row in round_.rows if row.connected)
    return out


def _write_engine(engine: pb.EngineLoad) -> bytes:
    """What a provider's engine says of its load (``null`` without a reading)."""
    return _ENGINE.render(engine) if engine.known else b"null"


def _kv_cache_usage(engine: pb.EngineLoad) -> Optional[float]:
    return fraction(engine.kv_cache_usage)


def _parallel(engine: pb.EngineLoad) -> Optional[int]:
    return engine.parallel or None


def _age_seconds(engine: pb.EngineLoad) -> float:
    return engine.age_ms / 1000


#: A provider's engine reading, of its ``EngineLoad`` (see :func:`_write_engine`).
ENGINE = (
    Member("running", "running", write_int),
    Member("waiting", "waiting", write_int),
    Member("kv_cache_usage", _kv_cache_usage, write_number),
    Member("parallel", _parallel, write_optional_int),
    Member("age_seconds", _age_seconds, write_number),
)


def _launch_state(launch: pb.EngineLaunch) -> str:
    return engine_state_name(launch.state)


def _launch_pid(launch: pb.EngineLaunch) -> Optional[int]:
    return launch.pid or None


#: A launched engine's lifecycle, of its ``EngineLaunch`` (see :func:`_write_launch`).
LAUNCH = (
    Member("state", _launch_state, write_text),
    Member("reason", "reason", write_text),
    Member("restarts", "restarts", write_int),
    Member("next_try_at", "next_try_at_ms", write_time_ms),
    Member("since", "since_ms", write_time_ms),
    Member("pid", _launch_pid, write_optional_int),
)


def _launch(provider: pb.ProviderSnapshot) -> Optional[pb.EngineLaunch]:
    return provider.launch if provider.HasField("launch") else None


def _write_launch(launch: Optional[pb.EngineLaunch]) -> bytes:
    """A launched engine's lifecycle (``null`` when someone else runs the engine)."""
    return _LAUNCH.render(launch) if launch is not None else b"null"


def _status_name(provider: pb.ProviderSnapshot) -> str:
    return STATUS_NAMES.get(provider.status, "unavailable")


def _health_name(provider: pb.ProviderSnapshot) -> str:
    return HEALTH_NAMES.get(provider.health, "unknown")


def _tokens_per_second(provider: pb.ProviderSnapshot) -> Optional[float]:
    return rate(provider.tokens_per_second)


#: One provider of a snapshot's node, of its ``ProviderSnapshot``.
PROVIDER = (
    Member("provider_id", "provider_id", write_text),
    Member("kind", "kind", write_text),
    Member("models", "models", write_texts),
    Member("status", _status_name, write_text),
    Member("health", _health_name, write_text),
    Member("health_reason", "health_reason", write_text),
    Member(
        "general",
        None,
        (
            Member("capacity", "capacity", write_int),
            Member("in_flight", "in_flight", write_int),
            Member("queued", "queued", write_int),
        ),
    ),
    Member(
        "long_context",
        None,
        (
            Member("capacity", "long_context_capacity", write_int),
            Member("in_flight", "long_context_in_flight", write_int),
            Member("queued", "long_context_queued", write_int),
        ),
    ),
    Member("engine", "engine", _write_engine),
    Member("tokens_per_second", _tokens_per_second, write_number),
    Member(
        "tokens",
        None,
        (
            Member("prompt", "prompt_tokens", write_int),
            Member("completion", "completion_tokens", write_int),
            Member(
                "estimated",
                None,
                (
                    Member("prompt", "estimated_prompt_tokens", write_int),
                    Member("completion", "estimated_completion_tokens", write_int),
                ),
            ),
        ),
    ),
    Member("saturated", "saturated", write_bool),
    Member("cooling_down", "cooling_down", write_bool),
    Member("launch", _launch, _write_launch),
    Member("latency", provider_latency_json, write_json),
)


def _write_providers(providers: Iterable[pb.ProviderSnapshot]) -> bytes:
    return b"[" + b",".join(_PROVIDER.render_all(providers)) + b"]"


def _labels(node: pb.EdgeNodeSnapshot) -> dict[str, str]:
    return dict(node.labels)


#: One node of a snapshot, of its ``EdgeNodeSnapshot``.
NODE = (
    Member("node_id", "node_id", write_text),
    Member("connected", "connected", write_bool),
    Member("drained", "drained", write_bool),
    Member("connected_since", "connected_since_ms", write_time_ms),
    Member("last_seen", "last_seen_ms", write_time_ms),
    Member("labels", _labels, write_json),
    Member("providers", "providers", _write_providers),
)

# Compiled once: these views keep no texts (no per-value members), so one
# compilation serves every renderer.
_ENGINE = Template("ENGINE", ENGINE)
_LAUNCH = Template("LAUNCH", LAUNCH)
_PROVIDER = Template("PROVIDER", PROVIDER)
_NODE = Template("NODE", NODE)


def _write_nodes(nodes: Iterable[pb.EdgeNodeSnapshot]) -> bytes:
    return b"[" + b",".join(_NODE.render_all(nodes)) + b"]"


def _write_totals(counts: tuple[int, ...]) -> bytes:
    return write_json(counts_json(counts))


def _write_models(response: pb.EdgeStatusResponse) -> bytes:
    return write_json(models_json(response))


@attrs.frozen
class _SnapshotView:
    """A kept snapshot and the message parsed from its bytes."""

    snapshot: StatusSnapshot
    response: pb.EdgeStatusResponse


#: What every view of one snapshot shows alike (:func:`snapshot_members`),
#: of a :class:`_SnapshotView`.
SNAPSHOT_MEMBERS = (
    Member("generated_at", "response.generated_at_ms", write_time_ms),
    Member("received_at", "snapshot.received_at", write_time),
    Member("nodes", "response.nodes", _write_nodes),
    Member("totals", "snapshot.counts", _write_totals),
    Member("models", "response", _write_models),
)


@attrs.frozen
class _StatusView:
    """What one ``GET /edges/{id}/status`` shows: the edge, and its snapshot's members written."""

    record: EdgeRecord
    stale: bool
    members: bytes


#: ``GET /edges/{id}/status``, of a :class:`_StatusView`.
EDGE_STATUS = (
    Member("edge_id", "record.edge_id", write_text),
    Member("connected", "record.connected", write_bool),
    Member("stale", "stale", write_bool),
    Member(None, "members", write_raw),
)


class JsonBytesRenderer:
    """The views that reuse what earlier renderings wrote, and every cache
    they keep (see the module docstring for their bounds)."""

    def __init__(self) -> None:
        self._edge = Template("EDGE_DETAIL", EDGE_DETAIL)
        self._edge_templates: WeakTable[EdgeRecord, tuple[EdgeHello, bytes]] = WeakTable(
            EDGE_TEMPLATES_KEPT, EDGE_TEMPLATES_BYTES
        )
        self._row = Template("FLEET_ROW", (*FLEET_ROW, Member("latency", self._row_latency, write_raw)))
        self._latencies: WeakTable[StatusSnapshot, bytes] = WeakTable(LATENCIES_KEPT, LATENCIES_BYTES)
        #: The same, keyed by the snapshots' latency keys (equal figures, written once).
        self._latencies_by_key: OrderedDict[bytes, bytes] = OrderedDict()
        self._page = Template("FLEET_PAGE", FLEET_PAGE)
        self._round_totals: WeakTable[FleetRound, bytes] = WeakTable(ROUNDS_KEPT, ROUND_TOTALS_BYTES)
        self._status = Template("EDGE_STATUS", EDGE_STATUS)
        self._snapshot_members = Template("SNAPSHOT_MEMBERS", SNAPSHOT_MEMBERS)
        self._snapshots: WeakTable[StatusSnapshot, bytes] = WeakTable(SNAPSHOTS_KEPT, SNAPSHOTS_BYTES)

    def edge_detail(self, record: EdgeRecord) -> bytes:
        """``GET /edges/{id}``: the edge, its status and its buffers."""
        hello = record.hello
        kept = self._edge_templates.get(record)
        if kept is None or kept[0] is not hello:
            template = self._edge.template_for(record)
            kept = self._edge_templates.keep(record, (hello, template), len(template))
        return self._edge.render(record, kept[1])

    def fleet_page(self, round_: FleetRound, cursor: str, limit: int, generated_at: float) -> bytes:
        """A page of ``GET /fleet/status``: rows after ``cursor``, and the round's totals."""
        rows = round_.rows
        start = bisect.bisect_right(round_.edge_ids, cursor) if cursor else 0
        end = min(start + limit, len(rows))
        items = b"[" + b",".join(self._row.render_all(rows[start:end])) + b"]"
        next_cursor = rows[end - 1].record.edge_id if end < len(rows) and end > start else None
        totals = self._round_totals.get(round_)
        if totals is None:
            totals = write_json(_fleet_totals(round_))
            self._round_totals.keep(round_, totals, len(totals))
        page = _FleetPage(generated_at, round_.round_at, items, len(rows), next_cursor, totals)
        return self._page.render(page)

    def _row_latency(self, row: StatusRow) -> bytes:
        """A fleet row's ``latency``: its snapshot's providers merged, written once per snapshot."""
        snapshot = row.snapshot
        if snapshot is None:
            return _NO_LATENCY
        key = snapshot.latency_key
        if key == b"":
            return _NO_LATENCY  # no provider carries figures: nothing to parse
        if key is None:
            written = self._latencies.get(snapshot)
            if written is None:
                written = write_json(edge_latency_json(snapshot.parse()))
                self._latencies.keep(snapshot, written, len(written))
            return written
        written = self._latencies_by_key.get(key)
        if written is None:
            written = write_json(edge_latency_json(snapshot.parse()))
            self._latencies_by_key[key] = written
            if len(self._latencies_by_key) > LATENCIES_KEPT:
                self._latencies_by_key.popitem(last=False)
        else:
            self._latencies_by_key.move_to_end(key)
        return written

    def edge_status(self, record: EdgeRecord, snapshot: StatusSnapshot, stale: bool) -> bytes:
        """``GET /edges/{id}/status``: a snapshot of the edge, with its totals."""
        members = self._snapshots.get(snapshot)
        if members is None:
            # The members without their braces, spliced after the edge's.
            members = self._snapshot_members.render(_SnapshotView(snapshot, snapshot.parse()))[1:-1]
            self._snapshots.keep(snapshot, members, len(members))
        return self._status.render(_StatusView(record, stale, members))

    @staticmethod
    def edge_status_json(record: EdgeRecord, snapshot: StatusSnapshot, stale: bool) -> dict[str, Any]:
        """:meth:`edge_status` as a dict, rendered anew (for an error body
        that carries the last snapshot)."""
        out: dict[str, Any] = {"edge_id": record.edge_id, "connected": record.connected, "stale": stale}
        out.update(snapshot_members(snapshot))
        return out

    def kept(self) -> dict[str, Kept]:
        """What each cache holds now."""
        labels, counts = self._row.shared
        return {
            "edge_templates": Kept(len(self._edge_templates), self._edge_templates.bytes),
            "fleet_label_maps": Kept(len(labels.texts), labels.bytes),
            "fleet_counts": Kept(len(counts.texts), counts.bytes),
            "round_totals": Kept(len(self._round_totals), self._round_totals.bytes),
            "snapshot_members": Kept(len(self._snapshots), self._snapshots.bytes),
            "row_latencies": Kept(
                len(self._latencies) + len(self._latencies_by_key),
                self._latencies.bytes + sum(len(k) + len(v) for k, v in self._latencies_by_key.items()),
            ),
        }
