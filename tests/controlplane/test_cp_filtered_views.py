"""Filtered views through StubTreq over the real Klein app: ``selector``,
``state`` and ``q`` on ``GET /edges`` and ``GET /fleet/status``."""

from __future__ import annotations

import json
from typing import Any, cast
from urllib.parse import quote

import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import CATALOG, AnsweringEdgePeer, HeldEdgePeer, snapshot
from twisted_iop.wire.peer import RemoteError

#: The fleet: edge id -> (labels, how it answers: "ok", "held" or "gone").
FLEET: dict[str, tuple[dict[str, str], str]] = {
    "eu-a1": ({"region": "eu", "tier": "prod"}, "ok"),
    "eu-b2": ({"region": "eu", "tier": "canary"}, "ok"),
    "us-c3": ({"region": "us", "tier": "prod"}, "ok"),
    "us-d4": ({"region": "us"}, "gone"),
    "eu-e5": ({"region": "eu", "tier": "prod"}, "held"),
    "eu-f6": ({"region": "eu", "gpu": "h100"}, "held"),
}
STATUS_TIMEOUT = 5.0


def hello(labels: dict[str, str]) -> EdgeHello:
    """A hello with ``labels``."""
    return EdgeHello(labels=labels, software_version="t", protocol_version="1.0", commands=tuple(CATALOG))


class Fleet:
    """The Klein app over a registry of :data:`FLEET`, on a test clock."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.registry = EdgeRegistry(self.clock)
        self.peers: dict[str, Any] = {}
        for edge_id, (labels, behaviour) in FLEET.items():
            peer: Any = HeldEdgePeer() if behaviour == "held" else AnsweringEdgePeer(edge_id)
            token = self.registry.connect(edge_id, peer, hello(labels))
            if behaviour == "gone":
                self.registry.disconnect(edge_id, token, "test")
            self.peers[edge_id] = peer
        self.gateway = EdgeGateway(self.registry, self.clock, status_timeout_seconds=STATUS_TIMEOUT)
        api = ControlPlaneHttp(self.registry, self.gateway, self.clock, ListenerReadiness([]))
        self.treq: Any = StubTreq(api.app.resource())

    async def get(self, path: str) -> tuple[int, Any]:
        """GET and decode JSON."""
        response = await self.treq.get("http://cp" + path)
        return response.code, json.loads(await response.content())

    def asked(self) -> dict[str, int]:
        """Status requests each edge received."""
        return {
            edge_id: len(peer.requests) if isinstance(peer, HeldEdgePeer) else peer.status_requests
            for edge_id, peer in self.peers.items()
        }

    async def fleet(self, query: str, error_held: bool = True) -> tuple[int, Any]:
        """``GET /fleet/status?query``: eu-e5 answers with an error, and eu-f6
        stays silent until the round's deadline (when either was asked)."""
        d = ensureDeferred(self.get("/fleet/status?" + query))
        held = cast(HeldEdgePeer, self.peers["eu-e5"])
        if error_held and held.requests and not held.requests[-1].called:
            held.requests[-1].errback(RemoteError(1, "provider table broken"))
        if not d.called:
            self.clock.advance(STATUS_TIMEOUT)
            self.treq.flush()
        return await d


def ids(body: Any) -> list[str]:
    """The edge ids of a page."""
    return [item["edge_id"] for item in body["items"]]


@pytest_twisted.ensureDeferred
async def test_edges_filter_by_selector_state_and_q() -> None:
    """Each filter alone, and combined (AND); total is of the filtered set."""
    fleet = Fleet()
    code, body = await fleet.get("/edges?selector=" + quote("region=eu,tier!=canary"))
    assert code == 200 and ids(body) == ["eu-a1", "eu-e5", "eu-f6"] and body["total"] == 3
    _, body = await fleet.get("/edges?selector=" + quote("tier in (prod,canary),!gpu"))
    assert ids(body) == ["eu-a1", "eu-b2", "eu-e5", "us-c3"]
    _, body = await fleet.get("/edges?state=disconnected")
    assert ids(body) == ["us-d4"] and body["items"][0]["connected"] is False
    _, body = await fleet.get("/edges?state=connected,disconnected")
    assert body["total"] == 6
    _, body = await fleet.get("/edges?q=EU-")
    assert ids(body) == ["eu-a1", "eu-b2", "eu-e5", "eu-f6"]
    _, body = await fleet.get("/edges?selector=region%3Dus&state=connected&q=c")
    assert ids(body) == ["us-c3"] and body["total"] == 1
    _, body = await fleet.get("/edges?selector=region%3Dmars")
    assert body == {"items": [], "total": 0, "next_cursor": None}


@pytest_twisted.ensureDeferred
async def test_edges_pages_of_a_filtered_set() -> None:
    """limit/cursor page the filtered set; total stays the filtered count."""
    fleet = Fleet()
    _, first = await fleet.get("/edges?selector=region%3Deu&limit=3")
    assert ids(first) == ["eu-a1", "eu-b2", "eu-e5"] and first["total"] == 4
    assert first["next_cursor"] == "eu-e5"
    _, rest = await fleet.get("/edges?selector=region%3Deu&limit=3&cursor=eu-e5")
    assert ids(rest) == ["eu-f6"] and rest["next_cursor"] is None and rest["total"] == 4


