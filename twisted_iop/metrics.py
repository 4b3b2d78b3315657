"""Prometheus metrics of the daemons (``prometheus-client``).

Each daemon has its own :class:`~prometheus_client.CollectorRegistry`, so
several daemons in one process (tests, benchmarks) never mix their figures.
Most figures are **read from the daemon's state when scraped** by a
collector (connected edges, buffer drops, provider counters): the hot paths
pay nothing for them. What has no state to read (frames and bytes on a
wire, latencies) is counted where it happens with plain integer counters or
a prometheus histogram, never per edge per fleet round.

The page is rendered in the reactor thread (the state it reads belongs to
the reactor), by :class:`MetricsResource` or the Control Plane's
``GET /metrics`` view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.web.resource import Resource

#: Buckets of request latencies, in seconds (1 ms to 30 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@attrs.define
class WireCounters:
    """Frames and bytes one side of a wire has read and written (plain ints: cheap)."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def received(self, size: int) -> None:
        """One frame of ``size`` bytes (length prefix included) was read."""
        self.frames_in += 1
        self.bytes_in += size

    def sent(self, size: int) -> None:
        """One frame of ``size`` bytes (length prefix included) was written."""
        self.frames_out += 1
        self.bytes_out += size


def wire_metrics(wires: dict[str, WireCounters]) -> Iterator[Metric]:
    """Counter families for the frames and bytes of each named wire."""
    frames = CounterMetricFamily(
        "iop_wire_frames", "Frames read and written on a framed wire", labels=["wire", "direction"]
    )
    data = CounterMetricFamily(
        "iop_wire_bytes", "Bytes read and written on a framed wire", labels=["wire", "direction"]
    )
    for name, counters in wires.items():
        frames.add_metric([name, "in"], counters.frames_in)
        frames.add_metric([name, "out"], counters.frames_out)
        data.add_metric([name, "in"], counters.bytes_in)
        data.add_metric([name, "out"], counters.bytes_out)
    yield frames
    yield data


def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    """A single-value gauge family."""
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    """A single-value counter family."""
    return CounterMetricFamily(name, documentation, value=value)


def labelled(
    kind: type[Any], name: str, documentation: str, labels: list[str], values: Iterable[tuple[list[str], float]]
) -> Metric:
    """A gauge or counter family with one sample per label set."""
    family = kind(name, documentation, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family


class StateCollector(Collector):
    """A collector that calls ``collect_state`` at scrape time."""

    def __init__(self, collect_state: Callable[[], Iterable[Metric]]) -> None:
        self._collect_state = collect_state

    def collect(self) -> Iterable[Metric]:
        return list(self._collect_state())


def new_registry(*collect: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A daemon's own registry with a state collector per callable."""
    registry = CollectorRegistry(auto_describe=False)
    for function in collect:
        registry.register(StateCollector(function))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition text of ``registry`` and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsResource(Resource):
    """``GET /metrics`` for a daemon without an HTTP site of its own."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._registry = registry

    def render_GET(self, request: Any) -> bytes:
        body, content_type = render(self._registry)
        request.setHeader(b"Content-Type", content_type.encode("ascii"))
        request.setHeader(b"Cache-Control", b"no-store")
        return body
