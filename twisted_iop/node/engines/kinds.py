"""The adapter of each provider kind."""

from __future__ import annotations

from twisted_iop.node.engines.base import EngineAdapter

#: One adapter per HTTP provider kind (``mock`` runs in process and has none).
ADAPTERS: dict[str, EngineAdapter] = {
    "openai": EngineAdapter(),
}


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter of ``kind`` (the generic OpenAI one for a kind without its own)."""
    return ADAPTERS.get(kind, ADAPTERS["openai"])
