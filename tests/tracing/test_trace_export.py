"""The trace export: a bounded queue that counts its drops, batches sent from one worker
thread while the reactor goes on, and OpenTelemetry loaded only when it is configured."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor

from twisted_iop.configuration import ConfigError, Section
from twisted_iop.testing.configs import gateway_edge_yaml, write_yaml
from twisted_iop.testing.harness import eventually
from twisted_iop.tracing.config import TracingConfig, parse_tracing_config
from twisted_iop.tracing.export import TraceExport
from twisted_iop.tracing.spans import EdgeTracer, RequestTrace


class BlockingExporter:
    """Records the batches it is given; blocks in its thread until :attr:`go` is set."""

    def __init__(self, ok: bool = True) -> None:
        self.batches: list[list[RequestTrace]] = []
        self.go = threading.Event()
        self.go.set()
        self.ok = ok
        self.threads: set[str] = set()
        self.closed = False

    def export(self, traces: list[RequestTrace]) -> bool:
        """Wait for ``go``, keep the batch."""
        self.threads.add(threading.current_thread().name)
        self.go.wait(10)
        self.batches.append(traces)
        return self.ok

    def shutdown(self) -> None:
        """Note it."""
        self.closed = True


def finished_trace(tracer: EdgeTracer, attempts: int = 1) -> RequestTrace:
    """A recorded trace with ``attempts`` attempts, finished (handed to the tracer's sink)."""
    trace = tracer.start(None, None, "chat", "m", 1.0)
    for index in range(attempts):
        trace.attempt(f"n{index}", "p", 1.0)
        trace.attempt_failed("overloaded", 1.5)
    trace.finish(2.0, "", 200)
    return trace


def export_service(exporter: BlockingExporter, **settings: object) -> tuple[TraceExport, EdgeTracer]:
    """A started export service over ``exporter`` and a tracer feeding it."""
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:1/v1/traces", **settings)  # type: ignore[arg-type]  # keyword values of mixed types
    service = TraceExport(config, reactor, lambda _: exporter)
    service.privilegedStartService()
    service.startService()
    return service, EdgeTracer(1.0, service)


@pytest_twisted.ensureDeferred
async def test_a_full_queue_drops_and_counts_while_an_export_blocks() -> None:
    """The collector hangs: the reactor keeps taking traces, the queue stops at its bound and counts the rest."""
    exporter = BlockingExporter()
    exporter.go.clear()
    service, tracer = export_service(exporter, max_queued_traces=4, max_batch_traces=2, export_interval_seconds=0.01)
    try:
        finished_trace(tracer)
        finished_trace(tracer)  # a full batch: sent at once, and the worker blocks on it
        await eventually(lambda: service.queued() == 0, message="batch taken")
        for _ in range(6):
            finished_trace(tracer, attempts=2)  # 3 spans each
        assert service.queued() == 4 and service.dropped_spans == 2 * 3
        exporter.go.set()
        await eventually(lambda: service.exported_spans == 2 * 2 + 4 * 3, message="all queued exported")
        assert [len(b) for b in exporter.batches] == [2, 2, 2]
        assert len(exporter.threads) == 1  # one worker thread, never the reactor's
        assert threading.current_thread().name not in exporter.threads
    finally:
        exporter.go.set()
        await service.stopService()
    assert exporter.closed


@pytest_twisted.ensureDeferred
async def test_a_failed_export_is_counted_and_stop_drains_the_queue() -> None:
    """A collector that refuses: its spans count as failed; a stop still sends what is queued."""
    exporter = BlockingExporter(ok=False)
    service, tracer = export_service(exporter, export_interval_seconds=60)
    finished_trace(tracer)
    await eventually(lambda: service.queued() == 1, message="queued")
    assert exporter.batches == []  # the interval has not come
    await service.stopService()
    assert len(exporter.batches) == 1 and service.failed_spans == 2 and service.exported_spans == 0
    assert exporter.closed


@pytest_twisted.ensureDeferred
async def test_a_stop_with_a_failing_collector_waits_for_one_export_only() -> None:
    """A stop while an export hangs on a refusing collector: after it, the queue counts as failed, unsent."""
    exporter = BlockingExporter(ok=False)
    exporter.go.clear()
    service, tracer = export_service(exporter, max_batch_traces=2, max_queued_traces=10, export_interval_seconds=60)
    finished_trace(tracer)
    finished_trace(tracer)  # a full batch: its export starts and hangs
    await eventually(lambda: service.queued() == 0, message="batch taken")
    for _ in range(6):
        finished_trace(tracer)
    stopped = service.stopService()
    exporter.go.set()  # the hanging export fails
    await stopped
    assert len(exporter.batches) == 1 and service.queued() == 0
    assert service.failed_spans == 8 * 2 and service.exported_spans == 0


def test_the_tracing_section_is_validated_naming_each_field() -> None:
    """Bad values name their dotted field; an endpoint without a path gets /v1/traces."""
    config = parse_tracing_config(Section({"otlp_endpoint": "http://collector:4318"}, "tracing"))
    assert config.otlp_endpoint == "http://collector:4318/v1/traces"
    assert parse_tracing_config(Section({}, "tracing")) == TracingConfig()
    kept = parse_tracing_config(Section({"otlp_endpoint": "https://c.example/otlp/v1/traces"}, "tracing"))
    assert kept.otlp_endpoint == "https://c.example/otlp/v1/traces"
    for raw, field in [
        ({"otlp_endpoint": "grpc://collector:4317"}, "tracing.otlp_endpoint"),
        ({"otlp_endpoint": "http://user:pw@collector:4318"}, "tracing.otlp_endpoint"),
        ({"otlp_endpoint": "http://:4318"}, "tracing.otlp_endpoint"),
        ({"otlp_endpoint": "http://collector:99999"}, "tracing.otlp_endpoint"),
        ({"sample_ratio": 1.5}, "tracing.sample_ratio"),
        ({"sample_ratio": -0.1}, "tracing.sample_ratio"),
        ({"service_name": ""}, "tracing.service_name"),
        ({"max_queued_traces": 0}, "tracing.max_queued_traces"),
        ({"max_queued_traces": 10, "max_batch_traces": 20}, "tracing.max_batch_traces"),
        ({"export_interval_seconds": 0}, "tracing.export_interval_seconds"),
        ({"otlp_endpoints": "http://c:4318"}, "tracing.otlp_endpoints"),
    ]:
        with pytest.raises(ConfigError, match=f"^{field.replace('.', '[.]')}: "):
            parse_tracing_config(Section(raw, "tracing"))


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60)


