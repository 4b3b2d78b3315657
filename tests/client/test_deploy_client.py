"""``iopctl deploy`` and the repository's deployment views against a REAL Control Plane and a real
Edge and Node (the mock engine profile launching ``iop-mock-provider``), and the roll's moves
against the real Klein app with simulated edges on a clock."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred

from twisted_iop.client import ControlPlaneStatusRepository
from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, parse_arguments, run
from twisted_iop.client.deployments import Deployment, DeploymentDryRun
from twisted_iop.testing.deployments import OPERATOR, VIEWER, DeploymentSite, SimulatedFleet, start_site
from twisted_iop.testing.harness import ControlPlaneHarness, start_control_plane, stop

DEPLOYMENT_YAML = """\
name: chat
model: m1
profile: mock
parameters:
  tokens_per_second: 100
edge_selector: site=lab
capacity: 4
"""


async def iopctl(
    argv: list[str], cp: ControlPlaneHarness, interrupted: Deferred[None] | None = None
) -> tuple[int, str, str]:
    """Run iopctl's ``run`` against the real Control Plane."""
    repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
    return await iopctl_on(argv, repository, interrupted)


async def iopctl_on(
    argv: list[str], repository: ControlPlaneStatusRepository, interrupted: Deferred[None] | None = None
) -> tuple[int, str, str]:
    """Run iopctl's ``run`` with ``repository``."""
    args = parse_arguments(argv)
    out, err = io.StringIO(), io.StringIO()
    code = await run(reactor, args, repository, lambda a: None, out, err, interrupted)
    return code, out.getvalue(), err.getvalue()


