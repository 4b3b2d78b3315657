"""Plain-text rendering of Control Plane views for people (iopctl tables).

Every function takes a model from :mod:`twisted_iop.client.models` and
returns text without a trailing newline; none of them prints. Columns are
aligned, numbers right-aligned, missing values shown as ``-``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Optional

from twisted_iop.client.models import (
    CommandCatalog,
    EdgeDetail,
    EdgePage,
    EdgeStatus,
    Event,
    EventPage,
    FleetStatus,
    FleetStatusRow,
    LateOutcome,
    Operation,
    OperationPage,
    ProviderCounters,
    ProviderStatus,
    Readiness,
    StatusTotals,
)

#: Shown for a value that is absent.
NONE = "-"


def render_table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: Iterable[int] = ()) -> str:
    """Align ``rows`` under ``headers``; columns listed in ``numeric`` are right-aligned.

    Trailing spaces are stripped so the output diffs cleanly.
    """
    text_rows = [[str(cell) for cell in row] for row in rows]
    right = set(numeric)
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = []
        for i, cell in enumerate(cells):
            parts.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers))] + [line(row) for row in text_rows])


def time_text(value: Optional[datetime]) -> str:
    """A UTC time as ``2026-11-29 20:00:00``, or ``-``."""
    if value is None:
        return NONE
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def yes_no(value: bool) -> str:
    """``yes`` or ``no``."""
    return "yes" if value else "no"


def labels_text(labels: Mapping[str, str]) -> str:
    """``k=v,k2=v2`` sorted by key, or ``-``."""
    if not labels:
        return NONE
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def counters_text(counters: ProviderCounters) -> str:
    """``in-flight/capacity in flight, N queued``."""
    return f"{counters.in_flight}/{counters.capacity} in flight, {counters.queued} queued"


def percent_text(fraction: Optional[float]) -> str:
    """A fraction as a whole percent (``42%``), or ``-``."""
    return NONE if fraction is None else f"{fraction * 100:.0f}%"


def rate_text(rate: Optional[float]) -> str:
    """Tokens per second to one decimal, or ``-``."""
    return NONE if rate is None else f"{rate:.1f}"


def seconds_text(seconds: Optional[float]) -> str:
    """A latency in milliseconds below 10 s (``412ms``), else in seconds (``12.4s``); ``-`` for none."""
    if seconds is None:
        return NONE
    if seconds < 10:
        return f"{seconds * 1000:.0f}ms" if seconds >= 0.001 else f"{seconds * 1000:.2f}ms"
    return f"{seconds:.1f}s"


def flags_text(provider: ProviderStatus) -> str:
    """``saturated``, ``cooling-down``, both (comma-separated), or ``-``."""
    flags = [name for name, on in (("saturated", provider.saturated), ("cooling-down", provider.cooling_down)) if on]
    return ",".join(flags) or NONE


def launch_text(provider: ProviderStatus) -> str:
    """A launched engine's state, with its restarts: ``ready``, ``crashed(2)``; ``-`` when not launched."""
    launch = provider.launch
    if launch is None:
        return NONE
    return f"{launch.state}({launch.restarts})" if launch.restarts else launch.state


def reason_text(provider: ProviderStatus) -> str:
    """The health reason, and when a crashed engine is tried next."""
    launch = provider.launch
    if launch is not None and launch.next_try_at is not None:
        return f"{provider.health_reason}; next try {time_text(launch.next_try_at)}"
    return provider.health_reason


def engine_cells(provider: ProviderStatus) -> tuple[str, str, str]:
    """The engine's running and waiting requests and KV cache use (``-`` without a reading)."""
    engine = provider.engine
    if engine is None:
        return NONE, NONE, NONE
    return str(engine.running), str(engine.waiting), percent_text(engine.kv_cache_usage)


