"""Deployments end to end: a real Control Plane, two real Edges each with a real Node whose only
providers come from deployments (the mock engine profile launching ``iop-mock-provider``).

PUT /deployments/chat selecting site=lab: the lab edge's node starts the engine, the rollup reaches
ready, and a chat completion through that edge answers; a parameter change restarts it once; a
Control Plane restart keeps the deployment and restarts no engine; a value out of bounds is named
by a dry run and refused by the Node; DELETE stops the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import pytest_twisted
import treq

from twisted_iop.testing.deployments import READY_SECONDS, DeploymentSite, start_site
from twisted_iop.testing.engines.launch import alive
from twisted_iop.testing.harness import (
    ControlPlaneHarness,
    contract_validator,
    eventually,
    start_control_plane,
    stop,
)
from twisted_iop.testing.http import chat, post

CHAT = {
    "model": "m1",
    "profile": "mock",
    "parameters": {"tokens_per_second": 100},
    "edge_selector": "site=lab",
    "replicas_per_edge": 1,
    "capacity": 4,
}


def _valid(schema: str, body: Any) -> Any:
    errors = list(contract_validator(schema).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


async def _call(cp: ControlPlaneHarness, method: str, path: str, body: Optional[dict[str, Any]] = None) -> Any:
    response = await treq.request(method, cp.http_url + path, json=body, timeout=10)
    return response.code, await response.json()


async def _deployment(cp: ControlPlaneHarness, name: str = "chat") -> Any:
    code, body = await _call(cp, "GET", f"/deployments/{name}")
    assert code == 200, body
    return _valid("Deployment", body)


async def _ready(cp: ControlPlaneHarness, generation: int) -> Any:
    """Wait until chat is ready on its one edge at ``generation``; its view."""
    seen: dict[str, Any] = {}

    async def ready() -> bool:
        body = seen["body"] = await _deployment(cp)
        edges = body["edges"]["items"]
        return (
            body["rollup"]["desired"] == 1
            and body["rollup"]["ready"] == 1
            and bool(edges)
            and edges[0]["observed_generation"] == generation
        )

    await eventually(ready, timeout=READY_SECONDS, interval=0.2, message=f"chat ready at generation {generation}")
    return seen["body"]


@pytest_twisted.ensureDeferred
async def test_a_deployment_serves_changes_once_survives_a_restart_and_stops(tmp_path: Path) -> None:
    """The whole life of a deployment over real daemons (see the module docstring)."""
    store = f"store:\n  backend: sqlite\n  path: {tmp_path / 'cp.sqlite'}\n"
    cp = await start_control_plane(config_text=store)
    sites: list[DeploymentSite] = []
    try:
        lab = await start_site(tmp_path, cp, "edge-lab", "lab")
        other = await start_site(tmp_path, cp, "edge-other", "other")
        sites += [lab, other]
        await eventually(
            lambda: all(cp.registry.get(e).connected for e in ("edge-lab", "edge-other")),
            timeout=10,
            message="both edges enrolled",
        )
        code, body = await _call(cp, "PUT", "/deployments/chat", CHAT)
        assert code == 201, body
        assert (_valid("Deployment", body)["generation"], body["changed"]) == (1, True)
        shown = await _ready(cp, 1)
        (edge,) = shown["edges"]["items"]
        assert edge["edge_id"] == "edge-lab"
        assert [(i["instance_id"], i["node_id"], i["state"]) for i in edge["instances"]] == [
            ("chat-1", "node-1", "ready")
        ]
        assert edge["instances"][0]["spec_hash"] == shown["spec_hash"]
        answer = await post(lab.base, "/v1/chat/completions", chat(max_tokens=3, model="m1"))
        assert answer.code == 200, answer.body
        assert other.pid() == 0 and other.counts() == (0, 0, 0)
        first_pid = lab.pid()
        assert alive(first_pid) and lab.counts() == (1, 0, 0)

        # A parameter change: a new spec hash, the instance restarted once.
        code, body = await _call(cp, "PUT", "/deployments/chat", {**CHAT, "parameters": {"tokens_per_second": 200}})
        assert (code, body["generation"]) == (200, 2)
        new_hash = body["spec_hash"]
        assert new_hash != shown["spec_hash"]
        shown = await _ready(cp, 2)
        assert shown["edges"]["items"][0]["instances"][0]["spec_hash"] == new_hash
        second_pid = lab.pid()
        assert second_pid != first_pid and alive(second_pid)
        assert lab.counts() == (1, 1, 0)

        # A Control Plane restart: the deployment is kept, no engine restarts.
        port = cp.edge_wire_port
        await cp.stop()
        cp = await start_control_plane(config_text=store, edge_wire_port=port)
        await eventually(
            lambda: all(
                cp.registry.find(e) is not None and cp.registry.get(e).connected for e in ("edge-lab", "edge-other")
            ),
            timeout=15,
            message="both edges back at the restarted Control Plane",
        )
        shown = await _ready(cp, 2)
        assert (shown["generation"], shown["spec_hash"]) == (2, new_hash)
        assert cp.service.deployments.desired.sets_sent >= 2  # both edges got their sets again
        assert lab.pid() == second_pid and lab.counts() == (1, 1, 0)
        answer = await post(lab.base, "/v1/chat/completions", chat(max_tokens=3, model="m1"))
        assert answer.code == 200, answer.body

        # Out of bounds: the dry run names it, the Node refuses it.
        bad = {**CHAT, "edge_selector": "site=other", "parameters": {"tokens_per_second": 5000}}
        code, dry = await _call(cp, "PUT", "/deployments/bad?dry_run=true", bad)
        assert code == 200, dry
        _valid("DeploymentDryRun", dry)
        (edge,) = dry["edges"]
        assert edge["edge_id"] == "edge-other"
        (problem,) = edge["problems"]
        assert problem["instance_id"] == "bad-1" and "maximum 1000" in problem["reason"]
        code, missing = await _call(cp, "GET", "/deployments/bad")
        assert (code, missing["error"]["code"]) == (404, "unknown_deployment")  # a dry run keeps nothing
        code, body = await _call(cp, "PUT", "/deployments/bad", bad)
        assert code == 201, body

        async def refused() -> bool:
            edges = (await _deployment(cp, "bad"))["edges"]["items"]
            return bool(edges) and edges[0]["state"] == "failed" and edges[0]["instances"][0]["state"] == "refused"

        await eventually(refused, timeout=15, interval=0.2, message="bad-1 refused by the node")
        reason = (await _deployment(cp, "bad"))["edges"]["items"][0]["instances"][0]["reason"]
        assert "tokens_per_second" in reason
        assert other.pid("bad-1") == 0

        # DELETE: the engine stops.
        code, body = await _call(cp, "DELETE", "/deployments/chat")
        assert code == 200, body
        await eventually(lambda: not alive(second_pid), timeout=15, message="chat-1's engine stopped")
        await eventually(lambda: lab.counts()[2] == 1, timeout=15, message="the node counted the stop")
        code, listed = await _call(cp, "GET", "/deployments")
        assert [d["name"] for d in _valid("DeploymentList", listed)["items"]] == ["bad"]
    finally:
        for site in sites:
            await stop(site.node, site.edge)
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_parameter_change_rolls_one_edge_at_a_time(tmp_path: Path) -> None:
    """Two lab edges run chat; a parameter change with rollout.max_in_flight 1 restarts the engine of
    the first edge while the second keeps its engine and spec, then the second's; each engine is
    restarted exactly once and both end ready at generation 2."""
    cp = await start_control_plane()
    sites: list[DeploymentSite] = []
    try:
        sites = [await start_site(tmp_path, cp, f"edge-lab-{i}", "lab") for i in (1, 2)]
        await eventually(
            lambda: all(cp.registry.find(f"edge-lab-{i}") is not None for i in (1, 2)),
            timeout=10,
            message="both edges enrolled",
        )
        both = {**CHAT, "rollout": {"max_in_flight": 1}}
        code, body = await _call(cp, "PUT", "/deployments/chat", both)
        assert code == 201, body

        async def all_ready(generation: int) -> bool:
            shown = await _deployment(cp)
            edges = shown["edges"]["items"]
            return shown["rollup"]["ready"] == 2 and all(e["observed_generation"] == generation for e in edges)

        await eventually(lambda: all_ready(1), timeout=READY_SECONDS, interval=0.2, message="chat ready on both")
        pids = [site.pid() for site in sites]
        changed = {**both, "parameters": {"tokens_per_second": 300}}
        code, body = await _call(cp, "PUT", "/deployments/chat", changed)
        assert (code, body["generation"]) == (200, 2)
        await eventually(lambda: sites[0].counts()[1] == 1, timeout=READY_SECONDS, message="edge-lab-1 restarted")
        # While the first edge is not ready at generation 2, the second keeps its engine.
        seen_second_alone = sites[1].pid() == pids[1] and sites[1].counts() == (1, 0, 0)
        await eventually(lambda: all_ready(2), timeout=2 * READY_SECONDS, interval=0.2, message="chat rolled out")
        assert seen_second_alone
        assert [site.counts() for site in sites] == [(1, 1, 0), (1, 1, 0)]
        assert all(site.pid() not in (0, old) for site, old in zip(sites, pids, strict=True))

        def kinds() -> list[str]:
            return [e.kind for e in cp.registry.fleet_events.since(0, 1000) if e.kind.startswith("deployment.")]

        # The next poll after every edge is ready ends the roll.
        await eventually(lambda: "deployment.rolled_out" in kinds(), timeout=10, message="the roll ended")
        assert kinds() == ["deployment.created", "deployment.updated", "deployment.rolled_out"]
    finally:
        for site in sites:
            await stop(site.node, site.edge)
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_held_edge_keeps_its_engine_until_released(tmp_path: Path) -> None:
    """edge.hold through the Control Plane's command route; a parameter change then shows the edge
    held and restarts nothing; edge.release applies it: ready at generation 2, restarted once."""
    cp = await start_control_plane()
    sites: list[DeploymentSite] = []
    try:
        lab = await start_site(tmp_path, cp, "edge-lab", "lab")
        sites.append(lab)
        await eventually(lambda: cp.registry.find("edge-lab") is not None, timeout=10, message="edge enrolled")
        code, body = await _call(cp, "PUT", "/deployments/chat", CHAT)
        assert code == 201, body
        await _ready(cp, 1)
        pid = lab.pid()
        code, op = await cp.post_json("/edges/edge-lab/commands", {"name": "edge.hold", "arguments": {"reason": "t"}})
        assert code == 200 and op["state"] == "succeeded", op
        code, body = await _call(cp, "PUT", "/deployments/chat", {**CHAT, "parameters": {"tokens_per_second": 400}})
        assert (code, body["generation"]) == (200, 2)

        async def held() -> bool:
            shown = await _deployment(cp)
            return bool(shown["rollup"]["held"] == 1 and shown["edges"]["items"][0]["state"] == "held")

        await eventually(held, timeout=15, interval=0.2, message="the edge shows held")
        assert lab.pid() == pid and lab.counts() == (1, 0, 0)
        code, op = await cp.post_json(
            "/edges/edge-lab/commands", {"name": "edge.release", "arguments": {"reason": "t"}}
        )
        assert code == 200 and op["state"] == "succeeded", op
        await _ready(cp, 2)
        assert lab.counts() == (1, 1, 0) and lab.pid() not in (0, pid)
    finally:
        for site in sites:
            await stop(site.node, site.edge)
        await cp.stop()
