"""Memory the Control Plane keeps of its edges stays under the documented bound.

Maximal events, catalogs, labels, results and status snapshots are fed to
the registry directly (cheap, and tracemalloc sees only what it keeps) and
to a real Control Plane over real sockets; the buffers' own byte
accounting and tracemalloc must stay under
:meth:`RegistryLimits.worst_case`, the numbers docs/security.md quotes.
One test runs the real daemon as a process and feeds it 300 events of
1 MiB: its RSS may grow only by what the budgets allow.
"""

from __future__ import annotations

import gc
import re
import tracemalloc
from functools import partial
from pathlib import Path

import pytest
import pytest_twisted
import treq
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.event_log import EventBuffer, relayed_record
from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests import operation_states
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.edge_wire import EdgeCredentials
from twisted_iop.testing.harness import eventually, start_control_plane, start_daemon, wait_for_ports
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import MAX_LABELS, MAX_TEXT, RejectionCode, check_edge_hello

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
#: A character that takes four bytes in a Python string (the worst case).
WIDE = "\U0001f600"
MIB = 1024 * 1024


class _Peer:
    """The least an EdgePeer needs for the registry (no requests are made)."""

    last_received = 0.0

    def disconnect(self, code: int, message: str) -> None:
        """Nothing to close."""


def maximal_hello() -> EdgeHello:
    """Labels at their bounds, in four-byte characters, and the most catalog
    objects a hello frame (64 KiB) can carry."""
    labels = {f"{i:03d}" + WIDE * (MAX_TEXT - 3): WIDE * MAX_TEXT for i in range(MAX_LABELS)}
    commands = []
    for c in range(256):
        spec = pb.CommandSpec(name=f"c{c}", target_kind="node", description="d" * 40)
        for a in range(4):
            spec.arguments.add(name=f"a{a}", description="x" * 8)
        commands.append(spec)
    request = pb.EdgeHelloRequest(edge_id="e", protocol_major=PROTOCOL_MAJOR, commands=commands)
    assert request.ByteSize() <= 64 * 1024
    assert check_edge_hello(request, EdgeCredentials()) is None
    return EdgeHello(
        labels=labels,
        software_version=WIDE * MAX_TEXT,
        protocol_version="1.0",
        commands=bounds.detached_catalog(commands),
    )


def maximal_event(sequence: int) -> pb.EdgeEvent:
    """An event over every bound: long texts in wide characters, too many attributes."""
    return pb.EdgeEvent(
        kind="node." + WIDE * 1000,
        node_id=WIDE * 1000,
        provider_id=WIDE * 1000,
        command_id=WIDE * 1000,
        message=WIDE * 20000,
        attributes={f"{i:04d}" + WIDE * 200: WIDE * 5000 for i in range(100)},
        edge_sequence=sequence,
    )


def maximal_result() -> dict[str, str]:
    """A command result over every bound."""
    return {f"{i:04d}" + WIDE * 200: WIDE * 5000 for i in range(200)}


def test_an_event_over_its_bounds_is_cut_and_marked() -> None:
    """Texts are cut, surplus and over-long attributes dropped, and the event says so."""
    clipped = relayed_record("e", maximal_event(1), 1.0)
    assert clipped.attributes["truncated"] == "true"
    assert len(clipped.message) == bounds.MAX_EVENT_MESSAGE and clipped.message.endswith("...")
    assert len(clipped.kind) == bounds.MAX_EVENT_ID
    assert len(clipped.attributes) == bounds.MAX_EVENT_ATTRIBUTES + 1
    assert all(len(v) <= bounds.MAX_ATTRIBUTE_VALUE for v in clipped.attributes.values())
    small = relayed_record("e", pb.EdgeEvent(kind="node.ready", message="hi", attributes={"a": "b"}), 1.0)
    assert small.attributes == {"a": "b"} and (small.kind, small.message) == ("node.ready", "hi")


def test_an_oversized_catalog_is_refused_as_invalid_hello() -> None:
    """Too many arguments, or an overlong description, is the existing invalid_hello."""
    many = pb.CommandSpec(name="x", arguments=[pb.CommandArgumentSpec(name=f"a{i}") for i in range(33)])
    wordy = pb.CommandSpec(name="x", description="d" * 1025)
    for spec in (many, wordy):
        rejection = check_edge_hello(
            pb.EdgeHelloRequest(edge_id="e", protocol_major=PROTOCOL_MAJOR, commands=[spec]), EdgeCredentials()
        )
        assert rejection is not None and rejection.code is RejectionCode.INVALID_HELLO


