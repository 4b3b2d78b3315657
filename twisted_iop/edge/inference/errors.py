"""What a failed ``InferenceDone`` means: the client's error, and whose fault it was.

A Node reports an engine's error in one set of codes (``error_code``):
``context_length_exceeded`` (400), ``model_not_found`` (404),
``overloaded`` (429 or 503, with ``Retry-After``), ``invalid_request``
(400, or 422 when the engine said 422) and ``provider_error`` (502), with
the engine's message in an OpenAI error body. An older Node sends no code;
its answers keep the mapping they always had (a provider's own 4xx OpenAI
error passes through as ``provider_error`` with its status; unreachable is
503 ``provider_unavailable``; anything else 502 ``provider_error``).

:func:`failure_kind` says what the gateway does with the provider:

* ``ELSEWHERE``: the provider could not take the request at all (engine
  unreachable: refused, reset before the answer, timeout; or overloaded:
  429/503). Before any byte reached the client it is retried on another
  provider, and the provider cools down at once.
* ``PROVIDER``: the provider failed it (5xx, a broken stream): counts
  towards the provider's failure share.
* ``CLIENT``: the request itself was wrong (too long, unknown model,
  invalid, an endpoint the engine does not serve: 400, 404, 405, 413,
  422, 501): no retry, and it says nothing about the provider; it never
  counts toward a cool-down.

An engine that answers 501 (llama-server's ``not_supported_error``, e.g.
``/v1/embeddings`` without ``--embeddings``) does not serve that
endpoint: the client gets 501 ``not_supported`` with the engine's
message, and the gateway remembers it per provider and endpoint
(:data:`UNSUPPORTED_MEMORY_SECONDS`) so it stops sending that endpoint
there; the provider keeps serving the others.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Optional, cast

from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.wire import control_pb2 as pb

#: The engine's HTTP statuses an older Node's error means "overloaded" by.
OVERLOAD_STATUSES = frozenset({429, 503})
#: Longest engine message kept from a Node's error (characters).
MAX_MESSAGE = 1000
#: Longest Retry-After passed on to a client, in seconds.
MAX_RETRY_AFTER_SECONDS = 3600

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
MODEL_NOT_FOUND = "model_not_found"
OVERLOADED = "overloaded"
INVALID_REQUEST = "invalid_request"
PROVIDER_ERROR = "provider_error"
PROVIDER_UNAVAILABLE = "provider_unavailable"
NOT_SUPPORTED = "not_supported"
#: An engine's status for "I do not serve this endpoint".
NOT_SUPPORTED_STATUSES = frozenset({501})
#: Engine statuses that say the request was the client's mistake, whatever code a Node gave them.
CLIENT_STATUSES = frozenset({400, 404, 405, 413, 422, 501})
#: How long an endpoint a provider answered 501 for is not sent to it again (an engine
#: restarted with the feature on is found again after this).
UNSUPPORTED_MEMORY_SECONDS = 60.0
#: Most (node, provider, endpoint) "not supported" answers remembered at once.
MAX_UNSUPPORTED = 4096


class FailureKind(enum.Enum):
    """Whose fault a failed request was."""

    ELSEWHERE = "elsewhere"
    PROVIDER = "provider"
    CLIENT = "client"


def failure_kind(done: pb.InferenceDone) -> FailureKind:
    """What a failed ``done`` says about its provider (see the module docstring)."""
    if done.status == pb.INFERENCE_STATUS_UNAVAILABLE:
        return FailureKind.ELSEWHERE
    code = done.error_code
    if code == OVERLOADED:
        return FailureKind.ELSEWHERE
    if code in (CONTEXT_LENGTH_EXCEEDED, MODEL_NOT_FOUND, INVALID_REQUEST):
        return FailureKind.CLIENT
    if not code and done.status == pb.INFERENCE_STATUS_PROVIDER_ERROR:
        if done.http_status in OVERLOAD_STATUSES:
            return FailureKind.ELSEWHERE
        if 400 <= done.http_status < 500:
            return FailureKind.CLIENT
    if done.status == pb.INFERENCE_STATUS_REJECTED:
        return FailureKind.CLIENT
    if done.status == pb.INFERENCE_STATUS_PROVIDER_ERROR and done.http_status in CLIENT_STATUSES:
        return FailureKind.CLIENT
    return FailureKind.PROVIDER


def not_supported(done: pb.InferenceDone) -> bool:
    """Whether the engine said it does not serve the request's endpoint."""
    return done.status == pb.INFERENCE_STATUS_PROVIDER_ERROR and done.http_status in NOT_SUPPORTED_STATUSES


