"""The Node's inference path against engines over real sockets: errors in one
shape, streams that end badly, the usage chunk, tokens, logs and /metrics.

Each engine here is a small twisted.web server on 127.0.0.1:0 that answers
each POST as its test scripts it (the shapes are the engines' documented
ones: vLLM and llama-cpp-python nested OpenAI errors, SGLang's flat one,
TGI's ``{"error", "error_type"}``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, cast

import attrs
import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet import reactor as global_reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.protocol import connectionDone
from twisted.internet.task import Clock
from twisted.logger import formatEvent
from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.kinds import adapter_for
from twisted_iop.node.engines.stream import NO_DONE, NO_OUTPUT, engine_request, estimated_usage
from twisted_iop.node.inference import InferenceRunner
from twisted_iop.node.provider_requests import RESPONSE_HEADERS_TIMEOUT_SECONDS
from twisted_iop.testing.configs import node_yaml, write_yaml
from twisted_iop.testing.harness import eventually, start_node, stop
from twisted_iop.testing.redis import free_port
from twisted_iop.testing.wires.wire import LogCapture
from twisted_iop.wire import control_pb2 as pb

MODEL = "tiny"
REACTOR: Reactor = global_reactor

# -- a scripted engine ---------------------------------------------------------------


@attrs.define
class Answer:
    """One scripted answer: status, headers, the body in parts, and how it ends.

    ``ending``: ``finish`` (a complete answer), ``drop`` (the connection is
    closed after the parts, mid-answer), ``reset`` (closed before any header).
    """

    status: int = 200
    parts: list[bytes] = attrs.field(factory=list)
    content_type: str = "application/json"
    headers: dict[str, str] = attrs.field(factory=dict)
    ending: str = "finish"


def events(*payloads: Any, done: bool = True) -> Answer:
    """A 200 event stream of ``payloads`` (dicts as JSON, bytes as they are), then ``[DONE]``."""
    parts = [p if isinstance(p, bytes) else b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads]
    if done:
        parts.append(b"data: [DONE]\n\n")
    return Answer(200, parts, "text/event-stream")


def error(status: int, body: Any, **headers: str) -> Answer:
    """An error answer with ``body`` (JSON, or text when bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Answer(status, [data], "application/json", headers)


def chunk(text: str, usage: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """A chat completion chunk carrying ``text`` (and ``usage`` if given)."""
    data: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    if usage is not None:
        data["usage"] = usage
    return data


USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
USAGE_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL, "choices": [], "usage": USAGE}


class ScriptedEngine(Resource):
    """Answers each POST with the next scripted :class:`Answer`; keeps the bodies it received."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[Answer] = []
        self.received: list[Any] = []

    def render_POST(self, request: Any) -> Any:
        """The next answer (a 500 when the script is over)."""
        self.received.append(json.loads(request.content.read()))
        answer = self.answers.pop(0) if self.answers else error(500, {"error": "unscripted"})
        if answer.ending == "reset":
            request.transport.abortConnection()
            return NOT_DONE_YET
        request.setResponseCode(answer.status)
        request.setHeader(b"Content-Type", answer.content_type.encode())
        for name, value in answer.headers.items():
            request.setHeader(name.encode(), value.encode())
        for part in answer.parts:
            request.write(part)
        if answer.ending == "drop":
            request.transport.loseConnection()
        else:
            request.finish()
        return NOT_DONE_YET


class CountingChannel(HTTPChannel):
    """An HTTP server connection that tells its site when it closes."""

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.site.closed += 1  # type: ignore[attr-defined]  # a CountingChannel's site is a CountingSite


class EngineSite(Site):
    """The engine's site; counts the connections it closed (idle ones after ``timeout``)."""

    protocol = CountingChannel  # type: ignore[assignment]  # HTTPFactory's stubs want a _GenericHTTPChannelProtocol factory
    noisy = False

    def __init__(self, resource: Resource, **kwargs: Any) -> None:
        super().__init__(resource, **kwargs)
        self.closed = 0


@attrs.define
class Engine:
    """A scripted engine listening on 127.0.0.1."""

    resource: ScriptedEngine
    site: EngineSite
    port: Any
    base_url: str = ""

    def __attrs_post_init__(self) -> None:
        self.base_url = f"http://127.0.0.1:{self.port.getHost().port}"


@pytest.fixture
def engine() -> Iterator[Engine]:
    """A scripted engine for one test."""
    resource = ScriptedEngine()
    site = EngineSite(resource)
    port = REACTOR.listenTCP(0, site, interface="127.0.0.1")
    yield Engine(resource, site, port)
    port.stopListening()


class RecordingSession:
    """The Edge's side of the runner: keeps the chunks and fires on ``InferenceDone``."""

    transport = None
    closing = False

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done: Deferred[pb.InferenceDone] = Deferred()

    def send(self, body: str, message: Any, request_id: int = 0) -> None:
        """An envelope from the runner: only ``inference_done`` is expected."""
        assert body == "inference_done"
        self.done.callback(message)

    def sendString(self, data: bytes) -> None:
        """A serialized chunk envelope."""
        self.chunks.append(pb.Envelope.FromString(data).inference_chunk.data)


def provider(base_url: str, provider_id: str = "engine-a", kind: str = "openai") -> NodeProviderConfig:
    """An HTTP provider serving :data:`MODEL`."""
    return NodeProviderConfig(provider_id=provider_id, kind=kind, models=(MODEL,), base_url=base_url)


def request_envelope(
    body: dict[str, Any],
    stream: bool = False,
    endpoint: pb.InferenceEndpoint = pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
    provider_id: str = "engine-a",
    inference_id: int = 1,
) -> pb.Envelope:
    """An ``inference_request`` as the Edge sends it."""
    envelope = pb.Envelope()
    envelope.inference_request.CopyFrom(
        pb.InferenceRequest(
            inference_id=inference_id,
            provider_id=provider_id,
            endpoint=endpoint,
            body=json.dumps({"stream": stream, **body}).encode(),
            stream=stream,
            model=str(body.get("model", MODEL)),
        )
    )
    return envelope


def chat(**extra: Any) -> dict[str, Any]:
    """A chat completion body."""
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


async def run(
    runner: InferenceRunner, body: dict[str, Any], stream: bool = False, **kwargs: Any
) -> tuple[list[bytes], pb.InferenceDone]:
    """One request through ``runner``: the chunks relayed and its ``InferenceDone``."""
    session = RecordingSession()
    runner.handle(session, request_envelope(body, stream, **kwargs), "inference_request")
    done = await session.done
    return session.chunks, done


@pytest.fixture
def runner(engine: Engine) -> Iterator[InferenceRunner]:
    """A runner whose one provider is ``engine`` (kind ``openai``)."""
    runner = InferenceRunner(lambda: (provider(engine.base_url),), REACTOR)
    yield runner
    runner.close()


# -- errors -------------------------------------------------------------------------

# Each engine's error shape, as its server documents or sends it, and what the Edge must get.
ERROR_SHAPES = [
    pytest.param(
        error(
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 2048 tokens. However, you requested 4000 tokens.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            },
        ),
        400,
        "context_length_exceeded",
        "This model's maximum context length is 2048 tokens. However, you requested 4000 tokens.",
        0,
        id="vllm-context",
    ),
    pytest.param(
        error(404, {"message": "The model `nope` does not exist.", "code": 404}),
        404,
        "model_not_found",
        "The model `nope` does not exist.",
        0,
        id="sglang-flat",
    ),
    pytest.param(
        error(
            422,
            {"error": "Input validation error: `temperature` must be strictly positive", "error_type": "validation"},
        ),
        422,
        "invalid_request",
        "Input validation error: `temperature` must be strictly positive",
        0,
        id="tgi-validation",
    ),
    pytest.param(
        error(429, {"error": "Model is overloaded", "error_type": "overloaded"}, **{"Retry-After": "3"}),
        429,
        "overloaded",
        "Model is overloaded",
        3,
        id="tgi-overloaded",
    ),
    pytest.param(
        Answer(503, [b"Service Unavailable"], "text/plain", {"Retry-After": "7"}),
        503,
        "overloaded",
        "Service Unavailable",
        7,
        id="text-503",
    ),
    pytest.param(
        error(
            500,
            {
                "error": {
                    "message": "Llama model must be created with embedding=True to call this method",
                    "type": "internal_server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
        502,
        "provider_error",
        "Llama model must be created with embedding=True to call this method",
        0,
        id="llama-cpp-python-500",
    ),
]


@pytest.mark.parametrize(("answer", "http_status", "code", "message", "retry_after"), ERROR_SHAPES)
@pytest_twisted.ensureDeferred
async def test_an_engine_error_reaches_the_edge_in_one_shape(
    engine: Engine, runner: InferenceRunner, answer: Answer, http_status: int, code: str, message: str, retry_after: int
) -> None:
    """Whatever the engine's shape: PROVIDER_ERROR, the client's status, one code, the engine's message, an OpenAI body."""
    engine.resource.answers.append(answer)
    chunks, done = await run(runner, chat())
    assert chunks == []
    assert done.status == pb.INFERENCE_STATUS_PROVIDER_ERROR
    assert (done.http_status, done.error_code, done.error, done.retry_after_seconds) == (
        http_status,
        code,
        message,
        retry_after,
    )
    assert json.loads(done.body) == {
        "error": {"message": message, "type": json.loads(done.body)["error"]["type"], "code": code}
    }
    assert runner.failed == 1 and runner.completed == 0


@pytest_twisted.ensureDeferred
async def test_an_error_answer_to_a_streamed_request_is_read_whole(engine: Engine, runner: InferenceRunner) -> None:
    """A streamed request answered 400 (not an event stream): the engine's error, no chunk."""
    engine.resource.answers.append(
        error(400, {"error": {"message": "bad temperature", "type": "invalid_request_error"}})
    )
    chunks, done = await run(runner, chat(), stream=True)
    assert chunks == []
    assert (done.status, done.http_status, done.error_code, done.error) == (
        pb.INFERENCE_STATUS_PROVIDER_ERROR,
        400,
        "invalid_request",
        "bad temperature",
    )


@pytest_twisted.ensureDeferred
async def test_no_answer_at_all_is_unavailable_without_a_code(engine: Engine, runner: InferenceRunner) -> None:
    """Reset before any header (twice: the Node sends it once more), or refused: UNAVAILABLE, a reason, no address."""
    engine.resource.answers.extend([Answer(ending="reset"), Answer(ending="reset")])
    _, reset = await run(runner, chat())
    await engine.port.stopListening()
    _, refused = await run(runner, chat(), inference_id=2)
    for done in (reset, refused):
        assert done.status == pb.INFERENCE_STATUS_UNAVAILABLE
        assert done.error_code == ""
        assert "127.0.0.1" not in done.error and engine.base_url.rsplit(":", 1)[1] not in done.error
    assert reset.error == "the engine closed the connection before answering"
    assert refused.error == "the engine refused the connection"


# -- streams ------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_stream_is_relayed_event_by_event_without_comments_or_done(
    engine: Engine, runner: InferenceRunner
) -> None:
    """Comments, pings and ``event:`` lines are skipped, ``[DONE]`` ends it: OK with every data chunk in order."""
    engine.resource.answers.append(
        events(b": ping\n\n", chunk("a"), b"event: message\r\ndata: " + json.dumps(chunk("b")).encode() + b"\r\n\r\n")
    )
    chunks, done = await run(runner, chat(), stream=True)
    assert [json.loads(c)["choices"][0]["delta"]["content"] for c in chunks] == ["a", "b"]
    assert done.status == pb.INFERENCE_STATUS_OK and done.chunks == 2


@pytest.mark.parametrize(
    ("answer", "relayed", "reason"),
    [
        pytest.param(events(chunk("a"), chunk("b"), done=False), 2, NO_DONE, id="no-done"),
        pytest.param(events(done=False), 0, NO_OUTPUT, id="empty-200"),
        pytest.param(
            Answer(200, [b"data: " + json.dumps(chunk("a")).encode() + b"\n\n"], "text/event-stream", ending="drop"),
            1,
            "the engine closed the connection mid-answer",
            id="dropped",
        ),
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_stream_that_does_not_end_with_done_is_an_error(
    engine: Engine, runner: InferenceRunner, answer: Answer, relayed: int, reason: str
) -> None:
    """No ``[DONE]`` (with output, without any, or the connection cut): PROVIDER_ERROR ``provider_error``, never OK."""
    engine.resource.answers.append(answer)
    chunks, done = await run(runner, chat(), stream=True)
    assert len(chunks) == relayed
    assert (done.status, done.http_status, done.error_code, done.error) == (
        pb.INFERENCE_STATUS_PROVIDER_ERROR,
        502,
        "provider_error",
        reason,
    )
    assert json.loads(done.body)["error"]["message"] == reason
    assert runner.failed == 1 and runner.completed == 0


@pytest_twisted.ensureDeferred
async def test_a_connection_closed_before_the_answer_is_sent_once_more(engine: Engine, runner: InferenceRunner) -> None:
    """A connection the engine closed under the request (a reused idle one): sent again once, and answered."""
    engine.resource.answers.extend([Answer(ending="reset"), events(chunk("a"))])
    chunks, done = await run(runner, chat(), stream=True)
    assert done.status == pb.INFERENCE_STATUS_OK and len(chunks) == 1
    assert len(engine.resource.received) == 2


@pytest_twisted.ensureDeferred
async def test_a_stream_cut_before_any_output_is_unavailable(engine: Engine, runner: InferenceRunner) -> None:
    """A killed engine after its headers, before any event: UNAVAILABLE, so the Edge may run it elsewhere."""
    engine.resource.answers.append(Answer(200, [b": ping\n\n"], "text/event-stream", ending="drop"))
    chunks, done = await run(runner, chat(), stream=True)
    assert chunks == []
    assert (done.status, done.error_code) == (pb.INFERENCE_STATUS_UNAVAILABLE, "")
    assert "before any output" in done.error


@pytest_twisted.ensureDeferred
async def test_an_error_event_in_a_200_stream_ends_the_request_with_its_code(
    engine: Engine, runner: InferenceRunner
) -> None:
    """vLLM's error event mid-stream: the chunks before it relayed, the event itself not, its code and message."""
    message = "This model's maximum context length is 2048 tokens."
    engine.resource.answers.append(
        events(
            chunk("a"),
            {"error": {"object": "error", "message": message, "type": "BadRequestError", "code": 400}},
            chunk("never"),
        )
    )
    chunks, done = await run(runner, chat(), stream=True)
    assert [json.loads(c)["choices"][0]["delta"]["content"] for c in chunks] == ["a"]
    assert (done.status, done.error_code, done.error, done.http_status) == (
        pb.INFERENCE_STATUS_PROVIDER_ERROR,
        "context_length_exceeded",
        message,
        400,
    )


# -- usage and tokens -------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_the_engine_is_asked_for_usage_and_the_client_that_did_not_ask_does_not_get_it(
    engine: Engine, runner: InferenceRunner
) -> None:
    """No ``include_usage`` from the client: the engine gets it (other options kept), the usage chunk stays on the Node."""
    engine.resource.answers.append(events(chunk("a"), USAGE_CHUNK))
    chunks, done = await run(runner, chat(stream_options={"include_usage": False, "other": 1}), stream=True)
    assert engine.resource.received[0]["stream_options"] == {"include_usage": True, "other": 1}
    assert [json.loads(c)["choices"] for c in chunks] == [chunk("a")["choices"]]
    assert done.status == pb.INFERENCE_STATUS_OK
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (7, 3, 10)


@pytest_twisted.ensureDeferred
async def test_a_client_that_asked_for_usage_gets_the_usage_chunk(engine: Engine, runner: InferenceRunner) -> None:
    """``include_usage`` from the client: its body goes as it is and the usage chunk is relayed."""
    engine.resource.answers.append(events(chunk("a"), USAGE_CHUNK))
    chunks, done = await run(runner, chat(stream_options={"include_usage": True}), stream=True)
    assert engine.resource.received[0]["stream_options"] == {"include_usage": True}
    assert [json.loads(c)["choices"] for c in chunks] == [chunk("a")["choices"], []]
    assert done.usage.completion_tokens == 3


@pytest_twisted.ensureDeferred
async def test_a_stream_without_usage_is_counted_as_estimated(engine: Engine, runner: InferenceRunner) -> None:
    """No usage chunk (llama-cpp-python): one completion token per content chunk, the prompt's characters / 4."""
    role_only = {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant"}}],
    }
    engine.resource.answers.append(events(role_only, chunk("a"), chunk("b"), chunk("c"), chunk("")))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 41}]}
    _, done = await run(runner, body, stream=True)
    assert done.status == pb.INFERENCE_STATUS_OK
    usage = done.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, usage.estimated) == (11, 3, 14, True)


