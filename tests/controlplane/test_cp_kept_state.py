"""What the registry keeps per edge, kept compactly: snapshots as bytes, buffers on demand."""

from __future__ import annotations

import gc
import json
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet import bounds, memory
from twisted_iop.controlplane.fleet.event_log import EventBuffer, relayed_record
from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.live_event import event_payload, fleet_event_message
from twisted_iop.controlplane.fleet.memory import event_size
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import checked_snapshot
from twisted_iop.controlplane.http import json_views as views
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.wires.client_wire import ClientWireFactory
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import HeldEdgePeer, snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.pending import PendingRequests
from twisted_iop.wire.status_totals import response_counts


def _registry_with_edge(edge_id: str = "edge-1") -> tuple[EdgeRegistry, int]:
    """A registry with one connected edge, and its connection token."""
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels={"site": "a"}, software_version="1", protocol_version="1.0", commands=())
    return registry, registry.connect(edge_id, HeldEdgePeer(), hello)


def test_a_snapshot_is_kept_as_bytes_and_renders_what_the_message_renders() -> None:
    """The kept snapshot holds the serialized response and its counts; its JSON is
    the JSON of the message it came from, rendered once per snapshot."""
    registry, token = _registry_with_edge()
    response = snapshot("edge-1", nodes=3)
    response.nodes[1].labels["rack"] = "r7"
    response.nodes[2].providers[0].health_reason = "warming up"
    kept = checked_snapshot(response, 1.0)
    assert registry.record_status("edge-1", token, kept)
    assert kept.data == response.SerializeToString() and kept.counts == response_counts(response)
    assert kept.parse() == response and kept.parse() is not kept.parse()
    record = registry.get("edge-1")
    renderer = JsonBytesRenderer()
    rendered = json.loads(renderer.edge_status(record, kept, False))
    assert rendered["nodes"] == [views.node_json(node) for node in response.nodes]
    assert rendered["totals"] == views.counts_json(response_counts(response))
    assert rendered["generated_at"] == views.iso_ms(response.generated_at_ms)
    again = json.loads(renderer.edge_status(record, kept, True))
    assert again == {**rendered, "stale": True}
    assert renderer.kept()["snapshot_members"].entries == 1
    assert record.kept_bytes() >= len(kept.data)


def test_a_snapshot_is_smaller_than_the_parsed_message_it_replaces() -> None:
    """The estimate of a kept snapshot counts its bytes, not a parsed message tree."""
    response = snapshot("edge-1", nodes=4)
    kept = checked_snapshot(response, 1.0)
    assert len(kept.data) <= kept.size() < len(kept.data) + 512
    assert isinstance(kept.parse(), pb.EdgeStatusResponse)


def test_buffers_make_room_on_first_use() -> None:
    """An edge's operation buffer holds no tables until its first command; event
    buffers read back what they keep; empty ones read as empty."""
    registry, _ = _registry_with_edge()
    record = registry.get("edge-1")
    assert len(record.events) == 1
    [connected] = record.events.since(0, 10)
    assert connected.kind == "edge.connected" and record.events.since(connected.sequence, 10) == []
    registry.record("edge-1", "note")
    assert [e.kind for e in record.events.since(0, 10)] == ["edge.connected", "note"]
    operations = record.operations
    assert not operations.allocated
    assert len(operations) == 0 and list(operations) == [] and operations.newest_first() == []
    assert operations.get("x") is None and operations.by_key("k") is None
    operations.operation_changed(OperationRecord("op", "edge-1", "n", "", {}, "", 1.0, 2.0))
    assert not operations.allocated
    operations.add(OperationRecord("op", "edge-1", "n", "", {}, "k", 1.0, 2.0))
    assert operations.allocated and operations.by_key("k") is operations.get("op")
    events = EventBuffer(10, 1 << 20)
    assert len(events) == 0 and events.since(0, 10) == []
    assert events.first_sequence == 1


