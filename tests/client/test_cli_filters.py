"""Filtered views from the client side: the repository's selector/state/q and
``iopctl edges|fleet -l/--selector --state --q``, against a real Control
Plane with scripted edges over real sockets."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, parse_arguments, run
from twisted_iop.client.errors import InvalidSelectorError, InvalidStateError
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge

LABELS = {
    "eu-1": {"region": "eu", "tier": "prod"},
    "eu-2": {"region": "eu", "tier": "canary"},
    "us-1": {"region": "us", "tier": "prod"},
    "us-2": {"region": "us", "tier": "prod"},
}


@pytest_twisted.async_yield_fixture
async def control_plane() -> AsyncIterator[tuple[ControlPlaneHarness, dict[str, ScriptedEdge]]]:
    """A real Control Plane with :data:`LABELS`' edges; us-2 disconnected."""
    cp = await start_control_plane(config_text="status: {fleet_max_age_seconds: 0}")
    edges: dict[str, ScriptedEdge] = {}
    try:
        for edge_id, labels in LABELS.items():
            edges[edge_id], _ = await connect_edge(cp.edge_wire_port, edge_id, labels=labels)
        edges["us-2"].tcp.loseConnection()
        await eventually(lambda: not cp.registry.get("us-2").connected, message="us-2 gone")
        yield cp, edges
    finally:
        for edge in edges.values():
            edge.tcp.loseConnection()
        await cp.stop()


async def iopctl(cp: ControlPlaneHarness, *argv: str) -> tuple[int, str, str]:
    """Run iopctl against ``cp``; exit code, stdout, stderr."""
    args = parse_arguments(list(argv))
    repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
    out, err = io.StringIO(), io.StringIO()

    def no_wire(_: Any) -> Any:
        raise AssertionError("no wire needed")

    code = await run(reactor, args, repository, no_wire, out, err)
    return code, out.getvalue(), err.getvalue()


@pytest_twisted.ensureDeferred
async def test_repository_filters_and_pages(control_plane: Any) -> None:
    """The repository sends selector, state (a string or a list) and q; the
    answers are filtered, totals of the filtered set; bad filters raise typed errors."""
    cp, edges = control_plane
    repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
    page = await repository.edges(selector="region=eu", limit=1)
    assert [e.edge_id for e in page.items] == ["eu-1"] and page.total == 2 and page.next_cursor == "eu-1"
    every = await repository.all_edges(selector="tier=prod", state=["connected"])
    assert [e.edge_id for e in every.items] == ["eu-1", "us-1"]
    assert [e.edge_id for e in (await repository.all_edges(q="US", state="disconnected")).items] == ["us-2"]
    fleet = await repository.full_fleet_status(selector="tier=prod", state="ok,disconnected")
    assert [r.edge_id for r in fleet.items] == ["eu-1", "us-1", "us-2"] and fleet.total == 3
    assert edges["eu-2"].status_requests == 0
    with pytest.raises(InvalidSelectorError) as bad:
        await repository.edges(selector="region in eu")
    assert "position 10" in bad.value.message and bad.value.status == 400
    with pytest.raises(InvalidStateError):
        await repository.fleet_status(state="sleepy")


@pytest_twisted.ensureDeferred
async def test_iopctl_edges_and_fleet_take_filters(control_plane: Any) -> None:
    """-l/--selector, --state and --q narrow both commands' tables and JSON."""
    cp, edges = control_plane
    code, out, _ = await iopctl(cp, "edges", "-l", "region=eu,tier!=canary")
    assert code == EXIT_OK and "eu-1" in out and "eu-2" not in out and "us-1" not in out
    code, out, _ = await iopctl(cp, "--json", "edges", "--state", "disconnected")
    assert code == EXIT_OK and [e["edge_id"] for e in json.loads(out)["items"]] == ["us-2"]
    code, out, _ = await iopctl(cp, "fleet", "--selector", "region=us", "--state", "connected", "--json")
    body = json.loads(out)
    assert code == EXIT_OK and [r["edge_id"] for r in body["items"]] == ["us-1"]
    assert body["totals"]["edges_known"] == 1
    assert [edge.status_requests for edge in edges.values()] == [0, 0, 1, 0]
    code, out, _ = await iopctl(cp, "fleet", "--q", "eu-")
    assert code == EXIT_OK and "eu-1" in out and "eu-2" in out and "us-1" not in out
    code, _, err = await iopctl(cp, "edges", "-l", "!")
    assert code == EXIT_ERROR and err.startswith("iopctl: invalid_selector: ") and "position 1" in err
    code, _, err = await iopctl(cp, "fleet", "--state", "asleep")
    assert code == EXIT_ERROR and "invalid_state" in err
