"""One forwarded inference request as it runs on its provider.

A job is what the :class:`~twisted_iop.node.inference.InferenceRunner`
starts for one ``InferenceRequest`` and later cancels, pauses or resumes:

* :class:`HTTPJob`: a POST to an engine's OpenAI-compatible API (the
  request's checked ``traceparent`` and ``tracestate`` as headers,
  :func:`trace_headers`), its answer read event by event by
  :class:`~twisted_iop.node.engines.stream.EngineBodyReader`, sent once
  more when a kept-alive connection closed under it, and no answer at all
  said in words that name no address (:func:`unreachable_reason`);
* :class:`MockJob`: :class:`~twisted_iop.mock_provider.MockRun` in
  process, paced by the provider's mock options (:func:`mock_behaviour`).

A job reports through a :class:`JobReply` (the runner's, which frames
what it is given and sends ``InferenceDone`` once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional, Protocol

from twisted.internet.defer import CancelledError, Deferred, TimeoutError
from twisted.internet.error import ConnectError, ConnectingCancelledError, ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from twisted.web._newclient import RequestTransmissionFailed, ResponseNeverReceived

from twisted_iop.mock_provider import MockBehaviour, MockRun
from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.base import EngineAdapter, EngineError
from twisted_iop.node.engines.http import InferenceHTTPClient
from twisted_iop.node.engines.kinds import adapter_for
from twisted_iop.node.engines.stream import EngineAnswer, EngineBodyReader, EngineRequest, estimated_usage
from twisted_iop.openai_api import EMBEDDINGS
from twisted_iop.tracing.context import parse_traceparent, parse_tracestate
from twisted_iop.wire import control_pb2 as pb

#: How long a provider may take to send its response headers.
RESPONSE_HEADERS_TIMEOUT_SECONDS = 300.0


class JobReply(Protocol):
    """Where a job sends what its provider answers (one reply per request)."""

    @property
    def provider_id(self) -> str:
        """The provider the request runs on."""

    @property
    def chunks(self) -> int:
        """How many chunks were sent so far."""

    def chunk(self, data: bytes) -> None:
        """Send one piece of the answer (a server-sent event of a stream)."""

    def failed(self, error: EngineError, usage: Optional[Mapping[str, Any]] = None) -> None:
        """The engine answered with an error."""

    def done(
        self,
        status: pb.InferenceStatus,
        http_status: int = 0,
        body: bytes = b"",
        usage: Optional[Mapping[str, Any]] = None,
        error: str = "",
        error_code: str = "",
        retry_after: int = 0,
    ) -> None:
        """The request ended (sent once; later calls send nothing)."""


def trace_headers(request: pb.InferenceRequest) -> dict[bytes, list[bytes]]:
    """The request's ``traceparent`` (and ``tracestate``) for the engine, if it is valid W3C
    trace context: a peer's word is checked, and a ``tracestate`` goes only with its traceparent."""
    if not request.traceparent:
        return {}
    parent = parse_traceparent(request.traceparent)
    if parent is None:
        return {}
    headers = {b"traceparent": [parent.header().encode("ascii")]}
    state = parse_tracestate([request.tracestate]) if request.tracestate else ""
    if state:
        headers[b"tracestate"] = [state.encode("ascii")]
    return headers


def mock_behaviour(provider: NodeProviderConfig) -> MockBehaviour:
    """The mock options of ``provider`` as the mock generator's behaviour."""
    mock = provider.mock
    return MockBehaviour(
        tokens_per_second=mock.tokens_per_second,
        latency_seconds=mock.latency_seconds,
        failure_rate=mock.failure_rate,
        completion_tokens=mock.completion_tokens,
    )


class MockJob:
    """A request answered by the mock generator in process."""

    def __init__(
        self,
        clock: IReactorTime,
        behaviour: MockBehaviour,
        endpoint: str,
        body: dict[str, Any],
        stream: bool,
        reply: JobReply,
        rand: Callable[[], float],
    ) -> None:
        body = dict(body)
        body["stream"] = stream
        self.provider_id = reply.provider_id
        self._reply = reply
        self._stream = stream and endpoint != EMBEDDINGS
        self._run = MockRun(clock, behaviour, endpoint, body, reply.chunk, self._done, rand)

    def _done(self, status: int, body: bytes, usage: dict[str, int]) -> None:
        if status >= 400:
            # The mock's error body is the OpenAI shape: read as the generic engine's.
            self._reply.failed(adapter_for("openai").engine_error(status, body), usage)
        else:
            self._reply.done(pb.INFERENCE_STATUS_OK, status, b"" if self._stream else body, usage)

    def start(self) -> None:
        self._run.start()

    def cancel(self) -> None:
        self._run.cancel()

    def pause(self) -> None:
        self._run.pause()

    def resume(self) -> None:
        self._run.resume()