def test_an_oversized_status_snapshot_is_refused() -> None:
    """Too many nodes, providers or bytes in a snapshot is named as a problem."""
    response = pb.EdgeStatusResponse(edge_id="e")
    for n in range(bounds.MAX_STATUS_NODES + 1):
        response.nodes.add(node_id=f"n{n}")
    assert "nodes" in (bounds.status_problem(response) or "")
    response = pb.EdgeStatusResponse(edge_id="e")
    response.nodes.add(node_id="n").providers.add(provider_id="p", health_reason="r" * 300_000)
    assert "bytes" in (bounds.status_problem(response) or "")
    assert bounds.status_problem(pb.EdgeStatusResponse(edge_id="e")) is None


def test_event_size_estimates_are_not_below_what_python_holds() -> None:
    """The buffer's byte accounting is an upper bound of the memory its events hold."""
    buffer = EventBuffer(1000, 64 * MIB)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(200):
            event = relayed_record("edge-" + str(i), maximal_event(i), float(i), i + 1, i + 1)
            buffer.append(event, i + 1)
        del event
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"200 maximal events: estimated {buffer.bytes} bytes, traced {held} bytes")
    assert 0 < held <= buffer.bytes


def test_the_registry_stays_under_its_worst_case_with_maximal_input() -> None:
    """Maximal hellos, events, results, late outcomes and snapshots, on edges
    connected and gone: the byte accounting and tracemalloc stay under the bound."""
    limits = RegistryLimits(
        events_per_edge=1000,
        fleet_events=10000,
        operations_per_edge=500,
        event_bytes_per_edge=256 * 1024,
        fleet_event_bytes=MIB,
        operation_bytes_per_edge=MIB,
        disconnected_edges=10000,
        disconnected_bytes=8 * MIB,
    )
    bound = limits.worst_case()
    clock = Clock()
    clock.advance(1000)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        registry = EdgeRegistry(clock, limits)
        connected = 3
        for n in range(12):
            edge_id = f"edge-{n}"
            token = registry.connect(edge_id, _Peer(), maximal_hello())  # type: ignore[arg-type]  # a fake peer with only what the registry calls
            for i in range(20):
                registry.record_edge_event(edge_id, token, maximal_event(i + 1))
            for i in range(6):
                operation = OperationRecord(
                    operation_id=f"{n:016d}{i:016d}",
                    edge_id=edge_id,
                    name="c1",
                    target="t" * MAX_TEXT,
                    arguments={f"{a:02d}" + WIDE * 200: WIDE * 1024 for a in range(32)},
                    idempotency_key="",
                    created_at=clock.seconds(),
                    deadline_at=clock.seconds() + 10,
                )
                registry.operations.start_operation(operation)
                registry.operations.advance_operation(
                    edge_id, operation.operation_id, operation_states.TIMED_OUT, "late"
                )
                registry.operations.record_late_outcome(
                    edge_id, operation.operation_id, operation_states.SUCCEEDED, WIDE * 5000, maximal_result()
                )
            record = registry.get(edge_id)
            assert record.events.bytes <= limits.event_bytes_per_edge
            assert record.operations.bytes <= limits.operation_bytes_per_edge
            assert record.kept_bytes() <= bound.per_connected_edge
            if n >= connected:
                registry.disconnect(edge_id, token, "gone")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    kept = [registry.get(f"edge-{n}") for n in range(connected)]
    assert all(r.connected for r in kept)
    assert registry.disconnected_bytes <= limits.disconnected_bytes
    assert registry.forgotten_edges > 0
    assert registry.fleet_events.bytes <= limits.fleet_event_bytes
    assert kept[0].events.dropped_by_bytes > 0 and kept[0].operations.dropped_by_bytes > 0
    total = bound.total(connected)
    accounted = registry.fleet_events.bytes + sum(r.kept_bytes() for r in registry.edges())
    print(f"registry: accounted {accounted} bytes, traced {held} bytes, documented bound {total} bytes")
    assert accounted <= total
    assert held <= total


