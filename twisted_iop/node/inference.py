"""The Node runs the inference requests its Edge forwards.

The Edge sends ``InferenceRequest`` naming the provider of its lease; the
runner answers with ``InferenceChunk`` frames (streaming: one per
server-sent event of the provider, never buffering a whole stream) and
exactly one ``InferenceDone``, unless the Edge cancels it first
(``InferenceCancel``) or the connection drops; then the provider request is
aborted and nothing more is sent.

* HTTP kinds (``openai``, ``vllm``, ``sglang``, ``llamacpp``, ``tgi``,
  ``ollama``): a POST to the provider's ``base_url`` through
  :class:`~twisted_iop.node.engines.client.EngineHTTPClient` (kept-alive connections with ``TCP_NODELAY``,
  the request in one write, the answer parsed in the read that brings it); the answer is read by
  :class:`~twisted_iop.node.engines.stream.EngineBodyReader` with the
  adapter of the provider's kind: events one by one, errors in one shape
  and one set of codes (``error_code``), a stream without ``[DONE]`` or
  with an error event an error. The engine is asked for the usage chunk
  of a stream (and that chunk kept from a client that did not ask).
  No answer at all (refused, reset, no headers in time) is ``UNAVAILABLE``
  with an empty ``error_code``: the Edge may retry it elsewhere. The
  request's ``traceparent`` (its attempt's span at the Edge) goes to the
  engine as its ``traceparent`` header, checked again here: one that is not
  valid W3C trace context is not sent.
* ``mock``: :class:`~twisted_iop.mock_provider.MockRun` in process, paced
  by the provider's mock options.

How one request runs on its provider (the HTTP and mock jobs) is
:mod:`twisted_iop.node.provider_requests`'; this module holds the runner:
requests per Edge connection, their replies, refusals, cancels and token
counts.

Every request that fails is logged once (provider, model, endpoint, code,
reason); a successful one is not. Tokens of the engine's ``usage`` are
counted per provider and model (:attr:`InferenceRunner.tokens`).

Output is bounded per connection: the runner registers as the connection's
producer, so when the Edge reads slowly the transport pauses every provider
stream of that connection (HTTP reads stop, mock generation stops) until it
drains.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from typing import Any, Optional, Protocol, cast

import attrs
from google.protobuf.message import Message
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.web.client import HTTPConnectionPool
from zope.interface import implementer

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.base import EngineError
from twisted_iop.node.engines.client import EngineHTTPClient
from twisted_iop.node.engines.http import InferenceHTTPClient
from twisted_iop.node.engines.kinds import adapter_for
from twisted_iop.node.engines.stream import engine_request
from twisted_iop.node.provider_requests import HTTPJob, MockJob, mock_behaviour, trace_headers
from twisted_iop.openai_api import CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, ENDPOINT_PATHS
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.preserialized import InferenceChunkEnvelopes

#: Wire bodies of the inference path that the Node receives from its Edge
#: (what the Edge receives is ``edge.inference.INFERENCE_BODIES_FROM_NODE``).
INFERENCE_BODIES_FROM_EDGE = frozenset({"inference_request", "inference_cancel"})
#: Requests running at once on one Edge connection; more are refused.
MAX_RUNNING_PER_CONNECTION = 4096
#: The token directions counted (the ``direction`` label of ``iop_tokens_total``).
TOKEN_DIRECTIONS = ("prompt", "completion")
#: The ``model`` label of tokens for a model the provider is not configured with.
OTHER_MODEL = "other"

ENDPOINT_NAMES = {
    pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS: CHAT_COMPLETIONS,
    pb.INFERENCE_ENDPOINT_COMPLETIONS: COMPLETIONS,
    pb.INFERENCE_ENDPOINT_EMBEDDINGS: EMBEDDINGS,
}


class InferenceSession(Protocol):
    """What the runner needs from an accepted Edge connection."""

    transport: Any
    closing: bool

    def send(self, body: str, message: Message, request_id: int = 0) -> None:
        """Send one envelope."""

    def sendString(self, data: bytes) -> None:
        """Send one serialized envelope as a frame."""


class _Job(Protocol):
    provider_id: str

    def start(self) -> None: ...
    def cancel(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...


@implementer(IPushProducer)
class _ConnectionValve:
    """The runner's producer on one Edge connection: holds its streams while it is full.

    Pausing is lazy: a pause only marks the connection full, and each job
    stops reading its engine when it next sends a frame (one frame more per
    stream at most, bounded by :data:`MAX_RUNNING_PER_CONNECTION`); a resume
    wakes only the jobs that stopped. With a thousand streams, pausing all
    of them at every full buffer cost two ``epoll_ctl`` per stream per
    pause and starved the Node.
    """

    def __init__(self, state: _SessionState) -> None:
        self._state = state

    def pauseProducing(self) -> None:
        self._state.paused = True

    def resumeProducing(self) -> None:
        state = self._state
        state.paused = False
        held, state.held = state.held, {}
        for inference_id, job in held.items():
            if state.jobs.get(inference_id) is job:
                job.resume()

    def stopProducing(self) -> None:
        self._state.paused = True


@attrs.define(eq=False)
class _SessionState:
    jobs: dict[int, _Job] = attrs.field(factory=dict)
    #: Whether the connection's send buffer is full (its transport paused us).
    paused: bool = False
    #: The jobs that stopped reading their engines while it was full.
    held: dict[int, _Job] = attrs.field(factory=dict)
    registered: bool = False

    def hold(self, inference_id: int) -> None:
        """The connection is full: ``inference_id`` stops reading until it drains."""
        job = self.jobs.get(inference_id)
        if job is not None and inference_id not in self.held:
            self.held[inference_id] = job
            job.pause()


class InferenceRunner:
    """Runs forwarded inference requests on this Node's providers."""

    _log = Logger()

    def __init__(
        self,
        providers: Callable[[], tuple[NodeProviderConfig, ...]],
        clock: IReactorTime,
        http: Optional[InferenceHTTPClient] = None,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._providers = providers
        self._clock = clock
        if http is None:
            # Only a running reactor comes without ``http``.
            http = cast(InferenceHTTPClient, EngineHTTPClient(cast(Reactor, clock)))
        self._http = http
        self._rand = rand
        self._sessions: dict[InferenceSession, _SessionState] = {}
        #: Requests finished, by outcome (for logs and tests).
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        #: Set when the Node stops: why new requests are refused.
        self.refusing = ""
        #: Why a provider cannot take a request now (its launched engine is not up), or None.
        self.refusal: Callable[[str], Optional[str]] = lambda provider_id: None
        self.refused = 0
        #: For /metrics: provider requests, start to done, per provider id.
        self.provider_seconds: dict[str, LatencyHistogram] = {}
        #: Tokens of the engines' usage by (provider id, model, direction); the model is
        #: one the provider is configured with, else :data:`OTHER_MODEL`.
        self.tokens: dict[tuple[str, str, str], int] = {}

    def refuse_new(self, reason: str) -> None:
        """The Node is stopping: refuse new requests (``UNAVAILABLE``), let running ones finish."""
        self.refusing = reason

    def end_all(self, reason: str) -> None:
        """End every running request now: abort it and answer the Edge ``UNAVAILABLE``."""
        for session, state in list(self._sessions.items()):
            jobs = list(state.jobs.items())
            state.jobs.clear()
            for inference_id, job in jobs:
                self.cancelled += 1
                job.cancel()
                session.send(
                    "inference_done",
                    pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE, error=reason),
                )

    def close(self) -> None:
        """Close idle provider connections (the Node is stopping)."""
        if isinstance(self._http, EngineHTTPClient):
            self._http.close()
            return
        pool = getattr(self._http, "pool", None)
        if isinstance(pool, HTTPConnectionPool):
            pool.closeCachedConnections()

    def running(self) -> int:
        """Requests running over every connection."""
        return sum(len(s.jobs) for s in self._sessions.values())

    def running_on(self, provider_id: str) -> int:
        """Requests running on ``provider_id`` over every connection (a probe timing out then is busy)."""
        return sum(1 for s in self._sessions.values() for job in s.jobs.values() if job.provider_id == provider_id)

    # -- the wire ----------------------------------------------------------------

    def handle(self, session: InferenceSession, envelope: pb.Envelope, body: str) -> None:
        """Serve ``inference_request`` or ``inference_cancel`` from the Edge."""
        if body == "inference_request":
            self._start(session, envelope.inference_request)
        elif body == "inference_cancel":
            self._cancel(session, envelope.inference_cancel.inference_id)

    def session_lost(self, session: InferenceSession) -> None:
        """The Edge connection closed: abort everything it was running."""
        state = self._sessions.pop(session, None)
        if state is None:
            return
        jobs = list(state.jobs.values())
        state.jobs.clear()
        for job in jobs:
            self.cancelled += 1
            job.cancel()

    # -- jobs -------------------------------------------------------------------

    def _start(self, session: InferenceSession, request: pb.InferenceRequest) -> None:
        inference_id = request.inference_id
        state = self._state(session)

        def refuse(reason: str) -> None:
            self.refused += 1
            self._log.warn("refusing inference {id}: {reason}", id=inference_id, reason=reason)
            session.send(
                "inference_done",
                pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_REJECTED, error=reason),
            )

        if inference_id == 0:
            refuse("inference_id must not be 0")
            return
        if self.refusing:
            self.refused += 1
            session.send(
                "inference_done",
                pb.InferenceDone(
                    inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE, error=self.refusing
                ),
            )
            return
        if inference_id in state.jobs:
            refuse(f"inference {inference_id} is already running")
            return
        if len(state.jobs) >= MAX_RUNNING_PER_CONNECTION:
            refuse(f"this node runs at most {MAX_RUNNING_PER_CONNECTION} requests per connection")
            return
        endpoint = ENDPOINT_NAMES.get(request.endpoint)
        if endpoint is None:
            refuse(f"unknown endpoint {request.endpoint}")
            return
        provider = next((p for p in self._providers() if p.provider_id == request.provider_id), None)
        if provider is None:
            refuse(f"provider {request.provider_id!r} is not hosted on this node")
            return
        not_up = self.refusal(provider.provider_id)
        if not_up:
            # The Edge runs it elsewhere (unavailable: the engine could not take it).
            self.refused += 1
            session.send(
                "inference_done",
                pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE, error=not_up),
            )
            return
        model = request.model if request.model in provider.models else OTHER_MODEL
        reply = _Reply(self, session, state, request, provider.provider_id, model, endpoint, self._clock.seconds())
        job: _Job
        if provider.kind == "mock":
            try:
                parsed = json.loads(request.body)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict):
                refuse("body is not a JSON object")
                return
            job = MockJob(
                self._clock, mock_behaviour(provider), endpoint, parsed, bool(request.stream), reply, self._rand
            )
        else:
            adapter = adapter_for(provider.kind)
            url = provider.base_url + ENDPOINT_PATHS[endpoint]
            stream = bool(request.stream)
            sent = engine_request(bytes(request.body), endpoint, stream, adapter)
            job = HTTPJob(self._http, self._clock, adapter, url, sent, stream, reply, trace_headers(request))
        state.jobs[inference_id] = job
        job.start()
        if state.paused:
            state.hold(inference_id)

    def _cancel(self, session: InferenceSession, inference_id: int) -> None:
        state = self._sessions.get(session)
        job = state.jobs.pop(inference_id, None) if state is not None else None
        if state is not None:
            state.held.pop(inference_id, None)
        if job is not None:
            self.cancelled += 1
            job.cancel()

    def _state(self, session: InferenceSession) -> _SessionState:
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _SessionState()
            transport = getattr(session, "transport", None)
            if transport is not None:
                try:
                    transport.registerProducer(_ConnectionValve(state), True)
                    state.registered = True
                except RuntimeError:
                    # Another producer owns the transport: no pausing, but
                    # the frames are still bounded by MAX_RUNNING_PER_CONNECTION.
                    pass
        return state

    def _finished(self, state: _SessionState, inference_id: int, ok: bool, provider_id: str, started: float) -> bool:
        """Count a request that ended; ``False`` when it had ended already (cancelled)."""
        state.held.pop(inference_id, None)
        if state.jobs.pop(inference_id, None) is None:
            return False
        histogram = self.provider_seconds.get(provider_id)
        if histogram is None:
            histogram = self.provider_seconds[provider_id] = LatencyHistogram()
        histogram.observe(self._clock.seconds() - started)  # metrics: once per request
        if ok:
            self.completed += 1
        else:
            self.failed += 1
        return True

    def _count_tokens(self, provider_id: str, model: str, prompt: int, completion: int) -> None:
        tokens = self.tokens
        if prompt:
            key = (provider_id, model, "prompt")
            tokens[key] = tokens.get(key, 0) + prompt
        if completion:
            key = (provider_id, model, "completion")
            tokens[key] = tokens.get(key, 0) + completion


