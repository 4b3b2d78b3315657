"""Deployments end to end over the SAMPLE fleet, every daemon a ``twistd -n`` process as a user
starts it: the shipped control-plane.yaml, edge.yaml (twice: edge-a and edge-b, both site=lab),
node.yaml and node-2.yaml under each Edge, and configs/deployments/chat.yaml applied with the real
``iopctl`` program. Only addresses, ports and paths are changed (and edge-b's id), so the test
proves the samples take deployments as shipped.

The deployment reaches ready on both edges (four engines, one per node) and answers chat
completions, plain and streamed, through each Edge's inference API; a parameter change restarts
each engine exactly once; a ``kill -9`` of the Control Plane loses no deployment and, once the
Edges are back and took the set again, restarts no engine; neither does a restart of one Edge.

Engine pids are read where the product shows them (each provider's ``launch.pid`` in the Control
Plane's ``/edges/{id}/status``) and checked against the Nodes' pidfiles; how many times each Node
started or restarted an engine is read from its ``/metrics`` (``iop_node_instance_changes``).
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq
import yaml
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from twisted_iop.testing.configs import loopback_listen, write_yaml
from twisted_iop.testing.engines.launch import alive, free_port
from twisted_iop.testing.harness import IOPCTL, Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import chat, get_json, post

pytestmark = pytest.mark.e2e

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SAMPLE_DEPLOYMENT = CONFIGS / "deployments" / "chat.yaml"
#: The shipped Node configs, by the node id the shipped edge.yaml gives them.
SAMPLE_NODES = {"node-1": "node.yaml", "node-2": "node-2.yaml"}
EDGES = ("edge-a", "edge-b")
#: Bound on four launched engines (Python processes) becoming ready on a busy 2-core machine.
READY_SECONDS = 60.0


def sample(name: str) -> dict[str, Any]:
    """A shipped config file, parsed."""
    data: dict[str, Any] = yaml.safe_load((CONFIGS / name).read_text())
    return data


@attrs.define
class SampleNode:
    """A Node started from a shipped node config."""

    node_id: str
    config: str
    state_directory: Path
    daemon: Daemon


@attrs.define
class SampleEdge:
    """An Edge started from the shipped edge.yaml, and its two Nodes."""

    edge_id: str
    config: str
    daemon: Daemon
    nodes: dict[str, SampleNode] = attrs.field(factory=dict)

    @property
    def inference(self) -> str:
        """The base URL of its inference API (as its log says it bound)."""
        return f"http://127.0.0.1:{self.daemon.ports()['inference']}"


@attrs.define
class SampleFleet:
    """The processes of the test, and what it needs to restart them."""

    directory: Path
    cp_config: str
    cp: Daemon
    edges: dict[str, SampleEdge] = attrs.field(factory=dict)

    @property
    def http(self) -> str:
        """The Control Plane's HTTP API."""
        return f"http://127.0.0.1:{self.cp.ports()['http']}"

    def daemons(self) -> list[Daemon]:
        """Every daemon, the Control Plane first."""
        out = [self.cp]
        for edge in self.edges.values():
            out.append(edge.daemon)
            out.extend(node.daemon for node in edge.nodes.values())
        return out


async def start_cp(directory: Path, config: str) -> Daemon:
    """``twistd -n iop-control-plane --config`` and wait until it listens."""
    daemon = start_daemon(["iop-control-plane", "--config", config], directory, name="cp")
    await wait_for_ports(daemon, {"http", "edge_wire"}, timeout=30)
    return daemon


def cp_config(directory: Path, edge_wire_port: int) -> str:
    """The shipped control-plane.yaml on loopback ports (the edge wire's fixed, so a restarted
    Control Plane is found where the Edges dial) with its SQLite file in ``directory``."""
    config = sample("control-plane.yaml")
    config["http"]["listen"] = loopback_listen(0)
    config["client_wire"]["listen"] = loopback_listen(0)
    config["edge_wire"]["listen"] = loopback_listen(edge_wire_port)
    config["store"]["path"] = str(directory / "cp" / "control-plane.sqlite")
    return write_yaml(directory / "control-plane.yaml", config)


def edge_config(directory: Path, edge_id: str, cp_port: int, node_port: int) -> str:
    """The shipped edge.yaml (site=lab) dialing the Control Plane at ``cp_port``, its nodes
    dialing ``node_port``, inference and metrics on free ports; named ``edge_id``."""
    config = sample("edge.yaml")
    config["control_plane"]["address"] = f"127.0.0.1:{cp_port}"
    config["control_plane"]["edge_id"] = edge_id
    config["node_server"]["listen"] = loopback_listen(node_port)
    config["inference"]["listen"] = loopback_listen(0)
    config["metrics"]["listen"] = loopback_listen(0)
    return write_yaml(directory / "edge.yaml", config)


