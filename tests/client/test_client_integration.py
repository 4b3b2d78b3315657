"""The clients against a REAL Control Plane on loopback, with scripted edges.

The repository, the wire client (hello, subscription, resume after a
reconnect, lost-event notices) and the installed ``iopctl`` script, run as a
subprocess the way an operator runs it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.protocol import ProcessProtocol
from twisted.internet.utils import getProcessOutputAndValue
from twisted.python.failure import Failure

from twisted_iop.client import (
    ClientWireClient,
    ControlPlaneStatusRepository,
    EdgeNotConnectedError,
    HelloRejected,
    UnknownEdgeError,
    WireRequestError,
)
from twisted_iop.testing.harness import IOPCTL, eventually, start_control_plane
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import control_pb2 as pb


async def iopctl(*args: str) -> tuple[int, str, str]:
    """Run the installed iopctl script without blocking the reactor."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
    out, err, code = await getProcessOutputAndValue(IOPCTL, args, env=env, reactor=reactor)
    return code, out.decode(), err.decode()


class Recorder:
    """Collects what a subscription delivers."""

    def __init__(self) -> None:
        self.events: list[pb.FleetEvent] = []
        self.lost: list[pb.EventsLost] = []

    def on_event(self, event: pb.FleetEvent) -> None:
        """Keep an event."""
        self.events.append(event)

    def on_lost(self, lost: pb.EventsLost) -> None:
        """Keep a lost-events notice."""
        self.lost.append(lost)

    def kinds(self) -> list[str]:
        """The kinds of the events kept so far."""
        return [e.kind for e in self.events]


@pytest_twisted.ensureDeferred
async def test_repository_against_the_real_control_plane() -> None:
    """Every repository view parses the real server's answers; errors map to their classes."""
    cp = await start_control_plane()
    repo = ControlPlaneStatusRepository(cp.http_url, timeout=10)
    edge = None
    try:
        edge, hello = await connect_edge(cp.edge_wire_port, "edge-a")
        assert hello is not None and hello.accepted
        edges = await repo.all_edges()
        assert [(e.edge_id, e.connected) for e in edges.items] == [("edge-a", True)]
        detail = await repo.edge("edge-a")
        assert detail.events is not None and detail.events.capacity > 0
        status = await repo.edge_status("edge-a")
        assert [n.node_id for n in status.nodes] == ["node-1", "node-2"]
        provider = status.nodes[0].providers[0]
        assert (provider.status, provider.health, provider.general.capacity) == ("available", "healthy", 4)
        assert (provider.long_context.capacity, provider.long_context.queued) == (1, 1)
        catalog = await repo.commands("edge-a")
        assert "node.drain" in [c.name for c in catalog.commands]
        operation = await repo.send_command("edge-a", "node.drain", target="node-1", idempotency_key="k-1")
        assert operation.state == "succeeded" and operation.target == "node-1"
        again = await repo.send_command("edge-a", "node.drain", target="node-1", idempotency_key="k-1")
        assert again.operation_id == operation.operation_id and len(edge.commands_seen) == 1
        operations = await repo.operations("edge-a")
        assert operations.items[0].operation_id == operation.operation_id
        assert (await repo.operation("edge-a", operation.operation_id)).history
        events = await repo.events("edge-a")
        assert "edge.connected" in [e.kind for e in events.items]
        fleet = await repo.full_fleet_status()
        assert fleet.totals.edges_connected == 1 and fleet.items[0].edge_id == "edge-a"
        assert (await repo.fleet_events()).items and (await repo.fleet_operations()).total == 1
        assert (await repo.healthz()).status == "ok" and (await repo.readyz()).ready
        with pytest.raises(UnknownEdgeError):
            await repo.edge_status("nope")
        assert edge.transport is not None
        edge.tcp.loseConnection()
        await edge.lost

        async def not_connected() -> Any:
            try:
                await repo.edge_status("edge-a")
            except EdgeNotConnectedError as e:
                return e
            return None

        error = await eventually(not_connected, timeout=5, message="edge_not_connected")
        assert error.snapshot is not None and error.snapshot.stale
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_iopctl_script_against_the_real_control_plane() -> None:
    """iopctl fleet/status print tables, --json parses; a stopped CP gives one line and exit 3."""
    cp = await start_control_plane()
    try:
        await connect_edge(cp.edge_wire_port, "edge-a")
        code, out, err = await iopctl("--url", cp.http_url, "fleet")
        assert code == 0, err
        assert "edge-a" in out and "edges      1/1 connected" in out
        code, out, err = await iopctl("--url", cp.http_url, "status", "edge-a")
        assert code == 0, err
        assert "mock-1" in out and "mock-2" in out and "LC-QUEUED" in out
        code, out, err = await iopctl("status", "edge-a", "--json", "--url", cp.http_url)
        assert code == 0, err
        document = json.loads(out)
        assert document["edge_id"] == "edge-a" and len(document["nodes"]) == 2
        code, out, err = await iopctl("--url", cp.http_url, "status", "nope")
        assert code == 1 and err.startswith("iopctl: unknown_edge: ") and len(err.splitlines()) == 1
        code, out, err = await iopctl("--url", cp.http_url, "command", "edge-a", "node.drain", "--target", "node-1")
        assert code == 0, err
        assert "succeeded" in out
        code, out, err = await iopctl("--wire-url", cp.wire_url, "hello")
        assert code == 0 and "events.subscribe" in out
    finally:
        await cp.stop()
    code, out, err = await iopctl("--url", cp.http_url, "fleet")
    assert code == 3 and out == ""
    assert err == f"iopctl: cannot reach the Control Plane at {cp.http_url}: connection refused\n"


