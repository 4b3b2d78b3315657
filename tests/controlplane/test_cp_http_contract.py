"""The Control Plane's HTTP views hold the contract their document states:
query parameters given once and well formed, tokens from the header only."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.controlplane.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.http_routes import ControlPlaneHttp, HttpSettings, ListenerReadiness
from twisted_iop.controlplane.registry import EdgeRegistry


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
