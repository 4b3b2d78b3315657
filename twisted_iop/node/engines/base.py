"""What every engine adapter offers, and the generic OpenAI-compatible behaviour.

An adapter is pure: it says which paths to ask and interprets the answers
(health, models, load, errors, stream events). The Node makes the HTTP
calls (``node/engines/probes.py`` for health, models and load, ``node/inference.py``
for requests) and the adapter of the provider's ``kind`` reads what came
back. Nothing here does I/O, so each adapter is tested with the engine's
recorded answers.

Errors reach the client in the OpenAI shape with one set of codes
(:data:`ERROR_CODES`), whatever shape the engine used, and with the
engine's own message.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from twisted_iop.wire import control_pb2 as pb

#: The error codes a client sees for an engine's error, whatever its shape.
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
MODEL_NOT_FOUND = "model_not_found"
OVERLOADED = "overloaded"
INVALID_REQUEST = "invalid_request"
PROVIDER_ERROR = "provider_error"
#: An engine's "this endpoint is not served here" (kept as it is for the client).
NOT_SUPPORTED_STATUS = 501
ERROR_CODES = (CONTEXT_LENGTH_EXCEEDED, MODEL_NOT_FOUND, OVERLOADED, INVALID_REQUEST, PROVIDER_ERROR)

#: The OpenAI error ``type`` of each code.
ERROR_TYPES = {
    CONTEXT_LENGTH_EXCEEDED: "invalid_request_error",
    MODEL_NOT_FOUND: "invalid_request_error",
    OVERLOADED: "server_error",
    INVALID_REQUEST: "invalid_request_error",
    PROVIDER_ERROR: "server_error",
}

#: Longest engine message passed on (messages travel to clients and logs).
MAX_MESSAGE_CHARS = 2000


@attrs.frozen
class HealthCheck:
    """What one answer of the engine's health endpoint says."""

    health: pb.ProviderHealth
    reason: str = ""


@attrs.frozen
class LoadReading:
    """The engine's own load figures (``None``: the engine does not say)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: Optional[float] = None
    parallel: Optional[int] = None

    @classmethod
    def of(
        cls,
        running: Optional[int] = None,
        waiting: Optional[int] = None,
        kv_cache_usage: Optional[float] = None,
        parallel: Optional[int] = None,
    ) -> Optional[LoadReading]:
        """A reading from figures each of which may be missing; ``None`` when all are."""
        if running is None and waiting is None and kv_cache_usage is None and parallel is None:
            return None
        return cls(running or 0, waiting or 0, kv_cache_usage, parallel or None)

    def to_wire(self, age_ms: int = 0) -> pb.EngineLoad:
        """The wire form (``EngineLoad``), known."""
        return pb.EngineLoad(
            known=True,
            running=max(0, self.running),
            waiting=max(0, self.waiting),
            kv_cache_usage=-1.0 if self.kv_cache_usage is None else min(1.0, max(0.0, self.kv_cache_usage)),
            parallel=max(0, self.parallel or 0),
            age_ms=max(0, min(age_ms, 2**32 - 1)),
        )


@attrs.frozen
class EngineError:
    """An engine's error in the client's terms: HTTP status, one of :data:`ERROR_CODES`, the engine's message."""

    status: int
    code: str
    message: str
    retry_after: Optional[int] = None

    def to_json(self) -> bytes:
        """The OpenAI error body."""
        kind = (
            "not_supported_error" if self.status == NOT_SUPPORTED_STATUS else ERROR_TYPES.get(self.code, "server_error")
        )
        return json.dumps({"error": {"message": self.message, "type": kind, "code": self.code}}).encode()

    @property
    def retryable(self) -> bool:
        """Whether another provider may succeed where this one failed (overload)."""
        return self.code == OVERLOADED


class StreamEventKind(enum.Enum):
    """What one ``data:`` line of an engine's event stream is."""

    DATA = "data"  #: an ordinary chunk, relayed to the client
    USAGE = "usage"  #: the final usage chunk (``choices: []``): relayed only if the client asked for it
    ERROR = "error"  #: an error event inside a 200 stream
    DONE = "done"  #: ``[DONE]``


@attrs.frozen
class StreamEvent:
    """One classified ``data:`` payload of a stream."""

    kind: StreamEventKind
    usage: Optional[Mapping[str, int]] = None
    error: Optional[EngineError] = None


