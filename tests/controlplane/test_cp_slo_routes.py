"""SLOs through the real Klein app (StubTreq) and the real service on a clock.

Every answer is validated against the OpenAPI document's schemas.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, HttpSettings, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.rollouts.service import RolloutService
from twisted_iop.controlplane.slo.service import SloService
from twisted_iop.controlplane.slo.settings import SloSettings
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.harness import contract_validator
from twisted_iop.testing.latency import LatencyFeed, latency_snapshot
from twisted_iop.testing.wires.peers import CATALOG, AnsweringEdgePeer

CHAT_TTFT = {
    "metric": "ttft",
    "percentile": 95,
    "objective_seconds": 0.5,
    "model": "llama-3-8b",
    "edge_selector": "region=eu",
    "window": "30d",
}


def _valid(schema: str, body: Any) -> Any:
    errors = list(contract_validator(schema).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


class Fleet:
    """A registry with answering edges whose providers report latency feeds, an SLO service and the app."""

    def __init__(self, store: Optional[MemoryStore] = None, tokens: Optional[ApiTokens] = None) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.registry = EdgeRegistry(self.clock)
        self.gateway = EdgeGateway(self.registry, self.clock)
        self.feeds: dict[str, LatencyFeed] = {}
        self.store = store if store is not None else MemoryStore()
        rollouts = RolloutService(self.registry, self.gateway, self.clock)
        self.slos = SloService(
            SloSettings(interval_seconds=10.0, persist_seconds=60.0),
            self.registry,
            self.gateway,
            self.store,
            rollouts.event_buffer,
            self.clock,
        )
        self.slos.startService()
        settings = HttpSettings() if tokens is None else HttpSettings(tokens=tokens)
        api = ControlPlaneHttp(
            self.registry, self.gateway, self.clock, ListenerReadiness([]), settings, rollouts=rollouts, slos=self.slos
        )
        self.treq = StubTreq(api.app.resource())

    def edge(self, edge_id: str, region: str) -> LatencyFeed:
        """Connect an answering edge in ``region`` with one provider; its feed."""
        feed = self.feeds[edge_id] = LatencyFeed()
        peer = AnsweringEdgePeer(edge_id)
        peer.status = lambda: latency_snapshot(edge_id, {"mock-1": feed})
        hello = EdgeHello(
            labels={"region": region}, software_version="t", protocol_version="1.0", commands=tuple(CATALOG)
        )
        self.registry.connect(edge_id, peer, hello)
        return feed

    def ticks(self, count: int) -> None:
        """``count`` evaluation intervals."""
        for _ in range(count):
            self.clock.advance(10.0)

    async def call(self, method: str, path: str, body: Any = None, token: str = "") -> tuple[int, Any]:
        """One request; the status and the decoded JSON."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        send = getattr(self.treq, method.lower())
        response = await send("http://cp" + path, data=data, headers=headers)
        return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_put_get_list_delete_and_put_is_idempotent() -> None:
    """The issue's body makes an SLO (201); the same body again changes nothing
    (200, same created_at); it is listed and shown; DELETE forgets it (404 after)."""
    fleet = Fleet()
    code, created = await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT)
    assert code == 201, created
    _valid("Slo", created)
    assert created["spec"] == CHAT_TTFT and created["target"] == 0.95
    assert created["error_budget_remaining"] == 1.0 and created["value"] is None
    assert [a["name"] for a in created["alerts"]] == ["page", "ticket"]
    assert {a["state"] for a in created["alerts"]} == {"inactive"}
    assert [r["window"] for r in created["burn_rates"]] == ["1h", "5m", "6h", "30m"]
    fleet.clock.advance(5)
    code, again = await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT)
    assert code == 200 and again["created_at"] == created["created_at"]
    code, listed = await fleet.call("GET", "/slos")
    assert code == 200 and _valid("SloList", listed)["total"] == 1
    code, shown = await fleet.call("GET", "/slos/chat-ttft")
    assert code == 200 and _valid("Slo", shown)["name"] == "chat-ttft"
    code, deleted = await fleet.call("DELETE", "/slos/chat-ttft")
    assert code == 200 and _valid("SloDeleted", deleted) == {"name": "chat-ttft", "deleted": True}
    code, gone = await fleet.call("GET", "/slos/chat-ttft")
    assert code == 404 and _valid("Error", gone)["error"]["code"] == "unknown_slo"
    code, gone = await fleet.call("DELETE", "/slos/chat-ttft")
    assert code == 404
    assert fleet.store.slos == {}


@pytest_twisted.ensureDeferred
async def test_bad_bodies_are_400s_naming_the_field() -> None:
    """Each bad field is a 400 invalid_slo whose message names it; bad JSON is invalid_json."""
    fleet = Fleet()
    cases = [
        ({**CHAT_TTFT, "percentile": 120}, "'percentile'"),
        ({**CHAT_TTFT, "metric": "p99"}, "'metric'"),
        ({k: v for k, v in CHAT_TTFT.items() if k != "model"}, "'model'"),
        ({**CHAT_TTFT, "edge_selector": "region in (eu"}, "'edge_selector'"),
        ({**CHAT_TTFT, "window": "a month"}, "'window'"),
        ({**CHAT_TTFT, "objective_ratio": 0.01}, "'objective_ratio'"),
    ]
    for body, field in cases:
        code, answer = await fleet.call("PUT", "/slos/chat-ttft", body)
        assert code == 400, body
        assert _valid("Error", answer)["error"]["code"] == "invalid_slo"
        assert field in answer["error"]["message"], answer
    code, answer = await fleet.call("PUT", "/slos/chat-ttft", b"{not json")
    assert code == 400 and answer["error"]["code"] == "invalid_json"
    code, answer = await fleet.call("PUT", "/slos/has%20space", CHAT_TTFT)
    assert code == 400 and "'name'" in answer["error"]["message"]
    assert len(fleet.slos) == 0


