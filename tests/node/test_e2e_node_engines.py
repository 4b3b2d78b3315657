"""End to end: ``twistd iop-node`` runs its engines as processes, and none outlives it.

A SIGTERM lets a request in flight finish, then stops every engine it launched (a stubborn
one and the worker it forked are killed at its stop timeout), and the Node exits 0 with no
engine process left. A Node killed with ``kill -9`` leaves its engine running; the next Node
started with the same state directory stops that one and starts one engine, not two.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from twisted_iop.testing.configs import FAST_BACKOFF, gateway_edge_yaml, write_yaml
from twisted_iop.testing.engines.launch import (
    alive,
    free_port,
    group_members,
    launched_mock,
    launched_script,
    processes_with,
)
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, start_edge, stop
from twisted_iop.testing.http import chat, open_stream

pytestmark = pytest.mark.e2e

#: The Node's grace for requests in flight when it stops.
GRACE_SECONDS = 5.0
#: The stubborn engine's stop timeout (then SIGKILL).
STUBBORN_STOP_SECONDS = 1.0
#: Bound on an engine (a Python process) becoming ready here.
READY_SECONDS = 30.0
#: A script engine that ignores SIGTERM and forks a worker that does too.
STUBBORN = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'])\n"
    "print('stubborn engine up', flush=True)\n"
    "time.sleep(300)\n"
)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test started; any still running at the end are killed."""
    held: list[Daemon] = []
    yield held
    for daemon in held:
        daemon.kill()


def node_yaml(tmp_path: Path, edge_port: int, providers: list[dict[str, Any]]) -> str:
    """node.yaml for node-1 with ``providers`` and its state in ``tmp_path/state``."""
    config = {
        "node_id": "node-1",
        "edge": {"address": f"127.0.0.1:{edge_port}", "backoff": FAST_BACKOFF},
        "probes": {"interval_seconds": 0.5, "timeout_seconds": 1},
        "providers": providers,
        "shutdown": {"grace_seconds": GRACE_SECONDS},
        "metrics": {"listen": ""},
        "state_directory": str(tmp_path / "state"),
    }
    return write_yaml(tmp_path / "node.yaml", config)


def pid_of(tmp_path: Path, provider_id: str) -> int:
    """The engine pid the Node's pidfile names (0 while there is none)."""
    try:
        return int(json.loads((tmp_path / "state" / f"engine-{provider_id}.pid").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return 0


async def exited(daemon: Daemon, seconds: float) -> int:
    """Wait (bounded, without blocking the reactor) for ``daemon`` to exit; its exit code."""
    await eventually(lambda: daemon.process.poll() is not None, timeout=seconds, message="the node to exit")
    return int(daemon.process.returncode)


@pytest_twisted.ensureDeferred
async def test_sigterm_finishes_requests_then_stops_every_engine_and_leaves_none(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """SIGTERM with a stream in flight through the Edge: the stream finishes whole, then both
    engines stop (the stubborn one and its worker killed after its stop timeout), pidfiles
    are gone, exit code 0, and no process of either engine is left."""
    edge_config = gateway_edge_yaml(second_node=False, capacity=2)
    edge_config["nodes"][0]["providers"] = [
        {"provider_id": "p1", "kind": "openai", "models": ["llama-3-8b"], "capacity": 2},
        {"provider_id": "stubborn", "kind": "openai", "models": ["other"], "capacity": 1},
    ]
    edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
    try:
        await edge.inference_server.bound()
        port = free_port()
        providers = [
            launched_mock("p1", port, args=("--tokens-per-second", "10")),
            launched_script("stubborn", STUBBORN, stop={"timeout_seconds": STUBBORN_STOP_SECONDS}),
        ]
        node = start_daemon(["iop-node", "--config", node_yaml(tmp_path, edge.node_port, providers)], tmp_path)
        daemons.append(node)

        def launch_state() -> str:
            launch = edge.registry.providers.launch("node-1", "p1")
            return launch.name if launch is not None else ""

        await eventually(lambda: launch_state() == "ready", timeout=READY_SECONDS, message=f"p1 ready\n{node.log()}")
        await eventually(lambda: pid_of(tmp_path, "stubborn"), timeout=10, message="the stubborn engine's pidfile")
        engines = {name: pid_of(tmp_path, name) for name in ("p1", "stubborn")}
        await eventually(lambda: len(group_members(engines["stubborn"])) == 2, timeout=10, message="its worker")
        members = {pid for leader in engines.values() for pid in group_members(leader)}
        assert len(members) == 3, members  # two engines and one worker

        base = f"http://127.0.0.1:{edge.inference_port}"
        _, reader = await open_stream(base, chat(stream=True, max_tokens=15))
        await eventually(lambda: len(reader.events) >= 2, timeout=10, message="the stream running")
        started = time.monotonic()
        node.process.send_signal(signal.SIGTERM)
        events = await reader.done
        assert events[-1] == b"[DONE]", events[-3:]
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 15
        code = await exited(node, GRACE_SECONDS + STUBBORN_STOP_SECONDS + 15)
        took = time.monotonic() - started
        assert code == 0, node.log()
        assert not [pid for pid in members if alive(pid)], [pid for pid in members if alive(pid)]
        assert list((tmp_path / "state").iterdir()) == []
        log = node.log()
        assert "stubborn: its engine did not stop within 1s; killing it" in log
        assert log.index("stopping: 1 in flight") < log.index("provider p1: engine (pid")
        assert took < GRACE_SECONDS + STUBBORN_STOP_SECONDS + 10
    finally:
        await stop(edge)


@pytest_twisted.ensureDeferred
async def test_node_killed_and_started_again_stops_the_leftover_and_runs_one_engine(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """kill -9 of the Node leaves its engine running; the next Node stops that engine first and
    starts exactly one of its own on the same port; its own stop leaves none."""
    port = free_port()
    marker = f"tcp:{port}:interface=127.0.0.1"
    config = node_yaml(tmp_path, free_port(), [launched_mock("p1", port)])
    first = start_daemon(["iop-node", "--config", config], tmp_path, name="node-first")
    daemons.append(first)
    await eventually(lambda: pid_of(tmp_path, "p1"), timeout=READY_SECONDS, message="the first engine's pidfile")
    leftover = pid_of(tmp_path, "p1")
    await eventually(lambda: processes_with(marker) == [leftover], timeout=READY_SECONDS, message="the engine")
    first.kill()
    assert alive(leftover), "the engine died with its Node: nothing left to find"

    second = start_daemon(["iop-node", "--config", config], tmp_path, name="node-second")
    daemons.append(second)
    await eventually(lambda: not alive(leftover), timeout=15, message=f"the leftover stopped\n{second.log()}")
    await eventually(lambda: pid_of(tmp_path, "p1") not in (0, leftover), timeout=READY_SECONDS, message="a new engine")
    ours = pid_of(tmp_path, "p1")
    await eventually(lambda: processes_with(marker) == [ours], timeout=10, message="exactly one engine on the port")
    await eventually(
        lambda: "provider p1 engine loading -> ready" in second.log() or "engine starting -> ready" in second.log(),
        timeout=READY_SECONDS,
        message=f"the new engine ready\n{second.log()}",
    )
    assert processes_with(marker) == [ours]
    assert f"its engine from an earlier Node still runs (pid {leftover}); stopping it first" in second.log()
    second.process.send_signal(signal.SIGTERM)
    assert await exited(second, 20) == 0
    assert processes_with(marker) == []
