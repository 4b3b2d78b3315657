"""Whether a request may be admitted: "not now" is not "gone".

The questions the inference API asks before a request takes a place in
its model's queue, answered from the Node registry:

* :func:`is_long_context`: the request's class (characters/4 +
  ``max_tokens`` above the threshold);
* :func:`available_models`: the models some provider serves now or only
  "not now" (saturated, cooling down, re-probing, its engine on its way
  back), which ``/v1/models`` lists;
* :func:`check_model`: the error a request gets at once (404 for a model
  no provider has, 400 for a long-context request no provider of its
  model takes, 503 when none of them can take requests); a model served
  only "not now" passes, and its request waits in the queue;
* :func:`queue_full`: the 429 of a request whose model's queue is full.
"""

from __future__ import annotations

from typing import Any

from twisted_iop.edge.inference.config import InferenceConfig
from twisted_iop.edge.inference.lifecycle import InferenceError, QueueFull
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.openai_api import estimate_prompt_tokens, whole_tokens


def is_long_context(body: dict[str, Any], threshold_tokens: int) -> bool:
    """Whether characters/4 + max_tokens is above ``threshold_tokens``."""
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    extra = whole_tokens(max_tokens) or 0
    return estimate_prompt_tokens(body) + extra > threshold_tokens


def available_models(registry: NodeRegistry) -> list[str]:
    """Models some provider serves now or only "not now" (saturated, cooling down,
    re-probing, its engine on its way back): a request for one waits instead of failing."""
    models: dict[str, None] = {}
    for node in registry.nodes():
        for provider in node.providers:
            if registry.provider_may_serve(node.node_id, provider.provider_id):
                for model in provider.models:
                    models.setdefault(model, None)
    return list(models)


def check_model(registry: NodeRegistry, config: InferenceConfig, model: str, long_context: bool) -> None:
    """Raise the right :class:`InferenceError` if ``model`` cannot be admitted now."""
    configured = False
    has_class = False
    usable = False
    for node in registry.nodes():
        for provider in node.providers:
            if model not in provider.models:
                continue
            configured = True
            capacity = provider.long_context_capacity if long_context else provider.capacity
            if capacity <= 0:
                continue
            has_class = True
            # Saturated, cooling down, re-probing or a launched engine on its way back is
            # "not now": worth waiting for in the queue, bounded by its timeout.
            if registry.provider_may_serve(node.node_id, provider.provider_id):
                usable = True
    if not configured:
        raise InferenceError(404, "model_not_found", f"the model {model!r} does not exist on this gateway")
    if not has_class:
        raise InferenceError(
            400,
            "context_length_exceeded",
            f"the request is long-context (estimated prompt + max_tokens above "
            f"{config.long_context_threshold_tokens} tokens) and no provider of "
            f"{model!r} takes long-context requests",
        )
    if not usable:
        raise InferenceError(
            503,
            "model_unavailable",
            f"no provider of {model!r} can take requests: their nodes are not connected or drained, "
            "or their engines are stopped",
            kind="server_error",
            retry_after=config.retry_after_seconds,
        )


def queue_full(model: str, reason: QueueFull, retry_after_seconds: int) -> InferenceError:
    """The 429 of a request that found its model's queue full (``reason``: the queue's words)."""
    return InferenceError(
        429,
        "queue_full",
        f"too many requests wait for model {model!r}: {reason}",
        kind="rate_limit_error",
        retry_after=retry_after_seconds,
    )