def node_config(directory: Path, node_id: str, node_port: int) -> tuple[str, Path]:
    """The shipped config of ``node_id`` dialing the Edge at ``node_port``: metrics on a free port,
    its mock profile's ports one free port (its instance's), its pidfiles in ``directory``."""
    config = sample(SAMPLE_NODES[node_id])
    assert config["node_id"] == node_id
    config["edge"]["address"] = f"127.0.0.1:{node_port}"
    config["metrics"]["listen"] = loopback_listen(0)
    (profile,) = config["engines"]
    assert profile["name"] == "mock"
    port = free_port()
    profile["ports"] = [port, port]
    state = directory / "state"
    config["state_directory"] = str(state)
    return write_yaml(directory / f"{node_id}.yaml", config), state


async def start_edge(fleet: SampleFleet, edge_id: str, cp_port: int) -> SampleEdge:
    """An Edge from the shipped edge.yaml and its two Nodes from the shipped node configs."""
    directory = fleet.directory / edge_id
    directory.mkdir()
    node_port = free_port()
    config = edge_config(directory, edge_id, cp_port, node_port)
    daemon = start_daemon(["iop-edge", "--config", config], directory, name=edge_id)
    await wait_for_ports(daemon, {"inference", "node_server"}, timeout=30)
    edge = SampleEdge(edge_id, config, daemon)
    fleet.edges[edge_id] = edge
    for node_id in SAMPLE_NODES:
        path, state = node_config(directory, node_id, node_port)
        node = start_daemon(["iop-node", "--config", path], directory, name=f"{edge_id}-{node_id}")
        edge.nodes[node_id] = SampleNode(node_id, path, state, node)
    return edge


async def iopctl(fleet: SampleFleet, *args: str) -> str:
    """Run the installed ``iopctl`` program against the Control Plane; its output (exit 0 asserted)."""
    out, err, code = await getProcessOutputAndValue(
        IOPCTL, ["--url", fleet.http, *args], env=dict(os.environ), path=str(fleet.directory), reactor=reactor
    )
    assert code == 0, (out, err)
    return str(out.decode())


async def deployment(fleet: SampleFleet) -> Any:
    """GET /deployments/chat (asserted found)."""
    code, body = await get_json(fleet.http + "/deployments/chat", timeout=10)
    assert code == 200, body
    return body


async def ready(fleet: SampleFleet, generation: int) -> Any:
    """Wait (bounded) until chat is ready on both edges at ``generation``, every instance ready
    with the deployment's spec hash; its view."""
    seen: dict[str, Any] = {}

    async def check() -> bool:
        try:
            body = seen["body"] = await deployment(fleet)
        except (ConnectionError, OSError):
            return False
        edges = body["edges"]["items"]
        return (
            body["generation"] == generation
            and body["rollup"]["desired"] == 2
            and body["rollup"]["ready"] == 2
            and sorted(e["edge_id"] for e in edges) == list(EDGES)
            and all(e["observed_generation"] == generation for e in edges)
            and all(
                len(e["instances"]) == 2
                and all(i["state"] == "ready" and i["spec_hash"] == body["spec_hash"] for i in e["instances"])
                for e in edges
            )
        )

    await eventually(
        check, timeout=READY_SECONDS, interval=0.25, message=f"chat ready on both edges at generation {generation}"
    )
    return seen["body"]


async def engine_pids(fleet: SampleFleet) -> dict[tuple[str, str, str], int]:
    """Each deployment instance's engine pid as the Control Plane's status views show it, by
    (edge, node, instance); checked against the Node's pidfile."""
    pids: dict[tuple[str, str, str], int] = {}
    for edge_id, edge in fleet.edges.items():
        code, status = await get_json(f"{fleet.http}/edges/{edge_id}/status", timeout=10)
        assert code == 200, status
        for node in status["nodes"]:
            for provider in node["providers"]:
                if provider["provider_id"].startswith("chat-"):
                    assert provider["launch"] is not None, provider
                    pid = provider["launch"]["pid"]
                    assert isinstance(pid, int) and alive(pid), provider
                    pidfile = edge.nodes[node["node_id"]].state_directory / f"engine-{provider['provider_id']}.pid"
                    assert json.loads(pidfile.read_text())["pid"] == pid
                    pids[(edge_id, node["node_id"], provider["provider_id"])] = pid
    assert len(pids) == 4 and len(set(pids.values())) == 4, pids
    assert {(e, n) for e, n, _ in pids} == {(e, n) for e in EDGES for n in SAMPLE_NODES}, pids
    return pids