class HTTPJob:
    """A POST to an engine's OpenAI-compatible API, relayed event by event."""

    def __init__(
        self,
        http: InferenceHTTPClient,
        clock: IReactorTime,
        adapter: EngineAdapter,
        url: str,
        request: EngineRequest,
        stream: bool,
        reply: JobReply,
        trace_headers: Optional[dict[bytes, list[bytes]]] = None,
    ) -> None:
        self.provider_id = reply.provider_id
        self._http = http
        #: ``traceparent`` and ``tracestate`` for the engine (checked), or none.
        self._trace_headers = trace_headers
        self._clock = clock
        self._adapter = adapter
        self._url = url
        self._request_body = request
        self._stream = stream
        self._reply = reply
        self._request: Optional[Deferred[Any]] = None
        #: Whether the request was sent again after a connection closed under it.
        self._resent = False
        self._reader: Optional[EngineBodyReader] = None
        self._paused = False
        self._cancelled = False

    def start(self) -> None:
        headers = {b"Content-Type": [b"application/json"]}
        if self._stream:
            headers[b"Accept"] = [b"text/event-stream"]
        if self._trace_headers:
            headers.update(self._trace_headers)
        d = self._http.request("POST", self._url, data=self._request_body.body, headers=headers, unbuffered=True)
        d.addTimeout(RESPONSE_HEADERS_TIMEOUT_SECONDS, self._clock)
        self._request = d
        d.addCallbacks(self._response, self._unreachable)

    def _response(self, response: Any) -> None:
        self._request = None
        if self._cancelled:
            return
        code = int(response.code)
        retry_after = None
        if code >= 400:
            values = response.headers.getRawHeaders(b"retry-after") or []
            retry_after = values[0].decode("latin-1") if values else None
        self._reader = EngineBodyReader(
            self, self._adapter, code, self._stream, self._request_body.relay_usage, retry_after
        )
        response.deliverBody(self._reader)
        if self._paused:
            self._reader.pause()

    def _unreachable(self, failure: Failure) -> None:
        self._request = None
        if self._cancelled:
            return
        if not self._resent and failure.check(ResponseNeverReceived, RequestTransmissionFailed):
            # A kept-alive connection the engine closed as it was reused
            # (llama-cpp-python drops idle ones after 5 s): Twisted resends
            # only idempotent methods, so this POST is sent once more, on a
            # new connection. Nothing of the answer had come.
            self._resent = True
            self.start()
            return
        self._reply.done(pb.INFERENCE_STATUS_UNAVAILABLE, error=unreachable_reason(failure))

    # -- from the body reader ------------------------------------------------------

    def event(self, data: bytes) -> None:
        self._reply.chunk(data)

    def finished(self, answer: EngineAnswer) -> None:
        if self._cancelled:
            return
        error = answer.error
        if error is None:
            usage = answer.usage
            if not usage and self._stream:
                # llama-cpp-python's streams carry no usage: estimated, and said to be.
                usage = estimated_usage(self._request_body.body, answer.content_chunks)
            self._reply.done(pb.INFERENCE_STATUS_OK, answer.http_status, answer.body, usage)
        elif answer.cut and not self._reply.chunks:
            # Nothing reached the Edge: as if the engine had never answered,
            # so the Edge may run the request on another provider.
            self._reply.done(
                pb.INFERENCE_STATUS_UNAVAILABLE, error="the engine closed the connection before any output"
            )
        else:
            self._reply.failed(error, answer.usage)

    # -- control ---------------------------------------------------------------------

    def cancel(self) -> None:
        self._cancelled = True
        if self._request is not None:
            self._request.cancel()
            self._request = None
        if self._reader is not None:
            self._reader.abort()

    def pause(self) -> None:
        self._paused = True
        if self._reader is not None:
            self._reader.pause()

    def resume(self) -> None:
        self._paused = False
        if self._reader is not None:
            self._reader.resume()


def unreachable_reason(failure: Failure) -> str:
    """Why no answer came from the engine, in words that name no address."""
    if failure.check(TimeoutError, CancelledError, ConnectingCancelledError):
        return f"the engine sent no answer within {RESPONSE_HEADERS_TIMEOUT_SECONDS:g}s"
    if failure.check(ConnectionRefusedError):
        return "the engine refused the connection"
    if failure.check(ResponseNeverReceived, RequestTransmissionFailed):
        return "the engine closed the connection before answering"
    name = failure.type.__name__ if failure.type else "error"
    if failure.check(ConnectError):
        return f"could not connect to the engine ({name})"
    return f"the engine could not be reached ({name})"