def client_error(done: pb.InferenceDone, default_retry_after: int) -> InferenceError:
    """The client's OpenAI error for an ``InferenceDone`` that is not OK."""
    code = done.error_code
    message = done.error[:MAX_MESSAGE]
    if not_supported(done):
        engine = _openai_error(done.body)
        if engine is not None and isinstance(engine.get("message"), str) and engine["message"]:
            message = engine["message"][:MAX_MESSAGE]
        return InferenceError(
            done.http_status,
            NOT_SUPPORTED,
            message or "the provider does not serve this endpoint",
            kind="not_supported_error",
        )
    if code:
        return _coded_error(done, code, message, default_retry_after)
    status = done.status
    if status == pb.INFERENCE_STATUS_PROVIDER_ERROR and 400 <= done.http_status < 500 and _openai_error(done.body):
        # The provider's own OpenAI error (bad parameter ...) reaches the client as it is.
        return InferenceError(done.http_status, PROVIDER_ERROR, message, body=bytes(done.body))
    if status == pb.INFERENCE_STATUS_UNAVAILABLE:
        return InferenceError(
            503, PROVIDER_UNAVAILABLE, message or "the provider could not be reached", kind="server_error"
        )
    if status == pb.INFERENCE_STATUS_REJECTED:
        return InferenceError(502, "node_rejected", message or "the node refused the request", kind="server_error")
    if status == pb.INFERENCE_STATUS_PROVIDER_ERROR:
        return InferenceError(502, PROVIDER_ERROR, message or "the provider failed", kind="server_error")
    return InferenceError(502, PROVIDER_ERROR, f"unexpected inference status {status}", kind="server_error")


def _coded_error(done: pb.InferenceDone, code: str, message: str, default_retry_after: int) -> InferenceError:
    engine = _openai_error(done.body)
    if engine is not None and isinstance(engine.get("message"), str) and engine["message"]:
        message = engine["message"][:MAX_MESSAGE]
    retry_after: Optional[int] = None
    if code == CONTEXT_LENGTH_EXCEEDED:
        status, kind = 400, "invalid_request_error"
    elif code == MODEL_NOT_FOUND:
        status, kind = 404, "invalid_request_error"
    elif code == INVALID_REQUEST:
        status, kind = (422 if done.http_status == 422 else 400), "invalid_request_error"
    elif code == OVERLOADED:
        status = 429 if done.http_status == 429 else 503
        kind = "rate_limit_error" if status == 429 else "server_error"
        retry_after = min(done.retry_after_seconds, MAX_RETRY_AFTER_SECONDS) or default_retry_after
    else:
        # provider_error, or a code newer than this Edge: the provider failed.
        code, status, kind = PROVIDER_ERROR, 502, "server_error"
    if done.status == pb.INFERENCE_STATUS_UNAVAILABLE and code == PROVIDER_ERROR:
        code, status = PROVIDER_UNAVAILABLE, 503
    message = message or f"the provider answered {code}"
    return InferenceError(status, code, message, kind=kind, retry_after=retry_after)


def _openai_error(body: bytes) -> Optional[dict[str, Any]]:
    """The ``error`` object of an OpenAI error body, if ``body`` is one."""
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return cast("dict[str, Any] | None", parsed["error"])
    return None


class UnsupportedEndpoints:
    """The endpoints providers answered "not supported" for, each kept
    :data:`UNSUPPORTED_MEMORY_SECONDS` (at most :data:`MAX_UNSUPPORTED`, the
    oldest dropped first), so such requests are answered without the engine."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, int], tuple[InferenceError, float]] = {}

    def remember(
        self, node_id: str, provider_id: str, endpoint: pb.InferenceEndpoint, error: InferenceError, now: float
    ) -> None:
        """The provider does not serve ``endpoint`` (its answer was ``error``)."""
        if len(self._kept) >= MAX_UNSUPPORTED:
            self._kept.pop(next(iter(self._kept)))
        self._kept[(node_id, provider_id, int(endpoint))] = (error, now + UNSUPPORTED_MEMORY_SECONDS)

    def known(
        self, node_id: str, provider_id: str, endpoint: pb.InferenceEndpoint, now: float
    ) -> Optional[InferenceError]:
        """The provider's remembered answer for ``endpoint``, if still kept."""
        key = (node_id, provider_id, int(endpoint))
        kept = self._kept.get(key)
        if kept is None:
            return None
        if kept[1] <= now:
            del self._kept[key]
            return None
        return kept[0]

    def __len__(self) -> int:
        return len(self._kept)
