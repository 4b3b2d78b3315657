"""The runtime's load rounds and health log lines: engines' load sent as NodeLoadReport once ready."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, globalLogPublisher

from twisted_iop.node.config import parse_node_config
from twisted_iop.node.engines.probes import ProviderProber
from twisted_iop.node.inference import InferenceRunner
from twisted_iop.node.runtime import NodeRuntime
from twisted_iop.testing.engines.engine_fixtures import EngineFixture
from twisted_iop.wire import control_pb2 as pb


class RecordingSession:
    """An Edge session that keeps what the runtime sends."""

    def __init__(self) -> None:
        self.ready: list[list[pb.ProviderHealthReport]] = []
        self.health: list[list[pb.ProviderHealthReport]] = []
        self.load: list[list[pb.ProviderLoadReport]] = []
        self.instances: list[pb.NodeInstancesReport] = []

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Keep NodeReady."""
        self.ready.append(reports)

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Keep NodeHealthReport."""
        self.health.append(reports)

    def send_load(self, reports: list[pb.ProviderLoadReport]) -> None:
        """Keep NodeLoadReport."""
        self.load.append(reports)

    def send_instances(self, report: pb.NodeInstancesReport) -> None:
        """Keep NodeInstancesReport."""
        self.instances.append(report)


def config(providers: list[dict[str, Any]], **probes: Any) -> Any:
    """A node config with these providers and probe settings."""
    return parse_node_config({"node_id": "node-1", "probes": probes, "providers": providers})


MOCKS = [{"provider_id": "mock-a", "kind": "mock", "models": ["m"]}]


def test_mock_load_is_this_nodes_running_count() -> None:
    """A mock provider's load is what this Node runs on it (parallelism unknown), sent once ready."""
    clock = Clock()
    runtime = NodeRuntime(config(MOCKS), clock, ProviderProber(clock, running_on=lambda pid: 3))
    session = RecordingSession()
    runtime.load_round()
    assert session.load == []  # no session: nothing sent
    runtime.session_accepted(session)
    sent: list[list[pb.ProviderLoadReport]] = []
    runtime.load_round().addCallback(sent.append)
    assert sent == session.load
    [[report]] = sent
    load = report.load
    assert (load.known, load.running, load.waiting, load.kv_cache_usage, load.parallel) == (True, 3, 0, -1.0, 0)


def test_load_rounds_run_on_their_interval_and_can_be_off() -> None:
    """Every probes.load_interval_seconds a NodeLoadReport goes to a ready session; 0 sends none."""
    for interval, expected in ((5, 2), (0, 0)):
        clock = Clock()
        runtime = NodeRuntime(config(MOCKS, load_interval_seconds=interval, interval_seconds=60), clock)
        session = RecordingSession()
        runtime.startService()
        runtime.session_accepted(session)
        clock.advance(5)
        clock.advance(5)
        runtime.stopService()
        assert len(session.load) == expected


def test_an_offline_provider_is_not_asked_its_load() -> None:
    """A provider last found offline is sent known=false without asking its engine (no failed reads logged)."""
    clock = Clock()
    mock = {"provider_id": "mock-a", "kind": "mock", "models": ["m"], "mock": {"health": "offline"}}
    asked: list[str] = []

    class CountingProber(ProviderProber):
        def read_load(self, provider: Any, timeout: float) -> Any:
            asked.append(provider.provider_id)
            return super().read_load(provider, timeout)

    runtime = NodeRuntime(config([mock]), clock, CountingProber(clock))
    session = RecordingSession()
    runtime.session_accepted(session)
    sent: list[list[pb.ProviderLoadReport]] = []
    runtime.load_round().addCallback(sent.append)
    [[report]] = sent
    assert (report.provider_id, report.load.known, asked) == ("mock-a", False, [])


def test_no_load_round_before_ready() -> None:
    """Without a ready session the periodic load round asks no engine."""
    clock = Clock()
    runtime = NodeRuntime(config(MOCKS, load_interval_seconds=1), clock)
    runtime.startService()
    clock.advance(3)
    runtime.stopService()
    assert runtime.load_rounds == 0


