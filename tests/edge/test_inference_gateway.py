"""The inference gateway over real sockets: an Edge and Nodes in this reactor,
clients over HTTP on loopback, mock providers paced by their options."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from importlib import resources
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest
import pytest_twisted
import treq
from twisted.internet.defer import ensureDeferred

from twisted_iop.edge.tap import EdgeService
from twisted_iop.node.tap import NodeService
from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, mock_provider, write_yaml
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.testing.http import chat, connect, open_stream, post, request_head


@attrs.define
class Fleet:
    """An Edge with its Nodes, all in this reactor."""

    edge: EdgeService
    nodes: dict[str, NodeService]
    base: str

    def counters(self, node_id: str) -> Any:
        """The pool counters of the node's provider."""
        provider = {"node-1": "p1", "node-2": "p2"}[node_id]
        return self.edge.registry.pool.counters(node_id, provider)

    def runner(self, node_id: str) -> Any:
        """The node's inference runner."""
        return self.nodes[node_id].runtime.inference


async def start_fleet(
    tmp_path: Path,
    inference: Optional[dict[str, Any]] = None,
    node_mock: Optional[dict[str, dict[str, Any]]] = None,
    second_node: bool = True,
    capacity: int = 2,
) -> Fleet:
    """Start the Edge and its Nodes; wait until every Node is ready."""
    edge = await start_edge(
        write_yaml(
            tmp_path / "edge.yaml",
            gateway_edge_yaml(inference=inference, second_node=second_node, capacity=capacity),
        )
    )
    await edge.inference_server.bound()
    nodes = {}
    wanted = ["node-1", "node-2"] if second_node else ["node-1"]
    for node_id, provider_id in zip(wanted, ["p1", "p2"][: len(wanted)], strict=True):
        options = (node_mock or {}).get(node_id, {})
        config = gateway_node_yaml(node_id, edge.node_port, mock_provider(provider_id, **options))
        nodes[node_id] = start_node(write_yaml(tmp_path / f"{node_id}.yaml", config))
    for node_id in wanted:
        await eventually(functools.partial(edge.registry.is_ready, node_id), message=f"{node_id} ready")
    return Fleet(edge, nodes, f"http://127.0.0.1:{edge.inference_port}")


@pytest.fixture
async def fleet_cleanup() -> AsyncIterator[list[Any]]:
    """Services to stop at the end of a test."""
    services: list[Any] = []
    yield services
    await stop(*services)


def pool_idle(fleet: Fleet) -> bool:
    """No lease held and no request queued anywhere."""
    pool = fleet.edge.registry.pool
    return pool.in_flight_total() == 0 and pool.queued_total() == 0 and fleet.edge.inference.running() == 0


