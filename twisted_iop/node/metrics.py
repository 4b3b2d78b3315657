"""The Node's Prometheus metrics, read from its state when scraped.

Served by the Node's metrics listener (``metrics.listen``) at
``GET /metrics``: provider health from the last probes, the inference
runner's counters, latencies and tokens (``iop_tokens_total``), the
engines it launches (``iop_node_engine_*``), deployment instances
(``iop_node_instances``, ``iop_node_instance_changes``), and the state of the link to the Edge.
They are read from the parts named by :class:`NodeParts`, which the running
``NodeService`` (``tap.py``) provides; this module never imports the tap,
which composes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from twisted_iop.metrics import counter, gauge, histograms, labelled, new_metric_registry, wire_metrics
from twisted_iop.node.inference import TOKEN_DIRECTIONS
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label

if TYPE_CHECKING:
    from twisted_iop.node.deployments.instances import NodeInstances
    from twisted_iop.node.edge_link import EdgeLink
    from twisted_iop.node.launch.supervisor import EngineSupervisor
    from twisted_iop.node.runtime import NodeRuntime

#: Health values as the ``health`` label shows them (``unknown``: not probed yet).
HEALTH_NAMES = {
    pb.PROVIDER_HEALTH_HEALTHY: "healthy",
    pb.PROVIDER_HEALTH_DEGRADED: "degraded",
    pb.PROVIDER_HEALTH_UNHEALTHY: "unhealthy",
    pb.PROVIDER_HEALTH_OFFLINE: "offline",
}


class NodeParts(Protocol):
    """The parts of a running Node that its figures are read from."""

    @property
    def runtime(self) -> NodeRuntime:
        """Providers, their probed health and the inference runner."""

    @property
    def link(self) -> EdgeLink:
        """The link to the Edge."""


def node_metric_registry(service: NodeParts) -> CollectorRegistry:
    """The Prometheus registry behind the Node's ``GET /metrics``."""
    return new_metric_registry(lambda: node_metrics(service))


def node_metrics(service: NodeParts) -> Iterator[Metric]:
    """Every figure of the Node: providers, inference, and the link to its Edge."""
    runtime = service.runtime
    by_health = dict.fromkeys([*HEALTH_NAMES.values(), "unknown"], 0)
    for provider in runtime.providers:
        result = runtime.health.get(provider.provider_id)
        name = "unknown" if result is None else HEALTH_NAMES.get(result.health, "unknown")
        by_health[name] += 1
    yield labelled(
        GaugeMetricFamily,
        "iop_node_providers",
        "Providers of this Node by their last probed health",
        ["health"],
        [([name], count) for name, count in by_health.items()],
    )
    yield counter("iop_node_probe_rounds", "Probe rounds over every provider", runtime.rounds)
    runner = runtime.inference
    if runner is not None:
        yield gauge("iop_node_inference_in_flight", "Inference requests running on this Node", runner.running())
        yield labelled(
            CounterMetricFamily,
            "iop_node_inference_requests",
            "Inference requests ended, by outcome",
            ["outcome"],
            [
                (["completed"], runner.completed),
                (["failed"], runner.failed),
                (["cancelled"], runner.cancelled),
                (["refused"], runner.refused),
            ],
        )
        yield histograms(
            "iop_node_provider_request_seconds",
            "Provider requests, start to the last byte, by provider",
            ["provider"],
            [([provider_id], histogram) for provider_id, histogram in sorted(runner.provider_seconds.items())],
        )
        # Every configured (provider, model) from the start, so a rate is defined before the first request.
        tokens = {
            (provider.provider_id, model, direction): 0
            for provider in runtime.providers
            for model in provider.models
            for direction in TOKEN_DIRECTIONS
        }
        tokens.update(runner.tokens)
        yield labelled(
            CounterMetricFamily,
            "iop_tokens",
            "Tokens of the engines' usage, by provider, model (configured, else other) and direction",
            ["provider", "model", "direction"],
            [(list(key), count) for key, count in sorted(tokens.items())],
        )
    engines = runtime.engines
    if engines is not None:
        yield from engine_metrics(engines)
    if runtime.instances is not None:
        yield from instance_metrics(runtime.instances)
    link = service.link
    current = link.current
    yield gauge("iop_node_edge_connected", "1 while a connection to the Edge is open", 1 if current is not None else 0)
    accepted = current is not None and current.accepted
    yield gauge("iop_node_edge_accepted", "1 while the Edge has accepted this Node's hello", 1 if accepted else 0)
    yield gauge("iop_node_ready", "1 once NodeReady was sent on the current connection", 1 if runtime.ready_sent else 0)
    yield counter("iop_node_edge_acceptances", "Times the Edge accepted this Node", link.acceptances)
    yield from wire_metrics({"edge": link.wire_counters})


def instance_metrics(instances: NodeInstances) -> Iterator[Metric]:
    """The deployments' instances on this Node: how many in each state, and the engine starts,
    restarts and stops their desired sets caused."""
    by_state = {enum_label(pb.InstanceState, v): 0 for v in pb.InstanceState.values() if v}
    for status in instances.statuses():
        name = enum_label(pb.InstanceState, status.state)
        by_state[name] = by_state.get(name, 0) + 1
    yield labelled(
        GaugeMetricFamily,
        "iop_node_instances",
        "Deployment instances asked of this Node or still stopping, by state",
        ["state"],
        [([state], count) for state, count in by_state.items()],
    )
    yield labelled(
        CounterMetricFamily,
        "iop_node_instance_changes",
        "Engine starts, restarts (a changed spec) and stops that desired sets caused",
        ["change"],
        [(["start"], instances.starts), (["restart"], instances.restarts), (["stop"], instances.stops)],
    )
    yield gauge("iop_node_free_gpus", "GPU slots of this Node no instance holds", instances.free_gpus())


def engine_metrics(engines: EngineSupervisor) -> Iterator[Metric]:
    """The engines this Node launches: state, restarts, crashes and suppressed output lines."""
    launched = sorted(engines.engines.values(), key=lambda e: e.provider_id)
    yield labelled(
        GaugeMetricFamily,
        "iop_node_engine_state",
        "1 for the state each launched engine is in, 0 for the others",
        ["provider", "state"],
        [
            ([e.provider_id, state.value], 1 if e.lifecycle.state is state else 0)
            for e in launched
            for state in EngineState
        ],
    )
    yield labelled(
        GaugeMetricFamily,
        "iop_node_engine_restarts",
        "Restarts after crashes since the engine was last started by the Node or an operator",
        ["provider"],
        [([e.provider_id], e.lifecycle.restarts) for e in launched],
    )
    yield labelled(
        CounterMetricFamily,
        "iop_node_engine_crashes",
        "Exits nobody asked for and failed starts of each launched engine",
        ["provider"],
        [([e.provider_id], e.lifecycle.crashes) for e in launched],
    )
    yield labelled(
        CounterMetricFamily,
        "iop_node_engine_log_lines_suppressed",
        "Output lines of each launched engine kept out of the Node's log by its rate limit",
        ["provider"],
        [([e.provider_id], e.suppressed_lines) for e in launched],
    )
