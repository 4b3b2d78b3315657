"""Values many edges repeat are kept once: label maps, their texts, snapshot
counts and the ``edge.connected`` attributes; every edge still shows its own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet import memory
from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.http import json_views as views
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status, snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import (
    COUNTS_LEN,
    GENERAL_AT,
    HEALTH_AT,
    HEALTH_NAMES,
    LONG_AT,
    STATUS_AT,
    STATUS_NAMES,
    response_counts,
)


def _hello(labels: dict[str, str], version: str = "1.2.3") -> EdgeHello:
    """A hello with fresh copies of ``labels``' texts (as each wire read makes them)."""
    fresh = {"".join(list(key)): "".join(list(value)) for key, value in labels.items()}
    return EdgeHello(labels=fresh, software_version="".join(list(version)), protocol_version="1.0", commands=())


def test_equal_label_maps_are_kept_once_and_each_edge_shows_its_own() -> None:
    """Edges announcing equal labels (in any order) share one map; an edge with
    other labels keeps its own; summaries show each edge's labels."""
    registry = EdgeRegistry(Clock())
    registry.connect("edge-a", HeldEdgePeer(), _hello({"site": "lab", "region": "eu"}))
    registry.connect("edge-b", HeldEdgePeer(), _hello({"region": "eu", "site": "lab"}))
    registry.connect("edge-c", HeldEdgePeer(), _hello({"site": "lab", "region": "us"}))
    a, b, c = (registry.get(e).hello for e in ("edge-a", "edge-b", "edge-c"))
    assert a.labels is b.labels and a.labels is not c.labels
    assert views.edge_summary(registry.get("edge-b"))["labels"] == {"site": "lab", "region": "eu"}
    assert views.edge_summary(registry.get("edge-c"))["labels"] == {"site": "lab", "region": "us"}
    # The texts are kept once too, across maps and versions.
    assert next(iter(a.labels)) is next(k for k in c.labels if k == next(iter(a.labels)))
    assert a.software_version is c.software_version


def test_edges_that_said_the_same_share_one_hello() -> None:
    """Equal labels, versions and catalog copy: one hello for all those edges;
    another version or catalog: a hello of its own, with the same label map."""
    registry = EdgeRegistry(Clock())
    catalog = (pb.CommandSpec(name="node.drain"),)
    for edge_id, version, commands in (("a", "1", catalog), ("b", "1", catalog), ("c", "2", catalog), ("d", "1", ())):
        hello = _hello({"site": "lab"}, version=version)
        registry.connect(edge_id, HeldEdgePeer(), EdgeHello(hello.labels, hello.software_version, "1.0", commands))
    a, b, c, d = (registry.get(e).hello for e in "abcd")
    assert a is b and a is not c and a is not d
    assert a.labels is c.labels is d.labels
    assert (c.software_version, d.commands, a.commands) == ("2", (), catalog)


def test_a_new_hello_replaces_a_shared_map_without_changing_other_edges() -> None:
    """When an edge reconnects with other labels, edges that shared its old map keep it."""
    registry = EdgeRegistry(Clock())
    registry.connect("edge-a", HeldEdgePeer(), _hello({"site": "lab"}))
    registry.connect("edge-b", HeldEdgePeer(), _hello({"site": "lab"}))
    registry.connect("edge-a", HeldEdgePeer(), _hello({"site": "moved"}))
    assert registry.get("edge-a").hello.labels == {"site": "moved"}
    assert registry.get("edge-b").hello.labels == {"site": "lab"}


def test_large_label_maps_stay_the_edges_own() -> None:
    """A map over the shared size is kept as the edge's own (equal, not the same object)."""
    registry = EdgeRegistry(Clock())
    labels = {f"key-{i}": "v" * 200 for i in range(8)}
    registry.connect("edge-a", HeldEdgePeer(), _hello(labels))
    registry.connect("edge-b", HeldEdgePeer(), _hello(labels))
    a, b = registry.get("edge-a").hello.labels, registry.get("edge-b").hello.labels
    assert a == b == labels and a is not b


def test_equal_snapshot_counts_are_kept_once() -> None:
    """Snapshots with equal counts share one counts tuple; other counts are their own and right."""
    registry = EdgeRegistry(Clock())
    tokens = {e: registry.connect(e, HeldEdgePeer(), _hello({})) for e in ("edge-a", "edge-b", "edge-c")}
    kept = {
        e: keep_status(registry, e, tokens[e], snapshot(e, nodes=2, capacity=4 if e != "edge-c" else 9)) for e in tokens
    }
    a, b, c = (kept[e] for e in ("edge-a", "edge-b", "edge-c"))
    assert a is not None and b is not None and c is not None
    assert a.counts is b.counts and a.counts is not c.counts
    assert c.counts == response_counts(snapshot("edge-c", nodes=2, capacity=9)) != a.counts


