"""Estimated token usages (the engine sent none) beside exact ones, in the counter and /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from twisted.internet.task import Clock

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.inference.tokens import TokenCounter
from twisted_iop.edge.metrics import _engine_metrics
from twisted_iop.edge.nodes.registry import NodeRegistry

EDGE = {
    "control_plane": {"edge_id": "edge-a"},
    "nodes": [
        {
            "node_id": "node-1",
            "credential": "k1",
            "providers": [{"provider_id": "p1", "kind": "mock", "models": ["m"], "capacity": 2}],
        }
    ],
}


def test_estimated_usage_counts_in_the_totals_and_in_its_own_part() -> None:
    """An estimated usage adds to the totals like an exact one, and to the estimated part alone."""
    tokens = TokenCounter()
    tokens.add("node-1", "p1", "m", 7, 3, 100.0)
    tokens.add("node-1", "p1", "m", 11, 5, 100.0, estimated=True)
    assert tokens.totals() == [("node-1", "p1", "m", 18, 8)]
    assert tokens.estimated_totals() == [("node-1", "p1", "m", 11, 5)]
    assert tokens.provider_totals("node-1", "p1") == (18, 8)


def test_metrics_say_which_tokens_are_estimated() -> None:
    """``iop_tokens_estimated_total`` is the estimated part of ``iop_tokens_total``."""
    registry = NodeRegistry(parse_edge_config(EDGE), Clock())
    registry.tokens.add("node-1", "p1", "m", 7, 3, 0.0)
    registry.tokens.add("node-1", "p1", "m", 11, 5, 0.0, estimated=True)

    class Collector:
        def collect(self) -> list[Metric]:
            return list(_engine_metrics(registry))

    prometheus = CollectorRegistry()
    prometheus.register(Collector())
    labels = {"node": "node-1", "provider": "p1", "model": "m"}
    value = prometheus.get_sample_value
    assert value("iop_tokens_total", {**labels, "direction": "completion"}) == 8
    assert value("iop_tokens_estimated_total", {**labels, "direction": "completion"}) == 5
    assert value("iop_tokens_estimated_total", {**labels, "direction": "prompt"}) == 11