@pytest_twisted.ensureDeferred
async def test_engine_load_over_sockets_and_unknown_when_not_exported() -> None:
    """vLLM's /metrics is read into the report; a generic server and a dead engine are sent known=false."""
    vllm = EngineFixture("vllm")
    generic = EngineFixture("openai")
    dead = EngineFixture("sglang")
    urls = [vllm.start(), generic.start(), dead.start()]
    await dead.stop()
    providers = [
        {"provider_id": "v", "kind": "vllm", "models": ["m"], "base_url": urls[0]},
        {"provider_id": "o", "kind": "openai", "models": ["m"], "base_url": urls[1]},
        {"provider_id": "s", "kind": "sglang", "models": ["m"], "base_url": urls[2]},
    ]
    runtime = NodeRuntime(config(providers, timeout_seconds=1), reactor)
    session = RecordingSession()
    try:
        await runtime.session_accepted(session)
        reports = await runtime.load_round()
    finally:
        runtime.stopService()
        await vllm.stop()
        await generic.stop()
    by_id = {r.provider_id: r.load for r in reports}
    v = by_id["v"]
    assert (v.known, v.running, v.waiting, v.parallel) == (True, 4, 2, 0)
    assert abs(v.kv_cache_usage - 0.42) < 1e-9 and 0 <= v.age_ms < 1000
    assert not by_id["o"].known and not by_id["s"].known
    assert session.load == [reports]
    assert ("GET", "/metrics") in vllm.requests and ("GET", "/metrics") not in generic.requests


def test_health_changes_logged_with_short_names(tmp_path: Path) -> None:
    """A health change is logged as ``healthy -> unhealthy``, the Edge's spelling."""
    health_file = tmp_path / "m.health"
    providers = [{"provider_id": "mock-a", "kind": "mock", "models": ["m"], "mock": {"health_file": str(health_file)}}]
    runtime = NodeRuntime(config(providers), Clock())
    runtime.probe_round()
    health_file.write_text("unhealthy gpu gone")
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    try:
        runtime.probe_round()
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
    [line] = [e for e in events if "health" in e.get("log_format", "") and e.get("provider_id") == "mock-a"]
    assert (line["before"], line["after"]) == ("healthy", "unhealthy")


def test_default_prober_counts_the_runners_requests() -> None:
    """The runtime gives its prober the count of requests its inference runner runs on a provider."""

    class Runner:
        def running_on(self, provider_id: str) -> int:
            return {"p": 2}.get(provider_id, 0)

    prober = ProviderProber(Clock())
    runtime = NodeRuntime(config(MOCKS), Clock(), prober)
    assert prober.running_on is not None and prober.running_on("p") == 0  # no runner yet
    runtime.inference = Runner()  # type: ignore[assignment]  # a stand-in runner with only what the runtime calls
    assert (prober.running_on("p"), prober.running_on("q")) == (2, 0)


def test_runner_counts_running_requests_per_provider() -> None:
    """InferenceRunner.running_on counts the requests running on one provider, until they finish."""

    class Session:
        transport = None
        closing = False

        def __init__(self) -> None:
            self.sent: list[str] = []

        def send(self, body: str, message: Any, request_id: int = 0) -> None:
            self.sent.append(body)

        def sendString(self, data: bytes) -> None:
            pass

    clock = Clock()
    providers = config(
        [
            {"provider_id": "slow", "kind": "mock", "models": ["m"], "mock": {"latency_seconds": 1}},
            {"provider_id": "other", "kind": "mock", "models": ["m"]},
        ]
    ).providers
    runner = InferenceRunner(lambda: providers, clock)
    session = Session()
    for inference_id in (1, 2):
        request = pb.InferenceRequest(
            inference_id=inference_id,
            provider_id="slow",
            endpoint=pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
            body=b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
        )
        runner.handle(session, pb.Envelope(inference_request=request), "inference_request")
    assert (runner.running_on("slow"), runner.running_on("other")) == (2, 0)
    clock.advance(2)
    assert runner.running_on("slow") == 0 and session.sent.count("inference_done") == 2
