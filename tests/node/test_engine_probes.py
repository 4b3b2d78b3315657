"""Each engine adapter through the real prober, over real sockets, against its recorded shapes."""

from __future__ import annotations

from typing import Any, cast

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.logger import ILogObserver, globalLogPublisher

from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.probes import MAX_PROBE_BODY_BYTES, ProbeResult, ProviderProber
from twisted_iop.testing.engines.engine_fixtures import SHAPES, EngineFixture
from twisted_iop.wire import control_pb2 as pb

KINDS = sorted(SHAPES)
WITH_HEALTH = sorted(kind for kind, shapes in SHAPES.items() if shapes.health)
TIMEOUT = 0.5


def provider(fixture: EngineFixture, base_url: str, models: tuple[str, ...] = ("m",)) -> NodeProviderConfig:
    """The node.yaml provider of ``fixture``."""
    return NodeProviderConfig("p1", fixture.node_kind, models, base_url=base_url)


class Engine:
    """A started fixture, its provider and a prober with a settable running count."""

    def __init__(self, kind: str) -> None:
        self.fixture = EngineFixture(kind)
        self.base_url = self.fixture.start()
        self.provider = provider(self.fixture, self.base_url)
        self.running = 0
        self.prober = ProviderProber(reactor, running_on=lambda _: self.running)

    async def probe(self) -> ProbeResult:
        """One probe of the engine."""
        return await self.prober.probe(self.provider, TIMEOUT)

    async def close(self) -> None:
        """Close the prober's connections and the engine."""
        await self.prober.close()
        await self.fixture.stop()


@pytest.fixture
def engines() -> Any:
    """Starts engines by kind; closes them after the test."""
    started: list[Engine] = []

    def start(kind: str) -> Engine:
        engine = Engine(kind)
        started.append(engine)
        return engine

    yield start
    for engine in started:
        pytest_twisted.blockon(Deferred.fromCoroutine(engine.close()))


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_healthy_engine_reports_its_models(engines: Any, kind: str) -> None:
    """A healthy engine of every kind is healthy, with the model its own models list names."""
    engine = engines(kind)
    result = await engine.probe()
    assert (result.health, result.reason, result.models) == (pb.PROVIDER_HEALTH_HEALTHY, "", ("m",))
    shapes = engine.fixture.shapes
    asked = [path for method, path in engine.fixture.requests if method == "GET"]
    expected = [shapes.health_path, shapes.models_path] if shapes.health_path else [shapes.models_path]
    assert asked == expected


@pytest_twisted.ensureDeferred
async def test_loading_llamacpp_is_unhealthy(engines: Any) -> None:
    """llama.cpp's 503 "Loading model" is unhealthy with reason "loading model", without asking for models."""
    engine = engines("llamacpp")
    engine.fixture.health = "loading"
    result = await engine.probe()
    assert (result.health, result.reason) == (pb.PROVIDER_HEALTH_UNHEALTHY, "loading model")
    assert [path for _, path in engine.fixture.requests] == ["/health"]


@pytest.mark.parametrize("kind", WITH_HEALTH)
@pytest_twisted.ensureDeferred
async def test_failing_health_endpoint_is_unhealthy(engines: Any, kind: str) -> None:
    """An engine whose health endpoint fails is unhealthy (not offline), naming the status."""
    engine = engines(kind)
    engine.fixture.health = "down"
    result = await engine.probe()
    assert result.health == pb.PROVIDER_HEALTH_UNHEALTHY
    status = engine.fixture.shapes.health["down"].status
    assert str(status) in result.reason and "127.0.0.1" not in result.reason


@pytest_twisted.ensureDeferred
async def test_llama_cpp_python_models_list_is_the_health_check(engines: Any) -> None:
    """llama-cpp-python answers /health 404: its models list decides, and a model it lacks is degraded."""
    engine = engines("llama-cpp-python")
    engine.provider = provider(engine.fixture, engine.base_url, ("m", "other"))
    result = await engine.probe()
    assert result.health == pb.PROVIDER_HEALTH_DEGRADED and "other" in result.reason
    assert [path for _, path in engine.fixture.requests] == ["/health", "/v1/models"]


