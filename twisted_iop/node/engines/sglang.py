"""SGLang (``python -m sglang.launch_server``, kind ``sglang``).

* health: ``GET /health``, 200 when the scheduler answers, 503 otherwise
  (``python/sglang/srt/entrypoints/http_server.py``, ``health``);
* models: ``GET /v1/models`` (OpenAI shape);
* load: ``GET /metrics`` (only with ``--enable-metrics``), Prometheus
  text: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` and
  ``sglang:token_usage`` (the fraction of the KV-cache token pool in
  use) (https://docs.sglang.ai/references/production_metrics.html);
* errors: the flat ``ErrorResponse`` of
  ``python/sglang/srt/entrypoints/openai/protocol.py``:
  ``{"object": "error", "message", "type", "param", "code"}``; in a
  stream it is nested: ``data: {"error": {...}}``. Both are read by the
  generic code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from twisted_iop.node.engines.base import EngineAdapter, LoadReading
from twisted_iop.node.engines.readings import metrics_load

RUNNING = "sglang:num_running_reqs"
WAITING = "sglang:num_queue_reqs"
TOKEN_USAGE = "sglang:token_usage"


class SGLangAdapter(EngineAdapter):
    """SGLang's OpenAI server."""

    kind = "sglang"
    health_path = "/health"
    load_paths = ("/metrics",)

    def read_load(self, answers: Mapping[str, bytes]) -> Optional[LoadReading]:
        """Running, queued and token-pool use from ``/metrics``."""
        return LoadReading.of(*metrics_load(answers, (RUNNING,), (WAITING,), (TOKEN_USAGE,)))
