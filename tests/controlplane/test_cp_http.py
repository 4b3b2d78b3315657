"""HTTP views through treq.testing.StubTreq: shapes, bad input, auth, paging."""

from __future__ import annotations

import json
from typing import Any, Optional, cast

import attrs
import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, HttpSettings, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import CATALOG, AnsweringEdgePeer


def tokens(*entries: tuple[str, str, str]) -> ApiTokens:
    """Configured API tokens from (name, role, secret) triples."""
    return ApiTokens(tuple(ApiToken(name, role, token_digest(secret.encode())) for name, role, secret in entries))


HELLO = EdgeHello(labels={"site": "lab"}, software_version="t", protocol_version="1.0", commands=tuple(CATALOG))


@attrs.define
class FakeListener:
    """A listener the test binds by hand."""

    label: str
    is_bound: bool = False
    port_number: int = 0

    def bind(self, port: int) -> None:
        self.is_bound, self.port_number = True, port


def make_api(
    edges: int = 0, clock: Optional[Clock] = None, **settings: Any
) -> tuple[StubTreq, EdgeRegistry, dict[str, FakeListener]]:
    """A StubTreq over the Klein app with ``edges`` answering edges."""
    if clock is None:
        clock = Clock()
        clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    for i in range(edges):
        registry.connect(f"edge-{i:02d}", AnsweringEdgePeer(f"edge-{i:02d}"), HELLO)
    listeners = [FakeListener("http"), FakeListener("client_wire")]
    api = ControlPlaneHttp(
        registry, EdgeGateway(registry, clock), clock, ListenerReadiness(listeners), HttpSettings(**settings)
    )
    return StubTreq(api.app.resource()), registry, {listener.label: listener for listener in listeners}


async def get(treq: Any, path: str, **kwargs: Any) -> tuple[int, Any]:
    """GET and decode JSON."""
    response = await treq.get("http://cp" + path, **kwargs)
    assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
    return response.code, json.loads(await response.content())


async def post(treq: Any, path: str, body: bytes, **kwargs: Any) -> tuple[int, Any]:
    """POST raw bytes and decode JSON."""
    response = await treq.post("http://cp" + path, data=body, **kwargs)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_readyz_follows_listeners() -> None:
    """/readyz is 503 until every expected listener is bound, then 200."""
    treq, _, listeners = make_api()
    code, body = await get(treq, "/readyz")
    assert code == 503 and body["ready"] is False
    listeners["http"].bind(8080)
    code, body = await get(treq, "/readyz")
    assert code == 503 and body["listeners"] == {"http": True, "client_wire": False}
    listeners["client_wire"].bind(8081)
    code, body = await get(treq, "/readyz")
    assert code == 200 and body["ready"] is True


@pytest_twisted.ensureDeferred
async def test_edges_are_paginated() -> None:
    """limit/cursor walk the sorted edge list without gaps or repeats."""
    treq, _, _ = make_api(edges=5)
    seen: list[str] = []
    cursor = ""
    for _ in range(5):
        code, body = await get(treq, f"/edges?limit=2&cursor={cursor}")
        assert code == 200 and body["total"] == 5
        seen += [e["edge_id"] for e in body["items"]]
        if body["next_cursor"] is None:
            break
        cursor = body["next_cursor"]
    assert seen == [f"edge-{i:02d}" for i in range(5)]


@pytest_twisted.ensureDeferred
async def test_bad_query_parameters_are_400() -> None:
    """Non-numeric or out-of-range limit/since give 400 bad_request naming the parameter."""
    treq, _, _ = make_api(edges=1)
    for path in ("/edges?limit=abc", "/edges?limit=0", "/edges?limit=5000", "/edges/edge-00/events?since=-1"):
        code, body = await get(treq, path)
        assert code == 400 and body["error"]["code"] == "bad_request", path
    code, body = await get(treq, "/edges?limit=abc")
    assert "limit" in body["error"]["message"]


@pytest_twisted.ensureDeferred
async def test_command_body_validation() -> None:
    """Bad command bodies get 400 with a clear code; nothing is dispatched."""
    treq, registry, _ = make_api(edges=1)
    peer = cast(AnsweringEdgePeer, registry.get("edge-00").peer)
    cases = [
        (b"", "invalid_json"),
        (b"{not json", "invalid_json"),
        (b"[1,2]", "invalid_json"),
        (b'{"target": "n"}', "bad_request"),
        (b'{"name": "node.drain", "arguments": {"a": {"b": 1}}}', "bad_request"),
        (b'{"name": "node.drain", "timeout_seconds": -1}', "bad_request"),
        (b'{"name": "node.drain", "timeout_seconds": 100000}', "bad_request"),
        (b'{"name": "node.drain", "timeout_seconds": "soon"}', "bad_request"),
        (b'{"name": "no.such"}', "unknown_command"),
    ]
    for body, code_name in cases:
        code, answer = await post(treq, "/edges/edge-00/commands", body)
        assert code == 400 and answer["error"]["code"] == code_name, body
    assert peer.commands == []