@pytest_twisted.ensureDeferred
async def test_wire_hello_and_token_check() -> None:
    """hello is accepted with the right token and refused (with a reason) with a wrong one."""
    cp = await start_control_plane(config_text="http:\n  api_token: s3cret\n")
    good = ClientWireClient(cp.wire_url, reactor=reactor, api_token="s3cret")
    bad = ClientWireClient(cp.wire_url, reactor=reactor, api_token="nope")
    try:
        response = await good.hello()
        assert response.accepted and "events.subscribe" in response.features
        refused = await bad.hello()
        assert not refused.accepted and refused.reason
        with pytest.raises(HelloRejected):
            await bad.subscribe("")
    finally:
        await good.close()
        await bad.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_subscription_resumes_after_reconnect() -> None:
    """Events relayed while the client was away arrive after it reconnects, once each."""
    cp = await start_control_plane()
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        with pytest.raises(WireRequestError):
            await client.subscribe("edge-zzz")
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, backoff_initial=0.05
        )
        edge.event("node.ready", node_id="node-1")
        await eventually(lambda: seen.kinds() == ["node.ready"], timeout=5, message="node.ready")
        subscription.abort_connection()
        edge.event("node.disconnected", node_id="node-1")
        edge.event("node.ready", node_id="node-1")
        await eventually(lambda: subscription.reconnects >= 1, timeout=5, message="a reconnect")
        await eventually(lambda: len(seen.events) == 3, timeout=5, message="the missed events")
        assert seen.kinds() == ["node.ready", "node.disconnected", "node.ready"]
        sequences = [e.sequence for e in seen.events]
        assert sequences == sorted(set(sequences))
        assert seen.lost == []
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_resume_gap_is_signalled() -> None:
    """Events that left the bounded buffer while the client was away arrive as events_lost."""
    cp = await start_control_plane(config_text="registry:\n  events_per_edge: 5\n")
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, backoff_initial=0.3
        )
        edge.event("node.ready", node_id="node-1")
        await eventually(lambda: len(seen.events) == 1, timeout=5, message="first event")
        before = subscription.last_sequence
        subscription.abort_connection()
        # Recorded in this reactor turn, before any reconnect can resume
        # (the retry delay is jittered and may be near zero).
        for i in range(12):
            cp.registry.record("edge-a", "provider.health_changed", node_id="node-1", message=f"change {i}")
        await eventually(lambda: seen.lost and len(seen.events) >= 6, timeout=10, message="lost notice and the rest")
        (lost,) = seen.lost
        assert lost.reason == "resume_gap" and lost.first_sequence == (before or 0) + 1
        assert lost.count == lost.last_sequence - lost.first_sequence + 1 == 7
        assert [e.sequence for e in seen.events[1:]] == list(range(lost.last_sequence + 1, lost.last_sequence + 6))
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_slow_consumer_is_signalled() -> None:
    """A subscriber that stops reading is told how many events it lost, never buffered without bound."""
    cp = await start_control_plane(config_text="client_wire:\n  subscriber_queue: 5\n")
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        subscription = await client.subscribe("edge-a", on_event=seen.on_event, on_lost=seen.on_lost)
        protocol: Any = subscription._protocol
        protocol.transport.pauseProducing()  # stop reading: the server's socket fills up
        # Each event as large as the Control Plane keeps one (about 36 KB):
        # a 4096-character message and 32 attributes of 1024 characters.
        big = {f"a{j:02d}": "x" * 1024 for j in range(32)}
        for i in range(400):
            edge.send(
                "edge_event",
                pb.EdgeEvent(
                    kind="provider.health_changed", node_id="node-1", message=f"{i} " + "x" * 4000, attributes=big
                ),
            )
        await eventually(
            lambda: cp.registry.find("edge-a").events.last_sequence >= 400, timeout=20, message="events recorded"
        )
        protocol.transport.resumeProducing()
        await eventually(lambda: seen.lost, timeout=20, message="a slow_consumer notice")
        await eventually(
            lambda: seen.events and seen.events[-1].message.startswith("399 "), timeout=20, message="the newest event"
        )
        assert {l.reason for l in seen.lost} == {"slow_consumer"}
        assert len(seen.events) + sum(l.count for l in seen.lost) == 400
    finally:
        await client.close()
        await cp.stop()


