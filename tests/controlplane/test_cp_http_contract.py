"""The Control Plane's HTTP views hold the contract their document states:
query parameters given once and well formed, tokens from the header only."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest_twisted
import treq
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.controlplane.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.edge_hello import EdgeHello
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.history.queries import parse_step
from twisted_iop.controlplane.history.settings import DEFAULT_EDGE_TIERS, DEFAULT_TIERS
from twisted_iop.controlplane.http_routes import (
    MAX_ARGUMENT_VALUE,
    MAX_COMMAND_ARGUMENTS,
    MAX_TEXT,
    ControlPlaneHttp,
    HttpSettings,
    ListenerReadiness,
)
from twisted_iop.controlplane.registry import EdgeRegistry
from twisted_iop.testing.harness import start_control_plane
from twisted_iop.testing.peers import CATALOG, HeldEdgePeer

HELLO = EdgeHello(labels={}, software_version="t", protocol_version="1.0", commands=tuple(CATALOG))


def _http(registry: EdgeRegistry, gateway: EdgeGateway, clock: Clock) -> ControlPlaneHttp:
    """The Control Plane's views over ``registry`` and ``gateway``."""
    return ControlPlaneHttp(registry, gateway, clock, ListenerReadiness([]), HttpSettings())


def _api(**settings: Any) -> StubTreq:
    """A StubTreq over the Control Plane's Klein app with no edges."""
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    api = ControlPlaneHttp(
        registry, EdgeGateway(registry, clock), clock, ListenerReadiness([]), HttpSettings(**settings)
    )
    return StubTreq(api.app.resource())


async def _get(treq: Any, path: str, **kwargs: Any) -> tuple[int, Any]:
    """GET ``path`` and decode its JSON answer."""
    response = await treq.get("http://cp" + path, **kwargs)
    return response.code, json.loads(await response.content())


@pytest_twisted.ensureDeferred
async def test_empty_and_repeated_numbers_are_400() -> None:
    """``limit=``, ``since=`` and a repeated ``limit`` are refused like ``limit=abc``,
    on the edge, fleet and rollout lists alike, and a well-formed one still passes."""
    treq = _api()
    for path in (
        "/fleet/events?limit=&since=",
        "/fleet/events?since=",
        "/fleet/events?limit=5&limit=6",
        "/edges?limit=",
        "/edges?limit=1&limit=1",
        "/fleet/operations?limit=",
        "/rollouts?limit=",
        "/rollouts?limit=2&limit=3",
    ):
        code, body = await _get(treq, path)
        assert (code, body["error"]["code"]) == (400, "bad_request"), path
        assert "limit" in body["error"]["message"] or "since" in body["error"]["message"], path
    for path in ("/fleet/events?limit=5&since=0", "/edges?limit=1", "/rollouts?limit=2"):
        code, _ = await _get(treq, path)
        assert code == 200, path


@pytest_twisted.ensureDeferred
async def test_a_token_in_the_query_is_not_accepted() -> None:
    """``?access_token=`` with a real token is answered 401: tokens come from the
    ``Authorization`` header only (a URL ends up in histories, proxies and logs)."""
    secret = "s3cr3t-token"
    treq = _api(tokens=ApiTokens((ApiToken("alice", "operator", token_digest(secret.encode())),)))
    code, body = await _get(treq, f"/edges?access_token={secret}")
    assert (code, body["error"]["code"]) == (401, "unauthorized")
    code, _ = await _get(treq, "/edges", headers={b"Authorization": [b"Bearer " + secret.encode()]})
    assert code == 200


