"""The cluster's fencing rules, checked over the real Lua scripts in a real redis-server.

A Hypothesis state machine interleaves connects (CLAIM), closes (RELEASE),
status replies (STATUS), relayed and unfenced events (EVENT), reaping
(REAP), reassertion after an outage (REASSERT) and Redis losing its data,
for connections on three replicas to a few edges, and checks after every
step that Redis holds what the model says: the edge records, the
``owned:<replica>`` sets, consecutive stream IDs, and above all that
replaying the fleet stream (what every replica's mirror does) yields the
current owner of every edge.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from twisted_iop.controlplane.cluster import scripts
from twisted_iop.testing.redis import RedisServer, SyncRedis, redis_available

PREFIX = "fence-test"
#: Stream bounds far above what a run writes, so no entry is trimmed.
EDGE_MAX = FLEET_MAX = 100_000
NOW = "1700000000"
EDGES = ("e1", "e2", "e3")
REPLICAS = ("r1", "r2", "r3")


#: The module's client while its redis-server runs (the state machine's TestCase takes no fixtures).
_CLIENT: Optional[SyncRedis] = None


@pytest.fixture(scope="module", autouse=True)
def redis_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncRedis]:
    """One redis-server for the whole module, and one synchronous client to it."""
    global _CLIENT
    if not redis_available():
        pytest.fail("redis-server is not installed: run `make redis` (make test does)")
    server = RedisServer(Path(tmp_path_factory.mktemp("redis"))).start()
    try:
        with SyncRedis(server.port) as client:
            _CLIENT = client
            yield client
    finally:
        _CLIENT = None
        server.kill()


def _event(edge: str, kind: str) -> str:
    return json.dumps({"edge_id": edge, "kind": kind})


def _replica_of(fence: str) -> str:
    return fence.split("/", 1)[0]


class Fleet:
    """The fenced scripts, called the way ClusterReplica calls them (same ARGV)."""

    def __init__(self, redis: SyncRedis) -> None:
        self.redis = redis

    def _run(self, script: scripts.Script, origin: str, *args: object) -> Any:
        return self.redis.eval(script.source, PREFIX, origin, EDGE_MAX, FLEET_MAX, *args)

    def claim(self, edge: str, fence: str) -> int:
        """A hello accepted on the fence's replica; the new epoch."""
        owner = _replica_of(fence)
        return int(
            self._run(
                scripts.CLAIM,
                owner,
                edge,
                fence,
                owner,
                json.dumps({"edge_id": edge}),
                NOW,
                _event(edge, "edge.connected"),
                _event(edge, "edge.superseded"),
            )
        )

    def reassert(self, edge: str, fence: str) -> int:
        """Redis is back: is the connection with ``fence`` still current? (1, 2, 3 or 0)."""
        owner = _replica_of(fence)
        return int(
            self._run(
                scripts.REASSERT,
                owner,
                edge,
                fence,
                owner,
                json.dumps({"edge_id": edge}),
                NOW,
                _event(edge, "edge.connected"),
            )
        )

    def release(self, edge: str, fence: str) -> int:
        """The connection with ``fence`` closed; 1 when that changed something."""
        return int(self._run(scripts.RELEASE, _replica_of(fence), edge, fence, NOW, _event(edge, "edge.disconnected")))

    def status(self, edge: str, fence: str, snapshot: str) -> int:
        """A status reply on the connection with ``fence``; 1 when written."""
        return int(self._run(scripts.STATUS, _replica_of(fence), edge, fence, snapshot, NOW))

    def event(self, edge: str, fence: str, change: dict[str, Any], origin: str) -> int:
        """An event (fenced, or unfenced with ``fence=''``); its fleet sequence or 0."""
        return int(self._run(scripts.EVENT, origin, edge, fence, _event(edge, "edge.event"), json.dumps(change)))

    def reap(self, replica: str, keep: str, by: str) -> int:
        """``by`` reaps ``replica`` (keeping fences that start with ``keep``); how many it disconnected."""
        return int(self._run(scripts.REAP, by, replica, keep, NOW, "owner lost"))

    def edge(self, edge: str) -> list[Optional[str]]:
        """The edge record's fence, owner, connected, epoch and snapshot fields."""
        fields: list[Optional[str]] = self.redis.call(
            "HMGET", f"{PREFIX}:edge:{edge}", "fence", "owner", "connected", "epoch", "snapshot"
        )
        return fields

    def stream(self, name: str) -> list[tuple[str, dict[str, str]]]:
        """Every entry of the stream ``name`` (under the prefix), oldest first."""
        entries = self.redis.call("XRANGE", f"{PREFIX}:{name}", "-", "+")
        return [(entry_id, dict(zip(flat[::2], flat[1::2], strict=True))) for entry_id, flat in entries]

    def owned(self, replica: str) -> set[str]:
        """The ``owned:<replica>`` set."""
        return set(self.redis.call("SMEMBERS", f"{PREFIX}:owned:{replica}"))