def _event(sequence: int, message: str) -> EventRecord:
    return EventRecord(sequence, sequence, "e", "k", 1.0, 1.0, message=message)


class _ModelBuffer:
    """The event buffer's rules over a plain list (the reference)."""

    def __init__(self, capacity: int, budget: int) -> None:
        self.capacity, self.budget = capacity, budget
        self.events: list[EventRecord] = []
        self.dropped = self.dropped_by_bytes = 0

    def append(self, event: EventRecord) -> None:
        self.events.append(event)
        if len(self.events) > self.capacity:
            self.events.pop(0)
            self.dropped += 1
        while sum(event_size(e) for e in self.events) > self.budget and len(self.events) > 1:
            self.events.pop(0)
            self.dropped += 1
            self.dropped_by_bytes += 1


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 150),
    budget_events=st.integers(1, 200),
    messages=st.lists(st.integers(0, 300), max_size=400),
    reads=st.lists(st.tuples(st.integers(-5, 450), st.integers(0, 200)), max_size=5),
)
def test_event_buffer_matches_its_model(
    capacity: int, budget_events: int, messages: list[int], reads: list[tuple[int, int]]
) -> None:
    """Whatever is appended (past the head compaction too), the buffer keeps, drops
    and returns exactly what the plain-list model does."""
    budget = budget_events * event_size(_event(1, ""))
    buffer, model = EventBuffer(capacity, budget), _ModelBuffer(capacity, budget)
    for sequence, length in enumerate(messages, start=1):
        event = _event(sequence, "m" * length)
        buffer.append(event, sequence)
        model.append(event)
    assert len(buffer) == len(model.events)
    assert buffer.bytes == sum(event_size(e) for e in model.events)
    assert (buffer.dropped, buffer.dropped_by_bytes) == (model.dropped, model.dropped_by_bytes)
    assert buffer.since(0, 10_000) == model.events
    for after, limit in reads:
        assert buffer.since(after, limit) == [e for e in model.events if e.sequence > after][:limit]


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.floats(min_value=-1.0, max_value=3e11, allow_nan=False),
        st.integers(0, 2**38).map(lambda ms: ms / 1000.0),
        st.integers(0, 2**31).map(lambda s: s + 0.9995),
    )
)
def test_iso_matches_datetime(seconds: float) -> None:
    """The fast ISO 8601 rendering (second text reused) says what datetime says, to the millisecond."""
    expected = None if seconds <= 0 else views.iso_by_datetime(seconds)
    assert views.iso(seconds) == expected
    assert views.iso(seconds + 0.25) == (None if seconds + 0.25 <= 0 else views.iso_by_datetime(seconds + 0.25))


def test_an_event_message_is_the_envelope_the_protobuf_library_builds() -> None:
    """The live event's message, serialized without an envelope object, parses as the
    ClientEnvelope carrying the event; subscribers in a row share one serialization."""
    registry, _ = _registry_with_edge()
    recorded = registry.record("edge-1", "bench.tick", message="m" * 300, attributes={"a": "b"})
    payload = event_payload(recorded)
    envelope = pb.ClientEnvelope()
    envelope.ParseFromString(payload)
    assert envelope.WhichOneof("body") == "event" and envelope.request_id == 0
    assert envelope.event == fleet_event_message(recorded)
    assert payload == pb.ClientEnvelope(event=fleet_event_message(recorded)).SerializeToString()
    factory = ClientWireFactory(registry, clock=Clock())
    assert factory.event_payload(recorded) is factory.event_payload(recorded)
    later = registry.record("edge-1", "bench.tock")
    assert fleet_event_message(later) == _parsed(factory.event_payload(later)).event


_maybe_texts = st.one_of(st.just(""), st.text(max_size=20), st.text(min_size=100, max_size=200))