def engines_text(providers: Sequence[ProviderStatus]) -> str:
    """What the providers' engines say in all: requests running and waiting
    (of those with a reading), tokens per second, and how many are flagged."""
    read = [p.engine for p in providers if p.engine is not None]
    rate = sum(p.tokens_per_second or 0.0 for p in providers)
    text = (
        f"{sum(e.running for e in read)} running, {sum(e.waiting for e in read)} waiting "
        f"({len(read)} of {len(providers)} report); {rate:.1f} tokens/s"
    )
    saturated = sum(1 for p in providers if p.saturated)
    cooling = sum(1 for p in providers if p.cooling_down)
    if saturated or cooling:
        text += f"; {saturated} saturated, {cooling} cooling down"
    return text


def _counts_text(counts: Mapping[str, int]) -> str:
    shown = [f"{k} {v}" for k, v in counts.items() if v]
    return ", ".join(shown) if shown else "none"


def render_edges(page: EdgePage) -> str:
    """The ``iopctl edges`` table."""
    edges = page.items
    if not edges:
        return "no edges are known"
    rows = [
        (
            e.edge_id,
            yes_no(e.connected),
            e.software_version or NONE,
            e.protocol_version or NONE,
            time_text(e.connected_at if e.connected else e.disconnected_at),
            time_text(e.last_seen),
            e.enrollments,
            len(e.commands),
            labels_text(e.labels),
        )
        for e in edges
    ]
    headers = ("EDGE", "CONNECTED", "VERSION", "PROTOCOL", "SINCE", "LAST SEEN", "ENROLLMENTS", "COMMANDS", "LABELS")
    return render_table(headers, rows, numeric=(6, 7))


def render_edge(detail: EdgeDetail) -> str:
    """The ``iopctl edge ID`` key/value view."""
    edge = detail.summary
    pairs: list[tuple[str, str]] = [
        ("edge", edge.edge_id),
        ("connected", yes_no(edge.connected)),
        ("software version", edge.software_version or NONE),
        ("protocol version", edge.protocol_version or NONE),
        ("connected at", time_text(edge.connected_at)),
        ("last seen", time_text(edge.last_seen)),
        ("disconnected at", time_text(edge.disconnected_at)),
        ("enrollments", str(edge.enrollments)),
        ("labels", labels_text(edge.labels)),
        ("commands", ", ".join(edge.commands) or NONE),
    ]
    status = detail.status
    snapshot = "none" if not status.available else ("stale" if status.stale else "fresh")
    pairs.append(("last snapshot", f"{snapshot}, received {time_text(status.received_at)}"))
    b = detail.events
    last = NONE if b.last_sequence is None else str(b.last_sequence)
    pairs.append(("events", f"{b.kept} kept of {b.capacity}, {b.dropped} dropped, last sequence {last}"))
    b = detail.operations
    pairs.append(("operations", f"{b.kept} kept of {b.capacity}, {b.dropped} dropped"))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in pairs)


def render_totals(totals: StatusTotals) -> str:
    """Totals as two short lines."""
    lines = []
    if totals.edges_known is not None:
        lines.append(f"edges      {totals.edges_connected or 0}/{totals.edges_known} connected")
    lines.append(
        f"nodes      {totals.nodes_connected}/{totals.nodes_configured} connected; "
        f"providers {totals.providers} ({_counts_text(totals.providers_by_status)}; "
        f"{_counts_text(totals.providers_by_health)})"
    )
    lines.append(f"general    {counters_text(totals.general)}")
    lines.append(f"long ctx   {counters_text(totals.long_context)}")
    return "\n".join(lines)


