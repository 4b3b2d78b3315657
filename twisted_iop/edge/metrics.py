"""The Edge's Prometheus metrics, read from its state when scraped.

Served by the Edge's metrics listener (``metrics.listen``) at
``GET /metrics``. Node, provider and queue figures are read from the node
registry and the provider pool at scrape time; the inference gateway and
the wires count what has no state to read (outcomes, latencies, frames) in
plain integers. They are read from the parts named by :class:`EdgeParts`,
which the running ``EdgeService`` (``tap.py``) provides; this module never
imports the tap, which composes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from twisted_iop.edge.status import provider_counters
from twisted_iop.metrics import (
    counter,
    gauge,
    hello_rejections,
    histograms,
    labelled,
    new_metric_registry,
    wire_metrics,
)

if TYPE_CHECKING:
    from twisted_iop.edge.control_plane_link import ControlPlaneLink
    from twisted_iop.edge.inference.gateway import InferenceGateway
    from twisted_iop.edge.inference.latency import LatencyRecorder
    from twisted_iop.edge.nodes.registry import NodeRegistry
    from twisted_iop.edge.nodes.wire import NodeServerFactory

#: The ``class`` label of the two lease classes.
GENERAL = "general"
LONG_CONTEXT = "long_context"


class EdgeParts(Protocol):
    """The parts of a running Edge that its figures are read from."""

    @property
    def registry(self) -> NodeRegistry:
        """Nodes, their providers' pool and the event relay."""

    @property
    def node_factory(self) -> NodeServerFactory:
        """The node wire: its frames and refused hellos."""

    @property
    def link(self) -> ControlPlaneLink:
        """The link to the Control Plane."""

    @property
    def inference(self) -> InferenceGateway:
        """Inference requests: outcomes and latencies."""


def edge_metric_registry(service: EdgeParts) -> CollectorRegistry:
    """The Prometheus registry behind the Edge's ``GET /metrics``."""
    return new_metric_registry(lambda: edge_metrics(service))


def edge_metrics(service: EdgeParts) -> Iterator[Metric]:
    """Every figure of the Edge: Nodes, providers, inference, wires and the Control Plane link."""
    registry = service.registry
    nodes = registry.nodes()
    yield gauge("iop_edge_nodes_configured", "Nodes configured on this Edge", len(nodes))
    yield gauge("iop_edge_nodes_connected", "Nodes with a dispatch-ready connection", len(registry.ready_nodes()))
    drained = sum(1 for node in nodes if registry.is_drained(node.node_id))
    yield gauge("iop_edge_nodes_drained", "Nodes drained (no new work)", drained)
    yield gauge("iop_edge_node_connections", "Open Node connections, ready or not", registry.connection_count())
    capacity = GaugeMetricFamily(
        "iop_edge_provider_capacity", "Leases a provider takes at once", labels=["node", "provider", "class"]
    )
    in_flight = GaugeMetricFamily(
        "iop_edge_provider_in_flight", "Leases a provider holds now", labels=["node", "provider", "class"]
    )
    queued = GaugeMetricFamily(
        "iop_edge_provider_queued",
        "Requests waiting that this provider could serve",
        labels=["node", "provider", "class"],
    )
    pool = registry.pool
    for node in nodes:
        for provider in node.providers:
            # The status view's counters: 0 for a Node that is not connected.
            counters = provider_counters(registry, node.node_id, provider.provider_id)
            general = [node.node_id, provider.provider_id, GENERAL]
            long_context = [node.node_id, provider.provider_id, LONG_CONTEXT]
            capacity.add_metric(general, counters.capacity)
            capacity.add_metric(long_context, counters.long_context_capacity)
            in_flight.add_metric(general, counters.in_flight)
            in_flight.add_metric(long_context, counters.long_context_in_flight)
            queued.add_metric(general, counters.queued)
            queued.add_metric(long_context, counters.long_context_queued)
    yield capacity
    yield in_flight
    yield queued
    yield from _engine_metrics(registry)
    yield labelled(
        GaugeMetricFamily,
        "iop_edge_queued_requests",
        "Inference requests waiting in admission queues, by lease class",
        ["class"],
        [([GENERAL], pool.queued_total(False)), ([LONG_CONTEXT], pool.queued_total(True))],
    )
    yield hello_rejections("node", service.node_factory.hello_rejections)
    yield from wire_metrics({"node": service.node_factory.wire_counters, "control_plane": service.link.wire_counters})
    inference = service.inference
    yield gauge("iop_inference_in_flight", "Inference requests admitted and not ended", inference.running())
    yield labelled(
        CounterMetricFamily,
        "iop_inference_requests",
        "Inference requests ended or refused, by endpoint and outcome",
        ["endpoint", "outcome"],
        [([endpoint, outcome], count) for (endpoint, outcome), count in sorted(inference.requests.items())],
    )
    yield histograms(
        "iop_inference_seconds",
        "Inference requests: admission to the first output, and to the end of completed ones",
        ["phase"],
        [(["first_byte"], inference.first_byte_seconds), (["total"], inference.total_seconds)],
    )
    yield labelled(
        CounterMetricFamily,
        "iop_inference_retries",
        "Inference requests sent to another provider after a failure before their first byte, by code",
        ["code"],
        [([code], count) for code, count in sorted(inference.retries.items())],
    )
    yield from _latency_metrics(registry.latency)
    yield from _trace_metrics(inference)
    link = service.link
    yield gauge(
        "iop_edge_control_plane_connected",
        "1 while a connection to the Control Plane is open",
        1 if link.current is not None else 0,
    )
    yield gauge(
        "iop_edge_control_plane_enrolled",
        "1 while the Control Plane has accepted this Edge",
        1 if link.is_enrolled else 0,
    )
    yield counter("iop_edge_control_plane_enrollments", "Times the Control Plane accepted this Edge", link.enrollments)
    relay = registry.relay
    yield gauge("iop_edge_outbox_events", "Events waiting for the Control Plane", relay.outbox_length)
    yield counter("iop_edge_outbox_dropped_events", "Events dropped from a full outbox", relay.dropped_total)


