"""The Edge's traces as OpenTelemetry spans, sent with the SDK's OTLP/HTTP exporter.

The only module of the package that imports OpenTelemetry (the optional
``[tracing]`` extra: ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http``). It runs in the export worker
thread (:mod:`.export`), never on the reactor.

Each :class:`~twisted_iop.tracing.spans.RequestTrace` becomes a server
span (kind ``SERVER``, the client's span as its parent) and one child
span per attempt (kind ``CLIENT``), named ``{operation} {model}`` as the
OpenTelemetry GenAI conventions name inference spans, with their
attributes: ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``error.type``. Where
a request ran is said with ids: ``iop.node.id`` and ``iop.provider.id``
(never ``server.address``: a Node's address is not shown outside its
Edge); ``iop.attempt`` numbers the attempts and ``iop.retry.reason`` says
why one was made.
"""

from __future__ import annotations

from typing import Any, Optional

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from twisted_iop import __version__
from twisted_iop.tracing.config import TracingConfig
from twisted_iop.tracing.spans import Attempt, RequestTrace

_SCOPE = InstrumentationScope("twisted_iop.edge", __version__)
_OK = Status(StatusCode.UNSET)


def _nanos(seconds: float) -> int:
    return int(seconds * 1e9)


class OtlpSdkExporter:
    """Turns finished traces into spans and posts them (blocking: in the worker thread)."""

    def __init__(self, config: TracingConfig) -> None:
        self._resource = Resource.create({"service.name": config.service_name})
        self._exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, timeout=config.export_timeout_seconds)

    def export(self, traces: list[RequestTrace]) -> bool:
        """Post the spans of ``traces`` in one request; whether the collector took them."""
        spans: list[ReadableSpan] = []
        for trace in traces:
            spans.extend(self.spans(trace))
        return self._exporter.export(spans) is SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the exporter's connections."""
        self._exporter.shutdown()

    def spans(self, trace: RequestTrace) -> list[ReadableSpan]:
        """The server span of ``trace`` and its attempts' spans."""
        trace_id = int(trace.trace_id, 16)
        flags = TraceFlags(TraceFlags.SAMPLED if trace.sampled else TraceFlags.DEFAULT)
        state = TraceState.from_header([trace.tracestate]) if trace.tracestate else TraceState()
        server = SpanContext(trace_id, int(trace.span_id, 16), is_remote=False, trace_flags=flags, trace_state=state)
        parent: Optional[SpanContext] = None
        if trace.parent_span_id:
            parent = SpanContext(
                trace_id, int(trace.parent_span_id, 16), is_remote=True, trace_flags=flags, trace_state=state
            )
        name = f"{trace.operation} {trace.model}"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": trace.operation,
            "gen_ai.request.model": trace.model,
            "iop.attempts": len(trace.attempts),
        }
        if trace.input_tokens >= 0:
            attributes["gen_ai.usage.input_tokens"] = trace.input_tokens
        if trace.output_tokens >= 0:
            attributes["gen_ai.usage.output_tokens"] = trace.output_tokens
        if trace.status_code:
            attributes["http.response.status_code"] = trace.status_code
        if trace.attempts:
            attributes["iop.node.id"] = trace.attempts[-1].node_id
            attributes["iop.provider.id"] = trace.attempts[-1].provider_id
        if trace.error_type:
            attributes["error.type"] = trace.error_type
        spans = [
            ReadableSpan(
                name=name,
                context=server,
                parent=parent,
                resource=self._resource,
                attributes=attributes,
                kind=SpanKind.SERVER,
                status=_status(trace.error_type),
                start_time=_nanos(trace.start),
                end_time=_nanos(trace.end),
                instrumentation_scope=_SCOPE,
            )
        ]
        for number, attempt in enumerate(trace.attempts, 1):
            spans.append(self._attempt_span(trace, attempt, number, name, server, flags, state, trace_id))
        return spans

    def _attempt_span(
        self,
        trace: RequestTrace,
        attempt: Attempt,
        number: int,
        name: str,
        server: SpanContext,
        flags: TraceFlags,
        state: TraceState,
        trace_id: int,
    ) -> ReadableSpan:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": trace.operation,
            "gen_ai.request.model": trace.model,
            "iop.node.id": attempt.node_id,
            "iop.provider.id": attempt.provider_id,
            "iop.attempt": number,
        }
        if attempt.retry_reason:
            attributes["iop.retry.reason"] = attempt.retry_reason
        if attempt.error_type:
            attributes["error.type"] = attempt.error_type
        return ReadableSpan(
            name=name,
            context=SpanContext(
                trace_id, int(attempt.span_id, 16), is_remote=False, trace_flags=flags, trace_state=state
            ),
            parent=server,
            resource=self._resource,
            attributes=attributes,
            kind=SpanKind.CLIENT,
            status=_status(attempt.error_type),
            start_time=_nanos(attempt.start),
            end_time=_nanos(attempt.end or trace.end),
            instrumentation_scope=_SCOPE,
        )


def _status(error_type: str) -> Status:
    return Status(StatusCode.ERROR, error_type) if error_type else _OK