def test_without_tracing_no_opentelemetry_module_is_loaded(tmp_path: Path) -> None:
    """An Edge built from a config without ``tracing.otlp_endpoint`` loads no OpenTelemetry module."""
    config = write_yaml(tmp_path / "edge.yaml", gateway_edge_yaml())
    result = _run(
        f"""
        import sys
        from twisted.internet.testing import MemoryReactorClock
        from twisted_iop.edge.tap import Options, makeService
        options = Options()
        options.parseOptions(["--config", {config!r}])
        service = makeService(options, reactor=MemoryReactorClock())
        assert service.trace_export is None
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_with_tracing_and_no_sdk_start_up_fails_naming_the_extra(tmp_path: Path) -> None:
    """``tracing.otlp_endpoint`` set and OpenTelemetry missing: ``--check`` and start-up say to install ``[tracing]``."""
    data = gateway_edge_yaml()
    data["tracing"] = {"otlp_endpoint": "http://127.0.0.1:4318"}
    config = write_yaml(tmp_path / "edge.yaml", data)
    result = _run(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        from twisted.internet.testing import MemoryReactorClock
        from twisted_iop.daemon import ConfigurationExit
        from twisted_iop.edge.tap import Options, makeService
        try:
            Options().parseOptions(["--config", {config!r}, "--check"])
        except ConfigurationExit as e:
            print("check:", e)
        options = Options()
        options.parseOptions(["--config", {config!r}])
        service = makeService(options, reactor=MemoryReactorClock())
        try:
            service.privilegedStartService()
        except SystemExit as e:
            print("start:", e)
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stdout
    assert lines[0].startswith("check: iop-edge: ") and "pip install 'twisted-iop[tracing]'" in lines[0]
    assert lines[1].startswith("start: iop-edge: tracing.otlp_endpoint is set but OpenTelemetry is not installed")
    assert "twisted-iop[tracing]" in lines[1]


def test_the_edge_composes_the_export_when_tracing_is_set(tmp_path: Path) -> None:
    """With ``tracing.otlp_endpoint``, the Edge holds a trace export fed by its gateway's tracer; ``--check`` names it."""
    import opentelemetry.sdk.trace  # noqa: F401  (the [tracing] extra, installed by `make setup`)
    from twisted.internet.testing import MemoryReactorClock

    from twisted_iop.edge.tap import Options, makeService

    data = gateway_edge_yaml()
    data["tracing"] = {"otlp_endpoint": "http://127.0.0.1:4318", "sample_ratio": 0.25}
    config = write_yaml(tmp_path / "edge.yaml", data)
    options = Options()
    options.parseOptions(["--config", config])
    service = makeService(options, reactor=MemoryReactorClock())
    assert service.trace_export is not None and service.trace_export.parent is service
    assert service.inference.tracer.sink is service.trace_export
    assert service.inference.tracer.sample_ratio == 0.25
    assert service.trace_export.config.otlp_endpoint == "http://127.0.0.1:4318/v1/traces"
    checked = subprocess.run(
        [
            sys.executable,
            "-c",
            f"from twisted_iop.edge.tap import Options; Options().parseOptions(['--config', {config!r}, '--check'])",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    assert "traces to http://127.0.0.1:4318/v1/traces" in checked.stdout