_CHANGE = re.compile(r'^iop_node_instance_changes_total\{change="(\w+)"\} ([0-9.e+]+)$', re.MULTILINE)


async def engine_changes(fleet: SampleFleet) -> dict[tuple[str, str], tuple[int, int, int]]:
    """Each Node's engine (starts, restarts, stops) caused by desired sets, from its /metrics."""
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for edge_id, edge in fleet.edges.items():
        for node_id, node in edge.nodes.items():
            response = await treq.get(f"http://127.0.0.1:{node.daemon.ports()['metrics']}/metrics", timeout=10)
            counts = {kind: int(float(value)) for kind, value in _CHANGE.findall(await response.text())}
            out[(edge_id, node_id)] = (counts["start"], counts["restart"], counts["stop"])
    return out


async def serves(fleet: SampleFleet, model: str) -> None:
    """A chat completion, and a streamed one, through each Edge's inference API, answered by an
    instance of the deployment."""
    for edge in fleet.edges.values():
        answer = await post(edge.inference, "/v1/chat/completions", chat(max_tokens=3, model=model))
        assert answer.code == 200, answer.body
        assert answer.json()["choices"][0]["message"]["content"]
        (route,) = answer.headers.getRawHeaders(b"x-iop-route")
        assert b"provider=chat-" in route, route
        streamed = await post(edge.inference, "/v1/chat/completions", chat(stream=True, max_tokens=3, model=model))
        assert streamed.code == 200, streamed.body
        assert streamed.events[-1] == b"[DONE]" and len(streamed.events) >= 2, streamed.events
        assert b"provider=chat-" in streamed.headers.getRawHeaders(b"x-iop-route")[0]


async def edge_connected(fleet: SampleFleet, edge_id: str) -> bool:
    """Whether the Control Plane shows ``edge_id`` connected."""
    try:
        code, body = await get_json(f"{fleet.http}/edges/{edge_id}", timeout=5)
    except (ConnectionError, OSError):
        return False
    return code == 200 and bool(body["connected"])


