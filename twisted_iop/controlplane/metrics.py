"""The Control Plane's Prometheus metrics, read from its state when scraped.

The figures are read from the parts named by :class:`ControlPlaneParts`,
which the running ``ControlPlaneService`` (``tap.py``) provides; this module
never imports the tap, which composes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Optional, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from twisted_iop.controlplane.requests.operation_states import TERMINAL_STATES
from twisted_iop.controlplane.rollouts.states import EXECUTION_STATES, ROLLOUT_STATES
from twisted_iop.metrics import (
    count_by,
    counter,
    gauge,
    hello_rejections,
    histogram,
    labelled,
    new_metric_registry,
    wire_metrics,
)

if TYPE_CHECKING:
    from twisted_iop.controlplane.cluster.replica import ClusterReplica
    from twisted_iop.controlplane.deployments.service import DeploymentService
    from twisted_iop.controlplane.fleet.registry import EdgeRegistry
    from twisted_iop.controlplane.history.service import HistoryService
    from twisted_iop.controlplane.requests.gateway import EdgeGateway
    from twisted_iop.controlplane.rollouts.service import RolloutService
    from twisted_iop.controlplane.slo.service import SloService
    from twisted_iop.controlplane.store.interface import Store
    from twisted_iop.controlplane.wires.client_wire import ClientWireFactory
    from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory
    from twisted_iop.web.http_site import GuardedSite


class ControlPlaneParts(Protocol):
    """The parts of a running Control Plane that its figures are read from."""

    @property
    def registry(self) -> EdgeRegistry:
        """Edges, their events and enrollments."""

    @property
    def gateway(self) -> EdgeGateway:
        """Requests in flight, their latencies and outcomes."""

    @property
    def edge_factory(self) -> EdgeWireFactory:
        """The edge wire: its connections, frames and refused hellos."""

    @property
    def client_factory(self) -> ClientWireFactory:
        """The ``/client`` WebSocket subscribers."""

    @property
    def http_site(self) -> GuardedSite:
        """The HTTP site's connections and deadlines."""

    @property
    def rollouts(self) -> RolloutService:
        """Rollouts kept and their executions."""

    @property
    def history(self) -> HistoryService:
        """Capacity history: its series and samples."""

    @property
    def slos(self) -> SloService:
        """SLOs: their budgets, burn rates and alerts."""

    @property
    def cluster(self) -> Optional[ClusterReplica]:
        """Cluster mode: this replica's link to the shared fleet (``None``: memory)."""

    @property
    def store(self) -> Store:
        """What outlives the process: its health and commits."""


def control_plane_metric_registry(service: ControlPlaneParts) -> CollectorRegistry:
    """The Prometheus registry behind the Control Plane's ``GET /metrics``."""
    return new_metric_registry(lambda: control_plane_metrics(service))