def render_status(status: EdgeStatus) -> str:
    """The ``iopctl status ID`` view: a header, totals (with what the engines
    say in all), node rows, and provider rows with each engine's load,
    tokens per second and flags beside the capacity counters."""
    freshness = "STALE" if status.stale else "fresh"
    header = (
        f"edge {status.edge_id}: {'connected' if status.connected else 'not connected'}, "
        f"{freshness} snapshot generated {time_text(status.generated_at)}, "
        f"received {time_text(status.received_at)}"
    )
    parts = [header]
    providers = [p for n in status.nodes for p in n.providers]
    if status.totals is not None:
        totals = render_totals(status.totals)
        if providers:
            totals += f"\nengines    {engines_text(providers)}"
        parts.append(totals)
    if not status.nodes:
        parts.append("no nodes are configured")
        return "\n\n".join(parts)
    node_rows = [
        (
            n.node_id,
            yes_no(n.connected),
            yes_no(n.drained),
            len(n.providers),
            time_text(n.connected_since),
            time_text(n.last_seen),
            labels_text(n.labels),
        )
        for n in status.nodes
    ]
    parts.append(
        render_table(
            ("NODE", "CONNECTED", "DRAINED", "PROVIDERS", "CONNECTED SINCE", "LAST SEEN", "LABELS"),
            node_rows,
            numeric=(3,),
        )
    )
    provider_rows = [
        (
            n.node_id,
            p.provider_id,
            p.kind or NONE,
            p.status,
            p.health,
            p.general.capacity,
            p.general.in_flight,
            p.general.queued,
            p.long_context.capacity,
            p.long_context.in_flight,
            p.long_context.queued,
            *engine_cells(p),
            rate_text(p.tokens_per_second),
            seconds_text(p.latency.ttft_p95_seconds),
            seconds_text(p.latency.tpot_p95_seconds),
            flags_text(p),
            launch_text(p),
            ",".join(p.models) or NONE,
            reason_text(p),
        )
        for n in status.nodes
        for p in n.providers
    ]
    if provider_rows:
        parts.append(
            render_table(
                (
                    "NODE",
                    "PROVIDER",
                    "KIND",
                    "STATUS",
                    "HEALTH",
                    "CAP",
                    "IN-FLIGHT",
                    "QUEUED",
                    "LC-CAP",
                    "LC-IN-FLIGHT",
                    "LC-QUEUED",
                    "ENG-RUN",
                    "ENG-WAIT",
                    "KV",
                    "TOK/S",
                    "TTFT-P95",
                    "TPOT-P95",
                    "FLAGS",
                    "LAUNCH",
                    "MODELS",
                    "REASON",
                ),
                provider_rows,
                numeric=range(5, 17),
            )
        )
    model_rows = [
        (
            model,
            seconds_text(m.latency.ttft_p50_seconds),
            seconds_text(m.latency.ttft_p95_seconds),
            seconds_text(m.latency.tpot_p50_seconds),
            seconds_text(m.latency.tpot_p95_seconds),
            seconds_text(m.latency.duration_p95_seconds),
            NONE if m.latency.requests_per_second is None else f"{m.latency.requests_per_second:.2f}",
            m.latency.errors,
        )
        for model, m in sorted(status.models.items())
    ]
    if not any(m.latency.requests for m in status.models.values()):
        model_rows = []  # no request ended in the window: no table of dashes
    if model_rows:
        parts.append(
            render_table(
                ("MODEL", "TTFT-P50", "TTFT-P95", "TPOT-P50", "TPOT-P95", "DUR-P95", "REQ/S", "ERRORS"),
                model_rows,
                numeric=range(1, 8),
            )
        )
    return "\n\n".join(parts)


def row_error_text(row: FleetStatusRow) -> str:
    """Why a fleet row is not fresh (``edge_timeout: edge 'x' did not answer ...``), or ``""``."""
    if row.error is None:
        return ""
    return f"{row.error.code}: {row.error.message}" if row.error.message else row.error.code