class EngineAdapter:
    """The generic OpenAI-compatible server (kind ``openai``); other kinds override what differs.

    * health: no health endpoint of its own; ``GET /v1/models`` answering
      200 is the health check (see :attr:`health_path`);
    * load: none exported (:attr:`load_paths` is empty);
    * errors: the OpenAI shape ``{"error": {"message", "type", "code"}}``,
      and the common variants (flat ``{"message", "code"}``, ``{"error": "text"}``);
    * stream: ``data:`` lines, ``[DONE]`` at the end, a usage chunk with
      ``choices: []`` when ``stream_options.include_usage`` was asked.
    """

    #: The kind name in node.yaml.
    kind = "openai"
    #: The engine's health endpoint, or ``None`` when the models list is the health check.
    health_path: Optional[str] = None
    #: Where the engine lists its models (OpenAI shape ``{"data": [{"id": ...}]}``).
    models_path = "/v1/models"
    #: Paths read for load on every load round, in order (their answers go to :meth:`read_load`).
    load_paths: tuple[str, ...] = ()
    #: Whether the engine honours ``stream_options: {"include_usage": true}``.
    stream_usage = True

    def check_health(self, status: int, body: bytes) -> Optional[HealthCheck]:
        """Read the answer of :attr:`health_path`; ``None`` when the engine has no such endpoint (404).

        ``None`` makes the models list the health check.
        """
        if status == 404:
            return None
        if 200 <= status < 300:
            return HealthCheck(pb.PROVIDER_HEALTH_HEALTHY)
        detail = error_message(body)
        reason = f"GET {self.health_path} answered {status}" + (f": {detail}" if detail else "")
        return HealthCheck(pb.PROVIDER_HEALTH_UNHEALTHY, reason)

    def served_models(self, body: bytes) -> Optional[set[str]]:
        """Model ids from the answer of :attr:`models_path`, or ``None`` if it is not that shape."""
        try:
            parsed = json.loads(body)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or not isinstance(parsed.get("data"), list):
            return None
        return {item["id"] for item in parsed["data"] if isinstance(item, dict) and isinstance(item.get("id"), str)}

    def read_load(self, answers: Mapping[str, bytes]) -> Optional[LoadReading]:
        """The load in the 200 answers of :attr:`load_paths` (by path); ``None`` when they say nothing."""
        return None

    def engine_error(self, status: int, body: bytes, retry_after: Optional[str] = None) -> EngineError:
        """An error answer (status >= 400) in the client's terms."""
        message = error_message(body) or f"the engine answered {status}"
        return EngineError(
            client_status(status, code_of(status, body, message)),
            code_of(status, body, message),
            message,
            retry_seconds(retry_after),
        )

    def stream_event(self, payload: bytes) -> StreamEvent:
        """Classify one ``data:`` payload (the bytes after ``data:``, stripped)."""
        return classify_openai_event(payload, self)


# -- helpers the adapters share ---------------------------------------------------


def error_message(body: bytes) -> str:
    """The engine's message from any of the error shapes (nested, flat, string), or the text."""
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", "replace").strip()
        return text[:MAX_MESSAGE_CHARS]
    message: Any = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        if message is None:
            message = parsed.get("message", parsed.get("detail"))
    elif isinstance(parsed, str):
        message = parsed
    if not isinstance(message, str):
        message = json.dumps(message) if message is not None else ""
    return str(message.strip()[:MAX_MESSAGE_CHARS])


def error_fields(body: bytes) -> Mapping[str, Any]:
    """The error object's fields (nested ``error`` or the flat body), ``{}`` if none."""
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    error = parsed.get("error")
    if isinstance(error, dict):
        return error
    return parsed


_CONTEXT_WORDS = ("context length", "context window", "maximum context", "context_length", "exceed_context", "too long")


def code_of(status: int, body: bytes, message: str) -> str:
    """One of :data:`ERROR_CODES` for an engine's error answer."""
    fields = error_fields(body)
    declared = " ".join(str(fields.get(key, "")) for key in ("code", "type", "error_type")).lower()
    lowered = message.lower()
    if "context_length_exceeded" in declared or "exceed_context" in declared:
        return CONTEXT_LENGTH_EXCEEDED
    if status in (429, 503) or "overloaded" in declared:
        return OVERLOADED
    if status == 404 or "model_not_found" in declared:
        return MODEL_NOT_FOUND
    if 400 <= status < 500:
        if any(word in lowered for word in _CONTEXT_WORDS):
            return CONTEXT_LENGTH_EXCEEDED
        if "model" in lowered and ("not found" in lowered or "does not exist" in lowered):
            return MODEL_NOT_FOUND
        return INVALID_REQUEST
    return PROVIDER_ERROR


def client_status(engine_status: int, code: str) -> int:
    """The HTTP status the client sees for an engine's error with ``code``."""
    if code == OVERLOADED:
        return 429 if engine_status == 429 else 503
    if code == MODEL_NOT_FOUND:
        return 404
    if code in (CONTEXT_LENGTH_EXCEEDED, INVALID_REQUEST):
        return engine_status if engine_status in (400, 413, 422) else 400
    if engine_status == NOT_SUPPORTED_STATUS:
        # The engine does not serve this endpoint (llama-server's embeddings without
        # --embeddings): the client's call, kept as 501 so the Edge never counts it
        # against the engine (an older Edge shows it as provider_error).
        return NOT_SUPPORTED_STATUS
    return 502


def retry_seconds(value: Optional[str]) -> Optional[int]:
    """A ``Retry-After`` header in whole seconds (its date form is ignored)."""
    if value is None:
        return None
    try:
        seconds = int(value.strip())
    except ValueError:
        return None
    return seconds if 0 <= seconds <= 3600 else None


def classify_openai_event(payload: bytes, adapter: EngineAdapter) -> StreamEvent:
    """The generic classification of one ``data:`` payload.

    Cheap on the common path (one substring test per chunk): a payload is
    parsed only when it may be the usage chunk or an error.
    """
    if payload == b"[DONE]":
        return StreamEvent(StreamEventKind.DONE)
    if b'"error"' in payload:
        try:
            parsed = json.loads(payload)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get("error") is not None and "choices" not in parsed:
            fields = error_fields(payload)
            status = fields.get("code")
            status = status if isinstance(status, int) and 400 <= status < 600 else 500
            return StreamEvent(StreamEventKind.ERROR, error=adapter.engine_error(status, payload))
    if b'"usage":{' in payload or b'"usage": {' in payload:
        try:
            parsed = json.loads(payload)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
            # The usage chunk asked with stream_options has no choices; some
            # engines put usage on their last ordinary chunk instead.
            kind = StreamEventKind.USAGE if parsed.get("choices") == [] else StreamEventKind.DATA
            return StreamEvent(kind, usage=parsed["usage"])
    return _DATA


_DATA = StreamEvent(StreamEventKind.DATA)
