"""Latency in the capacity history: the p95s of merged sketches, requests per second, null without requests.

A real registry, gateway and history service over a fake clock; the edges
are :class:`AnsweringEdgePeer` s whose providers carry ``ProviderLatency``
made from known durations (:class:`~twisted_iop.testing.latency.LatencyFeed`),
so every expected figure is the quantile of a sketch of those durations
(within the sketch's 2 % of the durations themselves). The fleet's and a
model's p95 must be that of every edge's sketches merged, never a mean of
their p95s; a rolled-up tier's max is the highest p95 sampled; a selector
takes its slowest edge's. Old chunks (written before the latency fields
existed) still read, in every store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import maybeDeferred

from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.history import tiers
from twisted_iop.controlplane.history.fields import (
    FLEET_FIELDS,
    LATENCY_FIELDS,
    MISSING,
    names,
)
from twisted_iop.controlplane.history.latency import Lanes, LatencyTotal, part_of
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.http.latency_views import LatencyFigures
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, HttpSettings, ListenerReadiness
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.store.settings import StoreSettings
from twisted_iop.controlplane.store.sqlite import SqliteStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.latency.sketch import LatencySketch, merged
from twisted_iop.testing.harness import contract_validator, eventually
from twisted_iop.testing.history import OLD_FLEET_WIDTH, HistoryFleet, column, write_old_chunks
from twisted_iop.testing.latency import LatencyFeed, latency_snapshot, sketch_of
from twisted_iop.testing.wires.peers import AnsweringEdgePeer, snapshot
from twisted_iop.wire import control_pb2 as pb

HELLO = EdgeHello({"site": "test"}, "1.0", "1.0", ())
START = 1_700_000_000.0
#: 1 s samples; 4 s and 20 s tiers (the edges' too).
SETTINGS = config_from_text(
    "history:\n  interval_seconds: 1\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 4, keep_hours: 2}\n  - {step_seconds: 20, keep_hours: 4}\n"
).history
LATENCY = names(LATENCY_FIELDS)


def p95(*durations: list[float]) -> float:
    """The p95 a view shows of these durations merged (the sketch's quantile, to a tenth of a millisecond)."""
    value = sketch_of(d for each in durations for d in each).quantile(0.95)
    assert value is not None
    return round(value * 10_000) / 10_000


def rate(requests: int, window: float = 60.0) -> float:
    """Requests per second as a view shows it (hundredths)."""
    return round(requests / window * 100) / 100


class Fleet(HistoryFleet):
    """The history over a store, with edges whose providers' latency the tests set."""

    def __init__(self, settings: HistorySettings = SETTINGS, store: Any = None) -> None:
        super().__init__(settings, START, store)

    def connect(self, edge_id: str, feeds: dict[str, LatencyFeed], models: tuple[str, ...] = ("llama-3-8b",)) -> None:
        """Enroll an edge with one provider per feed, each answer carrying the feeds' figures then."""
        self.enroll(edge_id, HELLO, lambda: latency_snapshot(edge_id, feeds, models))


def last(view: Any, name: str) -> Any:
    """A field's newest value in a view."""
    return column(view, name)[-1]


def feed(ttft: list[float], tpot: Optional[list[float]] = None) -> LatencyFeed:
    """A provider's figures: requests with these TTFTs (and TPOTs) ended in its window."""
    made = LatencyFeed()
    made.requests(ttft=ttft, tpot=tpot)
    return made


def test_an_edges_sample_holds_the_p95_of_its_providers_sketches_merged() -> None:
    """Two providers with known durations: the edge's point holds the p95 of both merged (TTFT and TPOT,
    to a tenth of a millisecond), and the requests that ended in the minute per second."""
    fast, slow = [0.1 + 0.001 * i for i in range(30)], [0.4 + 0.01 * i for i in range(10)]
    fleet = Fleet()
    fleet.connect("edge-a", {"p1": feed(fast, [0.02] * 30), "p2": feed(slow, [0.05] * 10)})
    fleet.seconds(2)
    edge = fleet.view("edge:edge-a", step="1")
    assert column(edge, "ttft_p95") == [p95(fast, slow)] * 2
    assert column(edge, "tpot_p95") == [p95([0.02] * 30, [0.05] * 10)] * 2
    assert column(edge, "requests_per_second") == [rate(40)] * 2
    # Within the sketch's 2 % of the durations' own p95 (rank 0.95 * 39 of the 40: the 38th, 0.47 s).
    assert abs(last(edge, "ttft_p95") - 0.47) <= 0.47 * 0.02
    model = fleet.view("edge:edge-a/model:llama-3-8b", step="1")
    assert last(model, "ttft_p95") == p95(fast, slow) and last(model, "requests_per_second") == rate(40)


def test_the_fleets_and_a_models_p95_are_of_every_edges_sketches_merged_not_a_mean_of_p95s() -> None:
    """96 fast requests on one edge and 4 slow ones on another: the fleet's p95 is fast (rank 94 of
    100), where the mean of the edges' p95s would be 0.55 s and their max 1 s."""
    fast, slow = [0.1] * 96, [1.0] * 4
    fleet = Fleet()
    fleet.connect("edge-a", {"p1": feed(fast)}, models=("llama-3-8b", "qwen-2-7b"))
    fleet.connect("edge-b", {"p1": feed(slow)})
    fleet.seconds(2)
    assert last(fleet.view("edge:edge-a", step="1"), "ttft_p95") == p95(fast)
    assert last(fleet.view("edge:edge-b", step="1"), "ttft_p95") == p95(slow)
    whole = fleet.view("fleet", step="1")
    assert column(whole, "ttft_p95") == [p95(fast, slow)] * 2
    assert p95(fast, slow) == p95(fast) < 0.5
    assert last(whole, "tpot_p95") == p95([0.01] * 96, [0.1] * 4)
    assert last(whole, "requests_per_second") == pytest.approx(rate(96) + rate(4))
    llama = fleet.view("model:llama-3-8b", step="1")
    assert last(llama, "ttft_p95") == p95(fast, slow) and last(llama, "requests_per_second") == rate(100)
    qwen = fleet.view("model:qwen-2-7b", step="1")  # served by edge-a only
    assert last(qwen, "ttft_p95") == p95(fast) and last(qwen, "requests_per_second") == rate(96)


def test_without_requests_a_p95_is_null_never_0() -> None:
    """An edge whose providers measured but saw no request end: p95s null, 0 requests a second; an
    edge with no figures at all (an older or unused Edge): every latency value null; a minute of
    whole answers only: a TPOT and duration but no TTFT."""
    fleet = Fleet()
    fleet.connect("idle", {"p1": LatencyFeed()})
    fleet.peers["quiet"] = AnsweringEdgePeer("quiet")
    fleet.answer("quiet", lambda: snapshot("quiet"))
    fleet.registry.connect("quiet", fleet.peers["quiet"], HELLO)
    fleet.seconds(2)
    idle = fleet.view("edge:idle", step="1")
    assert column(idle, "ttft_p95") == [None, None] and column(idle, "tpot_p95") == [None, None]
    assert column(idle, "requests_per_second") == [0, 0]
    quiet = fleet.view("edge:quiet", step="1")
    assert [column(quiet, name) for name in LATENCY] == [[None, None]] * 3
    whole = fleet.view("fleet", step="1")
    assert last(whole, "ttft_p95") is None and last(whole, "requests_per_second") == 0

    whole_answers = pb.ProviderLatency(window_seconds=60.0, requests_recent=6)
    whole_answers.duration_recent.CopyFrom(pb.LatencySketch(index=[10], count=[6], sum_seconds=9.0))

    def status() -> pb.EdgeStatusResponse:
        response = latency_snapshot("idle", {"p1": LatencyFeed()})
        response.nodes[0].providers[0].latency.CopyFrom(whole_answers)
        return response

    fleet.answer("idle", status)
    fleet.seconds(1)
    idle = fleet.view("edge:idle", step="1")
    assert last(idle, "ttft_p95") is None and last(idle, "requests_per_second") == rate(6)
    assert last(fleet.view("fleet", step="1"), "ttft_p95") is None


def test_the_fleets_p95_follows_edges_that_change_and_go() -> None:
    """An edge's figures changing and then the edge going take its old sketches out of the fleet's
    merge exactly: the fleet's p95 is then that of what is left."""
    fleet = Fleet()
    a, b = feed([0.2] * 20), feed([0.3] * 20)
    fleet.connect("edge-a", {"p1": a})
    fleet.connect("edge-b", {"p1": b})
    fleet.seconds(1)
    assert last(fleet.view("fleet", step="1"), "ttft_p95") == p95([0.2] * 20, [0.3] * 20)
    b.new_window()
    b.requests(ttft=[2.0] * 30)
    fleet.seconds(1)
    assert last(fleet.view("fleet", step="1"), "ttft_p95") == p95([0.2] * 20, [2.0] * 30)
    token = fleet.registry.get("edge-b").token
    assert token is not None
    fleet.registry.disconnect("edge-b", token, "test")
    fleet.seconds(1)
    whole = fleet.view("fleet", step="1")
    assert last(whole, "ttft_p95") == p95([0.2] * 20)
    assert last(whole, "requests_per_second") == rate(20)
    assert last(fleet.view("model:llama-3-8b", step="1"), "ttft_p95") == p95([0.2] * 20)


def test_a_rolled_up_p95_keeps_the_highest_sampled_and_a_selector_its_slowest_edge() -> None:
    """A 4 s point's max is the highest p95 of its samples (its mean their mean); adding edges up by
    a selector takes the highest of their p95s and adds their requests per second."""
    fleet = Fleet()
    a, b = feed([0.2] * 10), feed([0.5] * 10)
    fleet.connect("edge-a", {"p1": a})
    fleet.connect("edge-b", {"p1": b})
    sampled: list[float] = []
    for ttft in (0.2, 0.8, 0.3, 0.25, 0.4, 0.2, 0.2, 0.9):
        a.new_window()
        a.requests(ttft=[ttft] * 10)
        fleet.seconds(1)
        sampled.append(p95([ttft] * 10))
    rolled = fleet.view("edge:edge-a", step="4")
    assert rolled.rolled
    by_bucket: dict[int, list[float]] = {}
    for second, value in zip(range(1, 9), sampled, strict=True):
        by_bucket.setdefault((second // 4) * 4, []).append(value)
    expected = [(round(sum(v) / len(v), 4), max(v), v[-1]) for _, v in sorted(by_bucket.items())]
    assert [list(t) for t in column(rolled, "ttft_p95")] == [pytest.approx(list(t), abs=1e-6) for t in expected]
    selected: list[Any] = []
    queries = fleet.history.queries
    now = fleet.clock.seconds()
    members = ["edge:edge-a", "edge:edge-b"]
    queries.aggregate_view("fleet", members, FLEET_FIELDS, 0, now - 3, now).addCallback(selected.append)
    both = selected[0]
    assert last(both, "ttft_p95") == max(p95([0.9] * 10), p95([0.5] * 10))
    assert last(both, "requests_per_second") == pytest.approx(rate(10) + rate(10))
    queries.aggregate_view("fleet", members, FLEET_FIELDS, 1, now - 10, now).addCallback(selected.append)
    # The last 4 s step holds the sample at +8 s: edge-a's 0.9 s against edge-b's 0.5 s.
    assert column(selected[1], "ttft_p95")[-1][1] == max(sampled[-1], p95([0.5] * 10))


def test_a_latency_total_takes_back_exactly_what_it_was_given() -> None:
    """Merging parts and taking some back out equals merging the others alone (counts are integers)."""

    @given(st.lists(st.lists(st.floats(1e-4, 100.0), max_size=30), min_size=1, max_size=6), st.data())
    @settings(max_examples=80, deadline=None)
    def check(durations: list[list[float]], data: st.DataObject) -> None:
        parts = [part_of(_figures(d)) for d in durations]
        gone = data.draw(st.sets(st.integers(0, len(parts) - 1)))
        total = LatencyTotal()
        for part in parts:
            total.add(part)
        for index in gone:
            total.add(parts[index], -1)
        kept = [d for i, d in enumerate(durations) if i not in gone]
        alone = LatencyTotal()
        for d in kept:
            alone.add(part_of(_figures(d)))
        assert total.values() == alone.values()
        flat = [x for d in kept for x in d]
        expected = merged(sketch_of(d) for d in kept).quantile(0.95)
        assert total.values()[0] == (MISSING if expected is None else round(expected * 10_000))
        assert Lanes.of(sketch_of(flat)).sketch().buckets == sketch_of(flat).buckets

    check()


def _figures(durations: list[float]) -> LatencyFigures:
    """A provider's figures of these TTFTs (TPOT a tenth of each) over a minute."""
    return LatencyFigures(
        sketch_of(durations), sketch_of(d / 10 for d in durations), LatencySketch(), len(durations), 0, 60.0
    )


def test_points_of_an_older_narrower_form_gain_the_latency_fields_as_nobodys() -> None:
    """A sampled row or rolled-up point stored before the latency fields reads with them missing."""
    width = len(FLEET_FIELDS)
    assert tiers.fitted((1,) * OLD_FLEET_WIDTH, width, False) == (1,) * OLD_FLEET_WIDTH + (MISSING,) * 3
    point = tiers.as_rolled((2,) * OLD_FLEET_WIDTH)
    widened = tiers.fitted(point, width, True)
    assert len(widened) == tiers.rolled_width(width) and widened[: len(point)] == point
    assert tiers.field_parts(widened, width - 1) == (None, None, None)
    assert tiers.fitted((*widened, 5, 5, 5, 1), width, True) == widened  # a newer, wider one: cut
    assert tiers.roll_rolled([widened, tiers.as_rolled((3,) * width)])[0] == 2


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_chunks_written_before_the_latency_fields_still_read_and_new_ones_round_trip(
    backend: str, tmp_path: Path
) -> None:
    """A store holding chunks of the older, narrower form (the fleet's, a model's, an edge's segment,
    a rolled-up point) and a restarted Control Plane's new ones: a view over both shows the old points
    with their values and null latency, the new ones with their latency, read back from the store."""
    t_ms = int(START * 1000) - 10_000
    if backend == "memory":
        store: Any = MemoryStore()
        store.open()
    else:
        store = SqliteStore(StoreSettings(backend="sqlite", path=str(tmp_path / "cp.sqlite")), reactor)
        store.open()
        store.startService()
    write_old_chunks(store, t_ms, (SETTINGS.tiers[0], SETTINGS.tiers[1]), "edge-a", "llama-3-8b")
    if backend == "sqlite":  # the old chunks on disk, read by a new process
        await maybeDeferred(store.stopService)
        store = SqliteStore(StoreSettings(backend="sqlite", path=str(tmp_path / "cp.sqlite")), reactor)
        store.open()
    fleet = Fleet(store=store)
    fleet.connect("edge-a", {"p1": feed([0.25] * 12)})
    fleet.seconds(3)
    fleet.history.stopService()  # everything written: the views below read the store
    if backend == "sqlite":
        store.flush()
        await eventually(lambda: store.health().pending == 0, message="flushed")
    try:
        whole = await fleet.read("fleet", step="1")
        times = [t for t, _, _ in whole.points]
        assert times == [t_ms, t_ms + 1000, t_ms + 2000] + [int((START + s) * 1000) for s in (1, 2, 3)]
        assert column(whole, "capacity")[:3] == [5, 5, 5] and column(whole, "ttft_p95")[:3] == [None] * 3
        assert column(whole, "ttft_p95")[3:] == [p95([0.25] * 12)] * 3
        assert column(whole, "requests_per_second") == [None] * 3 + [rate(12)] * 3
        rolled = await fleet.read("fleet", step="4")
        assert column(rolled, "capacity")[0] == (5, 5, 5) and column(rolled, "ttft_p95")[0] == (None, None, None)
        assert column(rolled, "ttft_p95")[-1][1] == p95([0.25] * 12)
        model = await fleet.read("model:llama-3-8b", step="1")
        assert column(model, "providers")[0] == 2 and column(model, "ttft_p95")[0] is None
        assert column(model, "ttft_p95")[-1] == p95([0.25] * 12)
        edge = await fleet.read("edge:edge-a", step="1")
        assert column(edge, "capacity")[:2] == [7, 7] and column(edge, "tpot_p95")[:2] == [None, None]
        assert column(edge, "tpot_p95")[-1] == p95([0.025] * 12)
        assert fleet.history.queries.unreadable == 0
    finally:
        if backend == "sqlite":
            await maybeDeferred(store.stopService)


@pytest_twisted.ensureDeferred
async def test_the_history_routes_show_the_latency_series() -> None:
    """Through the Control Plane's Klein app: the fleet's, an edge's, a model's and a selector's
    latency series, in seconds and null where no request ended, as the document says."""
    fleet = Fleet()
    fleet.connect("edge-a", {"p1": feed([0.3] * 20, [0.03] * 20)})
    fleet.connect("edge-b", {"p1": LatencyFeed()})
    fleet.seconds(3)
    http = ControlPlaneHttp(
        fleet.registry,
        fleet.gateway,
        fleet.clock,
        ListenerReadiness([]),
        HttpSettings(),
        history=fleet.history,
    )
    stub: Any = StubTreq(http.app.resource())
    validator = contract_validator("HistoryView")

    async def get(path: str) -> Any:
        response = await stub.get("http://cp" + path)
        body = json.loads(await response.content())
        assert response.code == 200, body
        validator.validate(body)
        return body

    series = "series=ttft_p95,tpot_p95,requests_per_second"
    whole = await get(f"/fleet/history?from=-1m&step=1&{series}")
    assert whole["columns"] == ["t", *LATENCY]
    assert whole["points"][-1][1:] == [p95([0.3] * 20), p95([0.03] * 20), rate(20)]
    idle = await get(f"/edges/edge-b/history?from=-1m&step=1&{series}")
    assert idle["points"][-1][1:] == [None, None, 0]
    model = await get(f"/edges/edge-a/history?from=-1m&step=1&model=llama-3-8b&{series}")
    assert model["series"] == "edge:edge-a/model:llama-3-8b" and model["points"][-1][1] == p95([0.3] * 20)
    chosen = await get(f"/fleet/history?from=-1m&step=1&selector=site%3Dtest&{series}")
    assert chosen["edges"] == 2 and chosen["points"][-1][1:] == [p95([0.3] * 20), p95([0.03] * 20), rate(20)]
    rolled = await get("/fleet/history?from=-1m&step=4&series=ttft_p95")
    assert rolled["columns"] == ["t", "count", "ttft_p95.mean", "ttft_p95.max", "ttft_p95.last"]
    assert rolled["points"][-1][3] == p95([0.3] * 20)
    response = await stub.get("http://cp/fleet/history?series=ttft_p99")
    assert response.code == 400 and json.loads(await response.content())["error"]["code"] == "invalid_series"
