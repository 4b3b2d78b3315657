"""A mock OpenAI-compatible LLM: the token generator and a standalone server.

:class:`MockRun` produces one answer (chat completion, completion or
embeddings) at a configurable pace (:class:`MockBehaviour`: tokens per
second, latency before the first token, failure rate). Two callers share it,
so both speak the same OpenAI shapes:

* the Node's built-in ``mock`` provider kind runs it in process;
* ``iop-mock-provider`` serves it over HTTP (``GET /v1/models``,
  ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
  streaming as server-sent events), so the Node's HTTP proxy path can be
  tested and measured against a real server over real sockets. It also
  answers ``GET /mock/stats`` (requests started, completed, failed and
  aborted by the client) for tests and benchmarks, and ``GET /mock/traces``:
  the ``traceparent`` and ``tracestate`` headers of the last
  :data:`MAX_RECORDED_TRACES` completion requests, so a test can check that a
  client's trace reached the engine.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Optional

import attrs
from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.web.iweb import IRequest

from twisted_iop.openai_api import (
    CHAT_COMPLETIONS,
    COMPLETIONS,
    EMBEDDINGS,
    ENDPOINT_PATHS,
    error_body,
    estimate_prompt_tokens,
    whole_tokens,
)

__all__ = ["ENDPOINT_PATHS", "MockBehaviour", "MockProviderServer", "MockRun", "main"]

#: Tokens emitted per reactor turn when there is no pacing (tokens_per_second 0).
UNPACED_BATCH = 64
#: Upper bound on the tokens of one mock answer, whatever max_tokens says.
MAX_MOCK_TOKENS = 100_000
#: Trace headers of this many requests are kept for ``GET /mock/traces``.
MAX_RECORDED_TRACES = 1000
#: A trace header longer than this is kept cut (it is only shown back).
MAX_RECORDED_HEADER_CHARS = 1024

_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "runs", "away")


@attrs.frozen
class MockBehaviour:
    """How a mock provider answers."""

    #: Tokens per second of a streamed or non-streamed answer; 0 = as fast as possible.
    tokens_per_second: float = 0.0
    #: Seconds before the first token (or the whole answer).
    latency_seconds: float = 0.0
    #: Share of requests (0..1) that fail: a 500 before any token, or a
    #: stream that breaks off half way.
    failure_rate: float = 0.0
    #: Tokens of an answer when the request gives no ``max_tokens``.
    completion_tokens: int = 16
    #: Length of each embedding vector.
    embedding_dimensions: int = 8


def requested_tokens(body: Any, default: int) -> int:
    """``max_tokens`` (or ``max_completion_tokens``) of a request, else ``default``."""
    if isinstance(body, dict):
        for key in ("max_completion_tokens", "max_tokens"):
            value = whole_tokens(body.get(key))
            if value is not None:
                return min(value, MAX_MOCK_TOKENS)
    return default


class MockRun:
    """One mock answer, produced over time on an injected clock.

    ``on_chunk`` receives each server-sent event's JSON (streaming only);
    ``on_done`` receives the HTTP status, the whole body (non-streaming, or
    an error body) and the usage. Exactly one ``on_done`` unless cancelled.
    """

    def __init__(
        self,
        clock: IReactorTime,
        behaviour: MockBehaviour,
        endpoint: str,
        body: dict[str, Any],
        on_chunk: Callable[[bytes], None],
        on_done: Callable[[int, bytes, dict[str, int]], None],
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._clock = clock
        self._behaviour = behaviour
        self._endpoint = endpoint
        self._body = body
        self._on_chunk = on_chunk
        self._on_done = on_done
        self._model = str(body.get("model", ""))
        self._stream = bool(body.get("stream")) and endpoint != EMBEDDINGS
        self._prompt_tokens = estimate_prompt_tokens(body)
        self._total = requested_tokens(body, behaviour.completion_tokens)
        self._fail = rand() < behaviour.failure_rate
        self._emitted = 0
        self._text: list[str] = []
        self._timer: Optional[IDelayedCall] = None
        self._paused = False
        self.finished = False
        self.cancelled = False
        self._id = f"cmpl-mock-{int(clock.seconds() * 1000)}-{id(self) & 0xFFFFFF:x}"
        self._created = int(clock.seconds())

    # -- control --------------------------------------------------------------

    def start(self) -> None:
        """Begin after the configured latency."""
        self._schedule(self._behaviour.latency_seconds, self._first)

    def pause(self) -> None:
        """Stop producing until :meth:`resume` (the consumer is full)."""
        self._paused = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
            self._timer = None

    def resume(self) -> None:
        """Continue producing."""
        if not self._paused or self.finished:
            return
        self._paused = False
        if self._timer is None:
            self._schedule(0, self._step if self._emitted or self._stream else self._first)

    def cancel(self) -> None:
        """Stop now; ``on_done`` is not called."""
        self.cancelled = True
        self.finished = True
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    # -- production -----------------------------------------------------------

    def _schedule(self, delay: float, call: Callable[[], None]) -> None:
        if self.finished or self._paused:
            return
        self._timer = self._clock.callLater(delay, self._fire, call)

    def _fire(self, call: Callable[[], None]) -> None:
        self._timer = None
        if not self.finished:
            call()

    def _first(self) -> None:
        if self._endpoint == EMBEDDINGS:
            self._finish_embeddings()
            return
        if self._fail and not self._stream:
            self._done(500, error_body("mock provider failure", "server_error", "mock_failure"))
            return
        self._step()

    def _step(self) -> None:
        rate = self._behaviour.tokens_per_second
        batch = 1 if rate > 0 else UNPACED_BATCH
        for _ in range(batch):
            if self._emitted >= self._total:
                break
            if self._fail and self._stream and self._emitted >= self._total // 2:
                self._done(500, error_body("mock provider broke off the stream", "server_error", "mock_failure"))
                return
            word = _WORDS[self._emitted % len(_WORDS)]
            token = word if self._emitted == 0 else " " + word
            self._emitted += 1
            if self._stream:
                self._on_chunk(self._chunk(token, None))
                if self.finished or self._paused:
                    break
            else:
                self._text.append(token)
        if self.finished:
            return
        if self._emitted >= self._total:
            self._finish_text()
        elif not self._paused:
            self._schedule(1.0 / rate if rate > 0 else 0.0, self._step)

    def _usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self._prompt_tokens,
            "completion_tokens": self._emitted,
            "total_tokens": self._prompt_tokens + self._emitted,
        }

    def _chunk(self, token: str, finish: Optional[str], usage: bool = False) -> bytes:
        if self._endpoint == CHAT_COMPLETIONS:
            delta: dict[str, Any] = {"content": token} if finish is None else {}
            if self._emitted == 1 and finish is None:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": token, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        data: dict[str, Any] = {
            "id": self._id,
            "object": obj,
            "created": self._created,
            "model": self._model,
            "choices": [choice],
        }
        if usage:
            data["usage"] = self._usage()
        return json.dumps(data).encode()

    def _finish_text(self) -> None:
        finish = "length" if self._emitted >= requested_tokens(self._body, -1) else "stop"
        if self._stream:
            self._on_chunk(self._chunk("", finish, usage=True))
            self._done(200, b"")
            return
        text = "".join(self._text)
        if self._endpoint == CHAT_COMPLETIONS:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            obj = "text_completion"
        body = {
            "id": self._id,
            "object": obj,
            "created": self._created,
            "model": self._model,
            "choices": [choice],
            "usage": self._usage(),
        }
        self._done(200, json.dumps(body).encode())

    def _finish_embeddings(self) -> None:
        if self._fail:
            self._done(500, error_body("mock provider failure", "server_error", "mock_failure"))
            return
        raw = self._body.get("input")
        inputs = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
        dims = self._behaviour.embedding_dimensions
        data = []
        for index, item in enumerate(inputs):
            seed = sum(str(item).encode()) + index
            data.append(
                {
                    "object": "embedding",
                    "index": index,
                    "embedding": [((seed * (i + 7)) % 997) / 997.0 for i in range(dims)],
                }
            )
        usage = {"prompt_tokens": self._prompt_tokens, "total_tokens": self._prompt_tokens}
        body = {"object": "list", "data": data, "model": self._model, "usage": usage}
        self.finished = True
        self._on_done(200, json.dumps(body).encode(), usage)

    def _done(self, status: int, body: bytes) -> None:
        self.finished = True
        self._on_done(status, body, self._usage())


# -- the standalone HTTP server ------------------------------------------------


@attrs.define
class MockStats:
    """What the standalone server has seen."""

    started: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    active: int = 0


class MockProviderServer:
    """The Klein app of ``iop-mock-provider``."""

    app = Klein()
    _log = Logger()

    def __init__(
        self,
        models: Sequence[str],
        behaviour: MockBehaviour,
        clock: IReactorTime,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.models = tuple(models)
        self.behaviour = behaviour
        self._clock = clock
        self._rand = rand
        self.stats = MockStats()
        #: (traceparent, tracestate) of the last completion requests ("" when absent).
        self.traces: deque[tuple[str, str]] = deque(maxlen=MAX_RECORDED_TRACES)

    @app.route("/v1/models", methods=["GET"])
    def list_models(self, request: IRequest) -> bytes:
        """The served models, OpenAI list shape."""
        request.setHeader(b"Content-Type", b"application/json")
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "mock"} for m in self.models]
        return json.dumps({"object": "list", "data": data}).encode()

    @app.route("/mock/stats", methods=["GET"])
    def show_stats(self, request: IRequest) -> bytes:
        """Counters for tests and benchmarks."""
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(attrs.asdict(self.stats)).encode()

    @app.route("/mock/traces", methods=["GET"])
    def show_traces(self, request: IRequest) -> bytes:
        """The trace headers of the last completion requests, oldest first."""
        request.setHeader(b"Content-Type", b"application/json")
        traces = [{"traceparent": parent, "tracestate": state} for parent, state in self.traces]
        return json.dumps({"traces": traces}).encode()

    @app.route("/v1/chat/completions", methods=["POST"])
    def chat_completions(self, request: IRequest) -> Any:
        """``POST /v1/chat/completions``."""
        return self._serve(request, CHAT_COMPLETIONS)

    @app.route("/v1/completions", methods=["POST"])
    def completions(self, request: IRequest) -> Any:
        """``POST /v1/completions``."""
        return self._serve(request, COMPLETIONS)

    @app.route("/v1/embeddings", methods=["POST"])
    def embeddings(self, request: IRequest) -> Any:
        """``POST /v1/embeddings``."""
        return self._serve(request, EMBEDDINGS)

    def _serve(self, request: Any, endpoint: str) -> Any:
        request.setHeader(b"Content-Type", b"application/json")
        self.traces.append((_header(request, b"traceparent"), _header(request, b"tracestate")))
        try:
            body = json.loads(request.content.read())
        except ValueError:
            request.setResponseCode(400)
            return error_body("body is not JSON", "invalid_request_error", "invalid_json")
        if not isinstance(body, dict):
            request.setResponseCode(400)
            return error_body("body must be a JSON object", "invalid_request_error", "invalid_body")
        model = body.get("model")
        if model not in self.models:
            request.setResponseCode(404)
            return error_body(f"model {model!r} is not served here", "invalid_request_error", "model_not_found")
        stream = bool(body.get("stream")) and endpoint != EMBEDDINGS
        stats = self.stats
        stats.started += 1
        stats.active += 1
        state = {"headers": False, "over": False}

        def finish_once(failed: bool) -> None:
            if state["over"]:
                return
            state["over"] = True
            stats.active -= 1
            if failed:
                stats.failed += 1
            else:
                stats.completed += 1

        def on_chunk(data: bytes) -> None:
            if not state["headers"]:
                state["headers"] = True
                request.setHeader(b"Content-Type", b"text/event-stream")
                request.setHeader(b"Cache-Control", b"no-cache")
            request.write(b"data: " + data + b"\n\n")

        def on_done(status: int, payload: bytes, usage: dict[str, int]) -> None:
            finish_once(status >= 400)
            if stream and state["headers"]:
                # Mid-stream: the status is sent; an error event, or [DONE].
                request.write(b"data: " + payload + b"\n\n" if status >= 400 else b"data: [DONE]\n\n")
                answer.callback(b"")
                return
            request.setResponseCode(status)
            answer.callback(payload)

        def gone(_: Deferred[bytes]) -> None:
            # Klein cancels the answer when the client hangs up.
            if not state["over"]:
                state["over"] = True
                stats.active -= 1
                stats.aborted += 1
                run.cancel()

        answer: Deferred[bytes] = Deferred(gone)
        run = MockRun(self._clock, self.behaviour, endpoint, body, on_chunk, on_done, self._rand)
        run.start()
        return answer


def _header(request: Any, name: bytes) -> str:
    values = request.requestHeaders.getRawHeaders(name) or []
    return ",".join(v.decode("latin-1") for v in values)[:MAX_RECORDED_HEADER_CHARS]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``iop-mock-provider``: serve a mock OpenAI-compatible API until stopped."""
    from twisted.internet import reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver
    from twisted.web.server import Site

    from twisted_iop.endpoints import check_listen_endpoint
    from twisted_iop.listeners import ListenerService

    parser = argparse.ArgumentParser(prog="iop-mock-provider", description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="tcp:8000:interface=127.0.0.1", help="Twisted server endpoint")
    parser.add_argument("--models", default="llama-3-8b", help="comma-separated model ids")
    parser.add_argument("--tokens-per-second", type=float, default=0.0, help="0 = as fast as possible")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before the first token")
    parser.add_argument("--failure-rate", type=float, default=0.0, help="share of requests that fail (0..1)")
    parser.add_argument("--completion-tokens", type=int, default=16, help="tokens when max_tokens is absent")
    parser.add_argument("--seed", type=int, default=None, help="seed of the failure draws")
    args = parser.parse_args(argv)
    if not 0.0 <= args.failure_rate <= 1.0:
        parser.error("--failure-rate must be between 0 and 1")
    if args.tokens_per_second < 0 or args.latency < 0 or args.completion_tokens < 1:
        parser.error("--tokens-per-second and --latency must be >= 0, --completion-tokens >= 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        parser.error("--models must name at least one model")
    problem, listen = check_listen_endpoint(args.listen)
    if problem is not None:
        parser.error(f"--listen: {problem}")
    behaviour = MockBehaviour(
        tokens_per_second=args.tokens_per_second,
        latency_seconds=args.latency,
        failure_rate=args.failure_rate,
        completion_tokens=args.completion_tokens,
    )
    rand = random.Random(args.seed).random
    server = MockProviderServer(models, behaviour, reactor, rand)
    site = Site(server.app.resource(), parsePOSTFormSubmission=False)  # JSON bodies only
    site.noisy = False
    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stdout)], redirectStandardIO=False)
    listener = ListenerService("mock_provider", listen, site, reactor)
    listener.privilegedStartService()
    listener.startService()
    reactor.addSystemEventTrigger("before", "shutdown", listener.stopService)
    reactor.run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
