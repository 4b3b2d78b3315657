"""vLLM (``vllm serve``, kind ``vllm``).

* health: ``GET /health``, 200 with an empty body; 503 once the engine
  loop has died (``vllm/entrypoints/openai/api_server.py``, ``health``);
* models: ``GET /v1/models`` (OpenAI shape);
* load: ``GET /metrics``, Prometheus text, one label set per served model
  (``model_name``): ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc`` (a
  fraction despite its name; ``vllm:gpu_cache_usage_perc`` before vLLM
  0.10) (https://docs.vllm.ai/en/latest/usage/metrics.html);
* errors: ``ErrorResponse`` in ``vllm/entrypoints/openai/protocol.py``:
  ``{"error": {"message", "type", "param", "code"}}`` (``code`` the HTTP
  status), the flat ``{"object": "error", "message", ...}`` in versions
  before 0.10; both are read by the generic code;
* stream: an error inside a 200 stream is ``data: {"error": {...}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from twisted_iop.node.engines.base import EngineAdapter, LoadReading
from twisted_iop.node.engines.readings import metrics_load

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE = "vllm:kv_cache_usage_perc"
KV_CACHE_BEFORE_0_10 = "vllm:gpu_cache_usage_perc"


class VLLMAdapter(EngineAdapter):
    """vLLM's OpenAI server."""

    kind = "vllm"
    health_path = "/health"
    load_paths = ("/metrics",)

    def read_load(self, answers: Mapping[str, bytes]) -> Optional[LoadReading]:
        """Running, waiting and KV-cache use from ``/metrics``."""
        return LoadReading.of(*metrics_load(answers, (RUNNING,), (WAITING,), (KV_CACHE, KV_CACHE_BEFORE_0_10)))