def control_plane_metrics(service: ControlPlaneParts) -> Iterator[Metric]:
    """Every figure of the Control Plane, from its registry, gateway, wires and HTTP site."""
    registry = service.registry
    yield gauge("iop_edges_connected", "Edges with a current connection", registry.connected_count)
    yield gauge("iop_edges_known", "Edges known, connected or not", registry.known_count)
    yield counter("iop_enrollments", "Accepted edge hellos", registry.enrollments_total)
    yield hello_rejections("edge", service.edge_factory.hello_rejections)
    admission = service.edge_factory.hello_admission
    yield gauge("iop_edge_hellos_queued", "Edge hellos waiting in the admission queue", admission.pending)
    yield labelled(
        CounterMetricFamily,
        "iop_edge_hello_admission_refused",
        "Edge hellos the admission queue told retry_later, by why (queue_full, queue_wait, loop_lag)",
        ["reason"],
        [([reason], count) for reason, count in admission.refused.items()],
    )
    yield gauge(
        "iop_edge_hello_queue_wait_max_seconds",
        "The longest an edge hello waited in the admission queue since the previous scrape",
        admission.reset_longest_wait(),
    )
    probe = admission.probe
    yield gauge("iop_event_loop_lag_seconds", "How late the event loop ran its last lag probe", probe.last_lag)
    yield gauge(
        "iop_event_loop_lag_max_seconds", "The event loop's largest lag since the previous scrape", probe.reset_max()
    )
    yield from wire_metrics({"edge": service.edge_factory.wire_counters})
    gateway = service.gateway
    yield labelled(
        GaugeMetricFamily,
        "iop_requests_in_flight",
        "Requests to edges waiting for their answer, by kind",
        ["kind"],
        [([kind], count) for kind, count in gateway.in_flight().items()],
    )
    yield histogram(
        "iop_status_request_seconds", "Single-edge status requests, asked to answered", gateway.status_seconds
    )
    yield histogram("iop_command_seconds", "Commands, dispatched to a terminal state", gateway.command_seconds)
    yield histogram("iop_fleet_round_seconds", "Fleet status rounds, start to last row", gateway.round_seconds)
    yield labelled(
        CounterMetricFamily,
        "iop_status_answers_refused",
        "Status answers refused, by reason (bounds: over a size, count or length bound; totals: wrong totals)",
        ["reason"],
        count_by(gateway.status_refused, ["bounds", "totals"]),
    )
    yield labelled(
        CounterMetricFamily,
        "iop_operations",
        "Operations that reached a terminal state, by state",
        ["state"],
        count_by(gateway.operations_ended, sorted(TERMINAL_STATES)),
    )
    fleet = registry.fleet_events
    yield counter("iop_events_recorded", "Events recorded", fleet.last_sequence)
    edge_dropped = sum(record.events.dropped for record in registry.edges())
    yield labelled(
        CounterMetricFamily,
        "iop_events_dropped",
        "Events that left a bounded buffer before anyone read them",
        ["buffer"],
        [(["fleet"], fleet.dropped), (["edge"], edge_dropped)],
    )
    yield gauge("iop_events_kept", "Events kept in the fleet buffer", len(fleet))
    yield gauge(
        "iop_edge_wire_connections", "Open edge-wire connections (hello or not)", len(service.edge_factory.connections)
    )
    subscribers = list(service.client_factory.connections)
    yield gauge("iop_client_connections", "Open /client WebSocket connections", len(subscribers))
    depth = GaugeMetricFamily(
        "iop_subscriber_queue_depth", "Events queued for slow /client subscribers", labels=["aggregate"]
    )
    depths = [connection.queued_events for connection in subscribers]
    depth.add_metric(["sum"], sum(depths))
    depth.add_metric(["max"], max(depths, default=0))
    yield depth
    site = service.http_site
    yield gauge("iop_http_connections", "Open HTTP connections", site.connections)
    yield counter("iop_http_refused_connections", "HTTP connections refused at a cap", site.refused_connections)
    yield counter("iop_http_timed_out_requests", "HTTP requests cut at a deadline", site.timed_out_requests)
    yield from rollout_metrics(service.rollouts)
    yield from store_metrics(service.store)
    yield from history_metrics(service.history)
    slos = getattr(service, "slos", None)
    if slos is not None:
        yield from slo_metrics(slos, slos.now())
    deployments = getattr(service, "deployments", None)
    if deployments is not None:
        yield from deployment_metrics(deployments)
    cluster = service.cluster
    if cluster is not None:
        yield gauge(
            "iop_cluster_available",
            "1 when this replica reaches the shared store with the fleet loaded",
            cluster.available,
        )
        yield gauge("iop_cluster_local_edges", "Edges whose connection this replica holds", len(cluster.local))
        yield counter("iop_cluster_writes_lost", "Writes to the shared store that failed", cluster.writes_lost)
        yield gauge(
            "iop_cluster_writes_pending",
            "Writes sent to the shared store and not yet answered",
            cluster.link.pending_writes,
        )
        yield counter(
            "iop_cluster_records_rejected",
            "Malformed records read from the shared store and skipped",
            cluster.entries_rejected,
        )
        yield counter(
            "iop_cluster_reaped_edges", "Edges of dead replicas this replica disconnected", cluster.reaped_edges
        )
        router = cluster.router
        yield counter("iop_cluster_routed_requests", "Status asks and commands routed to other replicas", router.sent)
        yield counter("iop_cluster_routed_answers", "Answers received to routed requests", router.answered)
        yield gauge("iop_cluster_routed_waiting", "Routed requests waiting for their answer", router.waiting)


def store_metrics(store: Store) -> Iterator[Metric]:
    """Whether the store writes, what it has queued and dropped, and its commits."""
    health = store.health()
    yield gauge("iop_store_writable", "1 while the store's last write succeeded", int(health.writable))
    yield gauge("iop_store_pending_changes", "Changes queued for the store, not yet on disk", health.pending)
    yield gauge("iop_store_pending_bytes", "Estimated bytes of the changes queued for the store", health.pending_bytes)
    yield counter("iop_store_dropped", "Changes dropped while the disk could not keep up", health.dropped)
    yield gauge("iop_store_file_bytes", "Bytes of the store's file and write-ahead log", health.file_bytes)
    yield counter("iop_store_commits", "Transactions committed by the store's writer", health.commits)
    yield counter("iop_store_rows_written", "Rows written by the store", health.rows_written)
    yield counter("iop_store_rows_trimmed", "Rows removed by the store's retention bounds", health.rows_trimmed)
    yield counter("iop_store_commit_seconds", "Seconds the store's writer spent committing", health.commit_seconds)


