"""One inference request's trace at the Edge, and the ``x-iop-route`` header.

:class:`EdgeTracer` starts a :class:`RequestTrace` for each request: it
continues the client's ``traceparent`` (the client's span is the parent of
the Edge's server span) or, when the header is absent or invalid, starts a
new trace. Each attempt (the first, a retry after a failure, a failover to
another provider) is a child span of the server span with its own span id
and, after the first, the reason it was made: the error code of the
attempt before it. The attempt's ``traceparent`` is what the Node sends the
engine, so the engine's own spans hang under the attempt.

The sampling decision follows the client's ``sampled`` flag when it sent
one, else ``tracing.sample_ratio`` (by trace id); the flag sent onwards is
that decision. A trace is *recorded* (kept for export) only when it is
sampled and an exporter is configured; otherwise it only carries ids, a
few objects per request and no work per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

from twisted_iop.tracing.context import IdSource, format_traceparent, parse_traceparent_headers, parse_tracestate
from twisted_iop.tracing.context import sampled_by_ratio as _sampled_by_ratio

#: The ``x-iop-route`` answer header.
ROUTE_HEADER = b"x-iop-route"
#: Model names longer than this are cut in traces (a model the client made up).
MAX_MODEL_CHARS = 256


class Attempt:
    """One attempt of a request on one provider: a child span of the server span."""

    __slots__ = ("end", "error_type", "node_id", "provider_id", "retry_reason", "span_id", "start")

    def __init__(self, span_id: str, node_id: str, provider_id: str, start: float, retry_reason: str) -> None:
        self.span_id = span_id
        self.node_id = node_id
        self.provider_id = provider_id
        self.start = start
        #: 0.0 while it runs.
        self.end = 0.0
        #: Why it failed ("" when it did not): an error code.
        self.error_type = ""
        #: Why it was made: the error code of the attempt before it ("" for the first).
        self.retry_reason = retry_reason


class RequestTrace:
    """The trace of one request at the Edge: its server span and its attempts."""

    __slots__ = (
        "_tracer",
        "attempts",
        "end",
        "error_type",
        "input_tokens",
        "model",
        "operation",
        "output_tokens",
        "parent_span_id",
        "recording",
        "retry_reason",
        "sampled",
        "span_id",
        "start",
        "status_code",
        "trace_id",
        "tracestate",
    )

    def __init__(
        self,
        tracer: EdgeTracer,
        trace_id: str,
        span_id: str,
        parent_span_id: str,
        sampled: bool,
        tracestate: str,
        operation: str,
        model: str,
        start: float,
    ) -> None:
        self._tracer = tracer
        self.trace_id = trace_id
        #: The Edge's server span.
        self.span_id = span_id
        #: The client's span ("" when the Edge started the trace).
        self.parent_span_id = parent_span_id
        self.sampled = sampled
        self.recording = sampled and tracer.exporting
        self.tracestate = tracestate
        #: The GenAI operation (``chat``, ``text_completion``, ``embeddings``).
        self.operation = operation
        self.model = model[:MAX_MODEL_CHARS]
        self.start = start
        self.end = 0.0
        self.attempts: list[Attempt] = []
        #: The reason of the next attempt (the code of the last failure).
        self.retry_reason = ""
        self.error_type = ""
        self.status_code = 0
        #: The engine's usage, -1 until known.
        self.input_tokens = -1
        self.output_tokens = -1

    # -- headers --------------------------------------------------------------

    def traceparent(self) -> str:
        """The ``traceparent`` of the Edge's server span (sent back to the client)."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)

    def route_header(self) -> Optional[bytes]:
        """``node=<id>;provider=<id>;attempts=N`` of the last attempt, or ``None`` before the first.

        Node and provider *ids* (what the views show), never an address.
        """
        if not self.attempts:
            return None
        last = self.attempts[-1]
        return f"node={last.node_id};provider={last.provider_id};attempts={len(self.attempts)}".encode("ascii")

    # -- the request's life --------------------------------------------------------

    def attempt(self, node_id: str, provider_id: str, now: float) -> str:
        """A new attempt on ``provider_id`` of ``node_id`` begins: its ``traceparent``."""
        if self.attempts and not self.attempts[-1].end:
            self.attempt_failed("superseded", now)  # not expected: an attempt still open ends here
        span_id = self._tracer.ids.span_id()
        self.attempts.append(Attempt(span_id, node_id, provider_id, now, self.retry_reason))
        return format_traceparent(self.trace_id, span_id, self.sampled)

    def attempt_failed(self, error_type: str, now: float) -> None:
        """The running attempt (if any) failed with ``error_type``; it is the next attempt's reason."""
        self.retry_reason = error_type
        if self.attempts:
            last = self.attempts[-1]
            if not last.end:
                last.end = now
                last.error_type = error_type

    def usage(self, input_tokens: int, output_tokens: int) -> None:
        """The engine's token counts."""
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens

    def finish(self, now: float, error_type: str = "", status_code: int = 0) -> None:
        """The request ended (``error_type`` "" when it completed); hand it to the exporter."""
        if self.end:
            return
        self.end = now
        self.error_type = error_type
        self.status_code = status_code
        if self.attempts:
            last = self.attempts[-1]
            if not last.end:
                last.end = now
                last.error_type = error_type
        if self.recording:
            self._tracer.finished(self)

    def span_count(self) -> int:
        """Spans this trace exports: the server span and one per attempt."""
        return 1 + len(self.attempts)