class FollowProcess(ProcessProtocol):
    """Collects a subprocess's output and notices its exit."""

    def __init__(self) -> None:
        self.out = b""
        self.err = b""
        self.ended: Deferred[Optional[int]] = Deferred()

    def outReceived(self, data: bytes) -> None:
        """Keep stdout."""
        self.out += data

    def errReceived(self, data: bytes) -> None:
        """Keep stderr."""
        self.err += data

    def processEnded(self, reason: Failure) -> None:
        """Fire ``ended`` with the exit code."""
        self.ended.callback(getattr(reason.value, "exitCode", None))


@pytest_twisted.ensureDeferred
async def test_iopctl_follow_prints_live_events_and_stops_on_ctrl_c() -> None:
    """iopctl events ID --follow prints events as the edge relays them; SIGINT ends it cleanly."""
    cp = await start_control_plane()
    process = FollowProcess()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
        transport = reactor.spawnProcess(
            process, IOPCTL, [IOPCTL, "--wire-url", cp.wire_url, "events", "edge-a", "--follow"], env=env
        )
        await eventually(lambda: b"following events of edge-a" in process.err, timeout=15, message="subscribed")
        edge.event("node.ready", node_id="node-1", message="node node-1 is ready")
        await eventually(lambda: b"node.ready" in process.out, timeout=5, message="the live event")
        transport.signalProcess("INT")
        code = await process.ended
        assert code == 0, process.err
        line = process.out.decode().splitlines()[0]
        assert "node.ready" in line and "node=node-1" in line and "node node-1 is ready" in line
        assert b"Traceback" not in process.err
    finally:
        if not process.ended.called:
            transport.signalProcess("KILL")
            await process.ended
        await cp.stop()