def render_fleet(fleet: FleetStatus) -> str:
    """The ``iopctl fleet`` view: totals, then one row per edge."""
    header = f"fleet status generated {time_text(fleet.generated_at)}"
    if fleet.round_at is not None:
        header += f" (status round began {time_text(fleet.round_at)})"
    parts = [header, render_totals(fleet.totals)]
    if not fleet.items:
        parts.append("no edges are known")
        return "\n\n".join(parts)
    rows = [
        (
            r.edge_id,
            r.state + (" (stale)" if r.stale and r.state == "ok" else ""),
            yes_no(r.connected),
            f"{r.nodes_connected}/{r.nodes_configured}",
            r.providers,
            r.general.capacity,
            r.general.in_flight,
            r.general.queued,
            r.long_context.capacity,
            r.long_context.in_flight,
            r.long_context.queued,
            seconds_text(r.latency.ttft_p95_seconds),
            seconds_text(r.latency.tpot_p95_seconds),
            row_error_text(r),
        )
        for r in fleet.items
    ]
    parts.append(
        render_table(
            (
                "EDGE",
                "STATE",
                "CONNECTED",
                "NODES",
                "PROVIDERS",
                "CAP",
                "IN-FLIGHT",
                "QUEUED",
                "LC-CAP",
                "LC-IN-FLIGHT",
                "LC-QUEUED",
                "TTFT-P95",
                "TPOT-P95",
                "ERROR",
            ),
            rows,
            numeric=range(3, 13),
        )
    )
    return "\n\n".join(parts)


def event_line(event: Event, fleet: bool = False) -> str:
    """One event on one line, for ``--follow``."""
    sequence = event.fleet_sequence if fleet else event.sequence
    when = event.occurred_at or event.recorded_at
    stamp = NONE if when is None else when.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]
    where = " ".join(
        x
        for x in (
            f"edge={event.edge_id}" if fleet else "",
            f"node={event.node_id}" if event.node_id else "",
            f"provider={event.provider_id}" if event.provider_id else "",
            f"command={event.command_id}" if event.command_id else "",
        )
        if x
    )
    text = f"{sequence:>6}  {stamp}  {event.kind:<26}"
    if where:
        text += f"  {where}"
    if event.message:
        text += f"  {event.message}"
    return text.rstrip()


def render_events(page: EventPage) -> str:
    """The ``iopctl events ID`` table and a line about the buffer."""
    fleet = page.edge_id is None
    footer = (
        f"{len(page.items)} shown; buffer keeps {page.kept} of {page.capacity}, "
        f"{page.dropped} dropped; next --since {page.next_since if page.next_since is not None else NONE}"
    )
    if not page.items:
        return "no events\n" + footer
    rows = [
        (
            e.fleet_sequence if fleet else e.sequence,
            time_text(e.occurred_at or e.recorded_at),
            e.kind,
            e.edge_id if fleet else (e.node_id or NONE),
            e.provider_id or NONE,
            e.message,
        )
        for e in page.items
    ]
    headers = ("SEQ", "TIME", "KIND", "EDGE" if fleet else "NODE", "PROVIDER", "MESSAGE")
    return render_table(headers, rows, numeric=(0,)) + "\n" + footer


def late_outcome_text(late: LateOutcome) -> str:
    """A late answer in a few words: ``succeeded at 2026-11-29 20:00:07: reason``."""
    text = f"{late.state} at {time_text(late.received_at)}"
    return f"{text}: {late.reason}" if late.reason else text


def render_operations(page: OperationPage) -> str:
    """The ``iopctl operations ID`` table, newest first.

    A LATE column (the edge's answer that came after the operation ended)
    appears when some operation of the page has one.
    """
    if not page.items:
        return "no operations"
    late = any(o.late_outcome is not None for o in page.items)
    rows = []
    for o in page.items:
        row = [o.operation_id, o.name, o.target or NONE, o.state]
        if late:
            row.append(o.late_outcome.state if o.late_outcome is not None else NONE)
        row += [time_text(o.created_at), time_text(o.finished_at), o.reason]
        rows.append(row)
    headers = ["OPERATION", "NAME", "TARGET", "STATE"] + (["LATE"] if late else []) + ["CREATED", "FINISHED", "REASON"]
    text = render_table(headers, rows)
    footer = f"{len(page.items)} shown of {page.total}"
    if page.kept is not None:
        footer += f"; buffer keeps {page.kept} of {page.capacity}, {page.dropped} dropped"
    return text + "\n" + footer


