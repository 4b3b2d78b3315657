"""GET /metrics on a real Edge and a real Node (in this reactor, real sockets):
the figures move with what the fleet does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families

from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, mock_provider, write_yaml
from twisted_iop.testing.harness import eventually, start_control_plane, start_edge, start_node, stop
from twisted_iop.testing.http import chat, post
from twisted_iop.testing.wires.peers import raw_node

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(port: int) -> Samples:
    """Every sample of ``http://127.0.0.1:port/metrics``, by name and sorted labels."""
    response = await treq.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.code == 200
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain")
    text = (await response.content()).decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def provider(name: str, node: str, provider_id: str, lease_class: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The key of a per-provider, per-class sample."""
    return (name, (("class", lease_class), ("node", node), ("provider", provider_id)))


def wire(name: str, wire_name: str, direction: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The key of a wire frames/bytes sample."""
    return (name, (("direction", direction), ("wire", wire_name)))


@pytest_twisted.ensureDeferred
async def test_edge_and_node_metrics_follow_the_fleet(tmp_path: Path) -> None:
    """A Node connects, a hello is rejected, inference requests run: both daemons' figures move."""
    cp = await start_control_plane()
    services: list[Any] = []
    try:
        edge = await start_edge(
            write_yaml(
                tmp_path / "edge.yaml",
                gateway_edge_yaml(cp_address=cp.edge_wire_address, second_node=False, capacity=2),
            )
        )
        services.append(edge)
        assert edge.metrics_server is not None
        edge_port = await edge.metrics_server.bound()
        await eventually(lambda: edge.link.is_enrolled, message="edge enrolled")

        before = await scrape(edge_port)
        assert before[("iop_edge_nodes_configured", ())] == 1
        assert before[("iop_edge_nodes_connected", ())] == 0
        # A Node that is not connected has no capacity, in the metrics as in the status view.
        assert before[provider("iop_edge_provider_capacity", "node-1", "p1", "general")] == 0
        assert before[provider("iop_edge_provider_capacity", "node-1", "p1", "long_context")] == 0
        assert before[("iop_edge_control_plane_enrolled", ())] == 1
        assert before[("iop_edge_control_plane_enrollments_total", ())] == 1
        assert before[("iop_edge_outbox_events", ())] == 0
        assert before[wire("iop_wire_frames_total", "control_plane", "out")] >= 1
        assert before[("iop_hello_rejections_total", (("reason", "unknown_node"), ("wire", "node")))] == 0

        stranger = await raw_node(edge.node_port)
        answer = await stranger.hello("node-9")
        assert not answer.accepted
        await stranger.lost

        node = start_node(
            write_yaml(tmp_path / "node-1.yaml", gateway_node_yaml("node-1", edge.node_port, mock_provider("p1")))
        )
        services.append(node)
        assert node.metrics_server is not None
        node_port = await node.metrics_server.bound()
        await eventually(lambda: edge.registry.is_ready("node-1"), message="node-1 ready")

        samples = await scrape(edge_port)
        assert samples[("iop_edge_nodes_connected", ())] == 1
        assert samples[("iop_edge_node_connections", ())] == 1
        assert samples[provider("iop_edge_provider_capacity", "node-1", "p1", "general")] == 2
        assert samples[provider("iop_edge_provider_capacity", "node-1", "p1", "long_context")] == 1
        assert samples[("iop_hello_rejections_total", (("reason", "unknown_node"), ("wire", "node")))] == 1
        node_frames_in = samples[wire("iop_wire_frames_total", "node", "in")]
        assert node_frames_in >= 3  # two hellos and NodeReady at least

        node_samples = await scrape(node_port)
        assert node_samples[("iop_node_edge_connected", ())] == 1
        assert node_samples[("iop_node_edge_accepted", ())] == 1
        assert node_samples[("iop_node_ready", ())] == 1
        assert node_samples[("iop_node_providers", (("health", "healthy"),))] == 1
        assert node_samples[("iop_node_inference_requests_total", (("outcome", "completed"),))] == 0

        whole = await post(f"http://127.0.0.1:{edge.inference_port}", "/v1/chat/completions", chat(max_tokens=3))
        assert whole.code == 200
        streamed = await post(
            f"http://127.0.0.1:{edge.inference_port}", "/v1/chat/completions", chat(stream=True, max_tokens=4)
        )
        assert streamed.code == 200 and streamed.events
        missing = await post(
            f"http://127.0.0.1:{edge.inference_port}", "/v1/chat/completions", chat(model="no-such-model")
        )
        assert missing.code == 404

        samples = await scrape(edge_port)
        completed = (("endpoint", "chat.completions"), ("outcome", "completed"))
        assert samples[("iop_inference_requests_total", completed)] == 2
        refused = (("endpoint", "chat.completions"), ("outcome", "model_not_found"))
        assert samples[("iop_inference_requests_total", refused)] == 1
        assert samples[("iop_inference_seconds_count", (("phase", "total"),))] == 2
        assert samples[("iop_inference_seconds_count", (("phase", "first_byte"),))] == 2
        waited = (("model", MODEL), ("node", "node-1"), ("provider", "p1"))
        assert samples[("iop_inference_queue_wait_seconds_count", waited)] == 2
        ok = (("model", MODEL), ("node", "node-1"), ("outcome", "ok"), ("provider", "p1"))
        assert samples[("gen_ai_server_request_duration_seconds_count", ok)] == 2
        assert samples[("gen_ai_server_time_to_first_token_seconds_count", ok)] == 1  # the streamed one
        assert samples[("iop_inference_in_flight", ())] == 0
        assert samples[provider("iop_edge_provider_in_flight", "node-1", "p1", "general")] == 0
        # The mock's usage: 3 + 4 completion tokens, as in the status view.
        tokens = (("direction", "completion"), ("model", MODEL), ("node", "node-1"), ("provider", "p1"))
        assert samples[("iop_tokens_total", tokens)] == 7
        snapshot = edge.status.snapshot().nodes[0].providers[0]
        assert snapshot.completion_tokens == 7 and snapshot.tokens_per_second > 0
        assert samples[wire("iop_wire_frames_total", "node", "in")] >= node_frames_in + 3
        assert samples[wire("iop_wire_bytes_total", "node", "out")] > 0

        node_samples = await scrape(node_port)
        assert node_samples[("iop_node_inference_requests_total", (("outcome", "completed"),))] == 2
        assert node_samples[("iop_node_provider_request_seconds_count", (("provider", "p1"),))] == 2
        assert node_samples[("iop_node_inference_in_flight", ())] == 0
        assert node_samples[wire("iop_wire_frames_total", "edge", "out")] >= 5

        assert edge.registry.set_drained("node-1", True, "metrics test")
        assert (await scrape(edge_port))[("iop_edge_nodes_drained", ())] == 1
    finally:
        await stop(*reversed(services))
        await cp.stop()
