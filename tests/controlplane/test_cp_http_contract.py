"""The Control Plane's HTTP views hold the contract their document states:
query parameters given once and well formed, tokens from the header only."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest_twisted
import treq
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.edge_filters import EDGE_STATES, FLEET_STATES
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.fields import FLEET_FIELDS, MODEL_FIELDS, names
from twisted_iop.controlplane.history.queries import parse_step
from twisted_iop.controlplane.history.settings import DEFAULT_EDGE_TIERS, DEFAULT_TIERS
from twisted_iop.controlplane.http.auth import ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.http.routes import (
    ControlPlaneHttp,
    HttpSettings,
    ListenerReadiness,
)
from twisted_iop.controlplane.requests.command_body import MAX_ARGUMENT_VALUE, MAX_COMMAND_ARGUMENTS, MAX_TEXT
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.rollouts.states import EXECUTION_STATES
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.label_selectors import SELECTOR_PATTERN
from twisted_iop.testing.harness import start_control_plane
from twisted_iop.testing.wires.peers import CATALOG, HeldEdgePeer

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


def _document() -> dict[str, Any]:
    """The packaged OpenAPI document."""
    return dict(json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text()))


def _schema_of(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator of one component schema (its references followed)."""
    registry: Registry[Any] = Registry().with_resource("urn:doc", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def test_the_documents_patterns_are_the_servers_rules() -> None:
    """Every selector in the document carries the parser's pattern; the state, step and series
    patterns take exactly the names the views know (any case for the edge and fleet states)."""
    document = _document()
    parameters = document["components"]["parameters"]
    schemas = document["components"]["schemas"]
    assert parameters["Selector"]["schema"]["pattern"] == SELECTOR_PATTERN
    assert schemas["RolloutRequest"]["properties"]["selector"]["pattern"] == SELECTOR_PATTERN
    assert schemas["RolloutCommand"]["properties"]["node_selector"]["pattern"] == SELECTOR_PATTERN
    executions = document["paths"]["/rollouts/{rollout_id}/executions"]["get"]["parameters"]
    (execution_state,) = [p["schema"]["pattern"] for p in executions if p.get("name") == "state"]
    for pattern, known, any_case, empty_parts in (
        (parameters["EdgeState"]["schema"]["pattern"], EDGE_STATES, True, True),
        (parameters["FleetState"]["schema"]["pattern"], FLEET_STATES, True, True),
        (execution_state, EXECUTION_STATES, False, False),
        (parameters["HistorySeries"]["schema"]["pattern"], names(FLEET_FIELDS) + names(MODEL_FIELDS), False, True),
    ):
        matches = re.compile(pattern).fullmatch
        assert matches(",".join(known)) and matches(" , ".join(reversed(known)))
        for name in known:
            assert matches(name) and matches(f" {name} ")
            assert bool(matches(name.upper())) is any_case, (pattern, name)
        assert not matches("bogus") and not matches(known[0] + ",bogus")
        assert bool(matches(known[0] + ",," + known[0])) is empty_parts
    step = re.compile(parameters["HistoryStep"]["schema"]["pattern"]).fullmatch
    assert all(step(text) for text in ("15", "15s", " 10m ", "1.5h", "500ms", ""))
    assert not any(step(text) for text in ("15x", "-1m", "\u0661\u0665", "1e3"))


def test_the_fields_that_exclude_each_other_are_said_so() -> None:
    """A rollout's batch_size and batch_percent, and its command's target and node_selector,
    exclude each other in the document as in the server (null or "" is not given)."""
    document = _document()
    strategy = _schema_of(document, "RolloutStrategy")
    assert not strategy.is_valid({"batch_size": 2, "batch_percent": 10})
    for valid in ({"batch_size": 2}, {"batch_percent": 10}, {"batch_size": None, "batch_percent": 10}, {}):
        assert strategy.is_valid(valid), valid
    command = _schema_of(document, "RolloutCommand")
    assert not command.is_valid({"name": "node.drain", "target": "n1", "node_selector": "rack=r1"})
    assert command.is_valid({"name": "node.drain", "target": "", "node_selector": "rack=r1"})
    assert command.is_valid({"name": "node.drain", "target": "n1", "node_selector": None})
    assert not command.is_valid({"name": "node.drain", "node_selector": "rack in (r1"})


@pytest_twisted.ensureDeferred
async def test_lengths_are_counted_before_spaces_are_trimmed() -> None:
    """A parameter over its documented maxLength is 400 even when it is all spaces (it used to be
    trimmed to nothing first, then taken as "not given"); a step in another script's digits too."""
    api = _api()
    for path, code in (
        (f"/fleet/history?step={'+' * 33}", "invalid_step"),
        ("/fleet/history?step=%D9%A1%D9%A5", "invalid_step"),
        (f"/fleet/history?from={'+' * 65}", "invalid_range"),
        (f"/fleet/history?to={'+' * 65}", "invalid_range"),
        (f"/fleet/history?series={'+' * 1025}", "invalid_series"),
        (f"/fleet/history?model={'+' * 257}", "bad_request"),
        (f"/edges?q={'+' * 257}", "bad_request"),
    ):
        status, body = await _get(api, path)
        assert (status, body["error"]["code"]) == (400, code), path
    status, _ = await _get(api, f"/fleet/history?step={'+' * 32}&series={'+' * 1024}&model={'+' * 256}")
    assert status == 200
    # A whole number is ASCII digits, nothing around them (int() took "5\r" and other scripts' digits).
    for path in ("/edges", "/fleet/operations", "/rollouts", "/fleet/events", "/fleet/status"):
        for limit in ("5%0D", "+5", "1_0", "%D9%A5", "9" * 5000):
            status, body = await _get(api, f"{path}?limit={limit}")
            assert (status, body["error"]["code"]) == (400, "bad_request"), (path, limit)
        status, _ = await _get(api, f"{path}?limit=5")
        assert status == 200, path


@pytest_twisted.ensureDeferred
async def test_a_wrong_value_is_not_taken_for_a_missing_one() -> None:
    """null is "not given", but false, 0 or [] where a string or an object belongs is 400; an
    Idempotency-Key header over 200 characters is 400 even beside a body key; a number too
    large for a float is 400, and 2.0 where a whole number belongs is 2."""
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    registry.connect("edge-00", HeldEdgePeer(), HELLO)
    api: Any = StubTreq(_http(registry, EdgeGateway(registry, clock), clock).app.resource())
    json_type = {b"content-type": [b"application/json"]}
    long_key = {**json_type, b"idempotency-key": [b"k" * 201]}
    for path, body, headers in (
        ("/edges/edge-00/commands", {"name": "node.drain", "target": False}, json_type),
        # A command's name is bounded like a rollout's (one reading of a command body).
        ("/edges/edge-00/commands", {"name": "n" * (MAX_TEXT + 1)}, json_type),
        ("/edges/edge-00/commands", {"name": "node.drain", "arguments": []}, json_type),
        ("/edges/edge-00/commands", {"name": "node.drain", "idempotency_key": "k"}, long_key),
        ("/rollouts", {"command": {"name": "node.drain", "target": 0}, "selector": ""}, json_type),
        ("/rollouts", {"command": {"name": "node.drain", "node_selector": False}, "selector": ""}, json_type),
        ("/rollouts", {"command": {"name": "node.drain", "arguments": False}, "selector": ""}, json_type),
        ("/rollouts", {"command": {"name": "node.drain"}, "selector": "", "idempotency_key": "k"}, long_key),
        # An object where the latency figure's name belongs (it was a 500: a dict is no key).
        (
            "/rollouts",
            {
                "command": {"name": "node.drain"},
                "selector": "",
                "abort": {"latency": {"metric": {}, "max_increase_percent": 1}},
            },
            json_type,
        ),
    ):
        response = await api.post("http://cp" + path, data=json.dumps(body).encode(), headers=headers)
        answer = json.loads(await response.content())
        assert (response.code, answer["error"]["code"]) == (400, "bad_request"), (path, body, answer)
    # A number too large for a float is a 400 like any out-of-range one (it was a 500).
    huge = b'{"command": {"name": "node.drain"}, "selector": "", "wait_seconds": 1' + b"0" * 400 + b"}"
    response = await api.post("http://cp/rollouts", data=huge, headers=json_type)
    assert response.code == 400, await response.content()
    nulls = {"command": {"name": "node.drain", "target": None, "arguments": None}, "selector": "", "strategy": None}
    response = await api.post("http://cp/rollouts", data=json.dumps(nulls).encode(), headers=json_type)
    assert response.code == 201, await response.content()
    # 2.0 is the whole number 2 (JSON Schema's "integer" says so too).
    whole = {"command": {"name": "node.drain"}, "selector": "", "strategy": {"batch_size": 2.0, "max_in_flight": 3.0}}
    response = await api.post("http://cp/rollouts", data=json.dumps(whole).encode(), headers=json_type)
    assert response.code == 201, await response.content()
    assert json.loads(await response.content())["strategy"]["batch_size"] == 2
    whole["strategy"] = {"batch_size": 2.5}
    response = await api.post("http://cp/rollouts", data=json.dumps(whole).encode(), headers=json_type)
    assert response.code == 400
