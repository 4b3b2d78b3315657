"""End to end: the OpenAI client through an Edge and Nodes started with
``twistd -n`` to the standalone ``iop-mock-provider`` over real sockets,
with the Control Plane's status view showing the work while it runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import openai
import pytest
import pytest_twisted
import treq
from twisted.internet.defer import DeferredList, ensureDeferred
from twisted.internet.threads import deferToThread

from twisted_iop.testing.configs import (
    CONTROL_PLANE_LOOPBACK_ENV,
    MODEL,
    gateway_edge_yaml,
    gateway_node_yaml,
    write_yaml,
)
from twisted_iop.testing.harness import (
    Daemon,
    MockProviderProcess,
    eventually,
    start_daemon,
    start_mock_provider,
    wait_for_ports,
)
from twisted_iop.testing.http import chat, open_stream

pytestmark = pytest.mark.e2e

CAPACITY = 2
AUTHORIZED_JSON: dict[bytes | str, list[bytes | str]] = {
    b"Content-Type": [b"application/json"],
    b"Authorization": [b"Bearer k-test"],
}


@attrs.define
class DaemonFleet:
    """CP, Edge and two Nodes as processes; one mock provider process behind both Nodes."""

    cp_http: str
    gateway: str
    mock: MockProviderProcess
    edge: Daemon
    nodes: dict[str, Daemon]

    def client(self) -> openai.OpenAI:
        """The OpenAI client pointed at the Edge."""
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key="k-test", max_retries=0, timeout=30)

    async def providers(self) -> dict[str, Any]:
        """The Control Plane's status view: provider counters by node id."""
        response = await treq.get(self.cp_http + "/edges/edge-a/status", timeout=5)
        if response.code != 200:
            await response.content()
            return {}
        body = json.loads(await response.content())
        return {n["node_id"]: n["providers"][0] for n in body["nodes"] if n["connected"]}

    async def mock_stats(self) -> dict[str, int]:
        """The mock provider's counters."""
        response = await treq.get(self.mock.base_url + "/mock/stats", timeout=5)
        return dict(json.loads(await response.content()))


