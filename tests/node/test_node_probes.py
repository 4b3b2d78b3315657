"""Provider probes: the generic OpenAI-compatible /v1/models through StubTreq, and mock providers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from treq.testing import StubTreq
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from twisted_iop.node.config import MockOptions, NodeProviderConfig
from twisted_iop.node.engines.probes import ProbeResult, ProviderProber
from twisted_iop.wire import control_pb2 as pb


class ModelsResource(Resource):
    """A fake OpenAI-compatible server: /v1/models answers ``body`` with ``code``."""

    isLeaf = True

    def __init__(self, body: Any, code: int = 200, hang: bool = False) -> None:
        super().__init__()
        self.body = body
        self.code = code
        self.hang = hang
        self.paths: list[bytes] = []

    def render_GET(self, request: Any) -> Any:
        """Answer the models list (or never, when hanging)."""
        self.paths.append(request.path)
        if self.hang:
            return NOT_DONE_YET
        request.setResponseCode(self.code)
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()


def generic(models: tuple[str, ...] = ("llama", "qwen")) -> NodeProviderConfig:
    """A generic OpenAI-compatible provider (its models list is its health check)."""
    return NodeProviderConfig("v1", "openai", models, base_url="http://gpu-box.internal:8000")


def probe(resource: Resource, provider: NodeProviderConfig, clock: Clock | None = None) -> ProbeResult:
    """Probe through StubTreq and return the result (it must complete)."""
    stub = StubTreq(resource)
    prober = ProviderProber(clock or Clock(), stub)  # type: ignore[arg-type]  # StubTreq has the HTTPClient methods the prober calls
    out: list[ProbeResult] = []
    prober.probe(provider, 2.0).addCallback(out.append)
    stub.flush()
    assert out, "probe did not complete"
    return out[0]


def test_all_models_served_is_healthy() -> None:
    """200 with every configured model is healthy and reports the served models."""
    resource = ModelsResource({"data": [{"id": "llama"}, {"id": "qwen"}, {"id": "extra"}]})
    result = probe(resource, generic())
    assert result.health == pb.PROVIDER_HEALTH_HEALTHY
    assert result.models == ("extra", "llama", "qwen")
    assert resource.paths == [b"/v1/models"]


def test_missing_model_is_degraded() -> None:
    """Some configured models missing is degraded, naming them."""
    result = probe(ModelsResource({"data": [{"id": "llama"}]}), generic())
    assert result.health == pb.PROVIDER_HEALTH_DEGRADED
    assert "qwen" in result.reason


def test_no_model_served_is_unhealthy() -> None:
    """None of the configured models served is unhealthy."""
    result = probe(ModelsResource({"data": []}), generic())
    assert result.health == pb.PROVIDER_HEALTH_UNHEALTHY


def test_error_status_is_unhealthy() -> None:
    """A non-200 answer is unhealthy with the status in the reason."""
    result = probe(ModelsResource({"error": "x"}, code=503), generic())
    assert result.health == pb.PROVIDER_HEALTH_UNHEALTHY
    assert "503" in result.reason


def test_bad_body_is_unhealthy() -> None:
    """A body that is not JSON or not a model list is unhealthy."""
    assert probe(ModelsResource(b"<html>"), generic()).health == pb.PROVIDER_HEALTH_UNHEALTHY
    assert probe(ModelsResource({"models": []}), generic()).health == pb.PROVIDER_HEALTH_UNHEALTHY


def test_no_answer_is_offline_after_timeout() -> None:
    """A provider that never answers is offline once the timeout passes."""
    clock = Clock()
    stub = StubTreq(ModelsResource({}, hang=True))
    prober = ProviderProber(clock, stub)  # type: ignore[arg-type]  # StubTreq has the HTTPClient methods the prober calls
    out: list[ProbeResult] = []
    prober.probe(generic(), 2.0).addCallback(out.append)
    stub.flush()
    assert out == []
    clock.advance(2.1)
    assert out and out[0].health == pb.PROVIDER_HEALTH_OFFLINE
    assert "2s" in out[0].reason


def test_refused_connection_is_offline_without_address() -> None:
    """A refused connection is offline; the reason never contains the base URL."""

    class Refusing:
        def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
            d: Deferred[Any] = Deferred()
            d.errback(ConnectionRefusedError("gpu-box.internal:8000"))
            return d

        def json_content(self, response: Any) -> Deferred[Any]:
            raise AssertionError("not reached")

    out: list[ProbeResult] = []
    ProviderProber(Clock(), Refusing()).probe(generic(), 1.0).addCallback(out.append)
    assert out[0].health == pb.PROVIDER_HEALTH_OFFLINE
    assert "gpu-box" not in out[0].reason


def test_mock_provider_health(tmp_path: Path) -> None:
    """Mock providers are healthy by default, follow their options and their health file."""
    prober = ProviderProber(Clock(), object())  # type: ignore[arg-type]  # a client the mock provider never uses
    out: list[ProbeResult] = []
    healthy = NodeProviderConfig("m", "mock", ("a",))
    prober.probe(healthy, 1).addCallback(out.append)
    assert out[-1].health == pb.PROVIDER_HEALTH_HEALTHY and out[-1].models == ("a",)
    sick = NodeProviderConfig("m", "mock", ("a",), mock=MockOptions(health="unhealthy"))
    prober.probe(sick, 1).addCallback(out.append)
    assert out[-1].health == pb.PROVIDER_HEALTH_UNHEALTHY and out[-1].reason
    health_file = tmp_path / "m.health"
    filed = NodeProviderConfig("m", "mock", ("a",), mock=MockOptions(health_file=str(health_file)))
    prober.probe(filed, 1).addCallback(out.append)
    assert out[-1].health == pb.PROVIDER_HEALTH_HEALTHY
    health_file.write_text("degraded warming up\n")
    prober.probe(filed, 1).addCallback(out.append)
    assert out[-1].health == pb.PROVIDER_HEALTH_DEGRADED and out[-1].reason == "warming up"