def _trace_metrics(inference: InferenceGateway) -> Iterator[Metric]:
    """Client traceparents that were not valid, and the spans of the OTLP export (when it is on)."""
    tracer = inference.tracer
    yield counter(
        "iop_inference_invalid_traceparents",
        "Inference requests whose traceparent header was not valid W3C trace context (a new trace was started)",
        tracer.invalid_traceparents,
    )
    sink = tracer.sink
    if sink is not None:
        yield labelled(
            CounterMetricFamily,
            "iop_trace_spans",
            "Spans of inference traces for the OTLP collector, by what became of them",
            ["result"],
            [(["exported"], sink.exported_spans), (["dropped"], sink.dropped_spans), (["failed"], sink.failed_spans)],
        )


def _latency_metrics(latency: LatencyRecorder) -> Iterator[Metric]:
    """The GenAI latency histograms by model, node, provider and outcome, and the queue waits."""
    labels = ["model", "node", "provider", "outcome"]
    series = list(latency.series())
    yield histograms(
        "gen_ai_server_time_to_first_token_seconds",
        "Admission to the first streamed token reaching the Edge (streamed answers only)",
        labels,
        [(key, figures.ttft) for key, figures in series],
    )
    yield histograms(
        "gen_ai_server_time_per_output_token_seconds",
        "Time per output token after the first: (end - first token) / (completion tokens - 1), completed requests",
        labels,
        [(key, figures.tpot) for key, figures in series],
    )
    yield histograms(
        "gen_ai_server_request_duration_seconds",
        "Admission to the end of the request",
        labels,
        [(key, figures.duration) for key, figures in series],
    )
    yield histograms(
        "iop_inference_queue_wait_seconds",
        "Admission (or a retry) to a lease, by the provider that granted it",
        ["model", "node", "provider"],
        latency.queue_waits(),
    )
    yield counter(
        "iop_inference_latency_dropped_series",
        "Requests left out of the latency histograms because too many label sets exist",
        latency.dropped_series,
    )


def _engine_metrics(registry: NodeRegistry) -> Iterator[Metric]:
    """The engines' own load, saturation, cool-downs and tokens, per provider."""
    labels = ["node", "provider"]
    running = GaugeMetricFamily("iop_edge_engine_running", "Requests the engine says it runs", labels=labels)
    waiting = GaugeMetricFamily("iop_edge_engine_waiting", "Requests waiting inside the engine", labels=labels)
    kv_cache = GaugeMetricFamily(
        "iop_edge_engine_kv_cache_usage", "Fraction of the engine's KV cache in use (when it says)", labels=labels
    )
    age = GaugeMetricFamily("iop_edge_engine_reading_age_seconds", "Age of the engine's last reading", labels=labels)
    saturated = GaugeMetricFamily(
        "iop_edge_provider_saturated", "1 while the engine's load is over a threshold (no new lease)", labels=labels
    )
    cooling = GaugeMetricFamily(
        "iop_edge_provider_cooling_down", "1 while the provider cools down after failures", labels=labels
    )
    rate = GaugeMetricFamily(
        "iop_edge_provider_tokens_per_second", "Completion tokens per second over the last minute", labels=labels
    )
    now = registry.now()
    for node in registry.nodes():
        for provider in node.providers:
            key = [node.node_id, provider.provider_id]
            reading = registry.providers.engine_loads.last(node.node_id, provider.provider_id)
            if reading is not None:
                running.add_metric(key, reading.running)
                waiting.add_metric(key, reading.waiting)
                if reading.kv_cache_usage is not None:
                    kv_cache.add_metric(key, reading.kv_cache_usage)
                age.add_metric(key, max(0.0, now - reading.read_at))
            saturated.add_metric(key, 1 if registry.providers.saturated(node.node_id, provider.provider_id) else 0)
            cooling.add_metric(key, 1 if registry.providers.cooling_down(node.node_id, provider.provider_id) else 0)
            rate.add_metric(key, registry.tokens.tokens_per_second(node.node_id, provider.provider_id, now))
    yield from (running, waiting, kv_cache, age, saturated, cooling, rate)
    tokens = CounterMetricFamily(
        "iop_tokens",
        "Tokens of the engines' usage, by provider, model and direction",
        labels=[*labels, "model", "direction"],
    )
    for node_id, provider_id, model, prompt, completion in registry.tokens.totals():
        tokens.add_metric([node_id, provider_id, model, "prompt"], prompt)
        tokens.add_metric([node_id, provider_id, model, "completion"], completion)
    yield tokens
    estimated = CounterMetricFamily(
        "iop_tokens_estimated",
        "The part of iop_tokens the Node estimated (the engine sent no usage: one completion token per"
        " streamed content chunk, the prompt's characters / 4)",
        labels=[*labels, "model", "direction"],
    )
    for node_id, provider_id, model, prompt, completion in registry.tokens.estimated_totals():
        estimated.add_metric([node_id, provider_id, model, "prompt"], prompt)
        estimated.add_metric([node_id, provider_id, model, "completion"], completion)
    yield estimated
