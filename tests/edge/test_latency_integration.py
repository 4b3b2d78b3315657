"""Latency through real daemons (a Control Plane, an Edge and a Node in this reactor,
real sockets, the mock engine at a set latency and pace): what /metrics, the
snapshot, ``iopctl status`` and the capacity history (``/fleet/history``)
show agrees with what the client measured.

How the figures are bounded without timing the machine: the Edge's interval
of each request (admission to the first chunk, to the end) lies inside the
client's (sending the request to reading the first event, to the end of the
body), so every Edge figure is at most the client's (the transport both
ways is what separates them), and at least what the mock engine waits by
its settings (``latency_seconds`` before the first token, ``1 /
tokens_per_second`` between tokens). A quantile of the sketch is within
:data:`~twisted_iop.latency.sketch.RELATIVE_ERROR` of a value observed at
its rank, so the bounds are widened by that error only.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor

from twisted_iop.client.cli import EXIT_OK, parse_arguments, run
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient
from twisted_iop.latency.sketch import RELATIVE_ERROR
from twisted_iop.latency.wire import sketch_from_wire
from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, mock_provider, write_yaml
from twisted_iop.testing.harness import eventually, start_control_plane, start_edge, start_node, stop
from twisted_iop.testing.http import chat, open_stream, post

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

#: The mock engine: this long before its first token, then this many tokens a second.
LATENCY_SECONDS = 0.15
TOKENS_PER_SECOND = 50.0
TOKENS = 6
REQUESTS = 8
#: The Control Plane samples its history every half second.
HISTORY = "history:\n  interval_seconds: 0.5\n  tiers:\n  - {keep_hours: 1}\n  - {step_seconds: 5, keep_hours: 2}\n"


async def scrape(port: int) -> Samples:
    """Every sample of the Edge's ``/metrics``, by name and sorted labels."""
    response = await treq.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families((await response.content()).decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def quantile(values: list[float], q: float) -> float:
    """The value at rank ``q * (n - 1)`` (the sketch's rank rule), exactly."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


@pytest_twisted.ensureDeferred
async def test_edge_latency_matches_what_the_client_measured(tmp_path: Path) -> None:
    """Streamed requests at a set TTFT and pace: /metrics counts and sums, the snapshot's
    p95, iopctl's TTFT column and the fleet's and the model's history all agree with the
    client's own measurements."""
    cp = await start_control_plane(config_text=HISTORY)
    services: list[Any] = []
    try:
        edge = await start_edge(
            write_yaml(
                tmp_path / "edge.yaml",
                gateway_edge_yaml(cp_address=cp.edge_wire_address, second_node=False, capacity=4),
            )
        )
        services.append(edge)
        assert edge.metrics_server is not None
        metrics_port = await edge.metrics_server.bound()
        mock = mock_provider(
            "p1", latency_seconds=LATENCY_SECONDS, tokens_per_second=TOKENS_PER_SECOND, completion_tokens=TOKENS
        )
        node = start_node(write_yaml(tmp_path / "node-1.yaml", gateway_node_yaml("node-1", edge.node_port, mock)))
        services.append(node)
        await eventually(lambda: edge.link.is_enrolled and edge.registry.is_ready("node-1"), message="ready")
        base = f"http://127.0.0.1:{edge.inference_port}"

        ttfts: list[float] = []
        durations: list[float] = []
        for _ in range(REQUESTS):
            started = reactor.seconds()
            marks: dict[str, float] = {}
            response, reader = await open_stream(base, chat(stream=True, max_tokens=TOKENS))
            assert response.code == 200

            def first_event(_: None, marks: dict[str, float] = marks) -> None:
                marks.setdefault("first", reactor.seconds())

            reader.first.addCallback(first_event)
            events = await reader.done
            ended = reactor.seconds()
            assert events and events[-1] == b"[DONE]"
            ttfts.append(marks["first"] - started)
            durations.append(ended - started)
        started = reactor.seconds()
        whole = await post(base, "/v1/chat/completions", chat(max_tokens=TOKENS))
        whole_duration = reactor.seconds() - started
        assert whole.code == 200

        samples = await scrape(metrics_port)
        ok = (("model", MODEL), ("node", "node-1"), ("outcome", "ok"), ("provider", "p1"))
        ttft_count = samples[("gen_ai_server_time_to_first_token_seconds_count", ok)]
        ttft_sum = samples[("gen_ai_server_time_to_first_token_seconds_sum", ok)]
        assert ttft_count == REQUESTS  # the whole answer has no TTFT
        assert REQUESTS * LATENCY_SECONDS <= ttft_sum <= sum(ttfts)
        assert samples[("gen_ai_server_request_duration_seconds_count", ok)] == REQUESTS + 1
        duration_sum = samples[("gen_ai_server_request_duration_seconds_sum", ok)]
        pace = 1.0 / TOKENS_PER_SECOND
        least = (REQUESTS + 1) * (LATENCY_SECONDS + (TOKENS - 1) * pace * 0.5)
        assert least <= duration_sum <= sum(durations) + whole_duration
        assert samples[("gen_ai_server_time_per_output_token_seconds_count", ok)] == REQUESTS
        tpot_sum = samples[("gen_ai_server_time_per_output_token_seconds_sum", ok)]
        assert REQUESTS * pace * 0.5 <= tpot_sum <= sum(d / (TOKENS - 1) for d in durations)

        def bucket(le: str) -> float:
            return samples[("gen_ai_server_time_to_first_token_seconds_bucket", tuple(sorted((*ok, ("le", le)))))]

        # The semconv's boundaries: none at or below 0.1 s (the mock waits 0.15 s), all below +Inf.
        assert bucket("0.1") == 0 and bucket("+Inf") == REQUESTS

        latency = edge.status.snapshot().nodes[0].providers[0].latency
        assert latency.requests_recent == REQUESTS + 1 and latency.errors_recent == 0
        edge_p95 = sketch_from_wire(latency.ttft_recent).quantile(0.95)
        assert edge_p95 is not None
        client_p95 = quantile(ttfts, 0.95)
        # The Edge's TTFTs are each inside the client's: its p95 is at most the client's (and at
        # least the mock's wait), each within the sketch's error.
        assert LATENCY_SECONDS * (1 - RELATIVE_ERROR) <= edge_p95 <= client_p95 * (1 + RELATIVE_ERROR)

        out, err = io.StringIO(), io.StringIO()
        args = parse_arguments(["--url", cp.http_url, "status", "edge-a"])
        repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)

        def wire_factory(a: Any) -> ClientWireClient:
            return ClientWireClient(cp.wire_url, reactor=reactor)

        code = await run(reactor, args, repository, wire_factory, out, err, None)
        assert code == EXIT_OK, err.getvalue()
        providers = [part for part in out.getvalue().split("\n\n") if part.startswith("NODE    PROVIDER")]
        header, row = providers[0].splitlines()[:2]
        at = header.split().index("TTFT-P95")
        shown = row.split()[at]
        assert shown.endswith("ms")
        assert LATENCY_SECONDS * 1000 * (1 - RELATIVE_ERROR) - 1 <= float(shown[:-2]) <= client_p95 * 1000 * 1.03

        # The capacity history: a sample after the requests holds the fleet's TTFT p95 (its one
        # provider's sketch), bounded like the snapshot's, and the requests of the minute per second.
        series = "series=ttft_p95,tpot_p95,requests_per_second"

        async def sampled(path: str) -> Any:
            code, view = await cp.get_json(path)
            assert code == 200, view
            points = [p for p in view["points"] if p[1] is not None and p[3] == round((REQUESTS + 1) / 60, 2)]
            return points[-1] if points else None

        point = await eventually(
            lambda: sampled(f"/fleet/history?from=-5m&step=0.5&{series}"), message="a sample with the requests"
        )
        assert LATENCY_SECONDS * (1 - RELATIVE_ERROR) <= point[1] <= client_p95 * (1 + RELATIVE_ERROR)
        assert 0 < point[2] <= max(d / (TOKENS - 1) for d in durations) * (1 + RELATIVE_ERROR)
        model = await eventually(
            lambda: sampled(f"/fleet/history?from=-5m&step=0.5&model={MODEL}&{series}"), message="the model's"
        )
        assert model[1] == point[1]
    finally:
        await stop(*reversed(services))
        await cp.stop()
