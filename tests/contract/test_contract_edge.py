"""The Edge's inference API (OpenAI's subset) against its own OpenAPI document.

An Edge started with ``twistd -n iop-edge`` with an API key, two Nodes with
the built-in mock provider (answers without a pause), then ``st run`` on the
Edge's ``GET /openapi.json`` (served without a key) with the key: every check
but ``ignored_auth``, all four phases, a fixed seed; it must find nothing.
Without the key, every route of the document but ``/openapi.json`` answers
401 ``invalid_api_key``. What the run accepts beyond the document is in
``edge.toml`` beside this file; docs/http-api.md#contract-checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
import pytest_twisted
import treq

from twisted_iop.testing.configs import MODEL, gateway_edge_yaml, gateway_node_yaml, mock_provider, write_yaml
from twisted_iop.testing.contract import operations, run_schemathesis
from twisted_iop.testing.harness import Daemon, eventually, start_daemon, wait_for_ports
from twisted_iop.testing.http import get_json

pytestmark = pytest.mark.e2e

API_KEY = "contract-edge-key-0123456789"
SETTINGS = Path(__file__).parent / "edge.toml"
SEED = 28
#: Cases per operation and phase: well under a minute on two cores.
MAX_EXAMPLES = 100
JSON: dict[bytes | str, bytes | str] = {"Content-Type": "application/json"}
#: Path parameters of the sweep.
PATH_VALUES = {"model": MODEL}


@attrs.define
class EdgeFleet:
    """The Edge, its Nodes and the inference API's URL."""

    api: str
    edge: Daemon
    work: Path


@pytest_twisted.async_yield_fixture(scope="module")
async def fleet(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EdgeFleet]:
    """An Edge with an API key (no Control Plane: the inference path does not need one) and two
    Nodes whose mock providers answer at once; a long-context lease on one of them."""
    work = tmp_path_factory.mktemp("contract-edge")
    daemons: list[Daemon] = []
    try:
        config = gateway_edge_yaml(inference={"api_keys": [API_KEY]}, capacity=4, long_context_capacity=1)
        edge = start_daemon(["iop-edge", "--config", write_yaml(work / "edge.yaml", config)], work, name="edge")
        daemons.append(edge)
        ports = await wait_for_ports(edge, {"node_server", "inference"})
        for node_id, provider_id in (("node-1", "p1"), ("node-2", "p2")):
            node = gateway_node_yaml(node_id, ports["node_server"], mock_provider(provider_id, tokens_per_second=0))
            path = write_yaml(work / f"{node_id}.yaml", node)
            daemons.append(start_daemon(["iop-node", "--config", path], work, name=node_id))
        api = f"http://127.0.0.1:{ports['inference']}"
        await eventually(lambda: _serves_model(api), timeout=30, interval=0.1, message=f"{MODEL} served")
        yield EdgeFleet(api, edge, work)
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


async def _serves_model(api: str) -> bool:
    """Whether ``GET /v1/models`` lists the model."""
    code, body = await get_json(api + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
    return code == 200 and [m["id"] for m in body["data"]] == [MODEL]


@pytest_twisted.ensureDeferred
async def test_schemathesis_finds_nothing(fleet: EdgeFleet) -> None:
    """st run with the key: every check, all four phases, a fixed seed, no failure and no error;
    every operation of the document is tested, and the Edge logged no traceback."""
    code, document = await get_json(fleet.api + "/openapi.json")
    assert code == 200 and document["openapi"].startswith("3.1")
    run = await run_schemathesis(
        fleet.api + "/openapi.json",
        fleet.work,
        settings=SETTINGS,
        token=API_KEY,
        seed=SEED,
        max_examples=MAX_EXAMPLES,
    )
    print(run.summary("edge"))
    assert run.exit_code == 0, run.output[-20000:]
    assert (run.failures, run.errors, run.failed_checks) == (0, 0, 0), run.output[-20000:]
    # /openapi.json is the run's own source, which schemathesis does not test.
    assert run.operations == len(operations(document)) - 1
    assert run.cases > 0 and run.checks > run.cases
    assert fleet.edge.running()
    assert "Traceback" not in fleet.edge.log()


@pytest_twisted.ensureDeferred
async def test_every_route_but_the_document_needs_the_key(fleet: EdgeFleet) -> None:
    """Without the key every documented route but /openapi.json answers 401 invalid_api_key in
    OpenAI's error shape, with WWW-Authenticate; the document marks only itself public."""
    code, document = await get_json(fleet.api + "/openapi.json")
    assert code == 200
    documented = operations(document)
    assert {path for path, _, operation in documented if operation.get("security") == []} == {"/openapi.json"}
    refused = 0
    for path, method, _ in documented:
        if path == "/openapi.json":
            continue
        filled = re.sub(r"\{(\w+)\}", lambda match: PATH_VALUES[match.group(1)], path)
        data = json.dumps({"model": MODEL}).encode() if method == "post" else None
        response = await treq.request(method.upper(), fleet.api + filled, data=data, headers=JSON, timeout=10)
        body = json.loads(await response.content())
        assert response.code == 401, (method, path, body)
        assert body["error"]["code"] == "invalid_api_key", (method, path)
        assert response.headers.getRawHeaders(b"www-authenticate") == [b'Bearer realm="iop-edge"'], (method, path)
        refused += 1
    assert refused == len(documented) - 1 >= 5
