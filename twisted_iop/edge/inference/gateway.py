"""The Edge's inference request path: forwarding and release, around its lifecycle.

Two layers:

* :class:`~twisted_iop.edge.inference.lifecycle.InferenceLifecycle` (pure,
  no I/O, in ``inference_lifecycle.py``) is the state machine of every
  request: ``queued`` (a place in its model's FIFO admission queue) ->
  ``leased`` (holds a lease, forwarded to its Node, nothing relayed yet) ->
  ``streaming`` (output reached the client) -> ``finished``. It owns the
  leases it takes from the :class:`~twisted_iop.edge.providers.pool.ProviderPool` and
  releases each exactly once, whatever ends the request. A request that
  failed before any output reached the client (its Node lost, its engine
  unreachable or overloaded) goes back to its queue and runs on another
  provider, at most ``inference.failover.max_retries`` times; the provider
  that failed it cools down (see ``registry.providers.request_failed``).
* :class:`InferenceGateway` does the I/O around it: ``InferenceRequest`` to
  the Node that owns the leased provider, ``InferenceChunk`` /
  ``InferenceDone`` back to the client's :class:`ResponseSink`,
  ``InferenceCancel`` when the client goes away, timers for the queue and
  for a silent Node. The chunks of one request that arrive in the same
  reactor turn (one read from the Node carries many frames) reach the
  sink together, in order, at the start of the next turn: one HTTP write
  for all of them. That is at most one read's worth, never a whole stream.

Whether a model's request may be admitted at all (or wait) is
:mod:`~twisted_iop.edge.inference.admission`'s; what a failed answer means
for the client and the provider is :mod:`~twisted_iop.edge.inference.errors`'. Each failed request is one log
line (model, provider, code, reason); a successful one is none. Tokens of
the engine's usage are counted in the registry's
:class:`~twisted_iop.edge.inference.tokens.TokenCounter`. Each request carries its
trace (:class:`~twisted_iop.tracing.spans.RequestTrace`): every attempt on
a provider is a span whose ``traceparent`` goes to the Node, and a failed
attempt's code is the reason of the next.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, cast

import attrs
from google.protobuf.message import Message
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from twisted_iop.edge.inference.admission import available_models, check_model, is_long_context, queue_full
from twisted_iop.edge.inference.config import InferenceConfig
from twisted_iop.edge.inference.errors import (
    UNSUPPORTED_MEMORY_SECONDS,
    FailureKind,
    UnsupportedEndpoints,
    client_error,
    failure_kind,
    not_supported,
)
from twisted_iop.edge.inference.latency import CANCELLED, CLIENT_ERROR, ERROR, OK
from twisted_iop.edge.inference.lifecycle import InferenceError, InferenceLifecycle, Outcome, Phase, QueueFull, Ticket
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.providers.pool import Lease, NoSuchModel
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.openai_api import CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS
from twisted_iop.tracing.spans import EdgeTracer, RequestTrace
from twisted_iop.wire import control_pb2 as pb

#: Wire bodies of the inference path that the Edge receives from a Node
#: (what the Node receives is ``node.inference.INFERENCE_BODIES_FROM_EDGE``).
INFERENCE_BODIES_FROM_NODE = frozenset({"inference_chunk", "inference_done"})
#: Endpoint names in metrics and logs.
ENDPOINT_NAMES = {
    pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS: CHAT_COMPLETIONS,
    pb.INFERENCE_ENDPOINT_COMPLETIONS: COMPLETIONS,
    pb.INFERENCE_ENDPOINT_EMBEDDINGS: EMBEDDINGS,
}
#: The OpenTelemetry GenAI operation of each endpoint (``gen_ai.operation.name`` of its spans).
GENAI_OPERATIONS = {
    pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS: "chat",
    pb.INFERENCE_ENDPOINT_COMPLETIONS: "text_completion",
    pb.INFERENCE_ENDPOINT_EMBEDDINGS: "embeddings",
}
#: Outcomes that are a failed request (logged, one line each).
_FAILURES = frozenset({Outcome.PROVIDER_ERROR, Outcome.NODE_SILENT, Outcome.QUEUE_TIMEOUT})
#: The latency figures' outcome of each ending (a provider error may be the client's: see ``client_fault``).
_LATENCY_OUTCOMES = {
    Outcome.COMPLETED: OK,
    Outcome.PROVIDER_ERROR: ERROR,
    Outcome.CLIENT_GONE: CANCELLED,
    Outcome.CLIENT_TOO_SLOW: CANCELLED,
    Outcome.NODE_LOST: ERROR,
    Outcome.NODE_SILENT: ERROR,
    Outcome.QUEUE_TIMEOUT: ERROR,
    Outcome.EDGE_STOPPING: ERROR,
}

# -- the gateway (I/O) ---------------------------------------------------------


class ResponseSink(Protocol):
    """Where one request's answer goes (the HTTP API's response to its client)."""

    def chunks(self, events: list[bytes]) -> None:
        """Streamed events in order (each the JSON after ``data: ``), to be written at once."""

    def complete(self, done: pb.InferenceDone) -> None:
        """The request finished well (the whole body for non-streaming)."""

    def fail(self, error: InferenceError) -> None:
        """The request ended with an error."""


class InferenceNodePeer(Protocol):
    """What the gateway needs from a Node connection."""

    closing: bool

    def send(self, body: str, message: Message, request_id: int = 0) -> None:
        """Send one envelope."""


@attrs.define(eq=False)
class _AdmittedRequest:
    """One request the gateway admitted, from its queue to its end.

    Its lifecycle ticket, where its answer goes, what to send the Node, and
    once leased, the Node connection it was sent on.
    """

    ticket: Ticket
    sink: ResponseSink
    endpoint: pb.InferenceEndpoint
    body: bytes
    stream: bool
    trace: RequestTrace
    peer: Optional[InferenceNodePeer] = None
    timer: Optional[IDelayedCall] = None
    #: When it was admitted, and when it last joined a queue (metrics).
    submitted_at: float = 0.0
    queued_at: float = 0.0
    first_output: bool = False
    #: When its first streamed output reached the Edge (latency: its time to first token).
    first_output_at: Optional[float] = None
    #: Its provider error was the client's own (a 4xx by inference_errors' rules): not an error of the provider's.
    client_fault: bool = False
    #: Events received in this reactor turn, not yet given to the sink.
    pending: list[bytes] = attrs.field(factory=list)


class InferenceGateway:
    """Admits, forwards and ends inference requests over the Node wire."""

    _log = Logger()

    def __init__(
        self,
        registry: NodeRegistry,
        config: InferenceConfig,
        clock: IReactorTime,
        tracer: Optional[EdgeTracer] = None,
    ) -> None:
        self._registry = registry
        #: Starts each request's trace (and hands the recorded ones to the exporter).
        self.tracer = tracer if tracer is not None else EdgeTracer()
        self.config = config
        self._clock = clock
        self.lifecycle = InferenceLifecycle(registry.pool, config.max_queued_per_model, config.max_retries)
        self._admitted: dict[int, _AdmittedRequest] = {}
        self._by_peer: dict[InferenceNodePeer, set[int]] = {}
        #: Admitted requests with pending events, and the call that writes them (next turn).
        self._flushing: list[_AdmittedRequest] = []
        self._flush_call: Optional[IDelayedCall] = None
        self.stopping = False
        #: Requests ended, by outcome name (for logs, tests and benchmarks).
        self.outcomes: dict[str, int] = {}
        #: Requests sent to another provider after a failure, by the failure's code.
        self.retries: dict[str, int] = {}
        #: For /metrics: requests ended by (endpoint, outcome), time to the
        #: first output and to the end of completed requests (the GenAI
        #: latency figures and queue waits are the registry's ``latency``).
        self.requests: dict[tuple[str, str], int] = {}
        #: Endpoints a provider answered "not supported" for: not sent there again for a while.
        self.unsupported = UnsupportedEndpoints()
        self.first_byte_seconds = LatencyHistogram()
        self.total_seconds = LatencyHistogram()

    # -- questions the API asks ----------------------------------------------------

    def long_context(self, body: dict[str, Any]) -> bool:
        """Whether characters/4 + max_tokens is above the threshold."""
        return is_long_context(body, self.config.long_context_threshold_tokens)

    def available_models(self) -> list[str]:
        """Models some provider serves now or only "not now" (:func:`available_models`)."""
        return available_models(self._registry)

    def check_model(self, model: str, long_context: bool) -> None:
        """Raise the right :class:`InferenceError` if ``model`` cannot be admitted now (:func:`check_model`)."""
        check_model(self._registry, self.config, model, long_context)

    # -- requests --------------------------------------------------------------------

    def start_trace(
        self,
        endpoint: pb.InferenceEndpoint,
        model: str,
        traceparent: Optional[list[bytes]] = None,
        tracestate: Optional[list[bytes]] = None,
    ) -> RequestTrace:
        """The trace of a new request: its client's (``traceparent`` header lines) or a new one."""
        operation = GENAI_OPERATIONS.get(endpoint, "unknown")
        return self.tracer.start(traceparent, tracestate, operation, model, self._clock.seconds())

    def submit(
        self,
        endpoint: pb.InferenceEndpoint,
        model: str,
        long_context: bool,
        body: bytes,
        stream: bool,
        sink: ResponseSink,
        trace: Optional[RequestTrace] = None,
    ) -> int:
        """Admit a request (lease now or queue); return its inference id.

        Raises :class:`InferenceError` (404, 400, 503, 429) when it cannot
        even wait for a lease (its trace ends with that error).
        """
        if trace is None:
            trace = self.start_trace(endpoint, model)
        try:
            return self._submit(endpoint, model, long_context, body, stream, sink, trace)
        except InferenceError as refused:
            trace.finish(self._clock.seconds(), refused.code, refused.status)
            raise

    def _submit(
        self,
        endpoint: pb.InferenceEndpoint,
        model: str,
        long_context: bool,
        body: bytes,
        stream: bool,
        sink: ResponseSink,
        trace: RequestTrace,
    ) -> int:
        try:
            if self.stopping:
                raise InferenceError(503, "shutting_down", "the edge is shutting down", kind="server_error")
            self.check_model(model, long_context)
        except InferenceError as refused:
            self._count_request(endpoint, refused.code)
            raise
        admitted: Optional[_AdmittedRequest] = None

        def granted(ticket: Ticket) -> None:
            assert admitted is not None
            self._dispatch(admitted)

        pending: list[Ticket] = []

        def granted_first(ticket: Ticket) -> None:
            # The very first grant may happen inside submit, before the
            # admitted request exists: remember it and dispatch right after.
            if admitted is None:
                pending.append(ticket)
            else:
                granted(ticket)

        try:
            ticket = self.lifecycle.submit(model, long_context, granted_first)
        except QueueFull as e:
            self._count("queue_full")
            self._count_request(endpoint, "queue_full")
            raise queue_full(model, e, self.config.retry_after_seconds) from None
        except NoSuchModel as e:
            self._count_request(endpoint, "model_not_found")
            raise InferenceError(404, "model_not_found", str(e)) from None
        now = self._clock.seconds()
        admitted = _AdmittedRequest(ticket, sink, endpoint, body, stream, trace, submitted_at=now, queued_at=now)
        self._admitted[ticket.inference_id] = admitted
        if pending:
            self._dispatch(admitted)
        else:
            self._start_queue_timer(admitted)
        return ticket.inference_id

    def client_gone(self, inference_id: int, outcome: Outcome = Outcome.CLIENT_GONE) -> None:
        """The client disconnected (or reads too slowly): end the request, cancel on the Node."""
        admitted = self._admitted.get(inference_id)
        if admitted is not None:
            self._end(admitted, outcome)

    def stop(self) -> None:
        """The Edge is stopping: end every request with 503."""
        self.stopping = True
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush()
        for admitted in list(self._admitted.values()):
            self._end(
                admitted,
                Outcome.EDGE_STOPPING,
                InferenceError(503, "shutting_down", "the edge is shutting down", kind="server_error"),
            )

    def running(self) -> int:
        """Requests admitted and not yet ended (queued or running)."""
        return len(self._admitted)

    # -- the Node wire ---------------------------------------------------------------

    def node_message(self, peer: InferenceNodePeer, envelope: pb.Envelope, body: str) -> None:
        """``inference_chunk`` or ``inference_done`` from a Node connection."""
        if body == "inference_chunk":
            message: Any = envelope.inference_chunk
        elif body == "inference_done":
            message = envelope.inference_done
        else:
            return
        admitted = self._admitted.get(message.inference_id)
        if admitted is None or admitted.peer is not peer:
            return  # cancelled, timed out, or not this connection's: harmless
        if body == "inference_chunk":
            if not admitted.stream:
                self._log.warn("ignoring a chunk for non-streaming inference {id}", id=message.inference_id)
                return
            if not admitted.pending:
                # The first event of this turn: re-arm the silence timer once per turn, not per event.
                self._arm_idle_timer(admitted)
                self.lifecycle.first_output(admitted.ticket)
                if not admitted.first_output:
                    admitted.first_output = True
                    now = admitted.first_output_at = self._clock.seconds()
                    self.first_byte_seconds.observe(now - admitted.submitted_at)  # metrics
                self._flushing.append(admitted)
                if self._flush_call is None:
                    self._flush_call = self._clock.callLater(0, self._flush)
            admitted.pending.append(message.data)
            return
        self._done(admitted, message)

    def _done(self, admitted: _AdmittedRequest, done: pb.InferenceDone) -> None:
        lease = admitted.ticket.lease
        assert lease is not None  # sent to a Node only once leased
        node_id, provider_id = lease.node_id, lease.provider_id
        if done.HasField("usage"):
            usage = done.usage
            admitted.trace.usage(usage.prompt_tokens, usage.completion_tokens)
            self._registry.tokens.add(
                node_id,
                provider_id,
                admitted.ticket.model,
                usage.prompt_tokens,
                usage.completion_tokens,
                self._clock.seconds(),
                estimated=usage.estimated,
            )
        if done.status == pb.INFERENCE_STATUS_OK:
            self._registry.providers.request_succeeded(node_id, provider_id)
            self._end(admitted, Outcome.COMPLETED, done=done)
            return
        error = client_error(done, self.config.retry_after_seconds)
        admitted.trace.attempt_failed(error.code, self._clock.seconds())  # the reason of a next attempt
        if not_supported(done):
            self.unsupported.remember(node_id, provider_id, admitted.endpoint, error, self._clock.seconds())
            self._log.info(
                "node {node_id} provider {provider_id} does not serve {endpoint}: such requests are answered "
                "without it for {seconds:g}s ({reason})",
                node_id=node_id,
                provider_id=provider_id,
                endpoint=ENDPOINT_NAMES.get(admitted.endpoint, "unknown"),
                seconds=UNSUPPORTED_MEMORY_SECONDS,
                reason=error.message[:200],
            )
            if self._try_elsewhere(admitted):
                return
        kind = failure_kind(done)
        admitted.client_fault = kind is FailureKind.CLIENT
        if kind is not FailureKind.CLIENT:
            reason = f"{error.code}: {error.message}"[:200]
            self._registry.providers.request_failed(
                node_id, provider_id, reason, cool_down_now=kind is FailureKind.ELSEWHERE
            )
        if kind is FailureKind.ELSEWHERE and admitted.ticket.phase is Phase.LEASED:
            self._forget_peer(admitted)
            self._cancel_timer(admitted)
            admitted.queued_at = self._clock.seconds()  # metrics: a retry waits again
            elsewhere = self.lifecycle.failed_before_output(admitted.ticket)
            # No other provider takes it now, but this one is only "not now" (an engine
            # restarting or re-probing): the request waits for it in the queue.
            if elsewhere or (
                self._registry.provider_may_serve(node_id, provider_id)
                and self.lifecycle.wait_for_return(admitted.ticket)
            ):
                self.retries[error.code] = self.retries.get(error.code, 0) + 1
                self._log.info(
                    "inference {id} (model {model}) failed on node {node_id} provider {provider_id} "
                    "before its first byte ({code}); {next}",
                    id=admitted.ticket.inference_id,
                    model=admitted.ticket.model,
                    node_id=node_id,
                    provider_id=provider_id,
                    code=error.code,
                    next="retrying on another provider" if elsewhere else "waiting for a provider to take it",
                )
                if admitted.ticket.phase is Phase.QUEUED:
                    self._start_queue_timer(admitted)
                return
        # A client's mistake is logged at debug: a client repeating it makes no line per request.
        self._end(admitted, Outcome.PROVIDER_ERROR, error, quiet=kind is FailureKind.CLIENT)

    def _try_elsewhere(self, admitted: _AdmittedRequest) -> bool:
        """The leased provider does not serve the request's endpoint: send it to another
        provider of its model if one takes work (True), else the caller ends it with ``error``."""
        if admitted.ticket.phase is not Phase.LEASED:
            return False
        self._forget_peer(admitted)
        self._cancel_timer(admitted)
        if not self.lifecycle.failed_before_output(admitted.ticket):
            return False
        if admitted.ticket.phase is Phase.QUEUED:
            self._start_queue_timer(admitted)
        return True

    def connection_lost(self, peer: InferenceNodePeer) -> None:
        """A Node connection closed: retry what had no output yet, fail the rest."""
        for inference_id in sorted(self._by_peer.pop(peer, set())):
            admitted = self._admitted.get(inference_id)
            if admitted is not None and admitted.peer is peer:
                self._node_lost(admitted)

    # -- internals ---------------------------------------------------------------------

    def _flush(self) -> None:
        """Give every admitted request the events it received in the last turn (one write each)."""
        self._flush_call = None
        flushing, self._flushing = self._flushing, []
        for admitted in flushing:
            self._write_pending(admitted)

    def _write_pending(self, admitted: _AdmittedRequest) -> None:
        if admitted.pending:
            events, admitted.pending = admitted.pending, []
            admitted.sink.chunks(events)

    def _dispatch(self, admitted: _AdmittedRequest) -> None:
        ticket = admitted.ticket
        lease = ticket.lease
        assert lease is not None
        self._cancel_timer(admitted)
        now = self._clock.seconds()
        self._registry.latency.queue_waited(ticket.model, lease.node_id, lease.provider_id, now - admitted.queued_at)
        unsupported = self.unsupported.known(lease.node_id, lease.provider_id, admitted.endpoint, now)
        if unsupported is not None:
            if not self._try_elsewhere(admitted):
                admitted.client_fault = True  # the engine does not serve the endpoint asked for
                self._end(admitted, Outcome.PROVIDER_ERROR, unsupported, quiet=True)  # said once, when remembered
            return
        peer = self._registry.owner_peer(lease.node_id)
        if peer is None or getattr(peer, "closing", False) or not hasattr(peer, "send"):
            self._node_lost(admitted)
            return
        node_peer = cast(InferenceNodePeer, peer)  # it has send (checked above)
        admitted.peer = node_peer
        self._by_peer.setdefault(node_peer, set()).add(ticket.inference_id)
        request = pb.InferenceRequest(
            inference_id=ticket.inference_id,
            provider_id=lease.provider_id,
            endpoint=admitted.endpoint,
            body=admitted.body,
            stream=admitted.stream,
            model=ticket.model,
            traceparent=admitted.trace.attempt(lease.node_id, lease.provider_id, self._clock.seconds()),
            tracestate=admitted.trace.tracestate,
        )
        node_peer.send("inference_request", request)
        self._arm_idle_timer(admitted)

    def _node_lost(self, admitted: _AdmittedRequest) -> None:
        lease = admitted.ticket.lease
        last_lease = lease
        lost_node = f"node {lease.node_id} provider {lease.provider_id}" if lease is not None else "no provider"
        admitted.trace.attempt_failed(Outcome.NODE_LOST.value, self._clock.seconds())
        self._forget_peer(admitted)
        self._cancel_timer(admitted)
        admitted.queued_at = self._clock.seconds()  # metrics: a retry waits again
        if self.lifecycle.node_lost(admitted.ticket):
            if admitted.ticket.phase is Phase.QUEUED:
                self._start_queue_timer(admitted)
            return
        self._admitted.pop(admitted.ticket.inference_id, None)
        self._count(Outcome.NODE_LOST.value)
        self._count_request(admitted.endpoint, Outcome.NODE_LOST.value)
        self._record_latency(admitted, last_lease, ERROR, None)
        self._write_pending(admitted)
        error = InferenceError(502, "node_lost", "the node running this request was lost", kind="server_error")
        admitted.trace.finish(self._clock.seconds(), error.code, error.status)
        self._log_failure(admitted, error, lost_node)
        admitted.sink.fail(error)

    def _end(
        self,
        admitted: _AdmittedRequest,
        outcome: Outcome,
        error: Optional[InferenceError] = None,
        done: Optional[pb.InferenceDone] = None,
        quiet: bool = False,
    ) -> None:
        ticket = admitted.ticket
        if self._admitted.pop(ticket.inference_id, None) is None:
            return
        lease = ticket.lease
        if error is not None and outcome in _FAILURES:
            where = f"node {lease.node_id} provider {lease.provider_id}" if lease is not None else "no provider"
            self._log_failure(admitted, error, where, quiet)
            if outcome is Outcome.NODE_SILENT and lease is not None:
                self._registry.providers.request_failed(
                    lease.node_id, lease.provider_id, error.code, cool_down_now=False
                )
        self._cancel_timer(admitted)
        peer = admitted.peer
        self._forget_peer(admitted)
        if self.lifecycle.finish(ticket, outcome) and peer is not None:
            peer.send("inference_cancel", pb.InferenceCancel(inference_id=ticket.inference_id, reason=outcome.value))
        self._count(outcome.value)
        self._count_request(admitted.endpoint, outcome.value)
        self._finish_trace(admitted, outcome, error)
        if outcome is Outcome.COMPLETED:
            elapsed = self._clock.seconds() - admitted.submitted_at
            self.total_seconds.observe(elapsed)  # metrics
            if not admitted.first_output:
                self.first_byte_seconds.observe(elapsed)  # metrics: a whole answer is its first byte
        latency_outcome = _LATENCY_OUTCOMES[outcome]
        if latency_outcome == ERROR and admitted.client_fault:
            latency_outcome = CLIENT_ERROR
        self._record_latency(
            admitted,
            lease,
            latency_outcome,
            done.usage.completion_tokens if done is not None and done.HasField("usage") else None,
        )
        if done is not None or error is not None:
            self._write_pending(admitted)  # what arrived before the end goes first
        else:
            admitted.pending = []  # the client is gone: nothing more is written
        if done is not None:
            admitted.sink.complete(done)
        elif error is not None:
            admitted.sink.fail(error)

    def _record_latency(
        self, admitted: _AdmittedRequest, lease: Optional[Lease], outcome: str, completion_tokens: Optional[int]
    ) -> None:
        """The request's figures to the latency recorder, on the provider that held it last."""
        self._registry.latency.request_ended(
            admitted.ticket.model,
            lease.node_id if lease is not None else "",
            lease.provider_id if lease is not None else "",
            outcome,
            admitted.submitted_at,
            admitted.first_output_at,
            self._clock.seconds(),
            completion_tokens,
        )

    def _finish_trace(self, admitted: _AdmittedRequest, outcome: Outcome, error: Optional[InferenceError]) -> None:
        """End the request's trace: its error code (or how it ended) and the status sent."""
        if error is not None:
            admitted.trace.finish(self._clock.seconds(), error.code, error.status)
        elif outcome is Outcome.COMPLETED:
            admitted.trace.finish(self._clock.seconds(), "", 200)
        else:
            admitted.trace.finish(self._clock.seconds(), outcome.value)

    def _log_failure(self, admitted: _AdmittedRequest, error: InferenceError, where: str, quiet: bool = False) -> None:
        """The one line of a failed request: model, provider, code and reason (never an address);
        at debug when ``quiet`` (a client's mistake)."""
        emit = self._log.debug if quiet else self._log.info
        emit(
            "inference {id} (model {model}) failed on {where}: {status} {code}: {reason}",
            id=admitted.ticket.inference_id,
            model=admitted.ticket.model,
            where=where,
            status=error.status,
            code=error.code,
            reason=error.message[:200],
        )

    def _forget_peer(self, admitted: _AdmittedRequest) -> None:
        if admitted.peer is not None:
            ids = self._by_peer.get(admitted.peer)
            if ids is not None:
                ids.discard(admitted.ticket.inference_id)
                if not ids:
                    del self._by_peer[admitted.peer]
            admitted.peer = None

    def _start_queue_timer(self, admitted: _AdmittedRequest) -> None:
        self._cancel_timer(admitted)
        seconds = self.config.queue_timeout_seconds
        admitted.timer = self._clock.callLater(seconds, self._queue_timeout, admitted)

    def _queue_timeout(self, admitted: _AdmittedRequest) -> None:
        admitted.timer = None
        if admitted.ticket.phase is not Phase.QUEUED:
            return
        seconds = self.config.queue_timeout_seconds
        self._end(
            admitted,
            Outcome.QUEUE_TIMEOUT,
            InferenceError(
                503,
                "queue_timeout",
                f"no provider of {admitted.ticket.model!r} became free within {seconds:g}s",
                kind="server_error",
                retry_after=self.config.retry_after_seconds,
            ),
        )

    def _arm_idle_timer(self, admitted: _AdmittedRequest) -> None:
        seconds = self.config.idle_timeout_seconds
        if admitted.timer is not None and admitted.timer.active():
            admitted.timer.reset(seconds)
        else:
            admitted.timer = self._clock.callLater(seconds, self._node_silent, admitted)

    def _node_silent(self, admitted: _AdmittedRequest) -> None:
        admitted.timer = None
        seconds = self.config.idle_timeout_seconds
        self._end(
            admitted,
            Outcome.NODE_SILENT,
            InferenceError(
                504, "provider_timeout", f"no answer from the provider for {seconds:g}s", kind="server_error"
            ),
        )

    def _cancel_timer(self, admitted: _AdmittedRequest) -> None:
        timer, admitted.timer = admitted.timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def _count_request(self, endpoint: pb.InferenceEndpoint, outcome: str) -> None:
        key = (ENDPOINT_NAMES.get(endpoint, "unknown"), outcome)
        self.requests[key] = self.requests.get(key, 0) + 1
