"""SLOs and the rollout latency criterion against a real Control Plane over real sockets.

The edges are scripted edges on the real edge wire whose providers report
``ProviderLatency`` from an engine at a set latency (each status answer
adds the requests it ran since the last one); every answer is validated
against the OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest_twisted
import treq

from twisted_iop.testing.harness import ControlPlaneHarness, contract_validator, eventually, start_control_plane
from twisted_iop.testing.latency import LatencyEngine
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge
from twisted_iop.wire import control_pb2 as pb

#: Evaluated ten times a second; a one-hour window scales the alert windows
#: to 5 s and 0.42 s (page) and 30 s and 2.5 s (ticket).
SLO_CONFIG = """
slos:
  interval_seconds: 0.1
  persist_seconds: 0.5
  objectives:
    chat-ttft:
      metric: ttft
      percentile: 95
      objective_seconds: 0.5
      model: llama-3-8b
      edge_selector: region=eu
      window: 1h
rollouts:
  latency_poll_seconds: 0.05
status:
  fleet_max_age_seconds: 0.05
"""


def _valid(schema: str, body: Any) -> Any:
    errors = list(contract_validator(schema).iter_errors(body))
    assert not errors, [e.message for e in errors]
    return body


async def _edge(cp: ControlPlaneHarness, edge_id: str, region: str, engine: LatencyEngine) -> ScriptedEdge:
    edge, answer = await connect_edge(cp.edge_wire_port, edge_id, labels={"region": region})
    assert answer is not None and answer.accepted
    edge.status = lambda: engine.status(edge_id)
    return edge


async def _slo(cp: ControlPlaneHarness) -> Any:
    code, slo = await cp.get_json("/slos/chat-ttft")
    assert code == 200, slo
    return _valid("Slo", slo)


def _alert(slo: Any, name: str) -> str:
    return str(next(a["state"] for a in slo["alerts"] if a["name"] == name))


@pytest_twisted.ensureDeferred
async def test_a_missed_objective_fires_the_fast_burn_alert_and_resolves_when_met_again() -> None:
    """An engine at 1 s against a 0.5 s p95 objective fires the page within its
    short window (slo.alert.firing, /metrics says 1); back at 0.1 s it resolves."""
    cp = await start_control_plane(config_text=SLO_CONFIG)
    engine = LatencyEngine(ttft=0.1)
    edges: list[ScriptedEdge] = []
    try:
        edges.append(await _edge(cp, "edge-eu-1", "eu", engine))
        edges.append(await _edge(cp, "edge-us-1", "us", LatencyEngine(ttft=5.0)))  # never counts: region=us

        async def counted() -> bool:
            return int((await _slo(cp))["requests"]) >= 100

        await eventually(counted, timeout=10, interval=0.05, message="fast requests counted")
        slo = await _slo(cp)
        assert slo["bad_requests"] == 0 and _alert(slo, "page") == "inactive"
        engine.ttft = 1.0

        async def firing() -> bool:
            return _alert(await _slo(cp), "page") == "firing"

        await eventually(firing, timeout=10, interval=0.05, message="the page fires")
        slo = await _slo(cp)
        assert slo["bad_requests"] > 0 and slo["error_budget_remaining"] < 1
        response = await treq.get(cp.http_url + "/metrics")
        metrics = (await response.text()).splitlines()
        assert 'iop_slo_alert_firing{alert="page",slo="chat-ttft"} 1.0' in metrics
        assert any(line.startswith('iop_slo_error_budget_remaining{metric="ttft"') for line in metrics)
        assert any(line.startswith('iop_slo_burn_rate{slo="chat-ttft",window="5s"}') for line in metrics)
        engine.ttft = 0.1

        async def resolved() -> bool:
            return _alert(await _slo(cp), "page") == "resolved"

        await eventually(resolved, timeout=15, interval=0.05, message="the page resolves")
        code, events = await cp.get_json("/fleet/events?limit=1000")
        assert code == 200
        kinds = [(e["kind"], e["attributes"].get("alert")) for e in events["items"] if e["kind"].startswith("slo.")]
        assert ("slo.alert.firing", "page") in kinds and ("slo.alert.resolved", "page") in kinds
        assert kinds.index(("slo.alert.firing", "page")) < kinds.index(("slo.alert.resolved", "page"))
    finally:
        for edge in edges:
            edge.tcp.loseConnection()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_rollout_whose_command_makes_latency_worse_aborts_by_its_latency_criterion() -> None:
    """The drain makes edge-slow's engine three times slower: its rollout
    aborts naming the edge and both figures; on edge-same the same rollout
    succeeds, its figures before and after alike."""
    cp = await start_control_plane(config_text=SLO_CONFIG)
    slow, same = LatencyEngine(ttft=0.1), LatencyEngine(ttft=0.1)
    edges: list[ScriptedEdge] = []
    try:
        slow_edge = await _edge(cp, "edge-slow", "slow", slow)
        edges += [slow_edge, await _edge(cp, "edge-same", "same", same)]
        original = slow_edge.envelope_received

        def slower_after_a_command(envelope: pb.Envelope, body: str) -> None:
            if body == "edge_command_request":
                slow.ttft = 0.3
            original(envelope, body)

        slow_edge.envelope_received = slower_after_a_command  # type: ignore[method-assign]  # replaced for this test
        criterion = {"latency": {"metric": "ttft_p95", "max_increase_percent": 20, "min_requests": 50}}
        results = {}
        for region in ("slow", "same"):
            code, rollout = await cp.post_json(
                "/rollouts",
                {
                    "command": {"name": "node.drain", "target": "node-1"},
                    "selector": f"region={region}",
                    "abort": criterion,
                },
            )
            assert code == 201, rollout
            _valid("Rollout", rollout)
            assert rollout["abort"]["latency"] == {**criterion["latency"], "watch_seconds": 600.0}
            rollout_id = rollout["rollout_id"]

            async def ended(rollout_id: str = rollout_id, region: str = region) -> bool:
                code, body = await cp.get_json(f"/rollouts/{rollout_id}")
                assert code == 200
                results[region] = _valid("Rollout", body)
                return body["finished_at"] is not None

            await eventually(ended, timeout=15, interval=0.05, message=f"rollout on {region} ends")
            code, page = await cp.get_json(f"/rollouts/{rollout_id}/executions")
            results[region + "/execution"] = _valid("ExecutionPage", page)["items"][0]
        aborted = results["slow"]
        assert aborted["state"] == "aborted", aborted
        assert aborted["reason"].startswith("edge edge-slow: ttft_p95 rose from ")
        assert "abort.latency.max_increase_percent 20%" in aborted["reason"]
        execution = results["slow/execution"]
        assert abs(execution["latency_before_seconds"] - 0.1) < 0.003
        assert abs(execution["latency_after_seconds"] - 0.3) < 0.007
        assert f"{execution['latency_before_seconds'] * 1000:.1f} ms" in aborted["reason"]
        assert results["same"]["state"] == "succeeded", results["same"]
        kept = results["same/execution"]
        assert kept["latency_before_seconds"] == kept["latency_after_seconds"]
    finally:
        for edge in edges:
            edge.tcp.loseConnection()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_an_slo_and_its_counts_survive_a_restart_in_the_sqlite_file(tmp_path: Path) -> None:
    """An SLO put over the API, with the counts and the firing page it had,
    is read back from the SQLite file by the next Control Plane; a deleted
    one stays deleted."""
    store = f"store: {{backend: sqlite, path: {tmp_path / 'cp.sqlite'}, flush_interval_seconds: 0.05}}\n"
    config = store + "slos:\n  interval_seconds: 0.1\n  persist_seconds: 0.2\nstatus:\n  fleet_max_age_seconds: 0.05\n"
    body = {"metric": "ttft", "percentile": 95, "objective_seconds": 0.5, "model": "llama-3-8b", "window": "1h"}
    cp = await start_control_plane(config_text=config)
    edge = await _edge(cp, "edge-1", "eu", LatencyEngine(ttft=2.0))
    try:
        for name in ("kept", "dropped"):
            response = await treq.put(cp.http_url + f"/slos/{name}", json=body)
            assert response.code == 201, await response.text()

        async def firing() -> bool:
            code, slo = await cp.get_json("/slos/kept")
            return code == 200 and _alert(slo, "page") == "firing"

        await eventually(firing, timeout=10, interval=0.05, message="the page fires")
        response = await treq.delete(cp.http_url + "/slos/dropped")
        assert response.code == 200
    finally:
        edge.tcp.loseConnection()
        await cp.stop()
    cp = await start_control_plane(config_text=config)
    try:
        code, listed = await cp.get_json("/slos")
        assert code == 200
        assert [s["name"] for s in _valid("SloList", listed)["items"]] == ["kept"]
        kept = listed["items"][0]
        assert kept["spec"] == {**body, "edge_selector": ""}
        assert kept["requests"] > 0 and kept["bad_requests"] == kept["requests"]
        assert _alert(kept, "page") == "firing"
    finally:
        await cp.stop()
