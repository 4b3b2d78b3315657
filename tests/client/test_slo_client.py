"""SLOs in the client: the repository's views and ``iopctl slo``, against a
REAL Control Plane (loopback sockets) whose SLO is missed by a scripted
edge's engine, so its page alert fires."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor

from twisted_iop.client import ControlPlaneStatusRepository
from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, build_parser, parse_arguments, run
from twisted_iop.client.iopctl.cli_base import UsageError
from twisted_iop.client.iopctl.completion import script
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.latency import LatencyEngine
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge

SLOS = """
slos:
  interval_seconds: 0.1
  objectives:
    chat-ttft: {metric: ttft, percentile: 95, objective_seconds: 0.5, model: llama-3-8b, window: 1h}
    chat-errors: {metric: error_ratio, objective_ratio: 0.01, model: llama-3-8b, window: 1h}
status:
  fleet_max_age_seconds: 0.05
"""


async def iopctl(argv: list[str], cp: ControlPlaneHarness) -> tuple[int, str, str]:
    """Run iopctl's ``run`` against the real Control Plane."""
    args = parse_arguments(argv)
    out, err = io.StringIO(), io.StringIO()
    repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
    code = await run(reactor, args, repository, lambda a: None, out, err)
    return code, out.getvalue(), err.getvalue()


async def _firing_fleet() -> tuple[ControlPlaneHarness, ScriptedEdge]:
    cp = await start_control_plane(config_text=SLOS)
    engine = LatencyEngine(ttft=2.0)
    edge, answer = await connect_edge(cp.edge_wire_port, "edge-1")
    assert answer is not None and answer.accepted
    edge.status = lambda: engine.status("edge-1")
    repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)

    async def firing() -> bool:
        return (await repository.slo("chat-ttft")).firing == ("page", "ticket")

    await eventually(firing, timeout=10, interval=0.05, message="the SLO's alerts fire")
    return cp, edge


@pytest_twisted.ensureDeferred
async def test_repository_reads_slos_with_their_figures_and_alerts() -> None:
    """slos() and slo() read the real documents: the missed one's value, budget and firing alerts."""
    cp, edge = await _firing_fleet()
    try:
        repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)
        listed = await repository.slos()
        assert [s.name for s in listed.items] == ["chat-errors", "chat-ttft"] and listed.total == 2
        slo = await repository.slo("chat-ttft")
        assert slo.spec.metric == "ttft" and slo.spec.percentile == 95 and slo.value_unit == "seconds"
        assert slo.value is not None and abs(slo.value - 2.0) < 0.05
        assert slo.bad_requests == slo.requests > 0 and slo.error_budget_remaining < 0
        assert [r.window for r in slo.burn_rates] == ["5s", "0.417s", "30s", "2.5s"]
        errors = await repository.slo("chat-errors")
        assert errors.value == 0.0 and errors.error_budget_remaining == 1.0 and errors.firing == ()
    finally:
        edge.tcp.loseConnection()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_iopctl_slo_list_show_json_and_unknown() -> None:
    """``iopctl slo list`` shows each SLO's objective, value, budget and the
    alerts firing; ``show`` the burn rates and alerts; ``--json`` the
    document; an unknown name exits 1 with the server's code."""
    cp, edge = await _firing_fleet()
    try:
        code, out, err = await iopctl(["slo", "list"], cp)
        assert code == EXIT_OK, err
        lines = out.splitlines()
        assert lines[0].split() == ["SLO", "OBJECTIVE", "MODEL", "EDGES", "WINDOW", "VALUE", "BUDGET", "FIRING"]
        ttft = next(line for line in lines if line.startswith("chat-ttft"))
        assert "ttft p95 <= 0.5s" in ttft and "page,ticket" in ttft and "(every edge)" in ttft
        assert lines[-1] == "2 SLOs"
        code, out, err = await iopctl(["slo", "show", "chat-ttft"], cp)
        assert code == EXIT_OK, err
        assert "objective:   ttft p95 <= 0.5s for llama-3-8b" in out
        assert any(line.split()[:2] == ["page", "firing"] for line in out.splitlines())
        assert any(line.split()[0] == "0.417s" for line in out.splitlines() if line.strip())
        code, out, err = await iopctl(["slo", "show", "chat-ttft", "--json"], cp)
        document: Any = json.loads(out)
        assert code == EXIT_OK and document["name"] == "chat-ttft" and document["spec"]["objective_seconds"] == 0.5
        code, out, err = await iopctl(["slo", "show", "nope"], cp)
        assert code == EXIT_ERROR and "unknown_slo" in err
    finally:
        edge.tcp.loseConnection()
        await cp.stop()


def test_completion_offers_the_slo_subcommand() -> None:
    """The completion scripts offer ``slo`` among the subcommands (generated from the parser)."""
    bash = next(line for line in script(build_parser(), "bash").splitlines() if "rollout history" in line)
    assert " slo" in bash
    assert "'slo:SLOs: their error budgets, burn rates and alerts'" in script(build_parser(), "zsh")


@pytest_twisted.ensureDeferred
async def test_iopctl_rollout_create_with_abort_on_latency_aborts_and_says_why() -> None:
    """``--abort-on-latency ttft_p95:20:40`` sends abort.latency; the drain
    triples the engine's TTFT, so the rollout aborts and ``show`` says why."""
    cp = await start_control_plane(config_text="rollouts:\n  latency_poll_seconds: 0.05\n")
    engine = LatencyEngine(ttft=0.1)
    edge, answer = await connect_edge(cp.edge_wire_port, "edge-1", labels={"region": "eu"})
    assert answer is not None and answer.accepted
    original = edge.envelope_received

    def slower_after_a_command(envelope: Any, body: str) -> None:
        if body == "edge_command_request":
            engine.ttft = 0.3
        original(envelope, body)

    edge.envelope_received = slower_after_a_command  # type: ignore[method-assign]  # replaced for this test
    edge.status = lambda: engine.status("edge-1")
    try:
        argv = ["rollout", "create", "--command", "node.drain", "--target", "node-1", "-l", "region=eu"]
        code, out, err = await iopctl([*argv, "--abort-on-latency", "ttft_p95:20:40", "--json"], cp)
        assert code == EXIT_OK, err
        created = json.loads(out)
        assert created["abort"]["latency"] == {
            "metric": "ttft_p95",
            "max_increase_percent": 20.0,
            "min_requests": 40,
            "watch_seconds": 600.0,
        }
        repository = ControlPlaneStatusRepository(cp.http_url, timeout=10)

        async def aborted() -> bool:
            return (await repository.rollout(created["rollout_id"])).state == "aborted"

        await eventually(aborted, timeout=10, interval=0.05, message="the rollout aborts")
        code, out, err = await iopctl(["rollout", "show", created["rollout_id"]], cp)
        assert code == EXIT_OK, err
        assert "aborted (edge edge-1: ttft_p95 rose from" in out
        assert "ttft_p95 up more than 20% over 40 requests" in out
        with pytest.raises(UsageError, match="METRIC:PERCENT"):
            parse_arguments([*argv, "--abort-on-latency", "p50:20"])
    finally:
        edge.tcp.loseConnection()
        await cp.stop()
