"""The history service with plain calls: a real registry and gateway, a fake clock, the memory store.

Edges are :class:`AnsweringEdgePeer` s whose snapshots the tests change
between samples; time moves with ``Clock.advance``. Views are read through
:class:`HistoryQueries`, as the routes read them.
"""

from __future__ import annotations

from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.history.frames import store_key
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.store.memory import MemoryHistory, MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.history import HistoryFleet, column
from twisted_iop.testing.wires.peers import AnsweringEdgePeer, set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb

HELLO = EdgeHello({"site": "test"}, "1.0", "1.0", ())
START = 1_700_000_000.0
#: 1 s samples; 4 s and 20 s tiers.
SETTINGS = config_from_text(
    "history:\n  interval_seconds: 1\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 4, keep_hours: 2}\n  - {step_seconds: 20, keep_hours: 4}\n"
).history


class Fleet(HistoryFleet):
    """The history over the memory store, with edges whose providers' work the tests change."""

    def __init__(self, settings: HistorySettings = SETTINGS, store: MemoryStore | None = None) -> None:
        super().__init__(settings, START, store)

    def connect(self, edge_id: str, in_flight: int = 1) -> AnsweringEdgePeer:
        """Enroll an edge whose providers each have ``in_flight`` requests."""
        peer = self.enroll(edge_id, HELLO, lambda: snapshot(edge_id))
        self.set_in_flight(edge_id, in_flight)
        return peer

    def set_in_flight(self, edge_id: str, in_flight: int, engine: bool = False) -> None:
        """The edge's next snapshots say ``in_flight`` on each of its two providers."""

        def status() -> pb.EdgeStatusResponse:
            response = snapshot(edge_id)
            for node in response.nodes:
                node.providers[0].in_flight = in_flight
                if engine:
                    set_engine(node.providers[0], running=in_flight, waiting=0, kv_cache_usage=0.5)
            return response

        self.peers[edge_id].status = status


def test_each_interval_samples_the_edges_the_models_and_the_fleet() -> None:
    """Every second a point per edge, per edge model, per model and for the fleet, with the real figures."""
    fleet = Fleet()
    fleet.connect("edge-a", in_flight=1)
    fleet.connect("edge-b", in_flight=3)
    fleet.seconds(3)
    assert fleet.history.samples == 3
    assert fleet.history.rounds_started == 3  # nobody else asked for a round
    a = fleet.view("edge:edge-a", step="1")
    assert column(a, "in_flight") == [2, 2, 2] and column(a, "capacity") == [8, 8, 8]
    assert column(a, "edges_connected") == [1, 1, 1]
    assert column(a, "engine_running") == [None, None, None]  # no engine said anything: null, not 0
    whole = fleet.view("fleet", step="1")
    assert column(whole, "in_flight") == [8, 8, 8] and column(whole, "edges_connected") == [2, 2, 2]
    assert [t for t, _, _ in whole.points] == [int((START + s) * 1000) for s in (1, 2, 3)]
    model = fleet.view("model:llama-3-8b", step="1")
    assert column(model, "in_flight") == [8, 8, 8] and column(model, "providers") == [4, 4, 4]
    assert column(fleet.view("edge:edge-b/model:llama-3-8b", step="1"), "in_flight") == [6, 6, 6]


def test_a_round_that_ran_anyway_is_sampled_without_a_new_one() -> None:
    """When a fleet round ended within the interval, the sample reads it and starts none."""
    fleet = Fleet()
    fleet.connect("edge-a")
    fleet.clock.advance(0.5)
    fleet.gateway.fleet_status()
    fleet.clock.advance(0.5)
    assert fleet.history.samples == 1 and fleet.history.rounds_started == 0


