"""Facts of the OpenAI-compatible API shared by the gateway, the Node and the mock.

The endpoint names and paths, the error body shape and the prompt-size
estimator live here once, so the Edge's admission, the Node's runner and
the mock provider cannot drift apart.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

#: The three OpenAI endpoints, by the name the wire and the runs use.
CHAT_COMPLETIONS = "chat.completions"
COMPLETIONS = "completions"
EMBEDDINGS = "embeddings"
ENDPOINT_PATHS = {
    CHAT_COMPLETIONS: "/v1/chat/completions",
    COMPLETIONS: "/v1/completions",
    EMBEDDINGS: "/v1/embeddings",
}


def whole_tokens(value: Any) -> Optional[int]:
    """A ``max_tokens`` value as a count: a whole number of at least 1 (JSON's
    ``3.0`` is 3, as JSON Schema says), else None (``true``, ``2.5``, ``"3"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value) if value >= 1 else None


def estimate_prompt_tokens(body: Any) -> int:
    """Characters of the prompt divided by 4 (the gateway's documented estimator)."""
    if not isinstance(body, dict):
        return 0
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                chars += _text_length(message.get("content"))
    chars += _text_length(body.get("prompt"))
    chars += _text_length(body.get("input"))
    return chars // 4


def _text_length(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, str):
                total += len(item)
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                total += len(item["text"])
            elif isinstance(item, int):
                total += 4  # one token id
        return total
    return 0


def error_body(message: str, kind: str, code: str) -> bytes:
    """An OpenAI-shaped error body."""
    return json.dumps({"error": {"message": message, "type": kind, "code": code}}).encode()
