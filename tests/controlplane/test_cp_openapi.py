"""The real Control Plane's answers against its own OpenAPI document.

A real Control Plane on loopback, fed by scripted edges, is driven into
every view and every error it documents; each answer is validated against
the schema that ``GET /openapi.json`` gives for that path, method and
status. An answer whose status the document does not list fails too, and
so does a route of the Klein app that the document does not describe.
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import pytest_twisted
import treq
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from twisted_iop.controlplane.http.errors import DOMAIN_ERRORS
from twisted_iop.controlplane.http.routes import ControlPlaneHttp
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.wires.peers import connect_edge, set_engine, set_launch, snapshot
from twisted_iop.wire import control_pb2 as pb

SPEC_URI = "urn:iop:openapi"


class Contract:
    """The OpenAPI document served by one Control Plane, as a validator."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._registry: Registry[Any] = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(document))
        self.checked: set[tuple[str, str, str]] = set()

    def schema_pointer(self, template: str, method: str, status: int) -> str:
        """The JSON pointer of the response schema; fails if the status is not documented."""
        operation = self.document["paths"][template][method]
        responses = operation["responses"]
        assert str(status) in responses, f"{method.upper()} {template} answered {status}, not documented"
        response = responses[str(status)]
        if "$ref" in response:
            name = response["$ref"].rsplit("/", 1)[-1]
            return f"/components/responses/{name}/content/application~1json/schema"
        escaped = template.replace("~", "~0").replace("/", "~1")
        return f"/paths/{escaped}/{method}/responses/{status}/content/application~1json/schema"

    def validate(self, template: str, method: str, status: int, body: Any) -> None:
        """Validate ``body`` against the documented schema; fail with every error found."""
        pointer = self.schema_pointer(template, method, status)
        validator = Draft202012Validator({"$ref": f"{SPEC_URI}#{pointer}"}, registry=self._registry)
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        assert not errors, f"{method.upper()} {template} {status}:\n" + "\n".join(
            f"  {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors
        )
        self.checked.add((template, method, str(status)))


_PARAM = re.compile(r"\{[^}]+\}")


def _template_of(contract: Contract, path: str) -> str:
    """The documented path template that ``path`` (without query) matches."""
    bare = path.split("?", 1)[0]
    for template in contract.document["paths"]:
        pattern = "^" + _PARAM.sub("[^/]+", re.escape(template).replace(r"\{", "{").replace(r"\}", "}")) + "$"
        if re.match(pattern, bare):
            return str(template)
    raise AssertionError(f"{bare} matches no documented path")


class Client:
    """Sends requests to a harness and validates every JSON answer."""

    def __init__(self, cp: ControlPlaneHarness, contract: Contract, token: Optional[str] = None) -> None:
        self.cp = cp
        self.contract = contract
        self.token = token

    async def call(
        self, method: str, path: str, body: Any = None, expect: Optional[int] = None, template: str = ""
    ) -> Any:
        """One request; validates the answer and returns the decoded JSON."""
        headers: dict[bytes | str, list[bytes | str]] = {b"Content-Type": [b"application/json"]}
        if self.token is not None:
            headers[b"Authorization"] = [b"Bearer " + self.token.encode()]
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        response = await treq.request(method, self.cp.http_url + path, data=data, headers=headers)
        content = await response.content()
        assert response.headers.getRawHeaders(b"content-type") == [b"application/json"], path
        document = json.loads(content)
        if expect is not None:
            assert response.code == expect, (path, response.code, document)
        self.contract.validate(template or _template_of(self.contract, path), method.lower(), response.code, document)
        return document


def _with_an_engine(response: pb.EdgeStatusResponse) -> pb.EdgeStatusResponse:
    """``response`` with an engine reading on its first node's provider (KV cache unknown), whose
    engine its Node launches and which crashed."""
    set_engine(response.nodes[0].providers[0], kv_cache_usage=-1.0, saturated=True)
    set_launch(response.nodes[0].providers[0])
    return response