@pytest_twisted.ensureDeferred
async def test_the_sample_fleet_takes_a_deployment_and_restarts_no_engine_it_need_not(tmp_path: Path) -> None:
    """apply -> ready and serving through both Edges; a parameter change restarts each engine once;
    a kill -9 of the Control Plane and a restart of one Edge restart none (see the module docstring)."""
    cp_port = free_port()
    config = cp_config(tmp_path, cp_port)
    fleet = SampleFleet(tmp_path, config, await start_cp(tmp_path, config))
    try:
        for edge_id in EDGES:
            await start_edge(fleet, edge_id, cp_port)

        async def fleet_up() -> bool:
            for edge_id in EDGES:
                code, status = await get_json(f"{fleet.http}/edges/{edge_id}/status", timeout=5)
                if code != 200 or not all(n["connected"] for n in status["nodes"]):
                    return False
            return True

        await eventually(fleet_up, timeout=30, interval=0.25, message="both edges and their four nodes connected")
        assert await engine_changes(fleet) == {(e, n): (0, 0, 0) for e in EDGES for n in SAMPLE_NODES}

        # Apply the sample deployment with the real iopctl.
        spec = yaml.safe_load(SAMPLE_DEPLOYMENT.read_text())
        model = spec["model"]
        applied_at = time.monotonic()
        out = await iopctl(fleet, "deploy", "apply", "-f", str(SAMPLE_DEPLOYMENT))
        assert "chat applied: generation 1" in out, out
        first = await ready(fleet, 1)
        to_ready = time.monotonic() - applied_at
        placed = {
            (e["edge_id"], i["node_id"], i["instance_id"]) for e in first["edges"]["items"] for i in e["instances"]
        }
        assert {(e, n) for e, n, _ in placed} == {(e, n) for e in EDGES for n in SAMPLE_NODES}, placed
        await serves(fleet, model)
        pids = await engine_pids(fleet)
        assert set(pids) == placed
        assert await engine_changes(fleet) == {(e, n): (1, 0, 0) for e in EDGES for n in SAMPLE_NODES}

        # A parameter change, rolled one edge at a time: each engine restarts exactly once.
        changed = copy.deepcopy(spec)
        changed["parameters"]["tokens_per_second"] = spec["parameters"]["tokens_per_second"] + 100
        changed_file = write_yaml(tmp_path / "chat-changed.yaml", changed)
        changed_at = time.monotonic()
        out = await iopctl(fleet, "deploy", "apply", "-f", changed_file)
        assert "chat applied: generation 2" in out, out
        second = await ready(fleet, 2)
        to_rolled = time.monotonic() - changed_at
        assert second["spec_hash"] != first["spec_hash"]
        rolled = await engine_pids(fleet)
        assert set(rolled) == placed
        assert all(rolled[k] != pids[k] for k in placed), (pids, rolled)
        assert not any(alive(pid) for pid in pids.values())
        assert await engine_changes(fleet) == {(e, n): (1, 1, 0) for e in EDGES for n in SAMPLE_NODES}
        await serves(fleet, model)

        # kill -9 of the Control Plane, started again on the same SQLite file.
        assert fleet.cp.kill() == -signal.SIGKILL
        restarted_at = time.monotonic()
        fleet.cp = await start_cp(tmp_path, config)
        kept = await deployment(fleet)
        assert (kept["generation"], kept["spec_hash"]) == (2, second["spec_hash"])
        assert kept["spec"]["parameters"] == {"tokens_per_second": changed["parameters"]["tokens_per_second"]}
        await eventually(
            lambda: _all_connected(fleet), timeout=60, interval=0.25, message="both edges back at the new Control Plane"
        )
        await ready(fleet, 2)
        to_ready_after_restart = time.monotonic() - restarted_at
        code, metrics = await _text(fleet.http + "/metrics")
        sent = re.search(r"^iop_deployment_sets_sent(?:_total)? ([0-9.e+]+)$", metrics, re.MULTILINE)
        assert code == 200 and sent is not None and float(sent.group(1)) >= 2, sent
        assert await engine_pids(fleet) == rolled
        assert await engine_changes(fleet) == {(e, n): (1, 1, 0) for e in EDGES for n in SAMPLE_NODES}
        await serves(fleet, model)

        # One Edge stopped and started again: its Nodes keep their engines.
        edge = fleet.edges["edge-b"]
        assert edge.daemon.stop() == 0
        await eventually(lambda: _not(edge_connected(fleet, "edge-b")), timeout=15, interval=0.1, message="edge-b gone")
        edge.daemon = start_daemon(["iop-edge", "--config", edge.config], tmp_path / "edge-b", name="edge-b")
        edge_restarted_at = time.monotonic()
        await wait_for_ports(edge.daemon, {"inference", "node_server"}, timeout=30)
        await eventually(lambda: edge_connected(fleet, "edge-b"), timeout=30, interval=0.1, message="edge-b back")
        await ready(fleet, 2)
        to_ready_after_edge = time.monotonic() - edge_restarted_at
        assert await engine_pids(fleet) == rolled
        assert await engine_changes(fleet) == {(e, n): (1, 1, 0) for e in EDGES for n in SAMPLE_NODES}
        await serves(fleet, model)
        print(
            f"sample fleet (2 edges x 2 nodes, 4 mock engines): apply -> ready {to_ready:.1f}s; "
            f"parameter change -> rolled out (max_in_flight 1) {to_rolled:.1f}s; "
            f"CP kill -9 -> restarted -> ready {to_ready_after_restart:.1f}s; "
            f"edge-b restarted -> ready {to_ready_after_edge:.1f}s; engine pids unchanged across both restarts"
        )

        # Nodes stopped: their engines stop with them.
        for edge in fleet.edges.values():
            for node in edge.nodes.values():
                assert node.daemon.stop(timeout=30) == 0, node.daemon.log()
        await eventually(
            lambda: not any(alive(pid) for pid in rolled.values()), timeout=10, message="the engines stopped"
        )
    finally:
        for daemon in reversed(fleet.daemons()):
            daemon.stop()


async def _text(url: str) -> tuple[int, str]:
    """GET ``url``: status and body text."""
    response = await treq.get(url, timeout=10)
    return response.code, await response.text()


async def _all_connected(fleet: SampleFleet) -> bool:
    """Whether the Control Plane shows every edge connected."""
    return all([await edge_connected(fleet, edge_id) for edge_id in EDGES])


async def _not(check: Any) -> bool:
    """Await ``check`` and negate it."""
    return not await check