@settings(max_examples=200, deadline=None)
@given(
    edge_id=st.text(min_size=1, max_size=64),
    kind=st.text(min_size=1, max_size=64),
    node=_maybe_texts,
    provider=_maybe_texts,
    command=_maybe_texts,
    message=_maybe_texts,
    attributes=st.one_of(st.none(), st.dictionaries(st.text(max_size=10), st.text(max_size=40), max_size=8)),
)
def test_an_event_record_is_sized_as_event_size_says(
    edge_id: str,
    kind: str,
    node: str,
    provider: str,
    command: str,
    message: str,
    attributes: dict[str, str] | None,
) -> None:
    """An event's size estimate counts every text and attribute it holds, and an
    event keeps the fields it was made with."""
    event = EventRecord(
        3, 7, edge_id, kind, 1.5, 2.5, node, provider, command, message=message, attributes=attributes or {}
    )
    bare = EventRecord(3, 7, edge_id, kind, 1.5, 2.5)
    texts = sum(sys.getsizeof(t) - sys.getsizeof("") for t in (node, provider, command, message))
    extra = memory.map_size(attributes) - sys.getsizeof({}) if attributes else 0
    assert event_size(event) == event_size(bare) + texts + extra
    assert event.attributes == (attributes or {})
    assert (event.sequence, event.fleet_sequence, event.edge_id, event.kind) == (3, 7, edge_id, kind)
    assert (event.node_id, event.provider_id, event.command_id, event.message) == (node, provider, command, message)


@settings(max_examples=200, deadline=None)
@given(
    message=_maybe_texts,
    attributes=st.one_of(st.none(), st.dictionaries(st.text(max_size=10), st.text(max_size=40), max_size=8)),
)
def test_a_kept_event_gives_back_its_record(message: str, attributes: dict[str, str] | None) -> None:
    """What a buffer keeps of an event gives back an equal record, attributes in their order."""
    event = EventRecord(
        5, 8, "edge-1", "node.note", 1.5, 2.5, "n1", "", "c1", message=message, attributes=attributes or {}
    )
    buffer = EventBuffer(10, 1 << 20)
    buffer.append(event, 5)
    [again] = buffer.since(0, 10)
    assert again == event and type(again) is EventRecord
    assert list(again.attributes.items()) == list(event.attributes.items())
    assert buffer.bytes == event_size(event)


def test_kept_events_cost_the_garbage_collector_nothing() -> None:
    """What the buffers keep of thousands of events adds no object the cyclic
    garbage collector walks (so its older-generation collections do not get
    slower as the buffers fill), while the records read back are ordinary."""
    registry, _ = _registry_with_edge()
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5000):
        registry.record("edge-1", "node.note", node_id=f"n{i}", attributes={"a": str(i), "b": "x"})
    gc.collect()
    tracked = len(gc.get_objects()) - before
    assert len(registry.get("edge-1").events) == 1000 and len(registry.fleet_events) == 5001
    assert tracked < 100, f"{tracked} objects tracked for 5,000 kept events"
    record = registry.fleet_events.since(0, 10000)[-1]
    assert record.attributes == {"a": "4999", "b": "x"} and record.node_id == "n4999"


def test_an_event_record_cannot_be_changed() -> None:
    """A recorded event is immutable: its fields cannot be set, nor new ones added."""
    event = EventRecord(1, 1, "e", "k", 1.0, 1.0, attributes={"a": "b"})
    with pytest.raises(AttributeError):
        event.kind = "other"  # type: ignore[misc]  # a frozen record, on purpose
    with pytest.raises(AttributeError):
        event.extra = 1  # type: ignore[attr-defined]  # a slotted record, on purpose
    assert event == EventRecord(1, 1, "e", "k", 1.0, 1.0, attributes={"a": "b"})
    assert event != EventRecord(1, 1, "e", "k", 1.0, 1.0, attributes={"a": "c"})


