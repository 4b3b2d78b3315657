"""GET /metrics on a real Control Plane: figures follow the fleet, behind the API token."""

from __future__ import annotations

from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families

from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.peers import connect_edge


async def scrape(url: str, **kwargs: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, by name and labels."""
    response = await treq.get(url + "/metrics", **kwargs)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
    text = (await response.content()).decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest_twisted.ensureDeferred
async def test_metrics_follow_edges_and_events() -> None:
    """Connected edges, enrollments, events and wire connections are exported and move with the fleet."""
    cp = await start_control_plane()
    try:
        before = await scrape(cp.http_url)
        assert before[("iop_edges_connected", ())] == 0
        assert before[("iop_enrollments_total", ())] == 0
        first, _ = await connect_edge(cp.edge_wire_port, "edge-m1")
        second, _ = await connect_edge(cp.edge_wire_port, "edge-m2")
        samples = await scrape(cp.http_url)
        assert samples[("iop_edges_connected", ())] == 2
        assert samples[("iop_edges_known", ())] == 2
        assert samples[("iop_enrollments_total", ())] == 2
        assert samples[("iop_events_recorded_total", ())] >= 2
        assert samples[("iop_edge_wire_connections", ())] == 2
        assert samples[("iop_events_dropped_total", (("buffer", "fleet"),))] == 0
        assert samples[("iop_http_connections", ())] >= 1
        first.tcp.loseConnection()

        async def one_left() -> bool:
            return (await scrape(cp.http_url))[("iop_edges_connected", ())] == 1

        await eventually(one_left, message="one edge connected in the metrics")
        samples = await scrape(cp.http_url)
        assert samples[("iop_edges_known", ())] == 2
        second.tcp.loseConnection()
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_metrics_need_a_viewer_token_when_tokens_are_set() -> None:
    """With API tokens configured, a scrape without one is refused and a viewer token reads the page."""
    cp = await start_control_plane(
        config_text="http:\n  tokens:\n    - {name: prometheus, role: viewer, token: scrape-secret-0123456}\n"
    )
    try:
        response = await treq.get(cp.http_url + "/metrics")
        assert response.code == 401
        await response.content()
        samples = await scrape(cp.http_url, headers={"Authorization": "Bearer scrape-secret-0123456"})
        assert samples[("iop_edges_connected", ())] == 0
    finally:
        await cp.stop()
