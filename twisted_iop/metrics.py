"""Prometheus metrics of the daemons (``prometheus-client``).

Each daemon has its own :class:`~prometheus_client.CollectorRegistry`, so
several daemons in one process (tests, benchmarks) never mix their figures.
Most figures are **read from the daemon's state when scraped** by a
collector (connected edges, buffer drops, provider counters): the hot paths
pay nothing for them. What has no state to read is counted where it
happens in plain integers, never per edge per fleet round: frames and bytes
in the wire's own :class:`~twisted_iop.wire.counters.WireCounters` (the wire
never imports this module), latencies in a :class:`LatencyHistogram`.

The page is rendered in the reactor thread (the state it reads belongs to
the reactor), by :class:`MetricsResource` or the Control Plane's
``GET /metrics`` view.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Optional

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from twisted.internet.interfaces import IReactorTime
from twisted.web.resource import Resource

from twisted_iop.web.http_site import GuardedSite
from twisted_iop.web.request_guard import SiteLimits
from twisted_iop.wire.counters import WireCounters
from twisted_iop.wire.hello import RejectionCode

#: Buckets of request latencies, in seconds (1 ms to 30 s).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """A histogram of seconds kept in plain ints (reactor thread only: no lock).

    :meth:`observe` is one bisect and three additions; the buckets are
    summed up only when a scrape renders them.
    """

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        #: One count per bound, then one above the last bound.
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Count one duration of ``seconds``."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus buckets: ``(le, observations at or below le)``, ``+Inf`` last."""
        buckets: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(self.bounds, self.counts, strict=False):
            running += count
            buckets.append((repr(float(bound)), running))
        buckets.append(("+Inf", self.count))
        return buckets


def histograms(
    name: str,
    documentation: str,
    labels: list[str],
    values: Iterable[tuple[list[str], LatencyHistogram]],
) -> HistogramMetricFamily:
    """A histogram family with one histogram per label set."""
    family = HistogramMetricFamily(name, documentation, labels=labels)
    for label_values, histogram in values:
        family.add_metric(label_values, histogram.cumulative(), histogram.total)
    return family


def histogram(name: str, documentation: str, value: LatencyHistogram) -> HistogramMetricFamily:
    """A histogram family without labels."""
    return histograms(name, documentation, [], [([], value)])


def count_by(counts: Mapping[str, int], names: Iterable[str]) -> list[tuple[list[str], float]]:
    """Samples for every name in ``names`` (0 when not counted yet), then any other counted one."""
    samples = [([name], float(counts.get(name, 0))) for name in names]
    known = {label for (label,), _ in samples}
    samples.extend(([name], float(value)) for name, value in counts.items() if name not in known)
    return samples


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


def hello_rejections(wire: str, counts: dict[str, int]) -> Metric:
    """``iop_hello_rejections_total{wire, reason}``: every rejection code, 0 until it happens."""
    return labelled(
        CounterMetricFamily,
        "iop_hello_rejections",
        "Hellos refused, by wire and rejection code",
        ["wire", "reason"],
        [([wire, reason], value) for (reason,), value in count_by(counts, [code.value for code in RejectionCode])],
    )


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
    family: Metric = kind(name, documentation, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)  # type: ignore[attr-defined]  # a Gauge or Counter family's own method
    return family


class StateCollector(Collector):
    """A collector that calls ``collect_state`` at scrape time."""

    def __init__(self, collect_state: Callable[[], Iterable[Metric]]) -> None:
        self._collect_state = collect_state

    def collect(self) -> Iterable[Metric]:
        return list(self._collect_state())


def new_metric_registry(*collect: Callable[[], Iterable[Metric]]) -> CollectorRegistry:
    """A daemon's own Prometheus registry with a state collector per callable."""
    registry = CollectorRegistry(auto_describe=False)
    for function in collect:
        registry.register(StateCollector(function))
    return registry


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition text of ``registry`` and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


#: An HTTP listener that serves only ``GET /metrics``.
METRICS_SITE_LIMITS = SiteLimits(
    max_body_bytes=0, max_connections=64, max_connections_per_address=16, methods=frozenset({b"GET", b"HEAD"})
)


def metrics_site(registry: CollectorRegistry, reactor: Optional[IReactorTime] = None) -> GuardedSite:
    """The site of a daemon's metrics listener: ``GET /metrics`` and nothing else."""
    root = Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    return GuardedSite(root, METRICS_SITE_LIMITS, None, reactor)


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
