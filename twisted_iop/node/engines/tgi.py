"""Hugging Face Text Generation Inference (``text-generation-launcher``): kind ``tgi``.

* health: ``GET /health``, 200 with an empty body, 503 when the model
  shards do not answer (``router/src/server.rs``, ``health``);
* models: TGI serves one model; ``GET /info`` names it (``model_id``) in
  every version, ``/v1/models`` only in newer ones, so ``/info`` is read
  (both shapes are understood);
* load: ``GET /metrics``, Prometheus text: ``tgi_queue_size`` (waiting)
  and ``tgi_batch_current_size`` (running); no KV-cache figure
  (https://huggingface.co/docs/text-generation-inference/reference/metrics);
* errors: ``ErrorResponse`` of ``router/src/lib.rs``: ``{"error": "text",
  "error_type": "validation" | "generation" | "overloaded" |
  "incomplete_generation"}`` with HTTP 422, 424, 429 and 500
  (``router/src/infer/mod.rs``, ``InferError``); in a stream the same
  object is one ``data:`` event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from twisted_iop.node.engines.base import (
    CONTEXT_LENGTH_EXCEEDED,
    INVALID_REQUEST,
    OVERLOADED,
    PROVIDER_ERROR,
    EngineAdapter,
    EngineError,
    LoadReading,
    client_status,
    error_fields,
    error_message,
    retry_seconds,
)
from twisted_iop.node.engines.readings import json_body, metrics_load

RUNNING = "tgi_batch_current_size"
WAITING = "tgi_queue_size"

#: TGI's ``error_type`` -> (its HTTP status, our code).
ERROR_TYPES = {
    "validation": (422, INVALID_REQUEST),
    "generation": (424, PROVIDER_ERROR),
    "overloaded": (429, OVERLOADED),
    "incomplete_generation": (500, PROVIDER_ERROR),
}


class TGIAdapter(EngineAdapter):
    """Text Generation Inference (its OpenAI ``/v1/chat/completions`` and ``/v1/completions``)."""

    kind = "tgi"
    health_path = "/health"
    models_path = "/info"
    load_paths = ("/metrics",)

    def served_models(self, body: bytes) -> Optional[set[str]]:
        """The one ``model_id`` of ``/info`` (or an OpenAI models list)."""
        parsed: Any = json_body(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("model_id"), str):
            return {parsed["model_id"]}
        return super().served_models(body)

    def read_load(self, answers: Mapping[str, bytes]) -> Optional[LoadReading]:
        """The current batch (running) and the queue (waiting) from ``/metrics``."""
        running, waiting, _ = metrics_load(answers, (RUNNING,), (WAITING,))
        return LoadReading.of(running, waiting)

    def engine_error(self, status: int, body: bytes, retry_after: Optional[str] = None) -> EngineError:
        """TGI's ``error_type`` decides the code; a validation error about token counts is the context."""
        error_type = error_fields(body).get("error_type")
        known = ERROR_TYPES.get(error_type) if isinstance(error_type, str) else None
        if known is None:
            return super().engine_error(status, body, retry_after)
        engine_status, code = known
        message = error_message(body) or f"the engine answered {engine_status} ({error_type})"
        if code == INVALID_REQUEST and _about_context(message):
            code = CONTEXT_LENGTH_EXCEEDED
        return EngineError(client_status(engine_status, code), code, message, retry_seconds(retry_after))


def _about_context(message: str) -> bool:
    """TGI's validation messages for a prompt over the limit.

    "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: ..." and
    "`inputs` must have less than 4096 tokens. Given: ..."
    (``router/src/validation.rs``).
    """
    lowered = message.lower()
    return "tokens" in lowered and ("must be <=" in lowered or "must have less than" in lowered)
