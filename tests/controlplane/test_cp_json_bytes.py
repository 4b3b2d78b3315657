"""The views written as bytes (``json_bytes``) are byte for byte the compact
JSON of the plain dict renderings (``testing.json_reference``), whatever the
edges said and whatever happened since; and what the renderer keeps stays
within its bounds and goes with what it renders."""

from __future__ import annotations

import gc
import json
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot, checked_snapshot
from twisted_iop.controlplane.http import json_bytes, json_templates
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.http.json_templates import Keep, Member, Template
from twisted_iop.controlplane.http.json_views import counts_json, iso
from twisted_iop.controlplane.requests.fleet_rounds import FleetRound, StatusRow
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing import json_reference as reference
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status, snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import response_counts

texts = st.text(max_size=20)


def _hello(labels: dict[str, str], version: str = "1.2.3") -> EdgeHello:
    """A hello with fresh copies of ``labels``' texts (as each wire read makes them)."""
    fresh = {"".join(list(key)): "".join(list(value)) for key, value in labels.items()}
    return EdgeHello(labels=fresh, software_version="".join(list(version)), protocol_version="1.0", commands=())


@settings(max_examples=80, deadline=None)
@given(
    labels=st.dictionaries(texts, texts, max_size=4),
    software=texts,
    protocol=texts,
    commands=st.lists(st.from_regex(r"[a-z%]{1,8}\.[a-z]{1,8}", fullmatch=True), max_size=3),
    start=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    events=st.integers(0, 5),
    operations=st.integers(0, 3),
    snapshot_at=st.one_of(st.none(), st.floats(min_value=1, max_value=4e9, allow_nan=False)),
    disconnected=st.booleans(),
)
def test_edge_detail_is_the_reference_dumped(
    labels: dict[str, str],
    software: str,
    protocol: str,
    commands: list[str],
    start: float,
    events: int,
    operations: int,
    snapshot_at: float | None,
    disconnected: bool,
) -> None:
    """For any hello (``%``, quotes and non-ASCII texts included), times, events,
    operations, snapshot and connection state, GET /edges/{id} is byte for
    byte the reference rendering, from a new template and from a kept one."""
    clock = Clock()
    clock.advance(start)
    registry = EdgeRegistry(clock)
    catalog = tuple(pb.CommandSpec(name=name) for name in commands)
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello(labels, software, protocol, catalog))
    record = registry.get("edge-1")
    renderer = JsonBytesRenderer()
    assert renderer.edge_detail(record) == reference.compact(reference.edge_detail(record))
    for i in range(events):
        registry.record("edge-1", "node.note", message=f"n{i}")
    for i in range(operations):
        registry.operations.start_operation(
            OperationRecord(f"op-{i}", "edge-1", "node.drain", "n", {}, "", start, start + 5)
        )
    if snapshot_at is not None:
        record.snapshot = checked_snapshot(pb.EdgeStatusResponse(edge_id="edge-1"), snapshot_at)
    clock.advance(1.25)
    if disconnected:
        assert record.token is not None
        registry.disconnect("edge-1", record.token, "gone")
    assert renderer.edge_detail(record) == reference.compact(reference.edge_detail(record))


def test_a_new_enrollment_renders_its_new_hello() -> None:
    """An edge's kept template follows its current hello: a re-enrollment with new labels shows them."""
    registry = EdgeRegistry(Clock())
    renderer = JsonBytesRenderer()
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello({"site": "a"}, "1", "1.0", ()))
    assert json.loads(renderer.edge_detail(registry.get("edge-1")))["labels"] == {"site": "a"}
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello({"site": "b"}, "2", "1.0", ()))
    record = registry.get("edge-1")
    assert json.loads(renderer.edge_detail(record))["labels"] == {"site": "b"}
    assert renderer.edge_detail(record) == reference.compact(reference.edge_detail(record))
    assert renderer.kept()["edge_templates"].entries == 1


def test_edge_templates_are_bounded() -> None:
    """Rendering more edges than EDGE_TEMPLATES_KEPT keeps at most that many
    templates, within their byte budget, and every rendering stays right."""
    registry = EdgeRegistry(Clock())
    renderer = JsonBytesRenderer()
    hello = EdgeHello({"site": "a"}, "1", "1.0", ())
    for i in range(json_bytes.EDGE_TEMPLATES_KEPT + 10):
        registry.connect(f"edge-{i}", HeldEdgePeer(), hello)
        renderer.edge_detail(registry.get(f"edge-{i}"))
    kept = renderer.kept()["edge_templates"]
    assert kept.entries == json_bytes.EDGE_TEMPLATES_KEPT
    assert 0 < kept.bytes <= json_bytes.EDGE_TEMPLATES_BYTES
    first = registry.get("edge-0")
    assert renderer.edge_detail(first) == reference.compact(reference.edge_detail(first))


