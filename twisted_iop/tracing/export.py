"""Finished traces to the OTLP collector, off the request path.

:class:`TraceExport` is the :class:`~twisted_iop.tracing.spans.TraceSink`
of the Edge's tracer when ``tracing.otlp_endpoint`` is set. ``add`` only
appends to a bounded queue (``tracing.max_queued_traces``; a trace is a
server span and at most ``1 + inference.failover.max_retries`` attempts of
a few ids each, so the queue is bounded in bytes too): a full queue drops
the trace and counts its spans. Every ``export_interval_seconds``, or as
soon as a batch is full, one batch goes to a single worker thread, which
turns it into OpenTelemetry spans and posts it with the SDK's OTLP/HTTP
exporter (blocking I/O, never on the reactor). One export runs at a time;
while it runs, new traces wait in the queue.

The OpenTelemetry packages are the optional ``[tracing]`` extra: they are
imported (by :mod:`.otlp_sdk`) only here, only when this service starts,
and their absence is a start-up error naming the extra.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Optional, Protocol, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from twisted_iop.daemon import StartupError
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.tracing.config import TracingConfig
from twisted_iop.tracing.spans import RequestTrace, TraceSink

#: What to install when the exporter's packages are missing.
EXTRA_HINT = "pip install 'twisted-iop[tracing]'"


class SpanExporter(Protocol):
    """Sends batches of finished traces (in the worker thread)."""

    def export(self, traces: list[RequestTrace]) -> bool:
        """Send them; whether the collector took them."""

    def shutdown(self) -> None:
        """Release the exporter's connections."""


def missing_sdk() -> Optional[str]:
    """Why the ``[tracing]`` extra cannot be used, or ``None`` when it is installed."""
    try:
        import twisted_iop.tracing.otlp_sdk  # noqa: F401
    except ImportError as e:
        return (
            f"tracing.otlp_endpoint is set but OpenTelemetry is not installed ({e.name or e}): "
            f"install the tracing extra ({EXTRA_HINT})"
        )
    return None


def sdk_exporter(config: TracingConfig) -> SpanExporter:
    """The SDK's OTLP/HTTP exporter for ``config`` (imports OpenTelemetry)."""
    problem = missing_sdk()
    if problem is not None:
        raise StartupError(problem)
    from twisted_iop.tracing.otlp_sdk import OtlpSdkExporter

    return OtlpSdkExporter(config)