@pytest_twisted.ensureDeferred
async def test_oversize_body_is_refused() -> None:
    """A body above max_body_bytes gets 413 body_too_large."""
    treq, _, _ = make_api(edges=1, max_body_bytes=1024)
    code, body = await post(treq, "/edges/edge-00/commands", b'{"name": "' + b"x" * 5000 + b'"}')
    assert code == 413 and body["error"]["code"] == "body_too_large"


@pytest_twisted.ensureDeferred
async def test_idempotency_key_header_returns_same_operation() -> None:
    """The Idempotency-Key header dedupes like the body field."""
    treq, registry, _ = make_api(edges=1)
    headers = {b"Idempotency-Key": [b"k-1"]}
    code, first = await post(
        treq, "/edges/edge-00/commands", b'{"name": "node.drain", "target": "n1"}', headers=headers
    )
    code2, second = await post(
        treq, "/edges/edge-00/commands", b'{"name": "node.drain", "target": "n1"}', headers=headers
    )
    assert code == code2 == 200
    assert first["operation_id"] == second["operation_id"] and first["idempotency_key"] == "k-1"
    assert len(cast(AnsweringEdgePeer, registry.get("edge-00").peer).commands) == 1
    code, one = await get(treq, f"/edges/edge-00/operations/{first['operation_id']}")
    assert code == 200 and one["state"] == "succeeded"
    code, missing = await get(treq, "/edges/edge-00/operations/nope")
    assert code == 404 and missing["error"]["code"] == "not_found"


@pytest_twisted.ensureDeferred
async def test_not_connected_command_is_409() -> None:
    """A command to a known but disconnected edge is 409 and dispatches nothing."""
    treq, registry, _ = make_api(edges=1)
    record = registry.get("edge-00")
    assert record.token is not None
    registry.disconnect("edge-00", record.token, "gone")
    code, body = await post(treq, "/edges/edge-00/commands", b'{"name": "node.drain"}')
    assert code == 409 and body["error"]["code"] == "edge_not_connected"


@pytest_twisted.ensureDeferred
async def test_api_token_is_enforced() -> None:
    """With a token set: no header 401, wrong 403, right 200; health stays open."""
    treq, _, _ = make_api(edges=1, tokens=tokens(("ops", "operator", "s3cret")))
    code, body = await get(treq, "/edges")
    assert code == 401 and body["error"]["code"] == "unauthorized"
    code, body = await get(treq, "/edges", headers={b"Authorization": [b"Bearer nope"]})
    assert code == 403 and body["error"]["code"] == "forbidden"
    code, body = await get(treq, "/edges", headers={b"Authorization": [b"Bearer s3cret"]})
    assert code == 200 and body["total"] == 1
    code, body = await get(treq, "/healthz")
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_viewer_tokens_read_but_do_not_command() -> None:
    """A viewer token reads views and is refused commands (403); an operator token commands."""
    treq, _, _ = make_api(edges=1, tokens=tokens(("dash", "viewer", "v-secret"), ("ops", "operator", "o-secret")))
    viewer = {b"Authorization": [b"Bearer v-secret"]}
    operator = {b"Authorization": [b"Bearer o-secret"]}
    code, body = await get(treq, "/edges/edge-00", headers=viewer)
    assert code == 200 and body["edge_id"] == "edge-00"
    code, body = await post(treq, "/edges/edge-00/commands", b'{"name": "node.drain", "target": "n"}', headers=viewer)
    assert code == 403 and body["error"]["code"] == "forbidden"
    assert "viewer" in body["error"]["message"]
    code, body = await post(treq, "/edges/edge-00/commands", b'{"name": "node.drain", "target": "n"}', headers=operator)
    assert code == 200 and body["state"] == "succeeded"
    assert body["requested_by"] == "ops"
    code, page = await get(treq, "/edges/edge-00/operations", headers=viewer)
    assert code == 200 and [op["requested_by"] for op in page["items"]] == ["ops"]


