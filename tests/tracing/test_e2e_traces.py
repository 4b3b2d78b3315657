"""End to end: a client's trace through an Edge and a Node started with ``twistd -n`` to the
standalone ``iop-mock-provider``, and the Edge's spans to an OTLP receiver in this process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor

from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.harness import eventually, start_daemon, start_mock_provider, wait_for_ports
from twisted_iop.testing.http import chat, post
from twisted_iop.testing.otlp_receiver import OtlpReceiver, decoded_spans, listen_otlp_receiver
from twisted_iop.tracing.context import parse_traceparent

pytestmark = pytest.mark.e2e

TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CLIENT = f"00-{TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    """The started processes; stopped at the end, newest first."""
    held: list[Any] = []
    yield held
    for process in reversed(held):
        process.stop()


async def mock_traces(base_url: str) -> list[dict[str, str]]:
    """The trace headers the mock engine got."""
    response = await treq.get(base_url + "/mock/traces", timeout=5)
    traces: list[dict[str, str]] = json.loads(await response.content())["traces"]
    return traces


@pytest_twisted.ensureDeferred
async def test_a_client_trace_through_the_daemons_reaches_the_engine_and_the_collector(
    tmp_path: Path, processes: list[Any]
) -> None:
    """The engine sees the client's trace id with the attempt's span id; the collector gets the
    server span (child of the client's) and the attempt; the answer names node-1 and p1."""
    import opentelemetry.sdk.trace  # noqa: F401  (the [tracing] extra, installed by `make setup`)

    receiver = OtlpReceiver()
    collector, endpoint = listen_otlp_receiver(reactor, receiver)
    try:
        mock = start_mock_provider(tmp_path, "--models", MODEL)
        processes.append(mock)
        config = gateway_edge_yaml(second_node=False)
        config["nodes"][0]["providers"][0]["kind"] = "openai"
        config["tracing"] = {"otlp_endpoint": endpoint, "export_interval_seconds": 0.1, "service_name": "edge-e2e"}
        edge = start_daemon(["iop-edge", "--config", write_yaml(tmp_path / "edge.yaml", config)], tmp_path, name="edge")
        processes.append(edge)
        ports = await wait_for_ports(edge, {"node_server", "inference"})
        provider = {"provider_id": "p1", "kind": "openai", "models": [MODEL], "base_url": mock.base_url}
        node_config = gateway_node_yaml("node-1", ports["node_server"], provider)
        node = start_daemon(
            ["iop-node", "--config", write_yaml(tmp_path / "node.yaml", node_config)], tmp_path, name="node"
        )
        processes.append(node)
        base = f"http://127.0.0.1:{ports['inference']}"

        async def model_listed() -> bool:
            response = await treq.get(base + "/v1/models", timeout=5)
            return MODEL in (await response.content()).decode()

        await eventually(model_listed, timeout=30, interval=0.1, message="the node ready behind the edge")
        answer = await post(base, "/v1/chat/completions", chat(max_tokens=2), {b"traceparent": [CLIENT.encode()]})
        assert answer.code == 200, answer.body
        assert answer.headers.getRawHeaders(b"x-iop-route") == [b"node=node-1;provider=p1;attempts=1"]
        [seen] = await mock_traces(mock.base_url)
        at_engine = parse_traceparent(seen["traceparent"])
        assert at_engine is not None and at_engine.trace_id == TRACE and at_engine.span_id != CLIENT_SPAN

        fresh = await post(base, "/v1/chat/completions", chat(max_tokens=2))
        served = parse_traceparent((fresh.headers.getRawHeaders(b"traceparent") or [b""])[0])
        second = parse_traceparent((await mock_traces(mock.base_url))[-1]["traceparent"])
        assert served is not None and second is not None and served.trace_id == second.trace_id != TRACE

        await eventually(lambda: len(decoded_spans(receiver.bodies)) >= 4, timeout=20, message="spans exported")
        spans = [s for s in decoded_spans(receiver.bodies) if s.trace_id == TRACE]
        server = next(s for s in spans if s.parent_span_id == CLIENT_SPAN)
        [attempt] = [s for s in spans if s.parent_span_id == server.span_id]
        assert attempt.span_id == at_engine.span_id
        assert server.service_name == "edge-e2e" and server.attributes["iop.node.id"] == "node-1"
        assert attempt.attributes["iop.provider.id"] == "p1"
    finally:
        stopped = collector.stopListening()
        if stopped is not None:
            await stopped
