"""GET /edges/{id} renders from pieces kept per enrollment: the same bytes as
the plain rendering, whatever the edge said and whatever happened since."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.controlplane import json_views as views
from twisted_iop.controlplane.edge_hello import EdgeHello
from twisted_iop.controlplane.registry import EdgeRegistry
from twisted_iop.controlplane.snapshots import checked_snapshot
from twisted_iop.testing.peers import HeldEdgePeer
from twisted_iop.wire import control_pb2 as pb

texts = st.text(max_size=20)


def plain(record: object) -> bytes:
    """The rendering the view answered before: edge_detail through json.dumps (compact)."""
    return json.dumps(views.edge_detail(record), separators=(",", ":")).encode("utf-8")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(
    labels=st.dictionaries(texts, texts, max_size=4),
    software=texts,
    protocol=texts,
    commands=st.lists(st.from_regex(r"[a-z]{1,8}\.[a-z]{1,8}", fullmatch=True), max_size=3),
    start=st.floats(min_value=0, max_value=4e9, allow_nan=False),
    events=st.integers(0, 5),
    snapshot_at=st.one_of(st.none(), st.floats(min_value=1, max_value=4e9, allow_nan=False)),
    disconnected=st.booleans(),
)
def test_edge_detail_json_is_edge_detail_dumped(
    labels: dict[str, str],
    software: str,
    protocol: str,
    commands: list[str],
    start: float,
    events: int,
    snapshot_at: float | None,
    disconnected: bool,
) -> None:
    """For any hello, times, event count, snapshot and connection state, the
    kept-pieces rendering is byte for byte the plain one."""
    clock = Clock()
    clock.advance(start)
    registry = EdgeRegistry(clock)
    catalog = tuple(pb.CommandSpec(name=name) for name in commands)
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello(labels, software, protocol, catalog))
    record = registry.get("edge-1")
    for i in range(events):
        registry.record("edge-1", "node.note", message=f"n{i}")
    if snapshot_at is not None:
        record.snapshot = checked_snapshot(pb.EdgeStatusResponse(edge_id="edge-1"), snapshot_at)
    clock.advance(1.25)
    if disconnected:
        assert record.token is not None
        registry.disconnect("edge-1", record.token, "gone")
    assert views.edge_detail_json(record) == plain(record)


def test_a_new_enrollment_renders_its_new_hello() -> None:
    """The kept pieces follow the edge's current hello: a re-enrollment with new labels shows them."""
    registry = EdgeRegistry(Clock())
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello({"site": "a"}, "1", "1.0", ()))
    record = registry.get("edge-1")
    assert json.loads(views.edge_detail_json(record))["labels"] == {"site": "a"}
    registry.connect("edge-1", HeldEdgePeer(), EdgeHello({"site": "b"}, "2", "1.0", ()))
    record = registry.get("edge-1")
    assert json.loads(views.edge_detail_json(record))["labels"] == {"site": "b"}
    assert views.edge_detail_json(record) == plain(record)


def test_kept_pieces_are_bounded() -> None:
    """Rendering more edges than HELLO_JSON_KEPT keeps at most that many pieces, all still correct."""
    registry = EdgeRegistry(Clock())
    hello = EdgeHello({"site": "a"}, "1", "1.0", ())
    count = views.HELLO_JSON_KEPT + 10
    for i in range(count):
        registry.connect(f"edge-{i}", HeldEdgePeer(), hello)
        views.edge_detail_json(registry.get(f"edge-{i}"))
    assert len(views._hello_json) <= views.HELLO_JSON_KEPT
    first = registry.get("edge-0")
    assert views.edge_detail_json(first) == plain(first)