@pytest_twisted.ensureDeferred
async def test_bad_selector_and_state_are_400_naming_the_problem() -> None:
    """A selector syntax error names its position; an unknown state names the allowed ones."""
    fleet = Fleet()
    for path in ("/edges", "/fleet/status"):
        code, body = await fleet.get(path + "?selector=" + quote("region=eu,tier in prod"))
        assert code == 400 and body["error"]["code"] == "invalid_selector"
        assert "position 18" in body["error"]["message"]
        code, body = await fleet.get(path + "?state=connected,sleepy")
        assert code == 400 and body["error"]["code"] == "invalid_state"
        assert "'sleepy'" in body["error"]["message"] and "disconnected" in body["error"]["message"]
        code, body = await fleet.get(path + "?q=" + "x" * 300)
        assert code == 400 and body["error"]["code"] == "bad_request"
    # Row states belong to the fleet view only.
    code, body = await fleet.get("/edges?state=timeout")
    assert code == 400 and body["error"]["code"] == "invalid_state"
    assert fleet.asked() == dict.fromkeys(FLEET, 0)


@pytest_twisted.ensureDeferred
async def test_fleet_rows_filtered_by_row_state() -> None:
    """state= takes the rows' own states (ok, error, timeout) besides the connection."""
    fleet = Fleet()
    code, body = await fleet.fleet("state=error,timeout")
    assert code == 200
    assert {r["edge_id"]: r["state"] for r in body["items"]} == {"eu-e5": "error", "eu-f6": "timeout"}
    assert body["total"] == 2 and body["totals"]["edges_known"] == 2
    fleet.clock.advance(10)
    _, body = await fleet.fleet("state=ok")
    assert ids(body) == ["eu-a1", "eu-b2", "us-c3"] and body["totals"]["edges_connected"] == 3
    fleet.clock.advance(10)
    _, body = await fleet.fleet("state=disconnected")
    assert ids(body) == ["us-d4"] and body["totals"]["edges_connected"] == 0


@pytest_twisted.ensureDeferred
async def test_filtered_fleet_view_asks_only_matching_edges() -> None:
    """A selector view sends status requests to the matching connected edges
    only; its totals are of the matching rows."""
    fleet = Fleet()
    code, body = await fleet.fleet("selector=" + quote("region=eu,tier=prod"))
    assert code == 200 and ids(body) == ["eu-a1", "eu-e5"]
    assert fleet.asked() == {"eu-a1": 1, "eu-b2": 0, "us-c3": 0, "us-d4": 0, "eu-e5": 1, "eu-f6": 0}
    totals = body["totals"]
    one = snapshot("x")
    assert totals["edges_known"] == 2 and totals["edges_connected"] == 2
    # Only the fresh row (eu-a1) is summed: eu-e5 answered with an error.
    assert totals["nodes_connected"] == len(one.nodes)
    # A disconnected-only view asks nobody.
    fleet.clock.advance(10)
    _, body = await fleet.fleet("state=disconnected&q=us")
    assert ids(body) == ["us-d4"]
    assert sum(fleet.asked().values()) == 2


@pytest_twisted.ensureDeferred
async def test_filtered_rounds_are_shared_and_reused_within_the_max_age() -> None:
    """An equal filter within the max age reuses its round; a young full round
    serves filtered views without asking anyone; the full round is unchanged."""
    fleet = Fleet()
    _, first = await fleet.fleet("selector=region%3Dus")
    assert ids(first) == ["us-c3", "us-d4"] and fleet.asked()["us-c3"] == 1
    _, again = await fleet.get("/fleet/status?selector=region%3Dus&limit=1")
    assert ids(again) == ["us-c3"] and again["next_cursor"] == "us-c3" and again["total"] == 2
    assert again["round_at"] == first["round_at"] and fleet.asked()["us-c3"] == 1
    _, rest = await fleet.get("/fleet/status?selector=region%3Dus&limit=1&cursor=us-c3")
    assert ids(rest) == ["us-d4"] and rest["next_cursor"] is None
    fleet.clock.advance(10)
    # The full round waits out eu-f6's deadline: reuse it for longer than that.
    fleet.gateway.fleet_max_age_seconds = 3 * STATUS_TIMEOUT
    _, full = await fleet.fleet("")
    assert full["total"] == 6 and full["totals"]["edges_known"] == 6
    asked = fleet.asked()
    assert asked["us-c3"] == 2 and asked["eu-b2"] == 1
    _, cut = await fleet.get("/fleet/status?selector=tier%3Dcanary")
    assert ids(cut) == ["eu-b2"] and cut["round_at"] == full["round_at"] and cut["totals"]["edges_known"] == 1
    assert fleet.asked() == asked