def test_the_connected_event_reads_the_same_in_the_edge_and_fleet_views() -> None:
    """``edge.connected`` is kept once for the edge's and the fleet's buffer, and
    renders the same in both views; its attributes say the edge's own version,
    in texts that edges of one version share."""
    registry = EdgeRegistry(Clock())
    registry.connect("edge-a", HeldEdgePeer(), _hello({}, version="2.0"))
    registry.connect("edge-b", HeldEdgePeer(), _hello({}, version="2.0"))
    registry.connect("edge-c", HeldEdgePeer(), _hello({}, version="3.1"))
    fleet = {event.edge_id: event for event in registry.fleet_events.since(0, 10)}
    for edge_id, version in (("edge-a", "2.0"), ("edge-b", "2.0"), ("edge-c", "3.1")):
        [own] = registry.get(edge_id).events.since(0, 10)
        assert own == fleet[edge_id]
        assert views.event_json(own) == views.event_json(fleet[edge_id])
        rendered = views.event_json(own)
        assert rendered["kind"] == "edge.connected" and rendered["edge_id"] == edge_id
        assert rendered["attributes"] == {"software_version": version}
        assert rendered["message"] == "connected"
    assert fleet["edge-a"].attributes["software_version"] is fleet["edge-b"].attributes["software_version"]


@given(st.lists(st.integers(0, 40), max_size=200), st.integers(1, 16))
def test_a_shared_values_table_is_bounded_and_hands_out_equal_values(keys: list[int], capacity: int) -> None:
    """A table keeps at most its capacity, and always hands out a value equal to the one given."""
    table = memory.SharedValues(capacity)
    for key in keys:
        value = (key, "x")
        assert table.shared(value, value) == value
        assert len(table) <= capacity


def _reference_counts(response: pb.EdgeStatusResponse) -> tuple[int, ...]:
    """The counts written plainly, field by field into the layout (the model)."""
    counts = [0] * COUNTS_LEN
    for node in response.nodes:
        counts[1] += 1
        counts[0] += 1 if node.connected else 0
        for p in node.providers:
            counts[2] += 1
            counts[STATUS_AT[STATUS_NAMES.get(p.status, "unavailable")]] += 1
            counts[HEALTH_AT[HEALTH_NAMES.get(p.health, "unknown")]] += 1
            for at, value in (
                (GENERAL_AT, p.capacity),
                (GENERAL_AT + 1, p.in_flight),
                (GENERAL_AT + 2, p.queued),
                (LONG_AT, p.long_context_capacity),
                (LONG_AT + 1, p.long_context_in_flight),
                (LONG_AT + 2, p.long_context_queued),
            ):
                counts[at] += value
    return tuple(counts)


#: Unknown fields a newer Edge might send: numbers this side does not know,
#: and a known number with another wire type (kept as unknown by the parser).
def _unknown_fields(*known_numbers_other_wire_type: bytes) -> st.SearchStrategy[bytes]:
    """Fields 100 and 101 (varint, bytes), and the given known fields sent with another wire type."""
    return st.lists(
        st.sampled_from([b"\xa0\x06\x05", b"\xaa\x06\x02hi", *known_numbers_other_wire_type]), max_size=2
    ).map(b"".join)


_uint32 = st.integers(0, 2**32 - 1)
_provider = st.tuples(
    st.integers(-2, 9),
    st.integers(-2, 9),
    st.lists(_uint32, min_size=6, max_size=6),
    # capacity (7) as bytes, status (4) as fixed32
    _unknown_fields(b"\x3a\x01\x07", b"\x25\x01\x00\x00\x00"),
)
# connected (2) as fixed32
_node = st.tuples(st.booleans(), st.lists(_provider, max_size=4), _unknown_fields(b"\x15\x01\x00\x00\x00"))


# nodes (3) as fixed32
@given(st.lists(_node, max_size=5), _unknown_fields(b"\x1d\x00\x00\x00\x00"))
def test_counts_are_the_plain_sums_on_any_snapshot(
    nodes: list[tuple[bool, list[tuple[int, int, list[int], bytes]], bytes]], unknown: bytes
) -> None:
    """:func:`response_counts` equals the plain field-by-field counts on any
    snapshot, unknown enum values and unknown fields included."""
    response = pb.EdgeStatusResponse(edge_id="e")
    for connected, providers, node_unknown in nodes:
        node = pb.EdgeNodeSnapshot(node_id="n", connected=connected)
        for status, health, numbers, provider_unknown in providers:
            provider = pb.ProviderSnapshot(provider_id="p", status=status, health=health)  # type: ignore[arg-type]  # the stubs want the enum types; these are their int values
            for name, value in zip(_COUNTERS, numbers, strict=True):
                setattr(provider, name, value)
            node.providers.add().MergeFromString(provider.SerializeToString() + provider_unknown)
        response.nodes.add().MergeFromString(node.SerializeToString() + node_unknown)
    response.MergeFromString(unknown)
    assert response_counts(response) == _reference_counts(response)
    kept = StatusSnapshot(response.SerializeToString(), 1.0, response_counts(response))
    assert response_counts(kept.parse()) == kept.counts


