"""``iopctl rollout`` and the rollout repository against the REAL Control Plane.

A real Control Plane on loopback (``start_fleet``) with scripted edges over
real sockets; every rollout is driven through ``cli.run`` (and once through
the installed ``iopctl`` script) as an operator drives it. The scripted
edges all say hello with ``site=test``.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any, Optional

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.utils import getProcessOutputAndValue

from twisted_iop.client import ControlPlaneStatusRepository
from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, parse_arguments, run
from twisted_iop.testing.harness import IOPCTL, Fleet, eventually, start_fleet


async def iopctl(argv: list[str], fleet: Fleet, interrupted: Optional[Deferred[None]] = None) -> tuple[int, str, str]:
    """Run iopctl's ``run`` against ``fleet``'s real Control Plane."""
    args = parse_arguments(argv)
    repository = ControlPlaneStatusRepository(fleet.cp.http_url, timeout=10)
    out, err = io.StringIO(), io.StringIO()
    code = await run(reactor, args, repository, lambda a: None, out, err, interrupted)
    return code, out.getvalue(), err.getvalue()


def drain(*more: str) -> list[str]:
    """``rollout create`` of node.drain on node-1 of every scripted edge."""
    return ["rollout", "create", "--command", "node.drain", "--target", "node-1", "-l", "site=test", *more]


@pytest_twisted.ensureDeferred
async def test_a_watched_rollout_reaches_every_edge_once() -> None:
    """create --watch runs node.drain once on each matching edge, in batches, and exits 0;
    each execution names a real operation of its edge."""
    edge_ids = [f"edge-{i}" for i in range(6)]
    fleet = await start_fleet(*edge_ids)
    try:
        code, out, err = await iopctl(
            drain("--batch-size", "2", "--max-in-flight", "2", "--watch", "--interval", "0.05"), fleet
        )
        assert code == EXIT_OK, err
        assert "succeeded" in out.splitlines()[-1] and "6/6" in out.splitlines()[-1]
        assert all(len(fleet.edges[e].commands_seen) == 1 for e in edge_ids)
        rollout_id = err.split("rollout ")[1].split()[0]
        code, out, _ = await iopctl(["rollout", "show", rollout_id, "--executions", "--json"], fleet)
        executions = json.loads(out)["items"]
        assert sorted(e["edge_id"] for e in executions) == edge_ids
        assert {e["state"] for e in executions} == {"succeeded"}
        repo = fleet.repository()
        first = executions[0]
        operation = await repo.operation(first["edge_id"], first["operation_ids"][0])
        assert (operation.name, operation.target, operation.state) == ("node.drain", "node-1", "succeeded")
        code, out, _ = await iopctl(["rollout", "list", "--json"], fleet)
        assert json.loads(out)["items"][0]["rollout_id"] == rollout_id
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_a_failing_rollout_aborts_and_the_watch_exits_1() -> None:
    """With --abort-on-any-failure, the first failing edge aborts the rollout; the watch says why, exit 1."""
    fleet = await start_fleet(*[f"edge-{i}" for i in range(8)])
    try:
        fleet.edges["edge-1"].command_behaviour = "fail"
        code, out, err = await iopctl(
            drain(
                "--batch-size", "1", "--max-in-flight", "1", "--abort-on-any-failure", "--watch", "--interval", "0.05"
            ),
            fleet,
        )
        assert code == EXIT_ERROR
        assert "iopctl: aborted: " in err and "aborted" in out.splitlines()[-1]
        assert sum(len(e.commands_seen) for e in fleet.edges.values()) < 8
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_pause_resume_cancel_and_the_servers_errors() -> None:
    """pause, resume and cancel change the state; an impossible one is 409 invalid_transition,
    an unknown id 404 unknown_rollout, a bad selector 400 invalid_selector, each printed as code: message."""
    fleet = await start_fleet("edge-a", "edge-b", "edge-c")
    try:
        for edge in fleet.edges.values():
            edge.command_behaviour = "hold"
        code, out, err = await iopctl(drain("--batch-size", "1", "--max-in-flight", "1", "--json"), fleet)
        assert code == EXIT_OK, err
        rollout_id = json.loads(out)["rollout_id"]

        async def state() -> Any:
            _, shown, _ = await iopctl(["rollout", "show", rollout_id, "--json"], fleet)
            return json.loads(shown)["state"]

        await eventually(lambda: any(e.held_commands for e in fleet.edges.values()), timeout=5, message="dispatch")
        code, out, _ = await iopctl(["rollout", "pause", rollout_id, "--json"], fleet)
        assert code == EXIT_OK and json.loads(out)["state"] == "paused"
        code, out, _ = await iopctl(["rollout", "resume", rollout_id, "--json"], fleet)
        assert code == EXIT_OK and json.loads(out)["state"] == "running"
        code, out, _ = await iopctl(["rollout", "cancel", rollout_id, "--json"], fleet)
        assert code == EXIT_OK
        for edge in fleet.edges.values():
            while edge.held_commands:
                edge.answer_held()
        assert await eventually(lambda: state(), timeout=5) == "cancelled"
        code, _, err = await iopctl(["rollout", "resume", rollout_id], fleet)
        assert code == EXIT_ERROR and err.startswith("iopctl: invalid_transition: ")
        code, _, err = await iopctl(["rollout", "show", "no-such-rollout"], fleet)
        assert code == EXIT_ERROR and err.startswith("iopctl: unknown_rollout: ")
        status, body = await fleet.cp.post_json(
            "/rollouts", {"command": {"name": "node.drain"}, "selector": "site in (test"}
        )
        assert status == 400 and body["error"]["code"] == "invalid_selector"
        assert "position" in body["error"]["message"]
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_the_installed_script_watches_a_rollout() -> None:
    """The iopctl script, run as an operator runs it (stdout a pipe): plain progress lines, exit 0."""
    fleet = await start_fleet("edge-a", "edge-b")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
        argv = ["--url", fleet.cp.http_url, *drain("--watch", "--interval", "0.1")]
        out, err, code = await getProcessOutputAndValue(IOPCTL, argv, env=env, reactor=reactor)
        assert code == EXIT_OK, err
        text = out.decode()
        assert "\x1b" not in text and "2/2" in text.splitlines()[-1]
    finally:
        await fleet.stop()