@pytest_twisted.ensureDeferred
async def test_a_method_a_route_does_not_serve_is_405_with_its_allow() -> None:
    """POST on a GET-only route (``/``, ``/healthz``, ``/console``) is a JSON 405 whose
    ``Allow`` names only what is served; a path no route serves stays 404."""
    stub: Any = _api()
    for path in ("/", "/healthz", "/console", "/console/index.html", "/edges"):
        response = await stub.post("http://cp" + path, data=b"{}", headers={b"content-type": [b"application/json"]})
        body = json.loads(await response.content())
        assert (response.code, body["error"]["code"]) == (405, "method_not_allowed"), path
        assert response.headers.getRawHeaders(b"allow") == [b"GET, HEAD"], path
    response = await stub.post("http://cp/nowhere", data=b"{}", headers={b"content-type": [b"application/json"]})
    assert response.code == 404


@pytest_twisted.ensureDeferred
async def test_the_sites_own_405_and_400_speak_for_the_routes() -> None:
    """Through the daemon's site: OPTIONS on ``/rollouts/0/pause`` says ``Allow: POST``
    (the route's methods), on ``/healthz`` ``GET, HEAD``; ``GET /edges/%FF`` is a JSON 400."""
    cp = await start_control_plane()
    try:
        for path, allow in (("/rollouts/0/pause", b"POST"), ("/healthz", b"GET, HEAD")):
            response = await treq.request("OPTIONS", cp.http_url + path)
            await response.content()
            assert response.code == 405
            assert response.headers.getRawHeaders(b"allow") == [allow], path
        response = await treq.get(cp.http_url + "/edges/%FF")
        assert response.code == 400
        assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
        assert json.loads(await response.content())["error"]["code"] == "invalid_path"
    finally:
        await cp.stop()


def test_the_documented_step_example_is_a_step_of_every_series() -> None:
    """The document's ``step`` example is shared by the fleet's, a selector's and an edge's
    history: it names a tier of both default tier lists (``1m`` is no edge tier: 400)."""
    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    example = document["components"]["parameters"]["HistoryStep"]["example"]
    for tier_list in (DEFAULT_TIERS, DEFAULT_EDGE_TIERS):
        assert parse_step(example, tier_list) is not None


@pytest_twisted.ensureDeferred
async def test_a_key_replayed_after_a_stop_gets_the_operation_as_it_ended() -> None:
    """A command never answered, the Control Plane stopped (its caller: 503 ``shutting_down``),
    then a running Control Plane on the same records gets the same key: the failed operation
    with a 200 and ``replayed``, not the stop's 503 that a retrying client would loop on."""
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    registry.connect("edge-00", HeldEdgePeer(), HELLO)
    command = json.dumps({"name": "node.drain", "target": "node-1", "idempotency_key": "K"}).encode()
    headers = {b"content-type": [b"application/json"]}

    stopping = EdgeGateway(registry, clock)
    first: Any = StubTreq(_http(registry, stopping, clock).app.resource())
    answer = first.post("http://cp/edges/edge-00/commands", data=command, headers=headers)
    stopping.shut_down()
    first.flush()
    response = await answer
    assert response.code == 503
    assert json.loads(await response.content())["error"]["code"] == "shutting_down"

    running: Any = StubTreq(_http(registry, EdgeGateway(registry, clock), clock).app.resource())
    response = await running.post("http://cp/edges/edge-00/commands", data=command, headers=headers)
    body = json.loads(await response.content())
    assert response.code == 200, body
    assert body["state"] == "failed" and body["replayed"] is True
    assert "stopped before this operation ended" in body["reason"]


def test_the_command_schema_states_the_bounds_the_server_enforces() -> None:
    """The document's command body says what ``POST /edges/{id}/commands`` refuses with a 400:
    32 arguments, names and target of 256 characters, values of 1,024, a timeout of at most 300 s."""
    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    command = document["components"]["schemas"]["CommandRequest"]["properties"]
    assert command["target"]["maxLength"] == MAX_TEXT
    assert command["arguments"]["maxProperties"] == MAX_COMMAND_ARGUMENTS
    assert command["arguments"]["propertyNames"]["maxLength"] == MAX_TEXT
    assert command["arguments"]["additionalProperties"]["maxLength"] == MAX_ARGUMENT_VALUE
    assert command["timeout_seconds"]["maximum"] == HttpSettings().max_command_timeout_seconds
