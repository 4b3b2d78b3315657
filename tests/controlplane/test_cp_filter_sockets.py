"""Filtered views of a real Control Plane over real sockets, with scripted edges."""

from __future__ import annotations

from urllib.parse import quote

import pytest_twisted

from twisted_iop.testing.harness import contract_validator, eventually, start_control_plane
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge

#: edge id -> labels of its hello.
LABELS = {
    "eu-1": {"region": "eu", "tier": "prod"},
    "eu-2": {"region": "eu", "tier": "canary"},
    "eu-3": {"region": "eu", "tier": "prod", "gpu": "h100"},
    "us-1": {"region": "us", "tier": "prod"},
    "us-2": {"region": "us", "tier": "prod"},
}


def ids(body: dict[str, object]) -> list[str]:
    """The edge ids of a page."""
    return [item["edge_id"] for item in body["items"]]  # type: ignore[attr-defined]  # the body's items are a list of objects


@pytest_twisted.ensureDeferred
async def test_filtered_views_over_sockets_ask_only_matching_edges() -> None:
    """Selector, state and q filter both views; a filtered fleet round sends
    status requests only to the matching edges, and a silent one among them
    marks only its row (and is found by state=timeout)."""
    cp = await start_control_plane(
        config_text="http: {status_timeout_seconds: 0.3}\nstatus: {fleet_max_age_seconds: 0}"
    )
    edges: dict[str, ScriptedEdge] = {}
    try:
        for edge_id, labels in LABELS.items():
            edges[edge_id], _ = await connect_edge(cp.edge_wire_port, edge_id, labels=labels)
        edges["eu-3"].status = lambda: None  # silent: its rows time out
        edges["us-2"].tcp.loseConnection()
        await eventually(lambda: not cp.registry.get("us-2").connected, message="us-2 gone")

        code, page = await cp.get_json("/edges?selector=" + quote("region=eu,tier!=canary"))
        assert code == 200 and ids(page) == ["eu-1", "eu-3"] and page["total"] == 2
        contract_validator("EdgesPage").validate(page)
        _, page = await cp.get_json("/edges?state=disconnected")
        assert ids(page) == ["us-2"]
        _, page = await cp.get_json("/edges?q=US&state=connected")
        assert ids(page) == ["us-1"]

        code, fleet = await cp.get_json("/fleet/status?selector=" + quote("region=eu,tier=prod"))
        assert code == 200
        assert {r["edge_id"]: r["state"] for r in fleet["items"]} == {"eu-1": "ok", "eu-3": "timeout"}
        assert fleet["total"] == 2 and fleet["totals"]["edges_known"] == 2
        contract_validator("FleetStatus").validate(fleet)
        assert {e: edge.status_requests for e, edge in edges.items()} == {
            "eu-1": 1,
            "eu-2": 0,
            "eu-3": 1,
            "us-1": 0,
            "us-2": 0,
        }
        _, fleet = await cp.get_json("/fleet/status?state=timeout,disconnected")
        assert {r["edge_id"]: r["state"] for r in fleet["items"]} == {"eu-3": "timeout", "us-2": "disconnected"}
        _, fleet = await cp.get_json("/fleet/status?selector=tier%3Dprod&state=ok&limit=1")
        assert ids(fleet) == ["eu-1"] and fleet["next_cursor"] == "eu-1" and fleet["total"] == 2

        code, bad = await cp.get_json("/fleet/status?selector=" + quote("region in (eu"))
        assert code == 400 and bad["error"]["code"] == "invalid_selector"
        assert "position 13" in bad["error"]["message"]
        contract_validator("Error").validate(bad)
    finally:
        for edge in edges.values():
            edge.tcp.loseConnection()
        await cp.stop()