async def contract_of(cp: ControlPlaneHarness) -> Contract:
    """Fetch the document the running Control Plane serves."""
    code, document = await cp.get_json("/openapi.json")
    assert code == 200 and document["openapi"].startswith("3.1")
    return Contract(document)


def test_document_schemas_are_valid_json_schema() -> None:
    """Every component schema of the packaged document is valid JSON Schema 2020-12."""
    from importlib import resources

    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    for name, schema in document["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)
        assert name  # names are what $refs point at
    assert document["jsonSchemaDialect"] == "https://json-schema.org/draft/2020-12/schema"


def test_every_route_is_documented_and_every_documented_path_is_a_route() -> None:
    """The Klein routes and the document's paths are the same set (the catch-all 404 and branch files aside)."""
    from importlib import resources

    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    routes: set[tuple[str, str]] = set()
    for rule in ControlPlaneHttp.app.url_map.iter_rules():
        if rule.rule == "/<path:rest>" or rule.rule.endswith("<path:__rest__>"):
            continue  # the JSON 404 catch-all, and the files below a branch route
        template = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for method in rule.methods or ():
            if method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
                routes.add((template, method.lower()))
    documented = {(path, method) for path, ops in document["paths"].items() for method in ops}
    assert routes == documented


def test_every_domain_error_code_is_documented_with_its_status() -> None:
    """Each code of http_errors.DOMAIN_ERRORS is in the error enum and some view documents its status."""
    from importlib import resources

    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    codes = document["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"]
    statuses = {status for ops in document["paths"].values() for op in ops.values() for status in op["responses"]}
    for status, code in DOMAIN_ERRORS.values():
        assert code in codes
        assert str(status) in statuses, (status, code)
    for code in ("bad_request", "invalid_json", "internal", "idempotency_conflict", "edge_superseded"):
        assert code in codes


@pytest_twisted.ensureDeferred
async def test_empty_fleet_and_request_errors_match_the_document() -> None:
    """With no edge: health, readiness, lists, fleet views, console config, 400s and 404s validate."""
    cp = await start_control_plane()
    try:
        contract = await contract_of(cp)
        client = Client(cp, contract)
        assert (await client.call("GET", "/healthz", expect=200)) == {"status": "ok"}
        assert (await client.call("GET", "/readyz", expect=200))["ready"] is True
        assert (await client.call("GET", "/edges", expect=200)) == {"items": [], "total": 0, "next_cursor": None}
        fleet = await client.call("GET", "/fleet/status", expect=200)
        assert fleet["items"] == [] and fleet["totals"]["edges_known"] == 0
        assert (await client.call("GET", "/fleet/events", expect=200))["items"] == []
        assert (await client.call("GET", "/fleet/operations", expect=200))["total"] == 0
        assert "wire_url" in await client.call("GET", "/console/config.json", expect=200)
        for path in ("/edges?limit=0", "/edges?limit=x", "/fleet/events?since=-1", "/fleet/status?limit=0"):
            assert (await client.call("GET", path, expect=400))["error"]["code"] == "bad_request"
        for path in (
            "/edges/nope",
            "/edges/nope/status",
            "/edges/nope/events",
            "/edges/nope/operations",
            "/edges/nope/operations/x",
            "/edges/nope/commands",
        ):
            assert (await client.call("GET", path, expect=404))["error"]["code"] == "unknown_edge"
        error = await client.call("POST", "/edges/nope/commands", {"name": "x"}, expect=404)
        assert error["error"]["code"] == "unknown_edge"
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_authorization_errors_match_the_document() -> None:
    """With an API token: no token is 401, a wrong one 403, the right one 200; health needs none."""
    cp = await start_control_plane(config_text="http:\n  api_token: s3cret\n")
    try:
        contract = await contract_of(cp)
        anonymous, wrong, right = Client(cp, contract), Client(cp, contract, "nope"), Client(cp, contract, "s3cret")
        for path in ("/edges", "/edges/edge-a", "/fleet/status", "/fleet/events", "/fleet/operations"):
            assert (await anonymous.call("GET", path, expect=401))["error"]["code"] == "unauthorized"
            assert (await wrong.call("GET", path, expect=403))["error"]["code"] == "forbidden"
        await anonymous.call("POST", "/edges/edge-a/commands", {"name": "x"}, expect=401)
        await right.call("GET", "/edges", expect=200)
        await anonymous.call("GET", "/healthz", expect=200)
        assert (await anonymous.call("GET", "/console/config.json", expect=200))["api_token_required"] is True
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_connected_edge_views_and_commands_match_the_document() -> None:
    """A connected edge: detail, status, events, catalog, and commands that succeed, are rejected, time out."""
    cp = await start_control_plane(config_text="http:\n  max_body_bytes: 1024\n")
    try:
        contract = await contract_of(cp)
        client = Client(cp, contract)
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        assert (await client.call("GET", "/edges", expect=200))["total"] == 1
        detail = await client.call("GET", "/edges/edge-a", expect=200)
        assert detail["connected"] is True and "last_sequence" in detail["events"]
        status = await client.call("GET", "/edges/edge-a/status", expect=200)
        assert [n["node_id"] for n in status["nodes"]] == ["node-1", "node-2"]
        edge.status = lambda: _with_an_engine(snapshot("edge-a"))
        status = await client.call("GET", "/edges/edge-a/status", expect=200)
        assert [n["providers"][0]["engine"] is None for n in status["nodes"]] == [False, True]
        catalog = await client.call("GET", "/edges/edge-a/commands", expect=200)
        assert "node.drain" in [c["name"] for c in catalog["commands"]]

        path = "/edges/edge-a/commands"
        done = await client.call("POST", path, {"name": "node.drain", "target": "node-1", "idempotency_key": "k1"})
        assert done["state"] == "succeeded" and done["idempotency_key"] == "k1"
        again = await client.call("POST", path, {"name": "node.drain", "target": "node-1", "idempotency_key": "k1"})
        assert again["operation_id"] == done["operation_id"]
        edge.command_behaviour = "reject"
        rejected = await client.call("POST", path, {"name": "node.undrain", "target": "node-1"}, expect=200)
        assert rejected["state"] == "rejected" and rejected["reason"]
        edge.command_behaviour = "silent"
        timed_out = await client.call("POST", path, {"name": "node.drain", "timeout_seconds": 0.2}, expect=504)
        assert timed_out["error"]["code"] == "edge_timeout" and timed_out["operation"]["state"] == "timed_out"
        unknown = await client.call("POST", path, {"name": "gpu.melt"}, expect=400)
        assert unknown["error"]["code"] == "unknown_command"
        assert (await client.call("POST", path, b"{nope", expect=400))["error"]["code"] == "invalid_json"
        assert (await client.call("POST", path, {"name": ""}, expect=400))["error"]["code"] == "bad_request"
        big = {"name": "node.drain", "arguments": {"x": "y" * 2000}}
        assert (await client.call("POST", path, big, expect=413))["error"]["code"] == "body_too_large"

        operations = await client.call("GET", "/edges/edge-a/operations", expect=200)
        assert operations["total"] == 3
        one = await client.call("GET", f"/edges/edge-a/operations/{done['operation_id']}", expect=200)
        assert [h["state"] for h in one["history"]][-1] == "succeeded"
        missing = await client.call("GET", "/edges/edge-a/operations/nope", expect=404)
        assert missing["error"]["code"] == "not_found"
        await client.call("GET", "/edges/edge-a/operations?cursor=nope", expect=400)
        events = await client.call("GET", "/edges/edge-a/events?limit=500", expect=200)
        assert "operation.timed_out" in [e["kind"] for e in events["items"]]
        assert (await client.call("GET", "/fleet/operations", expect=200))["total"] == 3
        assert (await client.call("GET", "/fleet/events", expect=200))["items"]

        edge.command_behaviour = "disconnect"
        gone = await client.call("POST", path, {"name": "node.drain"}, expect=503)
        assert gone["error"]["code"] == "edge_disconnected" and gone["operation"]["state"] == "edge_disconnected"
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_frozen_and_disconnected_edges_match_the_document() -> None:
    """A frozen edge times out (row error object, 504); a gone edge is a 409 with its stale snapshot."""
    cp = await start_control_plane(config_text="http:\n  status_timeout_seconds: 0.3\n")
    try:
        contract = await contract_of(cp)
        client = Client(cp, contract)
        live, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        frozen, _ = await connect_edge(cp.edge_wire_port, "edge-b")
        gone, _ = await connect_edge(cp.edge_wire_port, "edge-c")
        await client.call("GET", "/edges/edge-c/status", expect=200)
        assert gone.transport is not None
        gone.tcp.loseConnection()
        await gone.lost
        await eventually(lambda: not cp.registry.get("edge-c").connected, timeout=5, message="edge-c gone")
        frozen.status = lambda: None

        fleet = await client.call("GET", "/fleet/status", expect=200)
        rows = {row["edge_id"]: row for row in fleet["items"]}
        assert rows["edge-a"]["state"] == "ok" and rows["edge-a"]["error"] is None
        assert rows["edge-b"]["state"] == "timeout" and rows["edge-b"]["stale"] is True
        assert rows["edge-b"]["error"]["code"] == "edge_timeout" and rows["edge-b"]["error"]["message"]
        assert rows["edge-c"]["state"] == "disconnected" and rows["edge-c"]["error"] is None
        assert fleet["totals"]["edges_connected"] == 2

        timeout = await client.call("GET", "/edges/edge-b/status", expect=504)
        assert timeout["error"]["code"] == "edge_timeout"
        stale = await client.call("GET", "/edges/edge-c/status", expect=409)
        assert stale["error"]["code"] == "edge_not_connected" and stale["snapshot"]["stale"] is True
        detail = await client.call("GET", "/edges/edge-c", expect=200)
        assert detail["disconnected_at"] is not None and detail["status"]["stale"] is True
        refused = await client.call("POST", "/edges/edge-c/commands", {"name": "node.drain"}, expect=409)
        assert refused["error"]["code"] == "edge_not_connected"
        assert live.transport is not None
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_edge_that_never_sent_a_snapshot_is_409_with_null_snapshot() -> None:
    """A known edge that left before any status: 409 with ``snapshot: null``, as documented."""
    cp = await start_control_plane()
    try:
        client = Client(cp, await contract_of(cp))
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        assert edge.transport is not None
        edge.tcp.loseConnection()
        await edge.lost
        await eventually(lambda: not cp.registry.get("edge-a").connected, timeout=5, message="edge gone")
        answer = await client.call("GET", "/edges/edge-a/status", expect=409)
        assert answer["snapshot"] is None
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_openapi_document_is_served_as_packaged() -> None:
    """GET /openapi.json answers the packaged file byte for byte, without a token."""
    from importlib import resources

    cp = await start_control_plane(config_text="http:\n  api_token: s3cret\n")
    try:
        response = await treq.get(cp.http_url + "/openapi.json")
        assert response.code == 200
        packaged = resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_bytes()
        assert await response.content() == packaged
    finally:
        await cp.stop()


#: Samples every 0.2 s, a 0.4 s and a 2 s tier.
HISTORY_CONFIG = (
    "history:\n  interval_seconds: 0.2\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 0.4, keep_hours: 1}\n  - {step_seconds: 2, keep_hours: 2}\n"
)


@pytest_twisted.ensureDeferred
async def test_history_views_and_their_errors_match_the_document() -> None:
    """Real samples of real edges: the fleet, an edge, a model, a selector, a rolled-up tier and every 400."""
    cp = await start_control_plane(config_text=HISTORY_CONFIG)
    try:
        client = Client(cp, await contract_of(cp))
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        edge.status = lambda: _with_an_engine(snapshot("edge-a"))
        await connect_edge(cp.edge_wire_port, "edge-b")
        history = cp.service.history
        await eventually(lambda: history.samples >= 4, timeout=10, message="four samples")
        fleet = await client.call("GET", "/fleet/history?from=-60s", expect=200)
        assert fleet["series"] == "fleet" and fleet["rolled_up"] is False and fleet["step_seconds"] == 0.2
        assert fleet["columns"][0] == "t" and fleet["columns"][1:] == fleet["fields"]
        capacity = fleet["columns"].index("capacity")
        assert len(fleet["points"]) >= 3 and fleet["points"][-1][capacity] == 16
        assert fleet["models"] == ["llama-3-8b"]
        one = await client.call("GET", "/edges/edge-a/history?from=-60s&series=in_flight,engine_running", expect=200)
        assert one["fields"] == ["in_flight", "engine_running"] and one["edge_id"] == "edge-a"
        assert one["points"][-1][1:] == [2, 1]
        other = await client.call("GET", "/edges/edge-b/history?from=-60s&series=engine_running", expect=200)
        assert other["points"][-1][1] is None  # no engine reading: null, not 0
        model = await client.call(
            "GET", "/fleet/history?from=-60s&model=llama-3-8b&series=providers,in_flight", expect=200
        )
        assert model["series"] == "model:llama-3-8b" and model["points"][-1][1:] == [4, 4]
        edge_model = await client.call("GET", "/edges/edge-a/history?model=llama-3-8b", expect=200)
        assert edge_model["series"] == "edge:edge-a/model:llama-3-8b"
        chosen = await client.call("GET", "/fleet/history?from=-60s&selector=site%3Dtest&series=capacity", expect=200)
        assert chosen["selector"] == "site=test" and chosen["edges"] == 2 and chosen["points"][-1][1] == 16
        rolled = await client.call("GET", "/fleet/history?step=0.4&series=in_flight,engine_running", expect=200)
        assert rolled["rolled_up"] is True
        assert rolled["columns"] == [
            "t",
            "count",
            "in_flight.mean",
            "in_flight.max",
            "in_flight.last",
            "engine_running.mean",
            "engine_running.max",
            "engine_running.last",
        ]
        assert rolled["points"] and rolled["points"][-1][2:5] == [4, 4, 4]
        coarse = await client.call("GET", "/fleet/history?from=-2d", expect=200)
        assert coarse["step_seconds"] == 2 and coarse["rolled_up"] is True
        for path, code in (
            ("/fleet/history?from=yesterday", "invalid_range"),
            ("/fleet/history?from=now&to=-1h", "invalid_range"),
            ("/fleet/history?step=7s", "invalid_step"),
            ("/fleet/history?series=gpus", "invalid_series"),
            ("/fleet/history?model=llama-3-8b&series=nodes_connected", "invalid_series"),
            ("/fleet/history?selector=a%20in%20(", "invalid_selector"),
            ("/edges/edge-a/history?step=x", "invalid_step"),
        ):
            assert (await client.call("GET", path, expect=400))["error"]["code"] == code, path
        assert (await client.call("GET", "/edges/nope/history", expect=404))["error"]["code"] == "unknown_edge"
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_slo_views_and_their_errors_match_the_document() -> None:
    """Every documented status of /slos and /slos/{name}, over the real site: 201, 200, 400, 404, 409."""
    cp = await start_control_plane(config_text="slos:\n  max_slos: 1\n")
    try:
        client = Client(cp, await contract_of(cp))
        body = {"metric": "ttft", "percentile": 95, "objective_seconds": 0.5, "model": "llama-3-8b"}
        made = await client.call("PUT", "/slos/chat-ttft", body, expect=201)
        assert made["spec"]["window"] == "30d"
        await client.call("PUT", "/slos/chat-ttft", body, expect=200)
        await client.call("PUT", "/slos/other", body, expect=409)
        bad = await client.call("PUT", "/slos/chat-ttft", {**body, "window": "forever"}, expect=400)
        assert bad["error"]["code"] == "invalid_slo" and "'window'" in bad["error"]["message"]
        await client.call("PUT", "/slos/chat-ttft", b"[", expect=400)
        listed = await client.call("GET", "/slos", expect=200)
        assert listed["total"] == 1
        await client.call("GET", "/slos/chat-ttft", expect=200)
        await client.call("DELETE", "/slos/chat-ttft", expect=200)
        await client.call("GET", "/slos/chat-ttft", expect=404)
        await client.call("DELETE", "/slos/chat-ttft", expect=404)
    finally:
        await cp.stop()