class TraceExport(Service, TraceSink):
    """The bounded queue of finished traces and their export in one worker thread."""

    _log = Logger()

    def __init__(
        self,
        config: TracingConfig,
        reactor: Reactor,
        exporter: Callable[[TracingConfig], SpanExporter] = sdk_exporter,
    ) -> None:
        self.config = config
        self._reactor = reactor
        # The running reactor also takes calls from threads; Twisted types
        # the global one without IReactorFromThreads.
        self._from_threads = cast(IReactorFromThreads, reactor)
        self._make_exporter = exporter
        self._exporter: Optional[SpanExporter] = None
        self._queue: deque[RequestTrace] = deque()
        self._pool: Optional[ThreadPool] = None
        self._loop: Optional[LoopingCall] = None
        self._exporting: Optional[Deferred[Any]] = None
        self._soon: Any = None
        #: Spans by what became of them (for /metrics and tests).
        self.exported_spans = 0
        self.dropped_spans = 0
        self.failed_spans = 0
        #: Whether the last export failed (so a failing collector is logged once, not per batch).
        self._failing = False

    # -- the sink (on the reactor, per request) -------------------------------------------

    def add(self, trace: RequestTrace) -> None:
        """Queue a finished trace; drop it (counted) when the queue is full."""
        queue = self._queue
        if len(queue) >= self.config.max_queued_traces:
            self.dropped_spans += trace.span_count()
            return
        queue.append(trace)
        if len(queue) >= self.config.max_batch_traces and self._soon is None and self.running:
            self._soon = self._reactor.callLater(0, self._export_soon)

    def queued(self) -> int:
        """Traces waiting for export."""
        return len(self._queue)

    # -- the service ------------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        """Load the exporter before anything listens: a missing extra is a start-up error."""
        super().privilegedStartService()
        self._exporter = self._make_exporter(self.config)

    def startService(self) -> None:
        """Start the worker thread and the export interval."""
        super().startService()
        if self._exporter is None:
            self._exporter = self._make_exporter(self.config)
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="iop-otlp-export")
        self._pool.start()
        self._loop = LoopingCall(self.export_batch)
        self._loop.clock = self._reactor
        self._loop.start(self.config.export_interval_seconds, now=False)
        self._log.info("exporting traces over OTLP/HTTP to {endpoint}", endpoint=self.config.otlp_endpoint)

    def stopService(self) -> Deferred[None]:
        """Export what is queued (one batch after another, unless the collector is failing:
        then what is left counts as failed), then stop the thread."""
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        if self._soon is not None and self._soon.active():
            self._soon.cancel()
        self._soon = None
        d: Deferred[Any] = self._exporting if self._exporting is not None else succeed(None)

        def drain(_: object) -> Deferred[Any]:
            if not self._queue:
                return succeed(None)
            if self._failing:
                # The collector is failing: a stop waits for no more than one export.
                self.failed_spans += sum(trace.span_count() for trace in self._queue)
                self._queue.clear()
                return succeed(None)
            batch = self._take_batch()
            return self._run(batch).addCallback(drain)

        d.addCallback(drain)
        d.addCallback(lambda _: self._shutdown())
        return d

    def _shutdown(self) -> Deferred[None]:
        pool, self._pool = self._pool, None
        exporter, self._exporter = self._exporter, None
        if pool is None:
            return succeed(None)
        d: Deferred[Any] = deferToThreadPool(self._from_threads, pool, exporter.shutdown) if exporter else succeed(None)
        d.addErrback(lambda f: self._log.failure("closing the OTLP exporter failed", f))
        d.addBoth(lambda _: pool.stop())
        return d

    # -- exporting ----------------------------------------------------------------------------

    def _export_soon(self) -> None:
        self._soon = None
        self.export_batch()

    def export_batch(self) -> Optional[Deferred[Any]]:
        """Hand one batch to the worker thread, unless one is on its way already."""
        if self._exporting is not None or not self._queue or self._pool is None:
            return None
        return self._run(self._take_batch())

    def _take_batch(self) -> list[RequestTrace]:
        queue = self._queue
        return [queue.popleft() for _ in range(min(len(queue), self.config.max_batch_traces))]

    def _run(self, batch: list[RequestTrace]) -> Deferred[Any]:
        spans = sum(trace.span_count() for trace in batch)
        exporter, pool = self._exporter, self._pool
        if exporter is None or pool is None:
            self.failed_spans += spans
            return succeed(None)
        d: Deferred[Any] = deferToThreadPool(self._from_threads, pool, exporter.export, batch)
        self._exporting = d

        def exported(ok: bool) -> None:
            if ok:
                self.exported_spans += spans
                if self._failing:
                    self._failing = False
                    self._log.info("the OTLP collector takes traces again")
            else:
                self._failed(spans, "the collector did not take them")

        def failed(failure: Failure) -> None:
            self._failed(spans, failure.getErrorMessage()[:200])

        def done(_: object) -> None:
            self._exporting = None
            if len(self._queue) >= self.config.max_batch_traces and self.running and self._soon is None:
                self._soon = self._reactor.callLater(0, self._export_soon)

        d.addCallbacks(exported, failed)
        d.addBoth(done)
        return d

    def _failed(self, spans: int, reason: str) -> None:
        self.failed_spans += spans
        if not self._failing:
            self._failing = True
            self._log.warn(
                "exporting {spans} spans to the OTLP collector failed: {reason} (logged once until it recovers)",
                spans=spans,
                reason=reason,
            )