def test_rolled_up_tiers_hold_mean_max_and_last_and_the_bucket_in_progress() -> None:
    """4 s points are the mean, max and last of their 1 s points; the open bucket shows as a partial point."""
    fleet = Fleet()
    fleet.connect("edge-a", in_flight=0)
    values = [1, 5, 2, 4, 3, 3, 0, 6, 2]
    for value in values:
        fleet.set_in_flight("edge-a", value)
        fleet.seconds(1)
    view = fleet.view("edge:edge-a", step="4")
    assert view.rolled
    # Samples at START+1 .. START+9; 4 s buckets start at multiples of 4 s (START is one).
    by_bucket: dict[int, list[int]] = {}
    for second, value in zip(range(1, 10), values, strict=True):
        by_bucket.setdefault((second // 4) * 4, []).append(value * 2)
    expected = [(round(sum(v) / len(v), 3), max(v), v[-1]) for _, v in sorted(by_bucket.items())]
    assert column(view, "in_flight") == expected
    assert [count for _, count, _ in view.points] == [len(v) for _, v in sorted(by_bucket.items())]


def test_history_survives_a_restart_through_the_store() -> None:
    """A new service on the same store reads the old points back; a bucket split by the restart is combined."""
    store = MemoryStore()
    first = Fleet(store=store)
    first.connect("edge-a", in_flight=2)
    first.seconds(6)
    first.history.stopService()
    second = Fleet(store=store)
    second.clock.advance(6)  # the same moment as the first one's clock
    second.connect("edge-a", in_flight=4)
    second.seconds(2)
    sampled = second.view("edge:edge-a", step="1")
    assert column(sampled, "in_flight") == [4] * 6 + [8, 8]
    rolled = second.view("edge:edge-a", step="4")
    # Samples at 1..6 then 7, 8: buckets [0,4) = 1,2,3; [4,8) = 4,5,6 (first) + 7 (second); [8,12) = 8.
    assert [count for _, count, _ in rolled.points] == [3, 4, 1]
    assert column(rolled, "in_flight")[1] == ((4 * 3 + 8) / 4, 8, 8)


def test_max_series_bounds_what_is_sampled_and_counts_the_rest() -> None:
    """Beyond max_series, new series are not started; the refusals are counted (and logged once)."""
    settings = HistorySettings(interval_seconds=SETTINGS.interval_seconds, tiers=SETTINGS.tiers, max_series=4)
    fleet = Fleet(settings)
    fleet.connect("edge-a")
    fleet.connect("edge-b")
    fleet.seconds(2)
    assert fleet.history.series_kept == 4
    assert fleet.history.series_refused > 0


def test_a_disconnected_edge_leaves_a_gap_and_its_series_is_closed() -> None:
    """An edge gone stops getting points; after a few intervals its series is written closed and forgotten."""
    fleet = Fleet()
    peer = fleet.connect("edge-a")
    fleet.connect("edge-b")
    fleet.seconds(2)
    token = fleet.registry.get("edge-a").token
    assert token is not None
    fleet.registry.disconnect("edge-a", token, "test")
    fleet.seconds(8)
    assert not fleet.history.keeps("edge:edge-a") and fleet.history.keeps("edge:edge-b")
    assert not fleet.history.keeps("edge:edge-a/model:llama-3-8b")
    assert len(fleet.view("edge:edge-a", step="1").points) == 2
    assert column(fleet.view("fleet", step="1"), "edges_connected")[-1] == 1
    assert peer.disconnects == []


def test_engine_figures_and_the_parse_budget() -> None:
    """Engine figures come from parsed snapshots; over the budget an edge keeps its last breakdown."""
    settings = HistorySettings(interval_seconds=SETTINGS.interval_seconds, tiers=SETTINGS.tiers, parse_budget=1)
    fleet = Fleet(settings)
    fleet.connect("edge-a")
    fleet.connect("edge-b")
    fleet.set_in_flight("edge-a", 2, engine=True)
    fleet.set_in_flight("edge-b", 3, engine=True)
    fleet.seconds(3)
    whole = fleet.view("fleet", step="1")
    running = column(whole, "engine_running")
    # One parse per sample: the first sample knows one edge's engines, the next both.
    assert running[0] in (4, 6) and running[-1] == 10
    assert column(whole, "kv_cache_usage")[-1] == 0.5
    assert fleet.history.breakdowns.deferred >= 1


def test_expiry_asks_the_store_to_forget_each_tier_past_its_keep() -> None:
    """The chunks of an edge gone for longer than every tier keeps are forgotten by the store."""
    fleet = Fleet()
    fleet.connect("edge-a")
    fleet.connect("edge-b")
    fleet.seconds(5)
    token = fleet.registry.get("edge-a").token
    assert token is not None
    fleet.registry.disconnect("edge-a", token, "test")
    fleet.seconds(8)
    segment = fleet.history.edges.edges.of("edge-a")
    keys = [store_key(tier) for tier in fleet.history.settings.edge_tiers]
    assert all(fleet.store.history.read([segment.series], key, 0, START + 1000) for key in keys)
    steps = [str(tier.step_seconds) for tier in fleet.history.settings.edge_tiers]
    assert all(fleet.view("edge:edge-a", step=step, span="-6h").points for step in steps)
    fleet.clock.advance(5 * 3600)  # past every tier's keep
    fleet.seconds(1)
    assert not any(fleet.view("edge:edge-a", step=step, span="-6h").points for step in steps)
    assert not any(
        fleet.store.history.read(["fleet"], tier.key, 0, START + 1000) for tier in fleet.history.settings.tiers
    )
    # edge-b's new point is in its open chunk (written to the store every few points).
    assert fleet.view("edge:edge-b", step="1").points


class LeaseStore(MemoryStore):
    """A memory store that says whether this replica holds the sampling lease (as the redis store does)."""

    def __init__(self, history: MemoryHistory, leads: bool) -> None:
        super().__init__()
        self.history = history
        self.leads = leads

    def history_leader(self) -> bool:
        """Whether this replica samples."""
        return self.leads


def test_only_the_replica_holding_the_sampling_lease_samples_and_every_replica_serves_views() -> None:
    """A replica without the lease takes no sample and starts no round; it reads the leader's points from the store."""
    shared = MemoryHistory()
    leader = Fleet(store=LeaseStore(shared, leads=True))
    follower_store = LeaseStore(shared, leads=False)
    follower = Fleet(store=follower_store)
    for fleet in (leader, follower):
        fleet.connect("edge-a", in_flight=2)
    for _ in range(8):
        leader.seconds(1)
        follower.seconds(1)
    assert leader.history.samples == 8
    assert follower.history.samples == 0 and follower.history.rounds_started == 0
    assert follower.history.intervals_elsewhere == 8
    assert follower.history.series_kept == 0
    # Written every few frames by the leader, read from the store by the follower.
    assert column(follower.view("edge:edge-a", step="1"), "in_flight") == [4] * 8
    assert column(follower.view("fleet", step="1"), "in_flight") == [4] * 8
    # The lease moves: the old leader writes what it had open and stops; the other one samples.
    assert isinstance(leader.store, LeaseStore)
    leader.store.leads, follower_store.leads = False, True
    leader.seconds(1)
    follower.seconds(1)
    assert leader.history.samples == 8 and follower.history.samples == 1
    assert column(leader.view("edge:edge-a", step="4"), "in_flight")[-1][0] == 4
    assert column(follower.view("edge:edge-a", step="1"), "in_flight") == [4] * 9


def test_edges_sampled_every_other_interval_and_the_fleet_at_every_one() -> None:
    """With the first edge tier twice the interval, an edge gets a point every
    2 s; the fleet gets one every second, its counts read fresh each time."""
    settings = config_from_text(
        "history:\n  interval_seconds: 1\n  tiers:\n  - {keep_hours: 1}\n  - {step_seconds: 4, keep_hours: 2}\n"
        "  edge_tiers:\n  - {step_seconds: 2, keep_hours: 1}\n  - {step_seconds: 4, keep_hours: 2}\n"
    ).history
    fleet = Fleet(settings)
    fleet.connect("edge-a", in_flight=1)
    for value in (1, 2, 3, 4, 5, 6):
        fleet.set_in_flight("edge-a", value)
        fleet.seconds(1)
    assert fleet.history.samples == 6 and fleet.history.edge_samples == 4
    edge = fleet.view("edge:edge-a", step="2")
    # A sample of the edges is the first of each 2 s step: START+1 (of [0, 2): START is one), +2, +4, +6.
    assert [t for t, _, _ in edge.points] == [int((START + s) * 1000) for s in (1, 2, 4, 6)]
    assert column(edge, "in_flight") == [2, 4, 8, 12]
    whole = fleet.view("fleet", step="1")
    assert column(whole, "in_flight") == [2, 4, 6, 8, 10, 12]
    assert column(whole, "capacity") == [8] * 6
    # The edge's 4 s points are of its own samples: [0, 4) holds START+1 and +2, [4, 8) +4 and +6.
    rolled = fleet.view("edge:edge-a", step="4")
    assert [count for _, count, _ in rolled.points] == [2, 2]
    assert column(rolled, "in_flight") == [(3.0, 4, 4), (10.0, 12, 12)]