def render_commands(catalog: CommandCatalog) -> str:
    """The ``iopctl commands ID`` table."""
    if not catalog.commands:
        return f"edge {catalog.edge_id} announced no commands"
    rows = []
    for c in catalog.commands:
        args = " ".join(f"{a.name}{'' if a.required else '?'}" for a in c.arguments)
        rows.append((c.name, c.target_kind or NONE, args or NONE, c.description))
    return render_table(("COMMAND", "TARGET", "ARGUMENTS", "DESCRIPTION"), rows) + "\n(? = optional argument)"


def render_operation(operation: Operation) -> str:
    """One operation with its result and history."""
    pairs: list[tuple[str, str]] = [
        ("operation", operation.operation_id),
        ("edge", operation.edge_id),
        ("command", operation.name),
        ("target", operation.target or NONE),
        ("arguments", labels_text(operation.arguments)),
        ("state", operation.state),
    ]
    if operation.reason:
        pairs.append(("reason", operation.reason))
    if operation.late_outcome is not None:
        pairs.append(("late outcome", late_outcome_text(operation.late_outcome)))
    if operation.idempotency_key:
        pairs.append(("idempotency key", operation.idempotency_key))
    if operation.requested_by:
        pairs.append(("requested by", operation.requested_by))
    if operation.replayed:
        pairs.append(("replayed", "yes: the key matched an earlier identical command; it was not sent again"))
    pairs.append(("created", time_text(operation.created_at)))
    pairs.append(("finished", time_text(operation.finished_at)))
    width = max(len(k) for k, _ in pairs)
    lines = [f"{k.ljust(width)}  {v}" for k, v in pairs]
    if operation.result:
        lines.append("result:")
        rw = max(len(k) for k in operation.result)
        lines.extend(f"  {k.ljust(rw)}  {v}" for k, v in sorted(operation.result.items()))
    if operation.late_outcome is not None and operation.late_outcome.result:
        late_result = operation.late_outcome.result
        lines.append("late result:")
        lw = max(len(k) for k in late_result)
        lines.extend(f"  {k.ljust(lw)}  {v}" for k, v in sorted(late_result.items()))
    if operation.history:
        lines.append("history:")
        lines.extend(
            f"  {time_text(h.at)}  {h.state}" + (f"  {h.reason}" if h.reason else "") for h in operation.history
        )
    return "\n".join(lines)


def _size(count: int) -> str:
    """Bytes for people: 512 B, 3.2 KiB, 1.5 MiB ..."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"  # pragma: no cover - the loop returns


def render_readiness(readiness: Readiness) -> str:
    """``iopctl health``: readiness, listeners, the store and cluster mode."""
    rows: list[tuple[str, str]] = [
        ("ready", "yes" if readiness.ready else "NO"),
        ("stopping", "yes" if readiness.stopping else "no"),
        (
            "listeners",
            ", ".join(
                f"{label} {'bound' if bound else 'NOT BOUND'}" for label, bound in sorted(readiness.listeners.items())
            )
            or NONE,
        ),
    ]
    store = readiness.store
    if store is not None:
        state = "writing" if store.writable else f"NOT WRITABLE: {store.error or 'no reason given'}"
        age = store.last_commit_age_seconds
        parts = [
            f"{store.backend}, {state}",
            f"{store.pending} changes queued ({_size(store.pending_bytes)})",
            f"{store.dropped} dropped",
        ]
        if age is not None:
            parts.append(f"last commit {age:.1f}s ago")
        if store.backend == "sqlite":
            parts.append(f"file {_size(store.file_bytes)}")
        rows.append(("store", "; ".join(parts)))
    cluster = readiness.cluster
    if cluster is not None:
        rows.append(
            (
                "cluster",
                f"replica {cluster.replica_id}, redis {'reachable' if cluster.available else 'NOT REACHABLE'}, "
                f"fleet {'loaded' if cluster.loaded else 'not loaded yet'}",
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