_COUNTERS = (
    "capacity",
    "in_flight",
    "queued",
    "long_context_capacity",
    "long_context_in_flight",
    "long_context_queued",
)


def test_an_operation_buffer_is_made_only_for_an_edge_that_runs_a_command() -> None:
    """Walking the fleet's operations or forgetting edges makes no buffer; the
    first operation makes one with the registry's limits, and it is listed."""
    registry = EdgeRegistry(Clock(), RegistryLimits(operations_per_edge=7, operation_bytes_per_edge=4096))
    for edge_id in ("edge-a", "edge-b"):
        registry.connect(edge_id, HeldEdgePeer(), _hello({}))
    assert registry.operations.fleet_operations() == []
    assert all(record.operations_kept is None for record in registry.edges())
    registry.operations.start_operation(OperationRecord("op-1", "edge-a", "node.drain", "n", {}, "", 1.0, 2.0))
    made = registry.get("edge-a").operations_kept
    assert made is not None and (made.capacity, made.byte_budget) == (7, 4096)
    assert registry.get("edge-b").operations_kept is None
    assert [op.operation_id for op in registry.operations.fleet_operations()] == ["op-1"]
    assert registry.disconnect("edge-b", registry.get("edge-b").token or 0, "gone")
    assert registry.get("edge-b").operations_kept is None and registry.get("edge-b").kept_bytes() > 0


def test_a_hello_with_a_large_catalog_is_not_shared() -> None:
    """A catalog larger than the catalog cache shares stays with its edges' own hellos
    (a shared hello would keep it after they are gone)."""
    registry = EdgeRegistry(Clock())
    catalog = tuple(pb.CommandSpec(name=f"command-{i}", description="d" * 1000) for i in range(20))
    assert sum(spec.ByteSize() for spec in catalog) > memory.SHARED_CATALOG_BYTES
    for edge_id in ("a", "b"):
        registry.connect(edge_id, HeldEdgePeer(), EdgeHello({"site": "lab"}, "1", "1.0", catalog))
    a, b = registry.get("a").hello, registry.get("b").hello
    assert a == b and a is not b and a.labels is b.labels


_SMALL_CATALOG = (pb.CommandSpec(name="node.drain"),)
_LARGE_CATALOG = tuple(pb.CommandSpec(name=f"command-{i}", description="d" * 1000) for i in range(20))
_LABEL_MAPS: tuple[dict[str, str], ...] = (
    {"site": "lab"},
    {"site": "lab", "region": "eu"},
    {},
    {f"key-{i}": "v" * 200 for i in range(8)},
)


@given(
    st.lists(
        st.tuples(
            st.sampled_from("abcdef"),
            st.sampled_from(range(len(_LABEL_MAPS))),
            st.sampled_from(("1", "2")),
            st.sampled_from(((), _SMALL_CATALOG, _LARGE_CATALOG)),
        ),
        max_size=30,
    )
)
def test_every_edge_keeps_what_it_said_and_equal_small_hellos_are_one(
    hellos: list[tuple[str, int, str, tuple[pb.CommandSpec, ...]]],
) -> None:
    """Whatever the order of enrollments (repeats found at once or built anew):
    each edge's kept hello equals what it said; edges that said the same with
    small labels and the same small catalog copy share one hello; a large
    catalog or label map is never in a shared hello."""
    registry = EdgeRegistry(Clock())
    said: dict[str, tuple[int, str, tuple[pb.CommandSpec, ...]]] = {}
    for edge_id, labels, version, commands in hellos:
        fresh = _hello(_LABEL_MAPS[labels], version)
        registry.connect(edge_id, HeldEdgePeer(), EdgeHello(fresh.labels, fresh.software_version, "1.0", commands))
        said[edge_id] = (labels, version, commands)
    for edge_id, (labels, version, commands) in said.items():
        kept = registry.get(edge_id).hello
        assert kept == EdgeHello(dict(_LABEL_MAPS[labels]), version, "1.0", commands)
        assert kept.commands is commands
        for other_id, other in said.items():
            shareable = labels < 3 and commands is not _LARGE_CATALOG
            if other == said[edge_id] and shareable:
                assert registry.get(other_id).hello is kept
            elif other_id != edge_id and not shareable:
                assert registry.get(other_id).hello is not kept