def rollout_metrics(rollouts: RolloutService) -> Iterator[Metric]:
    """Rollouts kept by state, their executions by state, operations they dispatched."""
    by_state, executions = rollouts.figures()
    yield labelled(
        GaugeMetricFamily, "iop_rollouts", "Rollouts kept, by state", ["state"], count_by(by_state, ROLLOUT_STATES)
    )
    yield labelled(
        GaugeMetricFamily,
        "iop_rollout_executions",
        "Executions of the kept rollouts, by state",
        ["state"],
        count_by(executions, EXECUTION_STATES),
    )
    yield counter("iop_rollout_dispatched", "Operations dispatched by rollouts", rollouts.dispatched_total)


def deployment_metrics(deployments: DeploymentService) -> Iterator[Metric]:
    """Deployments kept, each one's edges by rollup state, and the desired sets sent."""
    yield gauge("iop_deployments", "Deployments kept", len(deployments))
    yield labelled(
        GaugeMetricFamily,
        "iop_deployment_edges",
        "Edges a deployment selects, by the deployment's state there",
        ["deployment", "state"],
        (
            ([name, state], count)
            for name, counts in deployments.edges_by_state().items()
            for state, count in counts.items()
        ),
    )
    yield counter("iop_deployment_sets_sent", "Desired sets sent to edges", deployments.desired.sets_sent)


def slo_metrics(slos: SloService, now: float) -> Iterator[Metric]:
    """SLOs: the error budget left, the burn rate per window, and each alert (1 firing)."""
    states = slos.all()
    figures = [(state, state.figures(now)) for state in states]
    yield labelled(
        GaugeMetricFamily,
        "iop_slo_error_budget_remaining",
        "Share of the SLO's error budget left over its window (1: untouched; below 0: overspent)",
        ["slo", "model", "metric"],
        ((([s.spec.name, s.spec.model, s.spec.metric]), f.error_budget_remaining) for s, f in figures),
    )
    yield labelled(
        GaugeMetricFamily,
        "iop_slo_burn_rate",
        "The SLO's error ratio over the allowed one, per alert window (1: the budget lasts the window)",
        ["slo", "window"],
        (([s.spec.name, rate.window], rate.burn_rate) for s, f in figures for rate in f.burn_rates),
    )
    yield labelled(
        GaugeMetricFamily,
        "iop_slo_alert_firing",
        "1 while the SLO's burn-rate alert fires",
        ["slo", "alert"],
        (([slo, alert], float(firing)) for slo, alert, firing in slos.firing()),
    )
    yield counter("iop_slo_evaluations", "SLO evaluations done", slos.evaluations)
    yield counter(
        "iop_slo_readings_refused",
        "Provider latency readings left out of SLOs because they did not check",
        slos.readings.refused,
    )


def history_metrics(history: HistoryService) -> Iterator[Metric]:
    """Capacity history: series kept, samples taken and skipped, points written."""
    yield gauge(
        "iop_history_series",
        "History series being sampled (the fleet's, and every edge's and model on an edge's, in memory)",
        history.series_kept,
    )
    yield counter("iop_history_samples", "History samples taken", history.samples)
    yield labelled(
        CounterMetricFamily,
        "iop_history_samples_skipped",
        "History samples not taken, by why (busy: the previous one was still running or its round failed; "
        "max_series: a new series beyond history.max_series, one per point refused; elsewhere: another "
        "replica samples, cluster mode)",
        ["reason"],
        [
            (["busy"], history.samples_skipped),
            (["max_series"], history.series_refused),
            (["elsewhere"], history.intervals_elsewhere),
        ],
    )
    yield counter("iop_history_points_written", "History points appended, every tier", history.points_written)
    yield counter("iop_history_chunk_writes", "History chunks handed to the store", history.chunk_writes)
    yield counter(
        "iop_history_snapshots_parsed",
        "Status snapshots parsed for the per-model and engine figures of history",
        history.breakdowns.parsed,
    )