@pytest_twisted.ensureDeferred
async def test_non_streaming_and_streaming_chat(tmp_path: Path) -> None:
    """A whole answer and an event stream ending in [DONE], both with the mock's tokens; leases come back."""
    fleet = await start_fleet(tmp_path, second_node=False)
    try:
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=3))
        assert answer.code == 200
        body = answer.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "the quick brown"
        assert body["usage"]["completion_tokens"] == 3

        answer = await post(fleet.base, "/v1/chat/completions", chat(stream=True, max_tokens=5))
        assert answer.code == 200
        assert answer.events[-1] == b"[DONE]"
        chunks = [json.loads(e) for e in answer.events[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == "the quick brown fox jumps"
        assert pool_idle(fleet)
        assert fleet.runner("node-1").completed == 2
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_completions_embeddings_and_models(tmp_path: Path) -> None:
    """The other endpoints answer in OpenAI shapes; /v1/models lists what ready providers serve."""
    fleet = await start_fleet(tmp_path, second_node=False)
    try:
        body = json.dumps({"model": MODEL, "prompt": "say", "max_tokens": 2}).encode()
        answer = await post(fleet.base, "/v1/completions", body)
        assert answer.code == 200 and answer.json()["choices"][0]["text"] == "the quick"
        body = json.dumps({"model": MODEL, "input": ["a", "b"]}).encode()
        answer = await post(fleet.base, "/v1/embeddings", body)
        assert answer.code == 200 and [d["index"] for d in answer.json()["data"]] == [0, 1]
        response = await treq.get(fleet.base + "/v1/models")
        models = json.loads(await response.content())
        assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]

        fleet.edge.registry.set_drained("node-1", True)
        response = await treq.get(fleet.base + "/v1/models")
        assert json.loads(await response.content())["data"] == []
        answer = await post(fleet.base, "/v1/chat/completions", chat())
        assert answer.code == 503 and answer.json()["error"]["code"] == "model_unavailable"
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_request_errors_name_their_cause(tmp_path: Path) -> None:
    """400 names the field, 404 model_not_found, 413 for a body over the bound, 401 without the key."""
    fleet = await start_fleet(tmp_path, second_node=False, inference={"max_request_bytes": 2048, "api_keys": ["k1"]})
    auth = {b"Authorization": [b"Bearer k1"]}
    try:
        answer = await post(fleet.base, "/v1/chat/completions", chat())
        assert answer.code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        answer = await post(fleet.base, "/v1/chat/completions", chat(), {b"Authorization": [b"Bearer k2"]})
        assert answer.code == 401
        answer = await post(fleet.base, "/v1/chat/completions", chat(), auth)
        assert answer.code == 200

        bad = json.dumps({"model": MODEL, "messages": "hi"}).encode()
        answer = await post(fleet.base, "/v1/chat/completions", bad, auth)
        assert answer.code == 400 and "messages" in answer.json()["error"]["message"]
        answer = await post(fleet.base, "/v1/chat/completions", b"{not json", auth)
        assert answer.code == 400 and answer.json()["error"]["code"] == "invalid_json"
        answer = await post(fleet.base, "/v1/embeddings", json.dumps({"input": "x"}).encode(), auth)
        assert answer.code == 400 and answer.json()["error"]["message"].startswith("model:")
        answer = await post(fleet.base, "/v1/chat/completions", chat(model="no-such-model"), auth)
        assert answer.code == 404 and answer.json()["error"]["code"] == "model_not_found"
        answer = await post(fleet.base, "/v1/chat/completions", chat(content="x" * 5000), auth)
        assert answer.code == 413 and answer.json()["error"]["code"] == "request_too_large"
        # The key and the size are checked on the headers: a 1 GiB body is never read.
        port = fleet.edge.inference_port
        for extra, status, code in (
            ("Content-Length: 1073741824\r\n", 401, "invalid_api_key"),
            ("Authorization: Bearer k1\r\nContent-Length: 1073741824\r\n", 413, "request_too_large"),
        ):
            raw = await connect(port)
            raw.tcp.write(
                request_head("POST", port, "Content-Type: application/json\r\n" + extra, path="/v1/chat/completions")
            )
            await raw.closed
            assert raw.status == status and raw.body["error"]["code"] == code
            assert raw.body["error"]["type"] == "invalid_request_error"
        assert pool_idle(fleet)
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_three_times_capacity_queue_then_drain_back_to_zero(tmp_path: Path) -> None:
    """3x capacity at once: exactly capacity in flight, the rest queued (FIFO), all complete, counters 0."""
    fleet = await start_fleet(tmp_path, second_node=False, node_mock={"node-1": {"tokens_per_second": 20}})
    try:
        requests = [ensureDeferred(post(fleet.base, "/v1/chat/completions", chat(max_tokens=10))) for _ in range(6)]
        await eventually(
            lambda: (fleet.counters("node-1").in_flight, fleet.counters("node-1").queued) == (2, 4),
            message="2 in flight and 4 queued",
        )
        snapshot = fleet.edge.status.snapshot()
        provider = snapshot.nodes[0].providers[0]
        assert (provider.capacity, provider.in_flight, provider.queued) == (2, 2, 4)
        answers = [await r for r in requests]
        assert [a.code for a in answers] == [200] * 6
        await eventually(lambda: pool_idle(fleet), message="counters back to 0")
        assert fleet.counters("node-1").in_flight == 0 and fleet.counters("node-1").queued == 0
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_queue_bound_answers_429_and_queue_timeout_503(tmp_path: Path) -> None:
    """A full queue gets 429 with Retry-After; a queued request with no lease in time gets 503 with Retry-After."""
    fleet = await start_fleet(
        tmp_path,
        second_node=False,
        capacity=1,
        inference={"max_queued_per_model": 1, "queue_timeout_seconds": 0.5, "retry_after_seconds": 3},
        node_mock={"node-1": {"tokens_per_second": 2}},
    )
    try:
        _, holder = await open_stream(fleet.base, chat(stream=True, max_tokens=1000))
        await holder.first
        queued = ensureDeferred(post(fleet.base, "/v1/chat/completions", chat()))
        await eventually(lambda: fleet.counters("node-1").queued == 1, message="one queued")
        answer = await post(fleet.base, "/v1/chat/completions", chat())
        assert answer.code == 429
        assert answer.headers.getRawHeaders(b"retry-after") == [b"3"]
        assert answer.json()["error"]["code"] == "queue_full"
        timed_out = await queued
        assert timed_out.code == 503 and timed_out.json()["error"]["code"] == "queue_timeout"
        assert timed_out.headers.getRawHeaders(b"retry-after") == [b"3"]
        assert fleet.counters("node-1").queued == 0 and fleet.counters("node-1").in_flight == 1
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_client_disconnect_mid_stream_frees_the_lease_and_cancels_on_the_node(tmp_path: Path) -> None:
    """Hanging up mid-stream releases the lease at once and the Node stops generating."""
    fleet = await start_fleet(tmp_path, second_node=False, node_mock={"node-1": {"tokens_per_second": 50}})
    try:
        _, reader = await open_stream(fleet.base, chat(stream=True, max_tokens=10_000), hang_up_after=2)
        await reader.done
        await eventually(lambda: pool_idle(fleet), message="lease released")
        await eventually(lambda: fleet.runner("node-1").cancelled == 1, message="node cancelled the run")
        assert fleet.runner("node-1").running() == 0
        assert fleet.edge.inference.outcomes.get("client_gone") == 1
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_long_context_uses_its_own_capacity(tmp_path: Path) -> None:
    """A prompt above the threshold takes a long-context lease; general capacity stays free."""
    fleet = await start_fleet(
        tmp_path,
        second_node=False,
        inference={"long_context_threshold_tokens": 100},
        node_mock={"node-1": {"tokens_per_second": 5}},
    )
    try:
        _, long_reader = await open_stream(fleet.base, chat(stream=True, max_tokens=1000, content="x" * 800))
        await long_reader.first
        counters = fleet.counters("node-1")
        assert (counters.long_context_in_flight, counters.in_flight) == (1, 0)
        # The general class still has its own capacity (1 + 50 estimated tokens is below 100).
        _, short_reader = await open_stream(fleet.base, chat(stream=True, max_tokens=50))
        await short_reader.first
        counters = fleet.counters("node-1")
        assert (counters.long_context_in_flight, counters.in_flight) == (1, 1)
        # A second long-context request waits in its own queue.
        waiting = ensureDeferred(post(fleet.base, "/v1/chat/completions", chat(max_tokens=2, content="y" * 800)))
        await eventually(lambda: fleet.counters("node-1").long_context_queued == 1, message="long-context queued")
        assert fleet.counters("node-1").queued == 0
        long_reader.transport.stopProducing()  # type: ignore[union-attr]  # connected by now; a TCP transport is a producer
        assert (await waiting).code == 200
        short_reader.transport.stopProducing()  # type: ignore[union-attr]  # connected by now; a TCP transport is a producer
        await eventually(lambda: pool_idle(fleet), message="all released")
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_drain_during_load_finishes_in_flight_and_sends_new_work_elsewhere(tmp_path: Path) -> None:
    """A drained Node takes no new leases; its running streams complete; new requests go to the other Node."""
    fleet = await start_fleet(tmp_path, node_mock={"node-1": {"tokens_per_second": 40}})
    try:
        _, running = await open_stream(fleet.base, chat(stream=True, max_tokens=20))
        await running.first
        assert fleet.counters("node-1").in_flight == 1
        fleet.edge.registry.set_drained("node-1", True)
        answers = [await post(fleet.base, "/v1/chat/completions", chat(max_tokens=2)) for _ in range(3)]
        assert [a.code for a in answers] == [200] * 3
        assert fleet.runner("node-2").completed == 3
        events = await running.done
        assert events[-1] == b"[DONE]"
        await eventually(lambda: pool_idle(fleet), message="drained node empty")
        assert fleet.runner("node-1").completed == 1
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_node_lost_mid_stream_errors_and_queued_work_moves(tmp_path: Path) -> None:
    """A Node gone mid-stream: the client gets an error event; queued requests run on the other Node."""
    fleet = await start_fleet(
        tmp_path,
        capacity=1,
        node_mock={"node-1": {"tokens_per_second": 20}, "node-2": {"tokens_per_second": 20}},
    )
    try:
        _, on_one = await open_stream(fleet.base, chat(stream=True, max_tokens=1000))
        _, on_two = await open_stream(fleet.base, chat(stream=True, max_tokens=30))
        await on_one.first
        await on_two.first
        assert fleet.counters("node-1").in_flight == 1 and fleet.counters("node-2").in_flight == 1
        queued = ensureDeferred(post(fleet.base, "/v1/chat/completions", chat(max_tokens=2)))
        await eventually(lambda: fleet.edge.registry.pool.queued_total() == 1, message="one queued")
        # node-1's link drops without a word (the Edge sees its connection close).
        await fleet.nodes["node-1"].edge.stopService()
        events = await on_one.done
        assert b"node_lost" in events[-1]
        assert (await queued).code == 200
        assert (await on_two.done)[-1] == b"[DONE]"
        await eventually(lambda: pool_idle(fleet), message="all released")
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_edge_stop_ends_running_requests(tmp_path: Path) -> None:
    """Stopping the Edge ends a running stream with an error and releases its lease."""
    fleet = await start_fleet(tmp_path, second_node=False, node_mock={"node-1": {"tokens_per_second": 20}})
    try:
        _, reader = await open_stream(fleet.base, chat(stream=True, max_tokens=1000))
        await reader.first
        await stop(fleet.edge)
        events = await reader.done
        assert b"shutting_down" in events[-1]
        assert fleet.edge.registry.pool.in_flight_total() == 0
        await eventually(lambda: fleet.runner("node-1").running() == 0, message="node stopped the run")
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_the_document_and_every_refusal_speak_openai(tmp_path: Path) -> None:
    """GET /openapi.json is served without a key (the packaged document); an unknown path is a
    JSON 404 and a method a path does not serve a JSON 405 naming only what is served there,
    in OpenAI's error shape (not an HTML page), and only for a caller with the key."""
    fleet = await start_fleet(tmp_path, second_node=False, inference={"api_keys": ["k1"]})
    auth: dict[bytes | str, list[bytes | str]] = {
        b"Authorization": [b"Bearer k1"],
        b"Content-Type": [b"application/json"],
    }
    try:
        response = await treq.get(fleet.base + "/openapi.json")
        assert response.code == 200
        assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
        packaged = resources.files("twisted_iop.edge.inference").joinpath("openapi.json").read_bytes()
        assert await response.content() == packaged
        assert json.loads(packaged)["openapi"].startswith("3.1")

        for method, path, status, code, allow in (
            ("GET", "/v1/nothing", 404, "not_found", None),
            ("GET", "/", 404, "not_found", None),
            ("POST", "/v1/models", 405, "method_not_allowed", [b"GET, HEAD"]),
            ("GET", "/v1/chat/completions", 405, "method_not_allowed", [b"POST"]),
            ("DELETE", "/v1/embeddings", 405, "method_not_allowed", [b"POST"]),
            ("OPTIONS", "/v1/completions", 405, "method_not_allowed", [b"POST"]),
            ("OPTIONS", "/v1/models/x", 405, "method_not_allowed", [b"GET, HEAD"]),
        ):
            response = await treq.request(method, fleet.base + path, headers=auth, data=b"{}")
            assert response.code == status, (method, path)
            assert response.headers.getRawHeaders(b"content-type") == [b"application/json"], (method, path)
            body = json.loads(await response.content())
            assert body["error"]["code"] == code, (method, path, body)
            assert response.headers.getRawHeaders(b"allow") == allow, (method, path)
        response = await treq.get(fleet.base + "/v1/nothing")
        assert response.code == 401
        assert json.loads(await response.content())["error"]["code"] == "invalid_api_key"
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


@pytest_twisted.ensureDeferred
async def test_a_whole_number_written_with_a_point_is_a_whole_number(tmp_path: Path) -> None:
    """``max_tokens: 3.0`` is the number 3 in JSON (and to JSON Schema): it is taken, and counts
    towards the long-context estimate; 2.5, 0.0 and true are still 400."""
    fleet = await start_fleet(tmp_path, second_node=False)
    try:
        answer = await post(fleet.base, "/v1/chat/completions", _with_max_tokens(3.0))
        assert answer.code == 200, answer.body
        assert answer.json()["usage"]["completion_tokens"] == 3
        assert fleet.edge.inference.long_context({"max_tokens": 1e9}) is True
        for wrong in (2.5, 0.0, True, "3"):
            answer = await post(fleet.base, "/v1/chat/completions", _with_max_tokens(wrong))
            assert answer.code == 400 and answer.json()["error"]["code"] == "invalid_max_tokens", wrong
    finally:
        await stop(*fleet.nodes.values(), fleet.edge)


def _with_max_tokens(value: Any) -> bytes:
    """A chat request whose ``max_tokens`` is ``value`` as it is."""
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": value}).encode()