@attrs.define
class EdgeModel:
    """What one edge's shared record should hold."""

    fence: Optional[str] = None
    owner: Optional[str] = None
    connected: bool = False
    epoch: int = 0
    snapshot: Optional[str] = None
    #: The change kinds of the edge's stream, in order.
    kinds: list[str] = attrs.Factory(list)


class FencingMachine(RuleBasedStateMachine):
    """Connections of three replicas to three edges, in any interleaving, against the real scripts."""

    fences = Bundle("fences")

    def __init__(self) -> None:
        super().__init__()
        redis = _CLIENT
        assert redis is not None, "the module's redis_client fixture starts the server"
        redis.call("FLUSHALL")
        self.fleet_store = Fleet(redis)
        self.edges = {edge: EdgeModel() for edge in EDGES}
        self.boots = dict.fromkeys(REPLICAS, 1)
        self.tokens = 0
        self.snapshots = 0
        #: The fleet stream: (edge, change kind), in order.
        self.fleet: list[tuple[str, str]] = []

    def _append(self, edge: str, kind: str) -> None:
        self.edges[edge].kinds.append(kind)
        self.fleet.append((edge, kind))

    def _take(self, edge: str, fence: str) -> None:
        model = self.edges[edge]
        model.epoch += 1
        model.fence, model.owner, model.connected = fence, _replica_of(fence), True
        self._append(edge, "connect")

    def _any_connected(self) -> bool:
        # Reaps and restarts with nothing connected change nothing: spend the steps elsewhere.
        return any(model.connected for model in self.edges.values())

    @staticmethod
    def _current(model: EdgeModel, fence: str) -> bool:
        return model.fence == fence and model.connected

    @rule(target=fences, edge=st.sampled_from(EDGES), replica=st.sampled_from(REPLICAS))
    def connect(self, edge: str, replica: str) -> tuple[str, str]:
        """A hello on ``replica``: a new fence, a strictly newer epoch, the old connection superseded."""
        self.tokens += 1
        fence = f"{replica}/{self.boots[replica]}/{self.tokens}"
        model = self.edges[edge]
        before = model.epoch
        epoch = self.fleet_store.claim(edge, fence)
        assert epoch == before + 1 and epoch > before
        if model.connected:
            self._append(edge, "superseded")
        self._take(edge, fence)
        return (edge, fence)

    @rule(issued=fences)
    def close(self, issued: tuple[str, str]) -> None:
        """A connection closes: only the current, connected one disconnects the edge."""
        edge, fence = issued
        model = self.edges[edge]
        expected = self._current(model, fence)
        assert self.fleet_store.release(edge, fence) == int(expected)
        event(f"close {'applied' if expected else 'fenced off'}")
        if expected:
            model.connected = False
            self._append(edge, "disconnect")

    @rule(issued=fences)
    def status_reply(self, issued: tuple[str, str]) -> None:
        """A status reply is written only from the current connection."""
        edge, fence = issued
        model = self.edges[edge]
        self.snapshots += 1
        snapshot = f"snapshot-{self.snapshots}"
        expected = self._current(model, fence)
        assert self.fleet_store.status(edge, fence, snapshot) == int(expected)
        if expected:
            model.snapshot = snapshot

    @rule(issued=fences)
    def relayed_event(self, issued: tuple[str, str]) -> None:
        """An event relayed on a connection is appended only while that connection is current."""
        edge, fence = issued
        model = self.edges[edge]
        expected = self._current(model, fence)
        change = {"kind": "relayed", "edge_sequence": len(model.kinds) + 1, "fence": fence}
        sequence = self.fleet_store.event(edge, fence, change, _replica_of(fence))
        assert sequence == (len(self.fleet) + 1 if expected else 0)
        if expected:
            self._append(edge, "relayed")

    @rule(edge=st.sampled_from(EDGES), origin=st.sampled_from(REPLICAS))
    def own_event(self, edge: str, origin: str) -> None:
        """The Control Plane's own (unfenced) events always append."""
        sequence = self.fleet_store.event(edge, "", {"kind": "event"}, origin)
        assert sequence == len(self.fleet) + 1
        self._append(edge, "event")

    def _reap(self, replica: str, keep: str, by: str) -> None:
        doomed = {
            edge
            for edge, model in self.edges.items()
            if model.owner == replica and model.connected and not (keep and str(model.fence).startswith(keep))
        }
        count = self.fleet_store.reap(replica, keep, by)
        assert count == len(doomed)
        event(
            f"reap disconnected {min(count, 2)}{'+' if count >= 2 else ''} edges{' (keeping a boot)' if keep else ''}"
        )
        # The script walks a set: take the order of the disconnects from the stream.
        written = [fields for _, fields in self.fleet_store.stream("fleet")[len(self.fleet) :]]
        order = [json.loads(fields["e"])["edge_id"] for fields in written]
        assert sorted(order) == sorted(doomed) and len(order) == len(doomed)
        for edge in order:
            self.edges[edge].connected = False
            self._append(edge, "disconnect")

    @precondition(lambda self: self._any_connected())
    @rule(replica=st.sampled_from(REPLICAS), by=st.sampled_from(REPLICAS), keep_current_boot=st.booleans())
    def reap(self, replica: str, by: str, keep_current_boot: bool) -> None:
        """A replica's lease ran out (or, keeping its current boot, a stale boot's connections are let go)."""
        keep = f"{replica}/{self.boots[replica]}/" if keep_current_boot else ""
        self._reap(replica, keep, by)

    @precondition(lambda self: self._any_connected())
    @rule(replica=st.sampled_from(REPLICAS))
    def restart(self, replica: str) -> None:
        """A replica restarts: a new boot, and at join it reaps what its earlier run held."""
        self.boots[replica] += 1
        self._reap(replica, f"{replica}/{self.boots[replica]}/", replica)

    @rule(issued=fences)
    def reassert(self, issued: tuple[str, str]) -> None:
        """After an outage a replica reasserts a connection: kept, taken again, or superseded."""
        edge, fence = issued
        model = self.edges[edge]
        if model.fence is None:
            expected = 3
        elif model.fence == fence:
            expected = 1 if model.connected else 2
        else:
            expected = 0
        assert self.fleet_store.reassert(edge, fence) == expected
        event(f"reassert answered {expected}")
        if expected in (2, 3):
            self._take(edge, fence)

    @rule()
    def redis_loses_everything(self) -> None:
        """Redis comes back empty: every record, set and stream is gone."""
        self.fleet_store.redis.call("FLUSHALL")
        self.edges = {edge: EdgeModel() for edge in EDGES}
        self.fleet = []

    @invariant()
    def records_match_the_model(self) -> None:
        """Each edge's fence, owner, connected flag, epoch and snapshot are the model's."""
        for edge, model in self.edges.items():
            claimed = model.fence is not None
            assert self.fleet_store.edge(edge) == [
                model.fence,
                model.owner,
                ("1" if model.connected else "0") if claimed else None,
                str(model.epoch) if claimed else None,
                model.snapshot,
            ], edge

    @invariant()
    def streams_are_consecutive_and_agree(self) -> None:
        """Edge and fleet stream IDs are 1-0, 2-0, ...; they hold the model's changes in order (each
        connect with the next epoch) and point at each other."""
        fleet = self.fleet_store.stream("fleet")
        assert [entry_id for entry_id, _ in fleet] == [f"{n}-0" for n in range(1, len(fleet) + 1)]
        seen = [(json.loads(fields["e"])["edge_id"], json.loads(fields["c"])["kind"]) for _, fields in fleet]
        assert seen == self.fleet
        epochs: dict[str, list[int]] = {}
        for _, fields in fleet:
            change = json.loads(fields["c"])
            if change["kind"] == "connect":
                epochs.setdefault(json.loads(fields["e"])["edge_id"], []).append(change["epoch"])
        assert all(got == list(range(1, len(got) + 1)) for got in epochs.values()), epochs
        for edge, model in self.edges.items():
            entries = self.fleet_store.stream(f"events:{edge}")
            assert [entry_id for entry_id, _ in entries] == [f"{n}-0" for n in range(1, len(entries) + 1)]
            assert len(entries) == len(model.kinds)
            for n, (_, fields) in enumerate(entries, start=1):
                fleet_fields = fleet[int(fields["f"]) - 1][1]
                assert json.loads(fleet_fields["e"])["edge_id"] == edge and fleet_fields["s"] == str(n)
        stored = self.fleet_store.redis.call("GET", f"{PREFIX}:fleet_seq")
        assert int(stored or 0) == len(self.fleet)

    @invariant()
    def replaying_the_fleet_stream_gives_the_current_owner(self) -> None:
        """What a mirror does: connects set the owner, a disconnect of the current fence clears it
        (and a superseded entry names the connection that was current)."""
        mirror: dict[str, tuple[str, str, bool, int]] = {}
        for _, fields in self.fleet_store.stream("fleet"):
            change = json.loads(fields["c"])
            edge = json.loads(fields["e"])["edge_id"]
            if change["kind"] == "connect":
                assert fields["o"] == change["owner"]
                mirror[edge] = (change["fence"], change["owner"], True, change["epoch"])
            elif change["kind"] == "superseded":
                # A claim supersedes exactly the connection that was current.
                assert edge in mirror and mirror[edge][0] == change["fence"] and mirror[edge][2]
            elif change["kind"] == "disconnect" and edge in mirror and mirror[edge][0] == change["fence"]:
                mirror[edge] = (*mirror[edge][:2], False, mirror[edge][3])
        expected = {
            edge: (model.fence, model.owner, model.connected, model.epoch)
            for edge, model in self.edges.items()
            if model.fence is not None
        }
        assert mirror == expected

    @invariant()
    def owned_sets_hold_exactly_the_connected_edges(self) -> None:
        """``owned:<replica>`` is the set of edges connected through that replica."""
        for replica in REPLICAS:
            connected = {e for e, m in self.edges.items() if m.owner == replica and m.connected}
            assert self.fleet_store.owned(replica) == connected, replica