@pytest_twisted.ensureDeferred
async def test_iopctl_deploy_apply_watch_show_list_delete(tmp_path: Path) -> None:
    """apply --dry-run shows the start and keeps nothing; apply creates generation 1; status --watch
    redraws until 1/1 ready (exit 0); show lists the edge's instance ready; list has it; apply again
    says unchanged; delete stops it; a bad file is a usage error; a bad value the server's error."""
    cp = await start_control_plane()
    site: DeploymentSite | None = None
    try:
        site = await start_site(tmp_path, cp, "edge-lab", "lab")
        path = tmp_path / "chat.yaml"
        path.write_text(DEPLOYMENT_YAML)
        code, out, err = await iopctl(["deploy", "apply", "-f", str(path), "--dry-run"], cp)
        assert code == EXIT_OK, err
        assert "start 1" in out and "edge-lab" in out and "chat-1" in out and "node-1" in out
        code, out, err = await iopctl(["deploy", "list"], cp)
        assert code == EXIT_OK and "0 deployments" in out
        code, out, err = await iopctl(["deploy", "apply", "-f", str(path)], cp)
        assert code == EXIT_OK, err
        assert "chat applied: generation 1" in out
        code, out, err = await iopctl(
            ["deploy", "status", "chat", "--watch", "--interval", "0.2", "--timeout", "60"], cp
        )
        assert code == EXIT_OK, err
        lines = out.strip().splitlines()
        assert lines[-1].startswith("chat generation 1  [####################] 1/1 ready"), out
        code, out, err = await iopctl(["deploy", "show", "chat"], cp)
        assert code == EXIT_OK, err
        assert "tokens_per_second=100" in out
        assert any(line.split()[:5] == ["edge-lab", "ready", "chat-1", "node-1", "ready"] for line in out.splitlines())
        code, out, err = await iopctl(["--json", "deploy", "list"], cp)
        listed = json.loads(out)
        assert [(d["name"], d["rollup"]["ready"]) for d in listed["items"]] == [("chat", 1)]
        code, out, err = await iopctl(["deploy", "apply", "-f", str(path)], cp)
        assert code == EXIT_OK and "chat unchanged: generation 1" in out
        pid = site.pid()
        code, out, err = await iopctl(["deploy", "delete", "chat"], cp)
        assert code == EXIT_OK and "deleted chat" in out
        code, out, err = await iopctl(["deploy", "show", "chat"], cp)
        assert code == EXIT_ERROR and "unknown_deployment" in err
        assert pid > 0
        (tmp_path / "bad.yaml").write_text("model: m1\nprofile: mock\n")
        code, out, err = await iopctl(["deploy", "apply", "-f", str(tmp_path / "bad.yaml")], cp)
        assert code == EXIT_USAGE and "'name' is required" in err
        (tmp_path / "worse.json").write_text(
            json.dumps({"name": "chat", "model": "m1", "profile": "mock", "capacity": -1})
        )
        code, out, err = await iopctl(["deploy", "apply", "-f", str(tmp_path / "worse.json")], cp)
        assert code == EXIT_ERROR and "invalid_deployment" in err and "capacity" in err
    finally:
        if site is not None:
            await stop(site.node, site.edge)
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_the_repository_reads_every_deployment_document(tmp_path: Path) -> None:
    """apply_deployment (dry run and real), deployment() and deployments() read the real answers;
    a watch of a deployment that cannot be ready stops when interrupted, with exit 1."""
    cp = await start_control_plane()
    try:
        repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
        spec = {"model": "m1", "profile": "mock", "edge_selector": "site=nowhere"}
        dry = await repository.apply_deployment("chat", spec, dry_run=True)
        assert isinstance(dry, DeploymentDryRun) and dry.edges == () and dry.generation == 1
        applied = await repository.apply_deployment("chat", spec)
        assert isinstance(applied, Deployment) and applied.generation == 1 and applied.changed is True
        shown = await repository.deployment("chat")
        assert shown.edges is not None and shown.edges.total == 0 and shown.rollup.desired == 0
        assert [d.name for d in (await repository.deployments()).items] == ["chat"]
        interrupted: Deferred[None] = Deferred()
        reactor.callLater(0.3, interrupted.callback, None)
        code, out, err = await iopctl(["deploy", "status", "chat", "--watch", "--interval", "0.1"], cp, interrupted)
        assert code == EXIT_ERROR and "interrupted" in err and "0/0 ready" in out
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_iopctl_deploy_pause_resume_cancel_against_the_real_app() -> None:
    """Three lab edges and a change rolling out one edge at a time: ``deploy pause`` says the roll is
    paused with 1 reached and 2 pending, and polls reach nothing more; ``status`` and ``show`` say
    paused; ``resume`` reaches edge-2; ``cancel`` ends it (edge-3 keeps the old spec); a second
    cancel is the server's no_rollout error; a viewer's pause is forbidden."""
    fleet = SimulatedFleet()
    try:
        edges = [fleet.edge(f"edge-{i}", "lab") for i in (1, 2, 3)]
        chat = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}
        await fleet.call("PUT", "/deployments/chat", chat)
        old = edges[2].instances[0].spec_hash
        changed = {**chat, "parameters": {"tokens_per_second": 200}, "rollout": {"max_in_flight": 1}}
        await fleet.call("PUT", "/deployments/chat", changed)
        repository = ControlPlaneStatusRepository("http://cp", api_token=OPERATOR, http_client=fleet.treq)
        code, out, err = await iopctl_on(["deploy", "pause", "chat"], repository)
        assert code == EXIT_OK, err
        assert "rollout paused: 1 reached, 2 pending (paused by alice)" in out
        fleet.clock.advance(2)
        fleet.deployments.poll()
        assert edges[1].instances[0].spec_hash == old
        code, out, err = await iopctl_on(["deploy", "status", "chat"], repository)
        assert code == EXIT_OK and "rollout paused: 1 reached, 2 pending" in out
        code, out, err = await iopctl_on(["deploy", "show", "chat"], repository)
        assert any(line.startswith("rollout:    rollout paused") for line in out.splitlines()), out
        code, out, err = await iopctl_on(["deploy", "resume", "chat"], repository)
        assert code == EXIT_OK and "rollout running: 2 reached, 1 pending" in out
        code, out, err = await iopctl_on(["--json", "deploy", "cancel", "chat"], repository)
        assert code == EXIT_OK, err
        assert json.loads(out)["roll"]["state"] == "cancelled"
        fleet.clock.advance(2)
        fleet.deployments.poll()
        assert edges[2].instances[0].spec_hash == old
        code, out, err = await iopctl_on(["deploy", "cancel", "chat"], repository)
        assert code == EXIT_ERROR and "no_rollout" in err
        viewer = ControlPlaneStatusRepository("http://cp", api_token=VIEWER, http_client=fleet.treq)
        code, out, err = await iopctl_on(["deploy", "pause", "chat"], viewer)
        assert code == EXIT_ERROR and "forbidden" in err
    finally:
        fleet.stop()