@pytest_twisted.ensureDeferred
async def test_the_engines_usage_wins_and_is_not_estimated(engine: Engine, runner: InferenceRunner) -> None:
    """A usage chunk from the engine is the exact count: not labelled estimated."""
    engine.resource.answers.append(events(chunk("a"), chunk("b"), USAGE_CHUNK))
    _, done = await run(runner, chat(), stream=True)
    assert (done.usage.completion_tokens, done.usage.estimated) == (3, False)


def test_estimated_prompt_of_text_parts_and_completions() -> None:
    """Text parts of multi-part messages and a completions ``prompt`` count; a body that is not JSON counts 0."""
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "image_url"}]}]}
    assert estimated_usage(json.dumps(parts).encode(), 2)["prompt_tokens"] == 1
    assert estimated_usage(b'{"prompt": ["abcdefgh", 3]}', 0)["prompt_tokens"] == 2
    assert estimated_usage(b"not json", 5) == {
        "prompt_tokens": 0,
        "completion_tokens": 5,
        "total_tokens": 5,
        "estimated": True,
    }


@pytest_twisted.ensureDeferred
async def test_a_request_that_is_not_streamed_goes_as_it_is(engine: Engine, runner: InferenceRunner) -> None:
    """Not streamed, or embeddings: no ``stream_options`` added; the whole answer's usage is read."""
    whole = {"id": "x", "object": "chat.completion", "choices": [], "usage": USAGE}
    engine.resource.answers.append(Answer(200, [json.dumps(whole).encode()]))
    _, done = await run(runner, chat())
    assert "stream_options" not in engine.resource.received[0]
    assert json.loads(done.body) == whole and done.usage.total_tokens == 10


