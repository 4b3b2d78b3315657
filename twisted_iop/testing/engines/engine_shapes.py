"""Inference engines' recorded answers (tests only): what each kind documents it sends.

Per engine kind (:data:`SHAPES`): health answers, the models list, load
endpoints (Prometheus text, llama.cpp's ``/slots``, Ollama's ``/api/ps``),
error bodies with the code the Node must map each to, and what a
streamed chat completion looks like. llama.cpp's server's answers are
recorded from the real one (:mod:`twisted_iop.testing.engines.llama_server_recorded`);
the other engines cannot run here (vLLM, SGLang and TGI need a GPU,
Ollama is not packaged here), so theirs are written from their docs and
sources: every shape names where it is documented (the engine's docs, or
the source file that builds it).
:mod:`twisted_iop.testing.engines.engine_fixtures` serves them over HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from twisted_iop.testing.engines.llama_server_recorded import BUILD as LLAMA_SERVER_BUILD
from twisted_iop.testing.engines.llama_server_recorded import RECORDED as LLAMA_SERVER_RECORDED

#: ``next_chat`` answers besides a recorded error's name.
STREAM_OK = "stream_ok"  #: an ordinary answer (a stream if asked: chunks, usage chunk if asked, [DONE])
STREAM_ERROR = "stream_error"  #: 200, two chunks, then the engine's error event; no [DONE]
STREAM_TRUNCATED = "stream_truncated"  #: 200, two chunks, then the body ends without [DONE]
STREAM_EMPTY = "stream_empty"  #: 200 with an empty body (what llama-cpp-python did for a prompt over its context)

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


@attrs.frozen
class Reply:
    """One recorded HTTP answer."""

    status: int
    body: bytes
    content_type: str = JSON


@attrs.frozen
class RecordedError:
    """An engine's error answer and the code the Node must map it to."""

    status: int
    body: bytes
    expected_code: str


@attrs.frozen
class EngineShapes:
    """What one engine answers (``{model}`` in a body is replaced by the first model)."""

    node_kind: str
    #: Where these shapes are documented.
    source: str
    models_path: str
    models: Reply
    #: Health answers by state ("ok", "loading", "down"); empty: the engine has no health endpoint.
    health_path: Optional[str] = None
    health: Mapping[str, Reply] = attrs.field(factory=dict)
    #: Load endpoints: path -> answer.
    load: Mapping[str, Reply] = attrs.field(factory=dict)
    #: Figures the Node must read from :attr:`load` (running, waiting, kv_cache_usage, parallel).
    expected_load: Optional[tuple[int, int, Optional[float], Optional[int]]] = None
    #: Recorded error answers by name.
    errors: Mapping[str, RecordedError] = attrs.field(factory=dict)
    #: The ``data:`` payload of an error inside a 200 stream, and its expected code.
    stream_error: Optional[RecordedError] = None
    #: A ``:`` comment line the engine sends in its streams (keep-alive pings).
    stream_comment: bytes = b""


def as_json(value: Any) -> bytes:
    return json.dumps(value).encode()


def openai_error(message: str, type_: str, code: Any, param: Any = None) -> bytes:
    return as_json({"error": {"message": message, "type": type_, "param": param, "code": code}})


def _openai_models(owned_by: str, **extra: Any) -> Reply:
    return Reply(
        200,
        as_json(
            {
                "object": "list",
                "data": [{"id": "{model}", "object": "model", "created": 1, "owned_by": owned_by, **extra}],
            }
        ),
    )


# -- vLLM ---------------------------------------------------------------------------
# vllm/entrypoints/openai/api_server.py (/health, /v1/models, /metrics);
# vllm/entrypoints/openai/protocol.py ErrorResponse / ErrorInfo (nested since 0.10, flat before);
# metric names: https://docs.vllm.ai/en/latest/usage/metrics.html