def test_security_doc_quotes_the_worst_case_at_the_defaults() -> None:
    """docs/security.md's Memory section gives the numbers the code computes."""
    text = DOCS.read_text()
    bound = RegistryLimits().worst_case()
    section = text[text.index("## Memory") :]
    quoted = {
        m.group(1): int(m.group(2).replace(",", "")) for m in re.finditer(r"\| (\w[\w ]*?) \| ([\d,]+) \|", section)
    }
    assert quoted["per connected edge"] == bound.per_connected_edge
    assert quoted["per disconnected edge"] == bound.per_disconnected_edge
    assert quoted["disconnected edges in all"] == bound.disconnected_total
    assert quoted["fleet event buffer"] == bound.fleet_events


@pytest_twisted.ensureDeferred
async def test_a_real_control_plane_keeps_maximal_input_within_its_budgets() -> None:
    """Over real sockets: events of 1 MiB are cut, the buffers stay in budget,
    an oversized status is an edge error and an oversized catalog is refused."""
    harness = await start_control_plane(config_text="registry: {event_bytes_per_edge: 262144}\n")
    try:
        refused_edge, answer = await connect_edge(
            harness.edge_wire_port,
            "edge-wordy",
            catalog=[pb.CommandSpec(name="x", description="d" * 2000)],
        )
        assert answer is not None and not answer.accepted and answer.reason_code == "invalid_hello"
        edge, answer = await connect_edge(harness.edge_wire_port, "edge-big")
        assert answer is not None and answer.accepted
        for i in range(20):
            edge.send("edge_event", pb.EdgeEvent(kind="node.note", message="m" * MIB, edge_sequence=i + 1))
        record = harness.registry.get("edge-big")
        await eventually(lambda: record.events.last_sequence >= 21, message="20 events recorded")
        events = record.events.since(0, 1000)
        notes = [e for e in events if e.kind == "node.note"]
        assert notes and all(len(e.message) == bounds.MAX_EVENT_MESSAGE for e in notes)
        assert all(e.attributes == {"truncated": "true"} for e in notes)
        assert record.events.bytes <= 262144
        code, body = await harness.get_json("/edges/edge-big/events?limit=1")
        assert code == 200 and body["byte_budget"] == 262144 and body["bytes"] <= 262144
        huge = pb.EdgeStatusResponse(edge_id="edge-big")
        for n in range(bounds.MAX_STATUS_NODES + 1):
            huge.nodes.add(node_id=f"n{n}")
        edge.status = lambda: huge
        code, body = await harness.get_json("/edges/edge-big/status")
        assert code == 502 and body["error"]["code"] == "edge_error"
        assert record.snapshot is None
        edge.transport.loseConnection()  # type: ignore[union-attr]  # connected by now
        refused_edge.transport.loseConnection()  # type: ignore[union-attr]  # connected by now
        await edge.lost
    finally:
        await harness.stop()


