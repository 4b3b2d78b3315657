"""A deployment of a real engine: a Node's profile launches llama-cpp-python's OpenAI server on the
tiny model the tests write; a desired instance of it serves chat through the Edge, and a parameter
change (its context size) restarts it once. ``make llama-engine`` installs the engine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from twisted_iop.testing.deployments import desired, start_deployment_fleet
from twisted_iop.testing.engines.launch import free_port
from twisted_iop.testing.engines.llama_engine import ENGINE_FLAGS
from twisted_iop.testing.engines.tiny_model import tiny_model
from twisted_iop.testing.harness import eventually
from twisted_iop.testing.http import chat, post

pytestmark = pytest.mark.e2e

#: How long the engine may take to load (importing llama_cpp and its server is most of it).
START_SECONDS = 90.0


def llama_profile(models: Path, model: str) -> dict[str, Any]:
    """A llamacpp profile: llama-cpp-python's server on ``models/{model}.gguf``, its context a parameter."""
    port = free_port()
    return {
        "name": "llama",
        "kind": "llamacpp",
        "launch": {
            "command": [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                f"{models}/{{model}}.gguf",
                "--model_alias",
                "{model}",
                "--host",
                "127.0.0.1",
                "--port",
                "{port}",
                "--n_ctx",
                "{n_ctx}",
                *ENGINE_FLAGS,
            ],
            "readiness": {
                "interval_seconds": 0.2,
                "request_timeout_seconds": 2,
                "start_timeout_seconds": START_SECONDS,
            },
            "restart": {"policy": "always", "initial_seconds": 0.5, "max_seconds": 5, "max_restarts": 3},
            "stop": {"signal": "TERM", "timeout_seconds": 10},
        },
        "ports": [port, port],
        "models": [model],
        "parameters": {"n_ctx": {"type": "int", "min": 128, "max": 2048, "default": 512}},
    }


@pytest_twisted.ensureDeferred
async def test_a_deployed_llama_engine_serves_and_restarts_once_on_a_new_context_size(tmp_path: Path) -> None:
    """The instance loads and serves chat through the Edge; n_ctx 512 -> 1024 restarts it once (a new
    pid) and it serves again; a context size over the profile's bound is refused."""
    model_path = tiny_model(tmp_path / "models")
    model = model_path.stem
    fleet = await start_deployment_fleet(tmp_path, profiles=[llama_profile(model_path.parent, model)])
    try:
        instance = desired(profile="llama", model=model, parameters={"n_ctx": "512"}, capacity=1)
        await fleet.send(instance)
        await eventually(
            lambda: fleet.state() == "INSTANCE_STATE_READY", timeout=START_SECONDS, message="the engine ready"
        )
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=4, model=model))
        assert answer.code == 200, answer.body
        pid = fleet.pid()
        await fleet.send(desired(profile="llama", model=model, parameters={"n_ctx": "1024"}, capacity=1))
        await eventually(lambda: fleet.pid() not in (0, pid), timeout=30, message="a new engine")
        await eventually(lambda: fleet.state() == "INSTANCE_STATE_READY", timeout=START_SECONDS, message="ready again")
        answer = await post(fleet.base, "/v1/chat/completions", chat(max_tokens=4, model=model))
        assert answer.code == 200, answer.body
        instances = fleet.node.runtime.instances
        assert instances is not None and instances.restarts == 1
        await fleet.send(desired(profile="llama", model=model, parameters={"n_ctx": "4096"}, capacity=1))
        await eventually(lambda: fleet.state() == "INSTANCE_STATE_REFUSED", timeout=10, message="refused")
        status = fleet.status()
        assert status is not None and status.reason == "parameter n_ctx must be at most 2048, not 4096"
    finally:
        await fleet.stop()