def test_an_edge_template_goes_with_its_record() -> None:
    """When the registry forgets an edge, the renderer keeps nothing of it."""
    registry = EdgeRegistry(Clock(), RegistryLimits(disconnected_edges=0))
    renderer = JsonBytesRenderer()
    token = registry.connect("edge-1", HeldEdgePeer(), _hello({"site": "a"}))
    renderer.edge_detail(registry.get("edge-1"))
    assert renderer.kept()["edge_templates"].entries == 1
    assert registry.disconnect("edge-1", token, "gone")
    assert registry.find("edge-1") is None
    gc.collect()
    assert renderer.kept()["edge_templates"] == json_templates.Kept(0, 0)


_row_specs = st.lists(
    st.tuples(
        texts,  # edge id (made unique below)
        st.dictionaries(texts, texts, max_size=3),  # labels
        st.sampled_from(["ok", "timeout", "error", "disconnected"]),
        st.booleans(),  # connected
        st.booleans(),  # has a snapshot
        st.integers(1, 3),  # nodes
        st.integers(0, 2**40),  # capacity
        texts,  # error message
    ),
    max_size=12,
)


def _round(
    specs: list[tuple[str, dict[str, str], str, bool, bool, int, int, str]], now: float
) -> tuple[EdgeRegistry, FleetRound]:
    """A registry and a finished fleet round with a row for each spec."""
    clock = Clock()
    clock.advance(now)
    registry = EdgeRegistry(clock)
    rows = []
    for i, (name, labels, state, connected, has_snapshot, nodes, capacity, message) in enumerate(specs):
        edge_id = f"{name}-{i:02d}"
        token = registry.connect(edge_id, HeldEdgePeer(), _hello(labels))
        response = snapshot(edge_id, nodes=nodes, capacity=min(capacity, 2**32 - 1))
        kept = keep_status(registry, edge_id, token, response) if has_snapshot else None
        code = {"timeout": "edge_timeout", "error": "edge_error"}.get(state, "")
        rows.append(StatusRow(registry.get(edge_id), state, kept, connected, code, message if code else ""))
    rows.sort(key=lambda row: row.record.edge_id)
    return registry, FleetRound(now - 0.25, now, rows, [row.record.edge_id for row in rows])


@given(_row_specs, st.integers(1, 15), st.integers(0, 12), st.floats(1.0, 2e9))
def test_the_fleet_page_is_the_reference_dumped(
    specs: list[tuple[str, dict[str, str], str, bool, bool, int, int, str]], limit: int, skip: int, now: float
) -> None:
    """A fleet page is byte for byte the compact JSON of the reference page
    (any texts, states, counts, pages and cursors), again from the kept
    texts and totals, and its totals are the fresh rows' counts summed."""
    _, round_ = _round(specs, now)
    rows = round_.rows
    cursor = rows[skip - 1].record.edge_id if 0 < skip <= len(rows) else ""
    expected = reference.compact(reference.fleet_status_json(round_, cursor, limit, now))
    renderer = JsonBytesRenderer()
    assert renderer.fleet_page(round_, cursor, limit, now) == expected
    assert renderer.fleet_page(round_, cursor, limit, now) == expected
    totals = [0] * len(response_counts(snapshot("x")))
    for row in rows:
        if row.state == "ok" and row.snapshot is not None:
            totals = [a + b for a, b in zip(totals, row.snapshot.counts, strict=True)]
    page = json.loads(expected)
    assert {k: v for k, v in page["totals"].items() if not k.startswith("edges_")} == counts_json(totals)


def test_a_new_hello_shows_in_the_next_page_of_a_round() -> None:
    """A page shows each edge's labels as they are when it is written, even
    within a round whose earlier page showed the old ones."""
    registry, round_ = _round(
        [("a", {"site": "lab"}, "ok", True, True, 1, 4, ""), ("b", {}, "ok", True, True, 1, 4, "")], 5.0
    )
    renderer = JsonBytesRenderer()
    assert json.loads(renderer.fleet_page(round_, "", 10, 5.0))["items"][0]["labels"] == {"site": "lab"}
    registry.connect("a-00", HeldEdgePeer(), _hello({"site": "moved"}))
    page = renderer.fleet_page(round_, "", 10, 5.0)
    assert json.loads(page)["items"][0]["labels"] == {"site": "moved"}
    assert page == reference.compact(reference.fleet_status_json(round_, "", 10, 5.0))


