"""Failover over real sockets: an Edge and two Nodes in this reactor, each Node in front of
a small twisted.web server playing an OpenAI engine on 127.0.0.1:0."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, cast

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, gatherResults
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.testing.http import chat, post


class Engine(Resource):
    """An OpenAI engine: lists :data:`MODEL`, answers chat completions, or says it is overloaded."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.overloaded = False
        self.chats = 0

    def render_GET(self, request: Request) -> bytes:
        """Health and the model list."""
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()

    def render_POST(self, request: Request) -> bytes:
        """A whole chat answer with usage, or 429 with Retry-After."""
        self.chats += 1
        request.setHeader(b"Content-Type", b"application/json")
        if self.overloaded:
            request.setResponseCode(429)
            request.setHeader(b"Retry-After", b"3")
            return json.dumps({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}}).encode()
        return json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
            }
        ).encode()


async def fleet(tmp_path: Path) -> tuple[Any, list[Any], list[Engine], list[Any]]:
    """Edge, two Nodes of kind openai (probing rarely, so a dead engine is noticed by requests first), two engines."""
    engines = [Engine(), Engine()]
    ports = [reactor.listenTCP(0, Site(engine), interface="127.0.0.1") for engine in engines]  # type: ignore[arg-type]  # listenTCP's stubs want a ServerFactory of _ProtoWithFactory, which Site is not
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", gateway_edge_yaml(capacity=2)))
    await edge.inference_server.bound()
    nodes = []
    engine_ports = [cast(IPv4Address, port.getHost()).port for port in ports]
    for index, (node_id, provider_id) in enumerate([("node-1", "p1"), ("node-2", "p2")]):
        provider = {
            "provider_id": provider_id,
            "kind": "openai",
            "models": [MODEL],
            "base_url": f"http://127.0.0.1:{engine_ports[index]}",
        }
        config = gateway_node_yaml(node_id, edge.node_port, provider)
        config["probes"] = {"interval_seconds": 60, "timeout_seconds": 1}
        nodes.append(start_node(write_yaml(tmp_path / f"{node_id}.yaml", config)))
    for node_id in ("node-1", "node-2"):
        await eventually(functools.partial(edge.registry.is_ready, node_id), message=f"{node_id} ready")
    return edge, nodes, engines, ports


@pytest_twisted.ensureDeferred
async def test_a_dead_engine_fails_over_to_the_other(tmp_path: Path) -> None:
    """Engine 1 stops listening (refused): every request succeeds on engine 2, and provider 1 cools down."""
    edge, nodes, engines, ports = await fleet(tmp_path)
    try:
        await ports[0].stopListening()
        base = f"http://127.0.0.1:{edge.inference_port}"
        answers = await gatherResults(
            [Deferred.fromCoroutine(post(base, "/v1/chat/completions", chat(max_tokens=2))) for _ in range(6)]
        )
        assert [a.code for a in answers] == [200] * 6
        assert engines[1].chats == 6
        snapshot = edge.status.snapshot()
        p1 = snapshot.nodes[0].providers[0]
        assert p1.cooling_down and "provider_unavailable" in p1.health_reason
        assert snapshot.nodes[1].providers[0].completion_tokens == 12
    finally:
        await stop(*nodes, edge)
        await ports[1].stopListening()


@pytest_twisted.ensureDeferred
async def test_an_overloaded_engine_is_retried_elsewhere(tmp_path: Path) -> None:
    """Engine 1 answers 429: the requests it got are answered by engine 2; alone, the 429 reaches the client."""
    edge, nodes, engines, ports = await fleet(tmp_path)
    try:
        engines[0].overloaded = True
        base = f"http://127.0.0.1:{edge.inference_port}"
        answers = await gatherResults(
            [Deferred.fromCoroutine(post(base, "/v1/chat/completions", chat(max_tokens=2))) for _ in range(4)]
        )
        assert [a.code for a in answers] == [200] * 4
        assert engines[0].chats >= 1 and engines[1].chats == 4
        assert edge.status.snapshot().nodes[0].providers[0].cooling_down
        engines[1].overloaded = True
        edge.registry.providers.cooldowns.forget_provider("node-1", "p1")  # both engines back in rotation
        refused = await post(base, "/v1/chat/completions", chat(max_tokens=2))
        # The engine's own 429 and message (Retry-After comes with a Node that sends error codes).
        assert refused.code == 429 and refused.json()["error"]["message"] == "busy"
    finally:
        await stop(*nodes, edge)
        for port in ports:
            await port.stopListening()