@pytest.mark.parametrize("kind", ["llama-cpp-python", "vllm"])
@pytest_twisted.ensureDeferred
async def test_timeout_while_serving_is_busy_not_offline(engines: Any, kind: str) -> None:
    """A probe timing out while this Node runs requests there keeps the last health, saying busy."""
    engine = engines(kind)
    assert (await engine.probe()).health == pb.PROVIDER_HEALTH_HEALTHY
    engine.fixture.hang_probes = True
    engine.running = 3
    busy = await engine.probe()
    assert busy.health == pb.PROVIDER_HEALTH_HEALTHY and busy.models == ("m",)
    assert busy.reason == "busy: health check timed out while serving 3 requests"
    engine.running = 0
    idle = await engine.probe()
    assert idle.health == pb.PROVIDER_HEALTH_OFFLINE and idle.reason == f"no answer within {TIMEOUT:g}s"


@pytest_twisted.ensureDeferred
async def test_busy_keeps_a_degraded_health_and_its_reason(engines: Any) -> None:
    """Busy keeps the last good health as it was: degraded stays degraded, its reason kept."""
    engine = engines("sglang")
    engine.provider = provider(engine.fixture, engine.base_url, ("m", "other"))
    assert (await engine.probe()).health == pb.PROVIDER_HEALTH_DEGRADED
    engine.fixture.hang_probes = True
    engine.running = 1
    busy = await engine.probe()
    assert busy.health == pb.PROVIDER_HEALTH_DEGRADED
    assert busy.reason == "busy: health check timed out while serving 1 request; does not serve: other"


@pytest_twisted.ensureDeferred
async def test_stopped_engine_is_offline_even_while_serving(engines: Any) -> None:
    """A dead engine (connections closed, port refused) is offline, whatever this Node was running."""
    engine = engines("vllm")
    assert (await engine.probe()).health == pb.PROVIDER_HEALTH_HEALTHY
    await engine.fixture.stop()
    engine.running = 2
    result = await engine.probe()
    assert result.health == pb.PROVIDER_HEALTH_OFFLINE
    assert result.reason in ("connection refused", "connection lost before the answer")


@pytest.mark.parametrize("kind", KINDS)
@pytest_twisted.ensureDeferred
async def test_load_read_from_the_engine(engines: Any, kind: str) -> None:
    """Each engine's load endpoints read into running, waiting, KV cache and parallelism (or nothing)."""
    engine = engines(kind)
    reading = await engine.prober.read_load(engine.provider, TIMEOUT)
    expected = engine.fixture.shapes.expected_load
    if expected is None:
        assert reading is None
        return
    assert reading is not None
    assert (reading.running, reading.waiting, reading.kv_cache_usage, reading.parallel) == expected


@pytest_twisted.ensureDeferred
async def test_huge_metrics_body_is_a_failed_reading(engines: Any) -> None:
    """A /metrics answer over the bound (10 MB here) is not read whole: the reading fails."""
    engine = engines("vllm")
    big = b"vllm:num_requests_running 1\n" + b"# padding\n" * (10 * 1024 * 1024 // 10)
    assert len(big) > MAX_PROBE_BODY_BYTES
    engine.fixture.serve("/metrics", 200, big, "text/plain")
    assert await engine.prober.read_load(engine.provider, TIMEOUT) is None


@pytest_twisted.ensureDeferred
async def test_huge_health_answer_is_unhealthy(engines: Any) -> None:
    """A health answer over the bound makes the provider unhealthy, saying why."""
    engine = engines("tgi")
    engine.fixture.serve("/health", 200, b"x" * (MAX_PROBE_BODY_BYTES + 1))
    result = await engine.probe()
    assert result.health == pb.PROVIDER_HEALTH_UNHEALTHY and "larger than" in result.reason


@pytest_twisted.ensureDeferred
async def test_probes_log_no_factory_lines(engines: Any) -> None:
    """Connections of the probes' pool open and close without "Starting/Stopping factory" lines."""
    engine = engines("vllm")
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    try:
        for _ in range(3):
            await engine.probe()
            await engine.prober.read_load(engine.provider, TIMEOUT)
            await engine.prober.close()  # as when the engine drops idle connections
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
    noisy = [e for e in events if "factory" in str(e.get("log_format", "")).lower()]
    assert noisy == []
    assert len(engine.fixture.requests) == 9
