"""A Node that launches llama.cpp's ``llama-server`` (``make llama-server``) on the tiny model,
behind an Edge (both in this reactor): ``kill -9`` of the engine while one request streams on
it and another waits inside it (deferred, no output yet).

The stream that had output is cut (its client sees the error); the one that had none waits in
the Edge's queue while the Node starts the engine again, and gets its whole answer from the new
engine as soon as it is ``ready``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_twisted
from twisted.internet.threads import deferToThread

from twisted_iop.testing.configs import gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.launch import alive, free_port
from twisted_iop.testing.engines.llama_server import llama_cpp_server_argv
from twisted_iop.testing.engines.openai_load import ask
from twisted_iop.testing.engines.record_llama_server import request
from twisted_iop.testing.engines.tiny_model import TinyModelShape, tiny_model
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
#: A model some 6 times the tests' usual one (about 200 tokens a second on one thread here), with
#: a context long enough that its stream outlasts the test's steps by many seconds: the kill
#: always finds the stream running and the other request deferred.
SHAPE = TinyModelShape(layers=8, embedding=256, feed_forward=1024, context=4096)
N_CTX = 4096
LONG_MAX_TOKENS = 3000
START_SECONDS = 60.0


def launched_llama_server(provider_id: str, port: int, model: Path) -> dict[str, Any]:
    """node.yaml's provider whose engine the Node launches: llama-server with one slot on ``port``."""
    return {
        "provider_id": provider_id,
        "kind": "llamacpp",
        "models": [MODEL],
        "base_url": f"http://127.0.0.1:{port}",
        "launch": {
            "command": llama_cpp_server_argv(model, MODEL, port, parallel=1, n_ctx=N_CTX),
            "readiness": {
                "interval_seconds": 0.1,
                "request_timeout_seconds": 2,
                "start_timeout_seconds": START_SECONDS,
            },
            "restart": {"policy": "always", "initial_seconds": 0.5, "max_seconds": 5, "max_restarts": 3},
            "stop": {"signal": "TERM", "timeout_seconds": 10},
        },
    }


def engine_counts(base_url: str) -> tuple[float, float]:
    """llama-server's requests processing and deferred, from its /metrics (blocking)."""
    values = {"llamacpp:requests_processing": 0.0, "llamacpp:requests_deferred": 0.0}
    try:
        body = request(base_url, "/metrics", timeout=2)[2].decode()
    except OSError:
        return -1.0, -1.0
    for line in body.splitlines():
        name, _, value = line.partition(" ")
        if name in values:
            values[name] = float(value)
    return values["llamacpp:requests_processing"], values["llamacpp:requests_deferred"]


@pytest_twisted.ensureDeferred
async def test_kill_9_of_a_launched_llama_server_cuts_only_the_stream_that_had_output(tmp_path: Path) -> None:
    """One slot, Edge capacity 2: a long stream runs on the engine and a second request waits
    inside it (deferred); ``kill -9`` of the engine: the stream is cut (it had output), the
    deferred request waits in the Edge's queue while the Node starts the engine again, and gets
    its whole answer from the new engine."""
    model = tiny_model(tmp_path / "model", SHAPE)
    edge_config = gateway_edge_yaml(second_node=False, capacity=2, inference={"queue_timeout_seconds": 120})
    edge_config["nodes"][0]["providers"][0].update(kind="llamacpp", models=[MODEL])
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
    states: list[tuple[float, str]] = []
    edge.registry.relay.add_listener(
        lambda e: (
            states.append((time.monotonic(), e.attributes["state"])) if e.kind == "provider.launch_changed" else None
        )
    )
    port = free_port()
    node_config = gateway_node_yaml("node-1", edge.node_port, launched_llama_server("p1", port, model))
    node_config["state_directory"] = str(tmp_path / "state")
    node_config["probes"] = {"interval_seconds": 10, "timeout_seconds": 2, "load_interval_seconds": 1}
    node = start_node(write_yaml(tmp_path / "node.yaml", node_config))
    base = f"http://127.0.0.1:{port}"
    first = second = None
    try:
        await edge.inference_server.bound()

        def state() -> str:
            launch = edge.registry.providers.launch("node-1", "p1")
            return launch.name if launch is not None else ""

        await eventually(lambda: state() == "ready", timeout=START_SECONDS, message="the engine ready")
        first = node.engines.engines["p1"].pid
        assert first is not None
        gateway = f"http://127.0.0.1:{edge.inference_port}/v1"

        def client() -> openai.OpenAI:
            return openai.OpenAI(base_url=gateway, api_key="k", max_retries=0, timeout=180)

        running = deferToThread(ask, client(), MODEL, True, LONG_MAX_TOKENS, "a long story")
        await eventually(
            lambda: deferToThread(engine_counts, base).addCallback(lambda c: c[0] == 1), 30, message="the stream"
        )
        waiting = deferToThread(ask, client(), MODEL, False, 16, "and a short one")
        await eventually(
            lambda: deferToThread(engine_counts, base).addCallback(lambda c: c == (1.0, 1.0)),
            30,
            message="the second request deferred inside the engine",
        )
        killed_at = time.monotonic()
        os.kill(first, signal.SIGKILL)
        cut = await running
        answered = await waiting
        second = node.engines.engines["p1"].pid
    finally:
        await stop(node, edge)
    ready_again = next((at for at, name in states if at > killed_at and name == "ready"), 0.0)
    print(
        f"\nlaunched llama-server kill -9: the Edge heard the engine ready again {ready_again - killed_at:.2f}s "
        f"after the kill; the deferred request's answer came {answered.first_content - ready_again:.2f}s after "
        f"that; the running stream: {cut.chunks} chunks, then {cut.error or 'no error'}; states after the kill: "
        f"{[name for at, name in states if at > killed_at]}"
    )
    assert cut.chunks > 0 and not cut.ok, cut  # it had output: cut, its client told
    assert answered.ok, answered  # it had none: it waited and ran on the new engine
    assert second is not None and second != first and not alive(first)