def test_a_body_that_is_not_a_json_object_is_sent_as_it_is() -> None:
    """Only a JSON object is changed: anything else reaches the engine byte for byte."""
    adapter = adapter_for("openai")
    for body in (b"[1, 2]", b"not json", b'"text"'):
        sent = engine_request(body, "chat.completions", True, adapter)
        assert (sent.body, sent.relay_usage) == (body, True)
    sent = engine_request(b'{"model": "m", "stream": true}', "embeddings", True, adapter)
    assert sent.body == b'{"model": "m", "stream": true}'


@pytest_twisted.ensureDeferred
async def test_tokens_are_counted_per_provider_and_configured_model(engine: Engine, runner: InferenceRunner) -> None:
    """Usage of streams, whole answers and even failed streams adds up; a model not configured counts as ``other``."""
    engine.resource.answers.extend(
        [
            events(chunk("a"), USAGE_CHUNK),
            Answer(200, [json.dumps({"choices": [], "usage": USAGE}).encode()]),
            events(chunk("a", usage={"prompt_tokens": 1, "completion_tokens": 1}), done=False),
            Answer(200, [json.dumps({"choices": [], "usage": USAGE}).encode()]),
            Answer(
                200, [json.dumps({"choices": [], "usage": {"prompt_tokens": -4, "completion_tokens": "9"}}).encode()]
            ),
        ]
    )
    await run(runner, chat(), stream=True)
    await run(runner, chat())
    await run(runner, chat(), stream=True)
    await run(runner, chat(model="unknown-model"))
    await run(runner, chat())
    assert runner.tokens == {
        ("engine-a", MODEL, "prompt"): 15,
        ("engine-a", MODEL, "completion"): 7,
        ("engine-a", "other", "prompt"): 7,
        ("engine-a", "other", "completion"): 3,
    }