TestFencingRules = FencingMachine.TestCase
TestFencingRules.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


def test_reassert_answers_current_reaped_lost_and_superseded(redis_client: SyncRedis) -> None:
    """REASSERT: 1 for the current fence, 2 after a reap, 3 after Redis lost
    the record, 0 once a newer connection took over (which it leaves alone)."""
    redis_client.call("FLUSHALL")
    fleet = Fleet(redis_client)
    fence = "r1/1/1"
    assert fleet.claim("e1", fence) == 1
    assert fleet.reassert("e1", fence) == 1
    assert fleet.edge("e1")[:4] == [fence, "r1", "1", "1"]

    assert fleet.reap("r1", "", "r2") == 1
    assert fleet.edge("e1")[2] == "0"
    assert fleet.reassert("e1", fence) == 2
    assert fleet.edge("e1")[:4] == [fence, "r1", "1", "2"]
    assert fleet.owned("r1") == {"e1"}

    redis_client.call("FLUSHALL")
    assert fleet.reassert("e1", fence) == 3
    assert fleet.edge("e1")[:4] == [fence, "r1", "1", "1"]
    assert fleet.owned("r1") == {"e1"}

    newer = "r2/1/2"
    assert fleet.claim("e1", newer) == 2
    assert fleet.reassert("e1", fence) == 0
    assert fleet.edge("e1")[:4] == [newer, "r2", "1", "2"]
    assert fleet.owned("r1") == set() and fleet.owned("r2") == {"e1"}