@pytest.fixture
def daemon_fleet(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Holds the processes; stops them all at the end."""
    held: dict[str, Any] = {"daemons": [], "mock": None}
    yield held
    for daemon in reversed(held["daemons"]):
        daemon.stop()
    if held["mock"] is not None:
        held["mock"].stop()


async def start_daemon_fleet(tmp_path: Path, held: dict[str, Any], tokens_per_second: float) -> DaemonFleet:
    """Start every process and wait until both Nodes show connected in the Control Plane."""
    mock = start_mock_provider(tmp_path, "--models", MODEL, "--tokens-per-second", str(tokens_per_second))
    held["mock"] = mock
    cp = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
    held["daemons"].append(cp)
    cp_ports = await wait_for_ports(cp, {"http", "edge_wire"})
    edge_config = gateway_edge_yaml(
        f"127.0.0.1:{cp_ports['edge_wire']}", inference={"api_keys": ["k-test"]}, capacity=CAPACITY
    )
    for node in edge_config["nodes"]:
        node["providers"][0]["kind"] = "openai"
    edge = start_daemon(
        ["iop-edge", "--config", write_yaml(tmp_path / "edge.yaml", edge_config)], tmp_path, name="edge"
    )
    held["daemons"].append(edge)
    edge_ports = await wait_for_ports(edge, {"node_server", "inference"})
    nodes = {}
    for node_id, provider_id in (("node-1", "p1"), ("node-2", "p2")):
        provider = {"provider_id": provider_id, "kind": "openai", "models": [MODEL], "base_url": mock.base_url}
        config = gateway_node_yaml(
            node_id, edge_ports["node_server"], provider, keepalive={"interval_seconds": 1, "deadline_seconds": 3}
        )
        nodes[node_id] = start_daemon(
            ["iop-node", "--config", write_yaml(tmp_path / f"{node_id}.yaml", config)], tmp_path, name=node_id
        )
        held["daemons"].append(nodes[node_id])
    fleet = DaemonFleet(
        f"http://127.0.0.1:{cp_ports['http']}", f"http://127.0.0.1:{edge_ports['inference']}", mock, edge, nodes
    )

    async def both_connected() -> bool:
        providers = await fleet.providers()
        return set(providers) == {"node-1", "node-2"} and all(p["health"] == "healthy" for p in providers.values())

    await eventually(both_connected, timeout=30, interval=0.1, message="both nodes connected and healthy")
    return fleet


@pytest_twisted.ensureDeferred
async def test_openai_client_through_edge_and_nodes(tmp_path: Path, daemon_fleet: dict[str, Any]) -> None:
    """The openai package, non-streaming and streaming, through Edge and Node to the mock provider; 3x capacity queues."""
    fleet = await start_daemon_fleet(tmp_path, daemon_fleet, tokens_per_second=20)

    def openai_calls() -> tuple[str, str, int, list[str]]:
        client = fleet.client()
        whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        pieces = []
        pieces = [
            chunk.choices[0].delta.content
            for chunk in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
            if chunk.choices and chunk.choices[0].delta.content
        ]
        vectors = client.embeddings.create(model=MODEL, input=["a", "b", "c"])
        models = [m.id for m in client.models.list()]
        return whole.choices[0].message.content or "", "".join(pieces), len(vectors.data), models

    whole, streamed, vectors, models = await deferToThread(openai_calls)
    assert whole == "the quick brown"
    assert streamed == "the quick brown fox"
    assert vectors == 3
    assert models == [MODEL]

    def wrong_key() -> int:
        client = openai.OpenAI(base_url=fleet.gateway + "/v1", api_key="nope", max_retries=0)
        try:
            client.models.list()
        except openai.AuthenticationError as e:
            return e.status_code
        return 200

    assert await deferToThread(wrong_key) == 401

    # 3x capacity over two nodes: exactly capacity in flight on each, the rest queued
    # (a waiting request shows as queued on every provider that could take it).
    total = 3 * 2 * CAPACITY

    calls = [ensureDeferred(post_with_key(fleet, max_tokens=20)) for _ in range(total)]

    async def saturated() -> bool:
        providers = await fleet.providers()
        general = [providers[n]["general"] for n in ("node-1", "node-2") if n in providers]
        return (
            len(general) == 2
            and all(g["in_flight"] == CAPACITY for g in general)
            and all(g["queued"] == total - 2 * CAPACITY for g in general)
        )

    await eventually(saturated, timeout=20, interval=0.05, message="capacity in flight, the rest queued in the CP view")
    results = await DeferredList(calls, fireOnOneErrback=True, consumeErrors=True)
    assert all(ok and code == 200 for ok, (code, _) in results), results

    async def idle() -> bool:
        providers = await fleet.providers()
        return all(p["general"]["in_flight"] == 0 and p["general"]["queued"] == 0 for p in providers.values())

    await eventually(idle, timeout=10, message="counters back to 0")
    assert (await fleet.mock_stats())["completed"] == total + 3


@pytest_twisted.ensureDeferred
async def test_disconnect_and_node_kill_release_everything(tmp_path: Path, daemon_fleet: dict[str, Any]) -> None:
    """A client hang-up aborts the provider request; kill -9 of a Node mid-stream errors its client
    and the queued request runs on the other Node."""
    fleet = await start_daemon_fleet(tmp_path, daemon_fleet, tokens_per_second=20)

    _, reader = await open_stream_with_key(fleet, max_tokens=5000, hang_up_after=2)
    await reader.done
    await eventually(
        lambda: _stat_is(fleet, "aborted", 1), timeout=10, message="the provider request was aborted by the node"
    )

    # Fill both nodes, queue one more, then kill -9 the node whose stream is long.
    _, long_stream = await open_stream_with_key(fleet, max_tokens=5000)
    await long_stream.first
    # Equals take turns, so the long stream's Node is the one holding a lease now.
    providers = await fleet.providers()
    (long_node,) = [node_id for node_id, p in providers.items() if p["general"]["in_flight"] == 1]
    other_streams = []
    for _ in range(2 * CAPACITY - 1):
        _, other = await open_stream_with_key(fleet, max_tokens=40)
        other_streams.append(other)
    for other in other_streams:
        await other.first
    providers = await fleet.providers()
    assert sum(p["general"]["in_flight"] for p in providers.values()) == 2 * CAPACITY
    queued = ensureDeferred(post_with_key(fleet, max_tokens=2))
    await eventually(lambda: _queued_is(fleet, 1), timeout=10, message="one request queued")
    fleet.nodes[long_node].kill()
    events = await long_stream.done
    assert events and b"node_lost" in events[-1], events[-3:]
    code, body = await queued
    assert code == 200, body
    for other in other_streams:
        await other.done

    async def released() -> bool:
        providers = await fleet.providers()
        return list(providers) != [] and all(
            p["general"]["in_flight"] == 0 and p["general"]["queued"] == 0 for p in providers.values()
        )

    await eventually(released, timeout=15, message="leases released after the kill")


async def _stat_is(fleet: DaemonFleet, name: str, value: int) -> bool:
    return (await fleet.mock_stats())[name] == value


async def _queued_is(fleet: DaemonFleet, value: int) -> bool:
    providers = await fleet.providers()
    return bool(providers) and all(p["general"]["queued"] == value for p in providers.values())


async def open_stream_with_key(fleet: DaemonFleet, max_tokens: int, hang_up_after: Any = None) -> Any:
    """A streaming chat request with the API key."""
    return await open_stream(
        fleet.gateway,
        chat(stream=True, max_tokens=max_tokens),
        hang_up_after,
        headers={b"Authorization": [b"Bearer k-test"]},
    )


async def post_with_key(fleet: DaemonFleet, max_tokens: int) -> tuple[int, Any]:
    """A non-streaming chat request with the API key."""
    response = await treq.post(
        fleet.gateway + "/v1/chat/completions",
        data=chat(max_tokens=max_tokens),
        headers=AUTHORIZED_JSON,
        timeout=30,
    )
    return response.code, json.loads(await response.content())
