"""A Node that launches a real engine: llama-cpp-python's OpenAI server with the tiny model
the tests write, behind an Edge (both in this reactor).

The Edge sees the engine ``loading`` before ``ready`` (llama-cpp-python binds its port only
once the model is loaded), and ``provider.restart`` under streaming load fails no request
that had not started on it (those wait in the Edge's queue and run on the restarted engine;
the ones running finish in the drain). ``make llama-engine`` installs the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet.defer import DeferredList, ensureDeferred

from twisted_iop.testing.configs import gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.launch import ChatLoad, alive, free_port
from twisted_iop.testing.engines.llama_engine import llama_server_argv
from twisted_iop.testing.engines.tiny_model import tiny_model
from twisted_iop.testing.harness import eventually, start_edge, start_node, stop
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
N_CTX = 512
#: How long the engine may take to load (importing llama_cpp and its server is most of it).
START_SECONDS = 90.0
CLIENTS = 4
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once for this module."""
    return tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def launched_llama(provider_id: str, port: int, model: Path) -> dict[str, Any]:
    """node.yaml's provider whose engine the Node launches: llama-cpp-python on ``port``."""
    command = llama_server_argv(model, MODEL, port, N_CTX)
    return {
        "provider_id": provider_id,
        "kind": "llamacpp",
        "models": [MODEL],
        "base_url": f"http://127.0.0.1:{port}",
        "launch": {
            "command": command,
            "readiness": {
                "interval_seconds": 0.1,
                "request_timeout_seconds": 2,
                "start_timeout_seconds": START_SECONDS,
            },
            "restart": {"policy": "always", "initial_seconds": 0.5, "max_seconds": 5, "max_restarts": 3},
            "stop": {"signal": "TERM", "timeout_seconds": 10},
        },
    }


@pytest_twisted.ensureDeferred
async def test_real_engine_loads_then_restarts_under_streaming_load(tiny_llama: Path, tmp_path: Path) -> None:
    """The Edge sees starting, loading, ready; provider.restart (drain) while 4 clients stream:
    the engine drains, stops, loads again (loading seen again) and is ready; every request
    ends with a whole answer."""
    edge_config = gateway_edge_yaml(second_node=False, capacity=2, inference={"queue_timeout_seconds": 120})
    provider = edge_config["nodes"][0]["providers"][0]
    provider.update(kind="llamacpp", models=[MODEL])
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
    states: list[str] = []
    edge.registry.relay.add_listener(
        lambda e: states.append(e.attributes["state"]) if e.kind == "provider.launch_changed" else None
    )
    node_config = gateway_node_yaml("node-1", edge.node_port, launched_llama("p1", free_port(), tiny_llama))
    node_config["state_directory"] = str(tmp_path / "state")
    node_config["probes"] = {"interval_seconds": 0.5, "timeout_seconds": 1}
    node = start_node(write_yaml(tmp_path / "node.yaml", node_config))
    load = ChatLoad(f"http://127.0.0.1:{edge.inference_port}", model=MODEL, max_tokens=MAX_TOKENS)
    clients: list[Any] = []
    try:
        await edge.inference_server.bound()

        def state() -> str:
            launch = edge.registry.providers.launch("node-1", "p1")
            return launch.name if launch is not None else ""

        await eventually(lambda: state() == "ready", timeout=START_SECONDS, message=f"ready; states {states}")
        # The Node reports its engine once it is accepted: the first state the Edge hears may
        # already be loading (the first readiness check answers within 0.1 s).
        assert states[0] in ("starting", "loading") and "loading" in states
        assert states.index("loading") < states.index("ready")
        first = node.engines.engines["p1"].pid
        assert first is not None

        clients = [ensureDeferred(load.client(i, stream_only=True)) for i in range(CLIENTS)]
        await eventually(lambda: len(load.outcomes) >= 4, timeout=60, message="the load running")
        states.clear()
        request = pb.EdgeCommandRequest(
            command_id="restart-1", name="provider.restart", target="node-1/p1", timeout_ms=120_000
        )
        response = await edge.commands.run(request)
        assert response.outcome == pb.COMMAND_OUTCOME_SUCCEEDED, response.reason
        assert response.result["state"] == "ready" and response.result["cut_requests"] == "0"
        assert states[:2] == ["draining", "stopping"] and states[-1] == "ready"
        assert states.index("loading") < states.index("ready")
        second = node.engines.engines["p1"].pid
        assert second is not None and second != first and not alive(first)
        served = len(load.outcomes)
        await eventually(lambda: len(load.outcomes) >= served + 4, timeout=60, message="streams on the new engine")
    finally:
        load.running = False
        await DeferredList(clients)
        await stop(node, edge)
    assert load.failures() == [], load.failures()[:5]
    assert not alive(second)