class TraceSink:
    """Where recorded traces go when they end (the exporter's queue), and what became of their spans."""

    exported_spans = 0
    dropped_spans = 0
    failed_spans = 0

    def add(self, trace: RequestTrace) -> None:
        """Take a finished, recorded trace (never blocking)."""
        raise NotImplementedError


class EdgeTracer:
    """Starts the trace of each request; hands the recorded ones to ``sink`` when they end."""

    def __init__(
        self,
        sample_ratio: float = 1.0,
        sink: Optional[TraceSink] = None,
        ids: Optional[IdSource] = None,
        sampled_by_ratio: Callable[[str, float], bool] = _sampled_by_ratio,
    ) -> None:
        self.sample_ratio = sample_ratio
        self.sink = sink
        self.ids = ids if ids is not None else IdSource()
        self._sampled_by_ratio = sampled_by_ratio
        #: Requests whose client sent a ``traceparent`` that was not valid (a new trace was started).
        self.invalid_traceparents = 0

    @property
    def exporting(self) -> bool:
        """Whether recorded traces go anywhere."""
        return self.sink is not None

    def start(
        self,
        traceparent: Optional[Sequence[bytes]],
        tracestate: Optional[Sequence[bytes]],
        operation: str,
        model: str,
        now: float,
    ) -> RequestTrace:
        """The trace of a new request: the client's continued, or a new one.

        ``traceparent`` and ``tracestate`` are the request's header lines
        (``None`` when absent).
        """
        parent = parse_traceparent_headers(traceparent)
        if parent is None:
            if traceparent:
                self.invalid_traceparents += 1
            trace_id = self.ids.trace_id()
            return RequestTrace(
                self,
                trace_id,
                self.ids.span_id(),
                "",
                self._sampled_by_ratio(trace_id, self.sample_ratio),
                "",  # a tracestate without its traceparent means nothing
                operation,
                model,
                now,
            )
        return RequestTrace(
            self,
            parent.trace_id,
            self.ids.span_id(),
            parent.span_id,
            parent.sampled,
            parse_tracestate(tracestate),
            operation,
            model,
            now,
        )

    def finished(self, trace: RequestTrace) -> None:
        """A recorded trace ended."""
        if self.sink is not None:
            self.sink.add(trace)