def _rss(pid: int) -> int:
    """Resident bytes of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest_twisted.ensureDeferred
async def test_300_events_of_one_mebibyte_do_not_grow_the_daemon_by_hundreds_of_megabytes(tmp_path: Path) -> None:
    """The real daemon fed 300 events of 1 MiB grows only by what its budgets allow."""
    loopback = "tcp:0:interface=127.0.0.1"
    env = {"IOP_HTTP_LISTEN": loopback, "IOP_WIRE_LISTEN": loopback, "IOP_EDGE_WIRE_LISTEN": loopback}
    daemon = start_daemon(["iop-control-plane"], tmp_path, env=env, name="cp")
    try:
        ports = await wait_for_ports(daemon, {"edge_wire", "http"})
        edge, answer = await connect_edge(ports["edge_wire"], "edge-flood")
        assert answer is not None and answer.accepted
        http = ports["http"]

        async def recorded(sequence: int) -> bool:
            response = await treq.get(f"http://127.0.0.1:{http}/edges/edge-flood")
            body = await response.json()
            return bool(body["events"]["last_sequence"] >= sequence)

        edge.event("node.warmup")
        await eventually(lambda: recorded(2), message="warm-up event recorded")
        before = _rss(daemon.process.pid)
        message = "m" * MIB
        for i in range(300):
            edge.send("edge_event", pb.EdgeEvent(kind="node.note", message=message, edge_sequence=i + 2))
            if i % 20 == 19:
                # Paced by the daemon's own count, so the test holds no
                # more than 20 MiB of unsent frames.
                await eventually(partial(recorded, i + 3), timeout=60, message=f"{i + 1} events recorded")
        after = _rss(daemon.process.pid)
        config = config_from_text("")
        bound = config.registry.worst_case()
        allowed = bound.fleet_events + bound.per_connected_edge + 4 * config.edge_wire.max_frame_bytes
        print(f"daemon RSS {before} -> {after} bytes (+{after - before}); allowed growth {allowed}")
        assert after - before <= allowed
    finally:
        daemon.stop()


def test_byte_budgets_are_read_from_the_config_and_errors_name_the_field() -> None:
    """The registry and subscriber byte budgets come from control-plane.yaml;
    a budget too small for one record names its field."""
    config = config_from_text(
        "registry: {event_bytes_per_edge: 131072, fleet_event_bytes: 262144,"
        " operation_bytes_per_edge: 196608, disconnected_bytes: 0}\n"
        "client_wire: {subscriber_queue_bytes: 65536}\n"
    )
    assert config.registry.event_bytes_per_edge == 131072
    assert config.registry.fleet_event_bytes == 262144
    assert config.registry.operation_bytes_per_edge == 196608
    assert config.registry.disconnected_bytes == 0
    assert config.client_wire.subscriber_queue_bytes == 65536
    with pytest.raises(ConfigError, match=r"registry\.event_bytes_per_edge: must be between 65536"):
        config_from_text("registry: {event_bytes_per_edge: 100}\n")
    with pytest.raises(ConfigError, match=r"client_wire\.subscriber_queue_bytes"):
        config_from_text("client_wire: {subscriber_queue_bytes: many}\n")


def test_a_disconnected_edge_keeps_a_compact_catalog_until_it_returns() -> None:
    """Going away drops the catalog's descriptions (names and arguments stay);
    a new hello brings the full catalog back."""
    registry = EdgeRegistry(Clock())
    full = EdgeHello(
        {},
        "t",
        "1.0",
        (
            pb.CommandSpec(
                name="node.drain",
                description="Stop new leases",
                target_kind="node",
                arguments=[pb.CommandArgumentSpec(name="reason", description="why", required=True)],
            ),
        ),
    )
    token = registry.connect("edge-a", _Peer(), full)  # type: ignore[arg-type]  # a fake peer with only what the registry calls
    registry.disconnect("edge-a", token, "gone")
    (spec,) = registry.get("edge-a").hello.commands
    assert (spec.name, spec.target_kind, spec.description) == ("node.drain", "node", "")
    assert [(a.name, a.required, a.description) for a in spec.arguments] == [("reason", True, "")]
    assert registry.disconnected_bytes == registry.get("edge-a").kept_bytes()
    registry.connect("edge-a", _Peer(), full)  # type: ignore[arg-type]  # a fake peer with only what the registry calls
    assert registry.get("edge-a").hello.commands[0].description == "Stop new leases"
    assert registry.disconnected_bytes == 0


_short = st.text(max_size=8)
_long = st.text(min_size=250, max_size=300)


@st.composite
def _status_responses(draw: st.DrawFn) -> pb.EdgeStatusResponse:
    """Snapshots near the bounds: strings around MAX_TEXT, labels around MAX_LABELS."""
    response = pb.EdgeStatusResponse(edge_id="e")
    for _ in range(draw(st.integers(0, 6))):
        node = response.nodes.add(node_id=draw(st.one_of(_short, _long)))
        labels = draw(st.integers(0, 70))
        # The shortest labels there are (one-character keys, empty values)
        # or a little longer ones.
        if draw(st.booleans()):
            node.labels.update({chr(0x21 + i): "" for i in range(labels)})
        else:
            node.labels.update({f"k{i}": "" for i in range(labels)})
        if draw(st.booleans()):
            node.labels["x"] = draw(st.one_of(_short, _long))
        for _p in range(draw(st.integers(0, 3))):
            node.providers.add(
                provider_id=draw(st.one_of(_short, _long)),
                kind=draw(_short),
                models=draw(st.lists(st.one_of(_short, _long), max_size=3)),
                health_reason=draw(st.one_of(_short, st.text(min_size=1000, max_size=1100))),
            )
    return response


@settings(max_examples=200, deadline=None)
@given(_status_responses())
def test_status_problem_shortcut_agrees_with_the_full_check(response: pb.EdgeStatusResponse) -> None:
    """Judging a small snapshot by its wire sizes finds exactly what checking every bound finds."""
    assert (bounds.status_problem(response) is None) == (bounds.full_status_problem(response) is None)