def test_the_fleet_page_keeps_few_and_short_fragments() -> None:
    """However many distinct label maps a fleet has, the renderer keeps at
    most FRAGMENTS_KEPT of their texts, none longer than FRAGMENT_MAX_BYTES,
    and every page stays right."""
    registry = EdgeRegistry(Clock())
    rows = []
    for i in range(json_templates.FRAGMENTS_KEPT * 2):
        labels = {"edge": f"e{i}"} if i % 10 else {f"key-{k}": "v" * 200 for k in range(8)}
        registry.connect(f"edge-{i:05d}", HeldEdgePeer(), _hello(labels))
        rows.append(StatusRow(registry.get(f"edge-{i:05d}"), "disconnected", None, False))
    round_ = FleetRound(1.0, 1.0, rows, [row.record.edge_id for row in rows])
    renderer = JsonBytesRenderer()
    body = renderer.fleet_page(round_, "", len(rows), 1.0)
    assert body == reference.compact(reference.fleet_status_json(round_, "", len(rows), 1.0))
    kept = renderer.kept()["fleet_label_maps"]
    assert kept.entries == json_templates.FRAGMENTS_KEPT
    assert kept.bytes <= json_templates.FRAGMENTS_KEPT * json_templates.FRAGMENT_MAX_BYTES
    assert renderer.kept()["fleet_counts"].entries == 1


def test_round_totals_are_kept_per_round_and_bounded() -> None:
    """Each round's totals are kept while the round lives, for at most
    ROUNDS_KEPT rounds, and go with their round."""
    renderer = JsonBytesRenderer()
    rounds = []
    for i in range(json_bytes.ROUNDS_KEPT + 2):
        _, round_ = _round([("a", {}, "ok", True, True, 1, i, "")], 10.0 + i)
        renderer.fleet_page(round_, "", 10, 10.0 + i)
        rounds.append(round_)
        assert renderer.kept()["round_totals"].entries == min(i + 1, json_bytes.ROUNDS_KEPT)
    del rounds, round_
    gc.collect()
    assert renderer.kept()["round_totals"] == json_templates.Kept(0, 0)


def test_a_status_view_is_the_reference_and_kept_once_per_snapshot() -> None:
    """GET /edges/{id}/status (fresh or stale) says what the reference says;
    a snapshot's members are rendered once for all its views, and go with
    the snapshot when a newer one replaces it."""
    registry = EdgeRegistry(Clock())
    token = registry.connect("edge-1", HeldEdgePeer(), _hello({"site": "a"}))
    response = snapshot("edge-1", nodes=3)
    response.nodes[1].labels["rack"] = "r7"
    response.nodes[2].providers[0].health_reason = "warming up"
    kept = keep_status(registry, "edge-1", token, response)
    assert kept is not None
    record = registry.get("edge-1")
    renderer = JsonBytesRenderer()
    for stale in (False, True, False):
        expected = reference.compact(reference.snapshot_json(record, kept, stale))
        assert renderer.edge_status(record, kept, stale) == expected
        assert renderer.edge_status_json(record, kept, stale) == reference.snapshot_json(record, kept, stale)
    assert renderer.kept()["snapshot_members"].entries == 1
    assert keep_status(registry, "edge-1", token, snapshot("edge-1", nodes=1)) is not None
    newer = record.snapshot
    assert newer is not None
    assert renderer.edge_status(record, newer, False) == reference.compact(
        reference.snapshot_json(record, newer, False)
    )
    assert renderer.kept()["snapshot_members"].entries == 2
    del kept
    gc.collect()
    assert renderer.kept()["snapshot_members"].entries == 1


