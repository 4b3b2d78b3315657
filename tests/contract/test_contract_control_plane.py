"""The Control Plane's HTTP API against its own OpenAPI document, from outside.

A Control Plane started with ``twistd -n iop-control-plane`` and API tokens
(an operator and a viewer), two Edges started the same way (one with two
Nodes, one whose Nodes never come), then:

* ``st run`` (schemathesis) on its ``/openapi.json`` with the operator
  token: every check but ``ignored_auth``, the examples, coverage, fuzzing
  and stateful phases, a fixed seed; it must find nothing;
* without a token, every route of the document but the public ones
  (``/healthz``, ``/readyz``, ``/openapi.json``, the console's files) must
  answer 401, and with the viewer token every write 403; the routes come
  from the served document, so a new route is covered as it is added.

What the run accepts beyond the document (and why) is in
``control-plane.toml`` beside this file; docs/http-api.md#contract-checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
import treq

from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV, edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.contract import operations, run_schemathesis
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import get_json

pytestmark = pytest.mark.e2e

OPERATOR_TOKEN = "contract-operator-token-0123456789"
VIEWER_TOKEN = "contract-viewer-token-0123456789"
SETTINGS = Path(__file__).parent / "control-plane.toml"
#: Fixed, so a failure is found again by the same run (``st replay`` its case).
SEED = 28
#: Cases per operation and phase: about a minute on two cores.
MAX_EXAMPLES = 60
#: The routes anyone may read with tokens configured (docs/security.md).
PUBLIC = {"/healthz", "/readyz", "/openapi.json", "/", "/console", "/console/", "/console/config.json"}
#: What a path parameter is filled with in the sweep (a real edge, ids that name nothing).
PATH_VALUES = {"edge_id": "edge-a", "operation_id": "0" * 32, "rollout_id": "0" * 32, "name": "contract-slo"}

CONFIG = f"""\
http:
  tokens:
    - {{name: contract-operator, role: operator, token: {OPERATOR_TOKEN}}}
    - {{name: contract-viewer, role: viewer, token: {VIEWER_TOKEN}}}
  status_timeout_seconds: 2
store:
  backend: memory
"""


@attrs.define
class ControlPlaneFleet:
    """The daemons of the run and the Control Plane's HTTP URL."""

    http: str
    cp: Daemon
    daemons: list[Daemon]
    work: Path


@pytest_twisted.async_yield_fixture(scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ControlPlaneFleet]:
    """A Control Plane with tokens, edge-a (two Nodes, connected) and edge-b (its Nodes never come)."""
    work = tmp_path_factory.mktemp("contract-control-plane")
    (work / "control-plane.yaml").write_text(CONFIG)
    daemons: list[Daemon] = []
    try:
        cp = start_daemon(
            ["iop-control-plane", "--config", str(work / "control-plane.yaml")],
            work,
            env=CONTROL_PLANE_LOOPBACK_ENV,
            name="cp",
        )
        daemons.append(cp)
        ports = await wait_for_ports(cp, {"http", "edge_wire"})
        wire = f"127.0.0.1:{ports['edge_wire']}"
        edges = {}
        for edge_id in ("edge-a", "edge-b"):
            config = write_yaml(work / f"{edge_id}.yaml", edge_yaml(wire, edge_id=edge_id))
            edges[edge_id] = start_daemon(["iop-edge", "--config", config], work, name=edge_id)
            daemons.append(edges[edge_id])
        node_port = (await wait_for_ports(edges["edge-a"], {"node_server"}))["node_server"]
        for node_id in ("node-1", "node-2"):
            config = write_yaml(work / f"{node_id}.yaml", node_yaml(node_id, node_port))
            daemons.append(start_daemon(["iop-node", "--config", config], work, name=node_id))
        http = f"http://127.0.0.1:{ports['http']}"
        await eventually(lambda: _fleet_ready(http), timeout=30, interval=0.1, message="both edges and edge-a's nodes")
        yield ControlPlaneFleet(http, cp, daemons, work)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