_VLLM_METRICS = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="{model}"} 3.0
vllm:num_requests_running{engine="1",model_name="{model}"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="{model}"} 2.0
vllm:num_requests_waiting{engine="1",model_name="{model}"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="{model}"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="{model}"} 0.3
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="{model}"} 1234.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="{model}"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="{model}"} 4.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="{model}"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="{model}"} 3.5
"""

VLLM = EngineShapes(
    node_kind="vllm",
    source="vllm/entrypoints/openai/api_server.py, vllm/entrypoints/openai/protocol.py (ErrorResponse)",
    health_path="/health",
    health={"ok": Reply(200, b""), "down": Reply(503, b"")},
    models_path="/v1/models",
    models=_openai_models("vllm", root="{model}", parent=None, max_model_len=4096),
    load={"/metrics": Reply(200, _VLLM_METRICS, PROMETHEUS)},
    expected_load=(4, 2, 0.42, None),
    errors={
        "context_length_exceeded": RecordedError(
            400,
            openai_error(
                "This model's maximum context length is 4096 tokens. However, your request has 5000 input "
                "tokens. Please reduce the length of the input messages.",
                "BadRequestError",
                400,
            ),
            "context_length_exceeded",
        ),
        # The flat shape of vLLM before 0.10 (protocol.py ErrorResponse with object="error").
        "context_length_exceeded_flat": RecordedError(
            400,
            as_json(
                {
                    "object": "error",
                    "message": "This model's maximum context length is 4096 tokens. However, you requested "
                    "5000 tokens in the messages. Please reduce the length of the messages.",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            ),
            "context_length_exceeded",
        ),
        "model_not_found": RecordedError(
            404, openai_error("The model `nope` does not exist.", "NotFoundError", 404, "model"), "model_not_found"
        ),
        "invalid_request": RecordedError(
            400,
            openai_error("temperature must be non-negative, got -1.0.", "BadRequestError", 400),
            "invalid_request",
        ),
        "provider_error": RecordedError(
            500,
            openai_error(
                "EngineCore encountered an issue. See stack trace for the root cause.", "InternalServerError", 500
            ),
            "provider_error",
        ),
    },
    # serving_chat.py: an error while streaming is sent as data: {"error": ErrorInfo}.
    stream_error=RecordedError(
        200, openai_error("EngineCore encountered an issue.", "InternalServerError", 500), "provider_error"
    ),
)

# -- SGLang -------------------------------------------------------------------------
# python/sglang/srt/entrypoints/http_server.py (/health, /v1/models, /metrics with --enable-metrics);
# python/sglang/srt/entrypoints/openai/protocol.py ErrorResponse (flat), serving_base.py
# create_streaming_error_response (nested in a stream);
# metric names: https://docs.sglang.ai/references/production_metrics.html

_SGLANG_METRICS = b"""# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"} 5.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"} 0.55
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{engine_type="unified",model_name="{model}",pp_rank="0",tp_rank="0"} 812.5
"""


def _sglang_error(message: str, code: int, type_: str = "BadRequestError") -> bytes:
    return as_json({"object": "error", "message": message, "type": type_, "param": None, "code": code})


SGLANG = EngineShapes(
    node_kind="sglang",
    source="python/sglang/srt/entrypoints/http_server.py, python/sglang/srt/entrypoints/openai/protocol.py",
    health_path="/health",
    health={"ok": Reply(200, b""), "down": Reply(503, b"")},
    models_path="/v1/models",
    models=_openai_models("sglang", root="{model}", max_model_len=4096),
    load={"/metrics": Reply(200, _SGLANG_METRICS, PROMETHEUS)},
    expected_load=(5, 7, 0.55, None),
    errors={
        "context_length_exceeded": RecordedError(
            400,
            _sglang_error("The input (5000 tokens) is longer than the model's context length (4096 tokens).", 400),
            "context_length_exceeded",
        ),
        "model_not_found": RecordedError(
            404, _sglang_error("The model `nope` does not exist.", 404, "NotFoundError"), "model_not_found"
        ),
        "invalid_request": RecordedError(
            400, _sglang_error("Invalid request: messages must not be empty", 400), "invalid_request"
        ),
        "provider_error": RecordedError(
            500, _sglang_error("Internal server error", 500, "InternalServerError"), "provider_error"
        ),
    },
    stream_error=RecordedError(
        200,
        as_json(
            {
                "error": json.loads(
                    _sglang_error(
                        "The input (5000 tokens) is longer than the model's context length (4096 tokens).", 400
                    )
                )
            }
        ),
        "context_length_exceeded",
    ),
)

# -- llama.cpp's server ---------------------------------------------------------------
# Recorded from the real llama-server (llama.cpp build llama_server_recorded.BUILD, the one vendored
# in llama-cpp-python 0.3.36, built by `make llama-server`) on the tests' tiny model: health while
# loading and ready, the models list, /slots with both of its 2 slots busy and one request deferred,
# /props, /metrics (with --metrics), and its error answers. Re-record with
# `python -m twisted_iop.testing.engines.record_llama_server`. Not recorded: a /health "down" (llama-server
# exits when the model fails to load; the 500 below is tools/server/utils.hpp's server_error shape)
# and an error inside a 200 stream (one cannot be provoked on demand; the shape is server.cpp's).
# It exports no KV-cache metric (the llamacpp:kv_cache_usage_ratio of older builds is gone), so its
# KV use is unknown.


def _recorded(name: str) -> Reply:
    status, content_type, body = LLAMA_SERVER_RECORDED[name]
    return Reply(status, body, content_type)


def _recorded_error(name: str, expected_code: str) -> RecordedError:
    status, _, body = LLAMA_SERVER_RECORDED[name]
    return RecordedError(status, body, expected_code)


def _llamacpp_error(message: str, code: int, type_: str, **extra: Any) -> bytes:
    return as_json({"error": {"code": code, "message": message, "type": type_, **extra}})


LLAMACPP = EngineShapes(
    node_kind="llamacpp",
    source=f"recorded from llama-server {LLAMA_SERVER_BUILD} (twisted_iop/testing/engines/record_llama_server.py)",
    health_path="/health",
    health={
        "ok": _recorded("health_ok"),
        "loading": _recorded("health_loading"),
        "down": Reply(500, _llamacpp_error("Failed to load model", 500, "server_error")),
    },
    models_path="/v1/models",
    models=_recorded("models"),
    load={"/slots": _recorded("slots_busy"), "/props": _recorded("props"), "/metrics": _recorded("metrics_busy")},
    # requests_processing 2, requests_deferred 1, no KV-cache metric, 2 slots.
    expected_load=(2, 1, None, 2),
    errors={
        "context_length_exceeded": _recorded_error("context_length_exceeded", "context_length_exceeded"),
        # A chat asked while the model loads.
        "overloaded": _recorded_error("chat_while_loading", "overloaded"),
        "invalid_request": _recorded_error("invalid_request", "invalid_request"),
        # Embeddings asked of a server started without --embeddings: 501, the client's call.
        "provider_error": _recorded_error("embeddings_not_supported", "provider_error"),
    },
    # tools/server/server.cpp: an error while streaming is {"error": ...} in the event stream.
    stream_error=RecordedError(
        200, _llamacpp_error("failed to decode the batch", 500, "server_error"), "provider_error"
    ),
)

# -- llama-cpp-python's server (kind llamacpp) -----------------------------------------
# llama_cpp/server/app.py (routes: no /health, /slots or /metrics), llama_cpp/server/errors.py
# (context_length_exceeded); streams through sse-starlette, which sends ": ping" comments.

LLAMA_CPP_PYTHON = EngineShapes(
    node_kind="llamacpp",
    source="llama-cpp-python llama_cpp/server/app.py, llama_cpp/server/errors.py",
    health_path="/health",
    health={},  # 404 {"detail": "Not Found"} (FastAPI), like every path it lacks
    models_path="/v1/models",
    models=Reply(
        200,
        as_json(
            {"object": "list", "data": [{"id": "{model}", "object": "model", "owned_by": "me", "permissions": []}]}
        ),
    ),
    expected_load=None,
    errors={
        "context_length_exceeded": RecordedError(
            400,
            openai_error(
                "This model's maximum context length is 512 tokens. However, you requested 600 tokens "
                "(600 in the messages, None in the completion). Please reduce the length of the messages or completion.",
                "invalid_request_error",
                "context_length_exceeded",
                "messages",
            ),
            "context_length_exceeded",
        ),
        "provider_error": RecordedError(
            500, openai_error("llama_decode returned -1", "internal_server_error", None), "provider_error"
        ),
    },
    stream_comment=b": ping - 2025-01-01 00:00:00.000000",
)

# -- Text Generation Inference ----------------------------------------------------------
# router/src/server.rs (/health, /info, /metrics), router/src/lib.rs ErrorResponse,
# router/src/infer/mod.rs InferError (422 validation, 424 generation, 429 overloaded,
# 500 incomplete_generation), router/src/validation.rs (token limits);
# metric names: https://huggingface.co/docs/text-generation-inference/reference/metrics

_TGI_METRICS = b"""# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 8
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 3000
# TYPE tgi_request_count counter
tgi_request_count 57
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 10
tgi_request_duration_bucket{le="+Inf"} 57
tgi_request_duration_sum 31.5
tgi_request_duration_count 57
"""


def _tgi_error(message: str, error_type: str) -> bytes:
    return as_json({"error": message, "error_type": error_type})


TGI = EngineShapes(
    node_kind="tgi",
    source="text-generation-inference router/src/server.rs, router/src/lib.rs (ErrorResponse)",
    health_path="/health",
    health={"ok": Reply(200, b""), "down": Reply(503, _tgi_error("unhealthy", "healthcheck"))},
    models_path="/info",
    models=Reply(
        200,
        as_json(
            {
                "model_id": "{model}",
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": 128,
                "max_best_of": 2,
                "max_stop_sequences": 4,
                "max_input_tokens": 1024,
                "max_total_tokens": 2048,
                "validation_workers": 2,
                "max_client_batch_size": 4,
                "router": "text-generation-router",
                "version": "3.0.1",
                "sha": None,
                "docker_label": None,
            }
        ),
    ),
    load={"/metrics": Reply(200, _TGI_METRICS, PROMETHEUS)},
    expected_load=(8, 4, None, None),
    errors={
        "context_length_exceeded": RecordedError(
            422,
            _tgi_error(
                "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. "
                "Given: 2000 `inputs` tokens and 100 `max_new_tokens`",
                "validation",
            ),
            "context_length_exceeded",
        ),
        "invalid_request": RecordedError(
            422,
            _tgi_error("Input validation error: `temperature` must be strictly positive", "validation"),
            "invalid_request",
        ),
        "overloaded": RecordedError(429, _tgi_error("Model is overloaded", "overloaded"), "overloaded"),
        "provider_error": RecordedError(
            424,
            _tgi_error("Request failed during generation: Server error: CUDA out of memory.", "generation"),
            "provider_error",
        ),
    },
    stream_error=RecordedError(
        200,
        _tgi_error("Request failed during generation: Server error: CUDA out of memory.", "generation"),
        "provider_error",
    ),
)

# -- Ollama ---------------------------------------------------------------------------------
# server/routes.go ("/" answers "Ollama is running"), openai/openai.go (ListCompletion, ErrorResponse),
# https://github.com/ollama/ollama/blob/main/docs/api.md ("List Running Models": /api/ps).

OLLAMA = EngineShapes(
    node_kind="ollama",
    source="ollama server/routes.go, openai/openai.go, docs/api.md",
    health_path="/",
    health={"ok": Reply(200, b"Ollama is running", TEXT), "down": Reply(500, b"Internal Server Error", TEXT)},
    models_path="/v1/models",
    models=_openai_models("library"),
    # Served because Ollama serves it; the Node does not read it (no request counts in it).
    load={
        "/api/ps": Reply(
            200,
            as_json(
                {
                    "models": [
                        {
                            "name": "{model}",
                            "model": "{model}",
                            "size": 5137025024,
                            "digest": "2ae6f6dd7a3dd734790bbbf58b8909a606e0e7e97e94b7604e0aa7ae4490e6d8",
                            "details": {"format": "gguf", "family": "llama", "parameter_size": "8.0B"},
                            "expires_at": "2024-06-04T14:38:31.83753-07:00",
                            "size_vram": 5137025024,
                        }
                    ]
                }
            ),
        )
    },
    expected_load=None,
    errors={
        "model_not_found": RecordedError(
            404, openai_error('model "nope" not found, try pulling it first', "api_error", None), "model_not_found"
        ),
        "invalid_request": RecordedError(
            400, openai_error("invalid message content type", "invalid_request_error", None), "invalid_request"
        ),
        "provider_error": RecordedError(
            500,
            openai_error("llama runner process has terminated: signal: killed", "api_error", None),
            "provider_error",
        ),
    },
    stream_error=RecordedError(
        200, openai_error("llama runner process has terminated", "api_error", None), "provider_error"
    ),
)

# -- a generic OpenAI-compatible server --------------------------------------------------
# https://platform.openai.com/docs/guides/error-codes (the error object), the models list.

OPENAI = EngineShapes(
    node_kind="openai",
    source="https://platform.openai.com/docs/api-reference (models, error object)",
    models_path="/v1/models",
    models=_openai_models("system"),
    errors={
        "context_length_exceeded": RecordedError(
            400,
            openai_error(
                "This model's maximum context length is 8192 tokens.",
                "invalid_request_error",
                "context_length_exceeded",
                "messages",
            ),
            "context_length_exceeded",
        ),
        "model_not_found": RecordedError(
            404,
            openai_error("The model `nope` does not exist", "invalid_request_error", "model_not_found"),
            "model_not_found",
        ),
        "overloaded": RecordedError(
            429, openai_error("Rate limit reached", "requests", "rate_limit_exceeded"), "overloaded"
        ),
        "provider_error": RecordedError(
            500, openai_error("The server had an error", "server_error", None), "provider_error"
        ),
    },
)

#: The recorded shapes of each fixture kind.
SHAPES: dict[str, EngineShapes] = {
    "openai": OPENAI,
    "vllm": VLLM,
    "sglang": SGLANG,
    "llamacpp": LLAMACPP,
    "llama-cpp-python": LLAMA_CPP_PYTHON,
    "tgi": TGI,
    "ollama": OLLAMA,
}