class _Reply:
    """Sends one job's frames; after done or cancel, sends nothing more."""

    _log = Logger()

    def __init__(
        self,
        runner: InferenceRunner,
        session: InferenceSession,
        state: _SessionState,
        request: pb.InferenceRequest,
        provider_id: str,
        model: str,
        endpoint: str,
        started: float,
    ):
        self._runner = runner
        self._session = session
        self._state = state
        self.inference_id = request.inference_id
        self._requested_model = request.model
        self.provider_id = provider_id
        self._model = model
        self._endpoint = endpoint
        self._started = started
        self.chunks = 0
        # Written without building a message: this runs once per token.
        self._envelopes = InferenceChunkEnvelopes(self.inference_id)

    def chunk(self, data: bytes) -> None:
        state = self._state
        if self.inference_id not in state.jobs or self._session.closing:
            return
        self.chunks += 1
        self._session.sendString(self._envelopes.envelope_bytes(data))
        if state.paused:
            state.hold(self.inference_id)

    def failed(self, error: EngineError, usage: Optional[Mapping[str, Any]] = None) -> None:
        """The engine answered with an error (or its answer was one): ``PROVIDER_ERROR`` with its code."""
        self.done(
            pb.INFERENCE_STATUS_PROVIDER_ERROR,
            error.status,
            error.to_json(),
            usage,
            error.message,
            error.code,
            error.retry_after or 0,
        )

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
        ok = status == pb.INFERENCE_STATUS_OK
        if not self._runner._finished(self._state, self.inference_id, ok, self.provider_id, self._started):
            return
        message = pb.InferenceDone(
            inference_id=self.inference_id,
            status=status,
            http_status=http_status,
            body=body,
            error=error,
            chunks=self.chunks,
            error_code=error_code,
            retry_after_seconds=retry_after,
        )
        if usage:
            prompt = _count(usage.get("prompt_tokens"))
            completion = _count(usage.get("completion_tokens"))
            message.usage.prompt_tokens = prompt
            message.usage.completion_tokens = completion
            message.usage.total_tokens = _count(usage.get("total_tokens"))
            message.usage.estimated = usage.get("estimated") is True
            self._runner._count_tokens(self.provider_id, self._model, prompt, completion)
        if not ok:
            self._log.warn(
                "inference {inference_id} failed on provider {provider_id}"
                " (model {model}, {endpoint}): {code}: {reason}",
                inference_id=self.inference_id,
                provider_id=self.provider_id,
                model=self._requested_model,
                endpoint=self._endpoint,
                code=error_code or ("unavailable" if status == pb.INFERENCE_STATUS_UNAVAILABLE else "failed"),
                reason=error,
            )
        self._session.send("inference_done", message)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32 else 0