@pytest_twisted.ensureDeferred
async def test_writes_need_an_operator_token_and_reads_a_viewer_one() -> None:
    """A viewer token reads SLOs but cannot PUT or DELETE them (403)."""
    tokens = ApiTokens(
        (
            ApiToken("ops", "operator", token_digest(b"op-secret")),
            ApiToken("look", "viewer", token_digest(b"view-secret")),
        )
    )
    fleet = Fleet(tokens=tokens)
    code, _ = await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT, token="view-secret")
    assert code == 403
    code, _ = await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT, token="op-secret")
    assert code == 201
    code, _ = await fleet.call("GET", "/slos/chat-ttft", token="view-secret")
    assert code == 200
    code, _ = await fleet.call("DELETE", "/slos/chat-ttft", token="view-secret")
    assert code == 403
    code, _ = await fleet.call("GET", "/slos")
    assert code == 401


@pytest_twisted.ensureDeferred
async def test_missed_objective_fires_the_page_only_from_matching_edges_then_resolves() -> None:
    """Requests over the objective on the eu edge fire the page and the
    ticket (an slo.alert.firing event each); the us edge's slow requests
    never count (selector); fast requests afterwards resolve the page."""
    fleet = Fleet()
    eu, us = fleet.edge("edge-eu", "eu"), fleet.edge("edge-us", "us")
    code, _ = await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT)
    assert code == 201
    fleet.ticks(1)  # the baseline readings
    for _ in range(6):
        eu.requests(ttft=[0.1] * 5)
        us.requests(ttft=[3.0] * 50)
        fleet.ticks(1)
    code, calm = await fleet.call("GET", "/slos/chat-ttft")
    assert calm["requests"] == 30 and calm["bad_requests"] == 0
    assert {a["state"] for a in calm["alerts"]} == {"inactive"}
    for _ in range(3):
        eu.requests(ttft=[2.0] * 40)
        fleet.ticks(1)
    code, burning = await fleet.call("GET", "/slos/chat-ttft")
    _valid("Slo", burning)
    assert burning["bad_requests"] == 120 and burning["requests"] == 150
    assert burning["value"] == _approx(2.0)
    assert {a["name"]: a["state"] for a in burning["alerts"]} == {"page": "firing", "ticket": "firing"}
    assert burning["error_budget_remaining"] < 0
    code, events = await fleet.call("GET", "/fleet/events?limit=100")
    kinds = [(e["kind"], e["attributes"].get("alert")) for e in events["items"]]
    assert ("slo.alert.firing", "page") in kinds and ("slo.alert.firing", "ticket") in kinds
    for _ in range(40):
        eu.requests(ttft=[0.1] * 200)
        fleet.ticks(1)
    code, calmer = await fleet.call("GET", "/slos/chat-ttft")
    assert {a["name"]: a["state"] for a in calmer["alerts"]}["page"] == "resolved"
    code, events = await fleet.call("GET", "/fleet/events?limit=100")
    assert ("slo.alert.resolved", "page") in [(e["kind"], e["attributes"].get("alert")) for e in events["items"]]


def _approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=0.02)


@pytest_twisted.ensureDeferred
async def test_an_edge_restart_counts_from_zero_never_negative() -> None:
    """After the edge's counters begin again (new counting_since_ms) its new
    requests count whole; nothing goes negative."""
    fleet = Fleet()
    eu = fleet.edge("edge-eu", "eu")
    await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT)
    eu.requests(ttft=[0.1] * 500)
    fleet.ticks(1)
    eu.requests(ttft=[0.1] * 10)
    fleet.ticks(1)
    eu.restart(1_700_000_500_000)
    eu.requests(ttft=[0.9] * 4)
    fleet.ticks(1)
    code, shown = await fleet.call("GET", "/slos/chat-ttft")
    assert code == 200
    assert (shown["requests"], shown["bad_requests"]) == (14, 4)


@pytest_twisted.ensureDeferred
async def test_slos_and_their_buckets_survive_a_restart_through_the_store() -> None:
    """A new service on the same store reads the SLO back with its counts and alerts."""
    store = MemoryStore()
    fleet = Fleet(store)
    eu = fleet.edge("edge-eu", "eu")
    await fleet.call("PUT", "/slos/chat-ttft", CHAT_TTFT)
    fleet.ticks(1)
    eu.requests(ttft=[2.0] * 30)
    fleet.ticks(1)
    code, before = await fleet.call("GET", "/slos/chat-ttft")
    fleet.slos.stopService()
    again = Fleet(store)
    again.clock.advance(fleet.clock.seconds() - again.clock.seconds())
    code, after = await again.call("GET", "/slos/chat-ttft")
    assert code == 200
    for field in ("requests", "bad_requests", "value", "error_budget_remaining", "alerts", "created_at"):
        assert after[field] == before[field], field