async def _fleet_ready(http: str) -> bool:
    """Both edges connected and both of edge-a's Nodes connected."""
    auth = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    code, edges = await get_json(http + "/edges", headers=auth, timeout=5)
    if code != 200 or {e["edge_id"] for e in edges["items"] if e["connected"]} != {"edge-a", "edge-b"}:
        return False
    code, status = await get_json(http + "/edges/edge-a/status", headers=auth, timeout=5)
    return code == 200 and all(node["connected"] for node in status["nodes"])


@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing(fleet: ControlPlaneFleet) -> None:
    """st run with the operator token: every check, all four phases, a fixed seed, no failure and no error;
    every operation of the document is tested, and the Control Plane logged no traceback."""
    code, document = await get_json(fleet.http + "/openapi.json")
    assert code == 200
    run = await run_schemathesis(
        fleet.http + "/openapi.json",
        fleet.work,
        settings=SETTINGS,
        token=OPERATOR_TOKEN,
        seed=SEED,
        max_examples=MAX_EXAMPLES,
    )
    print(run.summary("control plane"))
    assert run.exit_code == 0, run.output[-20000:]
    assert (run.failures, run.errors, run.failed_checks) == (0, 0, 0), run.output[-20000:]
    # /openapi.json is the run's own source, which schemathesis does not test.
    assert run.operations == len(operations(document)) - 1
    assert run.cases > 0 and run.checks > run.cases
    assert fleet.cp.running()
    assert "Traceback" not in fleet.cp.log()


@pytest_twisted.ensureDeferred
async def test_every_route_but_the_public_ones_needs_a_token(fleet: ControlPlaneFleet) -> None:
    """Without a token every documented route but the public ones answers 401 unauthorized (with
    WWW-Authenticate), the public ones answer, and the document marks exactly those public."""
    code, document = await get_json(fleet.http + "/openapi.json")
    assert code == 200
    documented = operations(document)
    marked_public = {path for path, _, operation in documented if operation.get("security") == []}
    assert marked_public == PUBLIC
    refused = []
    for path, method, _ in documented:
        response, body = await _call(fleet.http, method, path)
        if path in PUBLIC:
            assert response.code in (200, 302), (method, path, response.code)
            continue
        assert response.code == 401, (method, path, response.code, body)
        assert json.loads(body)["error"]["code"] == "unauthorized", (method, path)
        assert response.headers.getRawHeaders(b"www-authenticate") == [b'Bearer realm="iop"'], (method, path)
        refused.append((method, path))
    assert len(refused) == len(documented) - len(PUBLIC) >= 20


@pytest_twisted.ensureDeferred
async def test_a_viewer_token_may_not_write(fleet: ControlPlaneFleet) -> None:
    """With the viewer token every documented POST answers 403 forbidden, before its body is read."""
    code, document = await get_json(fleet.http + "/openapi.json")
    assert code == 200
    writes = [(path, method) for path, method, _ in operations(document) if method == "post"]
    assert len(writes) >= 5
    for path, method in writes:
        response, body = await _call(fleet.http, method, path, token=VIEWER_TOKEN)
        assert response.code == 403, (method, path, response.code, body)
        assert json.loads(body)["error"]["code"] == "forbidden", (method, path)


async def _call(http: str, method: str, template: str, token: str = "") -> tuple[Any, bytes]:
    """``method`` on ``template`` with its path parameters filled in; a JSON ``{}`` body for writes."""
    path = re.sub(r"\{(\w+)\}", lambda match: PATH_VALUES[match.group(1)], template)
    headers: dict[bytes | str, bytes | str] = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = b"{}" if method == "post" else None
    response = await treq.request(
        method.upper(), http + path, headers=headers, data=data, allow_redirects=False, timeout=10
    )
    return response, await response.content()
