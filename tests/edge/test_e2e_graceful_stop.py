"""End to end: SIGTERM to each real daemon (``twistd -n``) keeps the stop's promises.

The Control Plane answers every HTTP caller in flight and ends every pending
operation; the Edge delivers its Nodes' ``node.disconnected`` events and says
``SHUTTING_DOWN``; the Node finishes or ends its streams. Each exits 0.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.web.client import HTTPConnectionPool
from twisted.web.http_headers import Headers

from twisted_iop.testing.configs import (
    CONTROL_PLANE_LOOPBACK_ENV,
    edge_yaml,
    gateway_edge_yaml,
    gateway_node_yaml,
    mock_provider,
    node_yaml,
    write_yaml,
)
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import chat, open_stream
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import control_pb2 as pb

pytestmark = pytest.mark.e2e

CP_ENV = CONTROL_PLANE_LOOPBACK_ENV
#: The grace period the daemons here are configured with.
GRACE_SECONDS = 2.0
#: Bound on waiting for an exit: the grace, the close wait and a slow machine.
EXIT_BOUND_SECONDS = GRACE_SECONDS + 10.0
CALLERS = 50


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    """Daemons a test started; any still running at the end are stopped."""
    held: list[Daemon] = []
    yield held
    for daemon in reversed(held):
        daemon.stop()


async def terminated(daemon: Daemon) -> int:
    """SIGTERM ``daemon`` and wait (bounded, without blocking the reactor) for its exit code."""
    daemon.process.send_signal(signal.SIGTERM)
    await eventually(
        lambda: daemon.process.poll() is not None, timeout=EXIT_BOUND_SECONDS, message="the daemon to exit"
    )
    return int(daemon.process.returncode)


async def answer(response_d: Any) -> tuple[int, Any]:
    """Status and JSON body of a treq response."""
    response = await response_d
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_control_plane_answers_every_caller_in_flight(tmp_path: Path, daemons: list[Daemon]) -> None:
    """SIGTERM with 50 commands held by the edge: each caller gets 503 shutting_down, each operation ends failed."""
    config = write_yaml(tmp_path / "cp.yaml", {"shutdown": {"grace_seconds": GRACE_SECONDS}})
    cp = start_daemon(["iop-control-plane", "--config", config], tmp_path, env=CP_ENV, name="cp")
    daemons.append(cp)
    ports = await wait_for_ports(cp, {"http", "edge_wire", "client_wire"})
    base = f"http://127.0.0.1:{ports['http']}"
    edge, response = await connect_edge(ports["edge_wire"], "edge-held", command_behaviour="hold")
    assert response is not None and response.accepted
    # A kept-alive connection, opened before the stop, to read /readyz on while it runs.
    pool = HTTPConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = 1
    try:
        code, ready = await answer(treq.get(base + "/readyz", pool=pool, timeout=5))
        assert code == 200 and ready["ready"] is True and ready["stopping"] is False
        calls = [
            ensureDeferred(
                answer(
                    treq.post(
                        base + "/edges/edge-held/commands",
                        data=json.dumps({"name": "node.drain", "target": f"node-{i}", "timeout_seconds": 60}).encode(),
                        headers=Headers({b"Content-Type": [b"application/json"]}),
                        timeout=EXIT_BOUND_SECONDS,
                    )
                )
            )
            for i in range(CALLERS)
        ]
        await eventually(lambda: len(edge.held_commands) == CALLERS, message="every command held by the edge")
        cp.process.send_signal(signal.SIGTERM)

        async def stopping_readyz() -> Any:
            code, body = await answer(treq.get(base + "/readyz", pool=pool, timeout=5))
            return body if code == 503 else None

        ready = await eventually(stopping_readyz, timeout=GRACE_SECONDS, message="/readyz 503 while stopping")
        assert ready["ready"] is False and ready["stopping"] is True
        results = await DeferredList(calls, consumeErrors=True)
        answers = [value for ok, value in results if ok]
        assert len(answers) == CALLERS, [value for ok, value in results if not ok][:3]
        for code, body in answers:
            assert code == 503 and body["error"]["code"] == "shutting_down"
            assert body["operation"]["state"] == "failed"
            assert body["operation"]["reason"] == "the Control Plane is shutting down"
        await edge.lost
        assert [e.code for e in edge.errors] == [pb.ERROR_CODE_SHUTTING_DOWN]
        await eventually(lambda: cp.process.poll() is not None, timeout=EXIT_BOUND_SECONDS, message="exit")
        assert cp.process.returncode == 0, cp.log()
    finally:
        await pool.closeCachedConnections()
    log = cp.log()
    assert "stopping: 50 in flight" in log and "ending them" in log


@pytest_twisted.ensureDeferred
async def test_edge_delivers_its_node_events_and_says_shutting_down(tmp_path: Path, daemons: list[Daemon]) -> None:
    """SIGTERM to an Edge: the Control Plane records node.disconnected for its Nodes and SHUTTING_DOWN."""
    cp = start_daemon(["iop-control-plane"], tmp_path, env=CP_ENV, name="cp")
    daemons.append(cp)
    cp_ports = await wait_for_ports(cp, {"http", "edge_wire"})
    http = f"http://127.0.0.1:{cp_ports['http']}"
    config = edge_yaml(f"127.0.0.1:{cp_ports['edge_wire']}")
    config["shutdown"] = {"grace_seconds": GRACE_SECONDS}
    edge = start_daemon(["iop-edge", "--config", write_yaml(tmp_path / "edge.yaml", config)], tmp_path, name="edge")
    daemons.append(edge)
    edge_ports = await wait_for_ports(edge, {"node_server"})
    for node_id in ("node-1", "node-2"):
        node_config = write_yaml(tmp_path / f"{node_id}.yaml", node_yaml(node_id, edge_ports["node_server"]))
        daemons.append(start_daemon(["iop-node", "--config", node_config], tmp_path, name=node_id))

    async def both_ready() -> bool:
        code, body = await answer(treq.get(http + "/edges/edge-a/events?limit=1000", timeout=5))
        return code == 200 and {e["node_id"] for e in body["items"] if e["kind"] == "node.ready"} == {
            "node-1",
            "node-2",
        }

    await eventually(both_ready, timeout=20, message="both nodes ready at the Control Plane")
    assert await terminated(edge) == 0, edge.log()

    async def edge_gone() -> Any:
        code, body = await answer(treq.get(http + "/edges/edge-a/events?limit=1000", timeout=5))
        kinds = [e["kind"] for e in body["items"]]
        return body["items"] if code == 200 and "edge.disconnected" in kinds else None

    events = await eventually(edge_gone, message="the edge's disconnect recorded")
    kinds = [e["kind"] for e in events]
    last_ready = max(i for i, kind in enumerate(kinds) if kind == "node.ready")
    disconnected = {e["node_id"] for e in events[last_ready:] if e["kind"] == "node.disconnected"}
    assert disconnected == {"node-1", "node-2"}
    assert kinds[-1] == "edge.disconnected"
    assert "SHUTTING_DOWN" in events[-1]["message"]
    assert kinds.index("node.disconnected", last_ready) < kinds.index("edge.disconnected")


@pytest_twisted.ensureDeferred
async def test_node_ends_or_finishes_its_streams(tmp_path: Path, daemons: list[Daemon]) -> None:
    """SIGTERM to a Node streaming two answers: the short one finishes, the long one ends with an error event."""
    edge_config = gateway_edge_yaml(second_node=False)
    edge = start_daemon(
        ["iop-edge", "--config", write_yaml(tmp_path / "edge.yaml", edge_config)], tmp_path, name="edge"
    )
    daemons.append(edge)
    edge_ports = await wait_for_ports(edge, {"node_server", "inference"})
    node_config = gateway_node_yaml("node-1", edge_ports["node_server"], mock_provider("p1", tokens_per_second=10))
    node_config["shutdown"] = {"grace_seconds": GRACE_SECONDS}
    node = start_daemon(
        ["iop-node", "--config", write_yaml(tmp_path / "node.yaml", node_config)], tmp_path, name="node"
    )
    daemons.append(node)
    base = f"http://127.0.0.1:{edge_ports['inference']}"

    async def models() -> bool:
        response = await treq.get(base + "/v1/models", timeout=5)
        return bool(json.loads(await response.content()).get("data"))

    await eventually(models, timeout=20, message="the node's model served")
    # 5 tokens at 10/s end within the grace; 1000 tokens do not.
    _, short = await open_stream(base, chat(stream=True, max_tokens=5))
    _, long = await open_stream(base, chat(stream=True, max_tokens=1000))
    await short.first
    await long.first
    assert await terminated(node) == 0, node.log()
    short_events = await short.done
    long_events = await long.done
    assert short_events[-1] == b"[DONE]"
    error = json.loads(long_events[-1])["error"]
    assert error["message"] == "the Node is shutting down" and error["type"] == "server_error"
    assert "SHUTTING_DOWN: the Node is shutting down" in edge.log()