@pytest_twisted.ensureDeferred
async def test_the_node_metrics_show_the_tokens(tmp_path: Path, engine: Engine) -> None:
    """A running Node's ``GET /metrics`` has ``iop_tokens_total`` per provider, model and direction."""
    # No Edge listens there: the Node's link keeps retrying, inference is driven directly.
    edge_port = free_port()
    config = node_yaml(
        "node-1",
        edge_port,
        [{"provider_id": "engine-a", "kind": "openai", "models": [MODEL, "b"], "base_url": engine.base_url}],
    )
    node = start_node(write_yaml(tmp_path / "node.yaml", config))
    try:
        assert node.metrics_server is not None
        port = await node.metrics_server.bound()
        engine.resource.answers.append(events(chunk("a"), USAGE_CHUNK))
        await run(node.inference, chat(), stream=True)
        response = await treq.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        text = (await response.content()).decode()
    finally:
        await stop(node)
    samples = {
        (s.name, s.labels["model"], s.labels["direction"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "iop_tokens_total" and s.labels["provider"] == "engine-a"
    }
    assert samples == {
        ("iop_tokens_total", MODEL, "prompt"): 7,
        ("iop_tokens_total", MODEL, "completion"): 3,
        ("iop_tokens_total", "b", "prompt"): 0,
        ("iop_tokens_total", "b", "completion"): 0,
    }


# -- logs ----------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_a_failed_inference_is_logged_once_and_a_successful_one_not(
    engine: Engine, runner: InferenceRunner
) -> None:
    """One warning per failure with provider, model, endpoint, code and reason, never the address; none for a success."""
    engine.resource.answers.extend(
        [events(chunk("a")), events(done=False), Answer(ending="reset"), Answer(ending="reset")]
    )
    capture = LogCapture()
    with capture.active():
        await run(runner, chat(), stream=True)
        await run(runner, chat(), stream=True, inference_id=2)
        await run(runner, chat(), inference_id=3)
    lines = [formatEvent(e) for e in capture.warnings()]
    assert lines == [
        f"inference 2 failed on provider engine-a (model {MODEL}, chat.completions): provider_error: {NO_OUTPUT}",
        f"inference 3 failed on provider engine-a (model {MODEL}, chat.completions): unavailable:"
        " the engine closed the connection before answering",
    ]
    assert not any("127.0.0.1" in line for line in lines)


@pytest_twisted.ensureDeferred
async def test_idle_engine_connections_opening_and_closing_are_not_logged(tmp_path: Path) -> None:
    """An engine that drops idle connections (as llama-cpp-python does after 5 s): no "factory" line per connection."""
    resource = ScriptedEngine()
    site = EngineSite(resource, timeout=0.1)  # the engine closes a connection idle for 0.1 s
    port = REACTOR.listenTCP(0, site, interface="127.0.0.1")
    address = cast(IPv4Address, port.getHost())
    runner = InferenceRunner(lambda: (provider(f"http://127.0.0.1:{address.port}"),), REACTOR)
    capture = LogCapture()
    try:
        with capture.active():
            for turn in range(3):
                resource.answers.append(events(chunk("a")))
                _, done = await run(runner, chat(), stream=True, inference_id=turn + 1)
                assert done.status == pb.INFERENCE_STATUS_OK
                await eventually(
                    lambda: site.closed >= len(resource.received), message="the engine closed the idle connection"
                )
    finally:
        runner.close()
        await maybeDeferred(port.stopListening)
    lines = [formatEvent(e) for e in capture.events]
    assert site.closed == 3
    assert not [line for line in lines if "factory" in line.lower()], lines


class SilentEngine:
    """An HTTP client whose requests never get an answer (unit test of the header timeout)."""

    def __init__(self) -> None:
        self.requests: list[Deferred[Any]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        """A request that stays unanswered."""
        self.requests.append(Deferred())
        return self.requests[-1]


def test_an_engine_that_never_answers_is_unavailable_after_the_header_timeout() -> None:
    """No headers within RESPONSE_HEADERS_TIMEOUT_SECONDS: UNAVAILABLE without a code, and nothing before that."""
    clock = Clock()
    runner = InferenceRunner(lambda: (provider("http://engine.invalid"),), clock, SilentEngine())
    session = RecordingSession()
    answers: list[pb.InferenceDone] = []
    session.done.addCallback(answers.append)
    runner.handle(session, request_envelope(chat(), stream=True), "inference_request")
    clock.advance(RESPONSE_HEADERS_TIMEOUT_SECONDS - 1)
    assert answers == []
    clock.advance(1)
    [done] = answers
    assert (done.status, done.error_code) == (pb.INFERENCE_STATUS_UNAVAILABLE, "")
    assert done.error == f"the engine sent no answer within {RESPONSE_HEADERS_TIMEOUT_SECONDS:g}s"


# -- a full Edge connection ------------------------------------------------------------


class _Session:
    """An Edge connection in memory: frames kept as envelopes, the transport's producer seen."""

    def __init__(self) -> None:
        from twisted.internet.testing import StringTransport

        self.transport = StringTransport()
        self.closing = False
        self.frames: list[pb.Envelope] = []

    def send(self, body: str, message: Any, request_id: int = 0) -> None:
        """Keep one envelope."""
        envelope = pb.Envelope(request_id=request_id)
        getattr(envelope, body).CopyFrom(message)
        self.frames.append(envelope)

    def sendString(self, data: bytes) -> None:
        """Keep one serialized envelope."""
        self.frames.append(pb.Envelope.FromString(data))

    def chunks_of(self, inference_id: int) -> int:
        """Chunks sent so far for ``inference_id``."""
        return sum(
            1
            for e in self.frames
            if e.WhichOneof("body") == "inference_chunk" and e.inference_chunk.inference_id == inference_id
        )


def test_a_full_edge_connection_holds_each_stream_at_its_next_frame() -> None:
    """When the Edge connection's buffer is full, each stream stops at its next
    frame (one frame more at most) and only the streams that stopped are woken
    when it drains; every stream then runs to its end."""
    from twisted_iop.node.config import MockOptions

    clock = Clock()
    provider = NodeProviderConfig("p1", "mock", (MODEL,), mock=MockOptions(tokens_per_second=10, completion_tokens=5))
    runner = InferenceRunner(lambda: (provider,), clock)
    session = _Session()
    body = json.dumps({"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    ids = (1, 2, 3)
    for inference_id in ids:
        request = pb.InferenceRequest(
            inference_id=inference_id,
            provider_id="p1",
            endpoint=pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
            body=body,
            stream=True,
            model=MODEL,
        )
        envelope = pb.Envelope()
        envelope.inference_request.CopyFrom(request)
        runner.handle(session, envelope, "inference_request")
    clock.advance(0)
    before = {i: session.chunks_of(i) for i in ids}
    valve = session.transport.producer
    assert valve is not None
    valve.pauseProducing()
    for _ in range(20):
        clock.advance(0.1)
    held = {i: session.chunks_of(i) for i in ids}
    assert all(held[i] - before[i] <= 1 for i in ids), (before, held)
    assert runner.running() == 3
    valve.resumeProducing()
    for _ in range(20):
        clock.advance(0.1)
    assert runner.running() == 0
    done = [e.inference_done for e in session.frames if e.WhichOneof("body") == "inference_done"]
    assert sorted(d.inference_id for d in done) == [1, 2, 3]
    assert all(d.status == pb.INFERENCE_STATUS_OK for d in done)
    assert all(session.chunks_of(i) >= 5 for i in ids)
