"""GET /metrics on a real Control Plane: figures follow the fleet, behind the API token."""

from __future__ import annotations

from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import ensureDeferred

from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.wires.peers import connect_edge


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


@pytest_twisted.ensureDeferred
async def test_hello_rejections_are_counted_by_reason() -> None:
    """A refused edge hello counts under its rejection code; every code is exported from the start."""
    cp = await start_control_plane()
    try:
        before = await scrape(cp.http_url)
        assert before[("iop_hello_rejections_total", (("reason", "invalid_id"), ("wire", "edge")))] == 0
        assert before[("iop_hello_rejections_total", (("reason", "unsupported_version"), ("wire", "edge")))] == 0
        bad, response = await connect_edge(cp.edge_wire_port, "not a valid id!")
        assert response is not None and not response.accepted
        old, response = await connect_edge(cp.edge_wire_port, "edge-old", protocol_major=99)
        assert response is not None and not response.accepted
        samples = await scrape(cp.http_url)
        assert samples[("iop_hello_rejections_total", (("reason", "invalid_id"), ("wire", "edge")))] == 1
        assert samples[("iop_hello_rejections_total", (("reason", "unsupported_version"), ("wire", "edge")))] == 1
        assert samples[("iop_hello_rejections_total", (("reason", "bad_credential"), ("wire", "edge")))] == 0
        assert samples[("iop_enrollments_total", ())] == 0
        await bad.lost
        await old.lost
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_requests_latencies_operations_and_frames_follow_the_gateway() -> None:
    """A status request, a succeeded command and a fleet round over two edges each observe once; frames move."""
    cp = await start_control_plane()
    try:
        first, _ = await connect_edge(cp.edge_wire_port, "edge-g1")
        second, _ = await connect_edge(cp.edge_wire_port, "edge-g2")
        before = await scrape(cp.http_url)
        assert before[("iop_status_request_seconds_count", ())] == 0
        assert before[("iop_requests_in_flight", (("kind", "status"),))] == 0
        assert before[("iop_operations_total", (("state", "succeeded"),))] == 0
        frames_in = before[("iop_wire_frames_total", (("direction", "in"), ("wire", "edge")))]
        frames_out = before[("iop_wire_frames_total", (("direction", "out"), ("wire", "edge")))]
        bytes_in = before[("iop_wire_bytes_total", (("direction", "in"), ("wire", "edge")))]
        assert frames_in >= 2 and frames_out >= 2 and bytes_in > 4 * frames_in

        code, _ = await cp.get_json("/edges/edge-g1/status")
        assert code == 200
        code, body = await cp.post_json("/edges/edge-g1/commands", {"name": "node.drain", "target": "node-1"})
        assert code == 200 and body["state"] == "succeeded"
        first.command_behaviour = "reject"
        code, body = await cp.post_json("/edges/edge-g1/commands", {"name": "node.drain", "target": "node-1"})
        assert body["state"] == "rejected"
        code, body = await cp.get_json("/fleet/status")
        assert code == 200 and len(body["items"]) == 2

        samples = await scrape(cp.http_url)
        assert samples[("iop_status_request_seconds_count", ())] == 1
        assert samples[("iop_status_request_seconds_bucket", (("le", "+Inf"),))] == 1
        assert samples[("iop_command_seconds_count", ())] == 2
        assert samples[("iop_operations_total", (("state", "succeeded"),))] == 1
        assert samples[("iop_operations_total", (("state", "rejected"),))] == 1
        assert samples[("iop_operations_total", (("state", "timed_out"),))] == 0
        # One round over two edges: one observation, not one per edge.
        assert samples[("iop_fleet_round_seconds_count", ())] == 1
        assert samples[("iop_status_answers_refused_total", (("reason", "bounds"),))] == 0
        assert samples[("iop_status_answers_refused_total", (("reason", "totals"),))] == 0
        assert second.status_requests == 1
        assert samples[("iop_requests_in_flight", (("kind", "status"),))] == 0
        assert samples[("iop_requests_in_flight", (("kind", "command"),))] == 0
        # 1 status + 2 commands + 2 fleet asks went out; their answers and the events came in.
        out = samples[("iop_wire_frames_total", (("direction", "out"), ("wire", "edge")))]
        assert out >= frames_out + 5
        assert samples[("iop_wire_frames_total", (("direction", "in"), ("wire", "edge")))] >= frames_in + 5
        assert samples[("iop_wire_bytes_total", (("direction", "out"), ("wire", "edge")))] > 4 * out

        first.hold_status = True
        pending = ensureDeferred(cp.get_json("/edges/edge-g1/status"))

        async def one_in_flight() -> bool:
            return (await scrape(cp.http_url))[("iop_requests_in_flight", (("kind", "status"),))] == 1

        await eventually(one_in_flight, message="a held status request in flight")
        first.release_status()
        code, _ = await pending
        assert code == 200
        assert (await scrape(cp.http_url))[("iop_status_request_seconds_count", ())] == 2
        first.tcp.loseConnection()
        second.tcp.loseConnection()
    finally:
        await cp.stop()
