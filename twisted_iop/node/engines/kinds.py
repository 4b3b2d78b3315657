"""The adapter of each provider kind."""

from __future__ import annotations

from twisted_iop.configuration import HTTP_PROVIDER_KINDS
from twisted_iop.node.engines.base import EngineAdapter
from twisted_iop.node.engines.llamacpp import LlamaCppAdapter
from twisted_iop.node.engines.ollama import OllamaAdapter
from twisted_iop.node.engines.sglang import SGLangAdapter
from twisted_iop.node.engines.tgi import TGIAdapter
from twisted_iop.node.engines.vllm import VLLMAdapter

#: One adapter per HTTP provider kind (``mock`` runs in process and has none).
ADAPTERS: dict[str, EngineAdapter] = {
    adapter.kind: adapter
    for adapter in (
        EngineAdapter(),
        VLLMAdapter(),
        SGLangAdapter(),
        LlamaCppAdapter(),
        TGIAdapter(),
        OllamaAdapter(),
    )
}
assert set(ADAPTERS) == set(HTTP_PROVIDER_KINDS), "every HTTP provider kind has its adapter"


def adapter_for(kind: str) -> EngineAdapter:
    """The adapter of ``kind`` (the generic OpenAI one for a kind without its own)."""
    return ADAPTERS.get(kind, ADAPTERS["openai"])