@pytest_twisted.ensureDeferred
async def test_unknown_routes_and_malformed_ids_are_json_404() -> None:
    """Unknown paths and malformed edge ids answer JSON 404s."""
    treq, _, _ = make_api()
    code, body = await get(treq, "/nope/at/all")
    assert code == 404 and body["error"]["code"] == "not_found"
    code, body = await get(treq, "/edges/bad%20id%21")
    assert code == 404 and body["error"]["code"] == "unknown_edge"


@pytest_twisted.ensureDeferred
async def test_fleet_status_totals_and_paging() -> None:
    """Fleet totals count every edge while rows are paged."""
    treq, _, _ = make_api(edges=3)
    code, body = await get(treq, "/fleet/status?limit=2")
    assert code == 200
    assert [r["edge_id"] for r in body["items"]] == ["edge-00", "edge-01"]
    assert body["next_cursor"] == "edge-01"
    assert body["totals"]["edges_connected"] == 3
    assert body["totals"]["general"]["capacity"] == 24
    code, rest = await get(treq, "/fleet/status?limit=2&cursor=edge-01")
    assert [r["edge_id"] for r in rest["items"]] == ["edge-02"] and rest["next_cursor"] is None


@pytest_twisted.ensureDeferred
async def test_fleet_pages_within_the_max_age_share_one_round() -> None:
    """Pages and refreshes within the max age reuse the round (same round_at, no new requests)."""
    clock = Clock()
    clock.advance(1_700_000_000)
    treq, registry, _ = make_api(edges=3, clock=clock)
    peers = [cast(AnsweringEdgePeer, record.peer) for record in registry.edges()]
    _code, first = await get(treq, "/fleet/status?limit=2")
    assert first["round_at"] == "2023-11-14T22:13:20.000Z"
    clock.advance(0.5)
    _code, second = await get(treq, "/fleet/status?limit=2&cursor=edge-01")
    _code, refresh = await get(treq, "/fleet/status")
    assert second["round_at"] == refresh["round_at"] == first["round_at"]
    assert second["generated_at"] == "2023-11-14T22:13:20.500Z"
    assert [p.status_requests for p in peers] == [1, 1, 1]
    assert refresh["totals"] == first["totals"] and refresh["total"] == 3
    clock.advance(0.5)  # the default max age (1 s) has passed: a new round
    _code, later = await get(treq, "/fleet/status")
    assert later["round_at"] == "2023-11-14T22:13:21.000Z"
    assert [p.status_requests for p in peers] == [2, 2, 2]


@pytest_twisted.ensureDeferred
async def test_command_answer_says_whether_it_was_replayed() -> None:
    """The POST answer carries replayed (false, then true for the same key) and late_outcome."""
    treq, _registry, _ = make_api(edges=1)
    body = b'{"name": "node.drain", "target": "n1", "idempotency_key": "k"}'
    code, first = await post(treq, "/edges/edge-00/commands", body)
    assert code == 200 and first["replayed"] is False and first["late_outcome"] is None
    code, again = await post(treq, "/edges/edge-00/commands", body)
    assert code == 200 and again["replayed"] is True and again["operation_id"] == first["operation_id"]
    code, conflict = await post(
        treq, "/edges/edge-00/commands", b'{"name": "node.drain", "target": "n2", "idempotency_key": "k"}'
    )
    assert code == 409 and conflict["error"]["code"] == "idempotency_conflict"
    assert conflict["operation"]["operation_id"] == first["operation_id"]


@pytest_twisted.ensureDeferred
async def test_console_config_names_the_wire() -> None:
    """/console/config.json gives the WebSocket URL from the request host and bound port."""
    treq, _, listeners = make_api()
    listeners["client_wire"].bind(18081)
    code, body = await get(treq, "/console/config.json", headers={b"Host": [b"example.test:8080"]})
    assert code == 200
    assert body == {"wire_url": "ws://example.test:18081/client", "api_token_required": False}


@pytest_twisted.ensureDeferred
async def test_deeply_nested_json_and_nul_paths_are_client_errors() -> None:
    """30,000 nested brackets answer 400 invalid_json; a NUL in a console path answers 404, never 500."""
    treq: Any
    treq, _, _ = make_api(edges=1)
    code, body = await post(treq, "/edges/edge-00/commands", b"[" * 30000)
    assert code == 400 and body["error"]["code"] == "invalid_json"
    response = await treq.get("http://cp/console/%00")
    assert response.code == 404
    response = await treq.get("http://cp/console/js/%00app.js")
    assert response.code == 404