_uint32 = st.integers(0, 2**32 - 1)
_engines = st.builds(
    pb.EngineLoad,
    known=st.booleans(),
    running=_uint32,
    waiting=_uint32,
    kv_cache_usage=st.floats(),
    parallel=_uint32,
    age_ms=_uint32,
)
_providers = st.builds(
    pb.ProviderSnapshot,
    provider_id=texts,
    kind=texts,
    models=st.lists(texts, max_size=3),
    status=st.integers(0, 6),
    health=st.integers(0, 7),
    health_reason=texts,
    capacity=_uint32,
    in_flight=_uint32,
    queued=_uint32,
    long_context_capacity=_uint32,
    long_context_in_flight=_uint32,
    long_context_queued=_uint32,
    engine=_engines,
    tokens_per_second=st.floats(),
    prompt_tokens=st.integers(0, 2**64 - 1),
    completion_tokens=st.integers(0, 2**64 - 1),
    saturated=st.booleans(),
    cooling_down=st.booleans(),
)
_nodes = st.builds(
    pb.EdgeNodeSnapshot,
    node_id=texts,
    connected=st.booleans(),
    drained=st.booleans(),
    connected_since_ms=st.integers(-(2**63), 2**63 - 1),
    last_seen_ms=st.integers(-(2**63), 2**63 - 1),
    labels=st.dictionaries(texts, texts, max_size=3),
    providers=st.lists(_providers, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(_nodes, max_size=3), generated_at_ms=st.integers(-(2**63), 2**63 - 1), stale=st.booleans())
def test_any_status_view_is_the_reference_dumped(
    nodes: list[pb.EdgeNodeSnapshot], generated_at_ms: int, stale: bool
) -> None:
    """Whatever nodes and providers a snapshot holds (any texts, codes, times,
    counts and engine figures), its status view is byte for byte the compact
    JSON of the reference."""
    registry = EdgeRegistry(Clock())
    token = registry.connect("edge-1", HeldEdgePeer(), _hello({"site": "a"}))
    response = pb.EdgeStatusResponse(edge_id="edge-1", generated_at_ms=generated_at_ms, nodes=nodes)
    kept = keep_status(registry, "edge-1", token, response)
    assert kept is not None
    record = registry.get("edge-1")
    body = JsonBytesRenderer().edge_status(record, kept, stale)
    assert body == reference.compact(reference.snapshot_json(record, kept, stale))


class _Point(NamedTuple):
    x: int
    y: int


class _Item(NamedTuple):
    point: _Point
    n: int
    text: str


_POINT = (Member("x", "x", json_templates.write_int), Member("y", "y", json_templates.write_int))


@given(st.lists(st.tuples(st.integers(-(2**40), 2**40), st.integers(0, 9), texts), max_size=8))
def test_a_declaration_writes_what_it_declares(values: list[tuple[int, int, str]]) -> None:
    """A compiled declaration writes its members in order: nested objects,
    members spliced in, per-value members kept by value, one subject or many."""
    members = (
        Member("point", "point", _POINT),
        Member("text", "text", json_templates.write_text),
        Member("shared", lambda item: (item.n,), lambda key: b'{"n":%d}' % key[0], Keep.PER_VALUE),
        Member(None, "n", lambda n: b'"after":%d' % n),
    )
    template = Template("TEST", members)
    items = [_Item(_Point(x, n), n, text) for x, n, text in values]
    expected = [
        {"point": {"x": item.point.x, "y": item.point.y}, "text": item.text, "shared": {"n": item.n}, "after": item.n}
        for item in items
    ]
    assert [json.loads(template.render(item)) for item in items] == expected
    assert [json.loads(text) for text in template.render_all(items)] == expected


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@given(
    st.one_of(
        st.tuples(st.just(json_templates.write_int), st.integers()),
        st.tuples(st.just(json_templates.write_bool), st.one_of(st.booleans(), st.none(), st.integers())),
        st.tuples(st.just(json_templates.write_present), st.one_of(st.none(), st.integers(), texts)),
        st.tuples(st.just(json_templates.write_text), texts),
        st.tuples(st.just(json_templates.write_json), _json_values),
        st.tuples(
            st.just(json_templates.write_time),
            st.one_of(st.none(), st.floats(-1.0, 3e11, allow_nan=False)),
        ),
        st.tuples(
            st.just(json_templates.write_received_at),
            st.one_of(st.none(), st.floats(-1.0, 3e11, allow_nan=False).map(lambda at: StatusSnapshot(b"", at, ()))),
        ),
    )
)
def test_a_compiled_view_writes_what_its_writers_write(case: tuple[json_templates.Writer, object]) -> None:
    """Each writer a compiled view writes in place writes there what calling
    it writes, and what json.dumps writes of the value it stands for."""
    write, value = case
    template = Template("ONE", (Member("v", None, write),))
    assert template.render(value) == b'{"v":' + write(value) + b"}"
    assert template.render_all([value]) == [template.render(value)]
    plain: object = value
    if write is json_templates.write_bool or write is json_templates.write_present:
        plain = bool(value) if write is json_templates.write_bool else value is not None
    elif write is json_templates.write_time:
        plain = None if value is None else iso(value)  # type: ignore[arg-type]  # write_time's values are times
    elif write is json_templates.write_received_at:
        plain = None if value is None else iso(value.received_at)  # type: ignore[attr-defined]  # write_received_at's values are events
    assert json.loads(write(value)) == plain
    assert write(value) == reference.compact(plain)


def test_a_read_must_be_an_attribute_path() -> None:
    """A dotted read that is not an attribute path is refused when the view is compiled."""
    with pytest.raises(ValueError, match="not an attribute path"):
        Template("BAD", (Member("x", "a.import", json_templates.write_int),))