@settings(max_examples=200, deadline=None)
@given(
    message=_maybe_texts,
    attributes=st.dictionaries(st.text(max_size=12), st.text(max_size=60), max_size=40),
)
def test_an_event_message_is_the_one_built_from_a_whole_map(message: str, attributes: dict[str, str]) -> None:
    """Setting the attributes one by one gives the bytes the protobuf library gives
    for the map passed whole (the same insertions in the same order)."""
    event = EventRecord(4, 9, "edge-1", "bench.tick", 1.25, 2.5, message=message, attributes=attributes)
    whole = pb.FleetEvent(
        sequence=4,
        fleet_sequence=9,
        edge_id="edge-1",
        kind="bench.tick",
        occurred_at_ms=1250,
        recorded_at_ms=2500,
        message=message,
        attributes=attributes,
    )
    assert fleet_event_message(event).SerializeToString() == whole.SerializeToString()


def _parsed(payload: bytes) -> pb.ClientEnvelope:
    envelope = pb.ClientEnvelope()
    envelope.ParseFromString(payload)
    return envelope


_texts = st.one_of(st.text(max_size=8), st.text(min_size=240, max_size=300))


@settings(max_examples=300, deadline=None)
@given(
    kind=_texts,
    node=_texts,
    message=st.one_of(_texts, st.text(min_size=4090, max_size=4100)),
    attributes=st.dictionaries(st.one_of(st.text(max_size=4), _texts), _texts, max_size=40),
)
def test_event_clip_shortcut_agrees_with_the_full_clip(
    kind: str, node: str, message: str, attributes: dict[str, str]
) -> None:
    """Taking a small event whole keeps exactly what clipping every text keeps."""
    event = pb.EdgeEvent(kind=kind, node_id=node, message=message, attributes=attributes)
    assert relayed_record("e", event, 1.0) == relayed_record("e", event, 1.0, clip=bounds.full_clip_event)


def test_edges_announcing_one_catalog_share_one_copy() -> None:
    """The same catalog gives the same detached copy; another catalog its own; the
    cache forgets its oldest beyond its count, and large catalogs are not shared."""
    cache = memory.CatalogCache()
    catalog = [pb.CommandSpec(name="edge.diagnostics", description="Versions", target_kind="edge")]
    first = cache.detached(catalog)
    assert cache.detached([pb.CommandSpec(name="edge.diagnostics", description="Versions", target_kind="edge")]) is (
        first
    )
    assert list(first) == catalog and first[0] is not catalog[0]
    other = cache.detached([pb.CommandSpec(name="node.drain", target_kind="node")])
    assert other is not first and other[0].name == "node.drain"
    for i in range(memory.SHARED_CATALOGS + 5):
        cache.detached([pb.CommandSpec(name=f"c{i}")])
    assert len(cache) == memory.SHARED_CATALOGS
    assert cache.detached(catalog) is not first  # forgotten, copied again
    big = [pb.CommandSpec(name="x", description="d" * 1000) for _ in range(20)]
    assert cache.detached(big) is not cache.detached(big) and len(cache) == memory.SHARED_CATALOGS


def test_pending_requests_give_their_memory_back_when_idle() -> None:
    """A burst of outstanding requests leaves no memory held once the last one
    is answered (a connection idle after a busy moment costs what an idle one
    does), and the table keeps working."""
    pending: PendingRequests[str] = PendingRequests()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        ids = [pending.add(None, 0, TimeoutError)[0] for _ in range(5000)]
        busy = tracemalloc.get_traced_memory()[0]
        for request_id in ids:
            pending.answer(request_id, "ok")
        del ids
        gc.collect()  # the answered Deferreds are collected, not counted
        idle = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(pending) == 0
    assert busy - before > 100_000  # the burst really held memory
    assert idle - before < 4096
    request_id, answered = pending.add(None, 0, TimeoutError)
    results: list[str] = []
    answered.addCallback(results.append)
    pending.answer(request_id, "ok")
    assert results == ["ok"] and len(pending) == 0
