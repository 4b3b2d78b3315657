"""Ollama (``ollama serve``): kind ``ollama``.

* health: ``GET /`` answers 200 ``Ollama is running`` (``server/routes.go``,
  the ``/`` handler);
* models: ``GET /v1/models`` (OpenAI shape; every pulled model, loaded
  or not) (``openai/openai.go``, ``ListCompletion``);
* load: none. ``GET /api/ps`` lists the models loaded in memory (name,
  size, VRAM, expiry) but no request counts, and Ollama exports no
  metrics, so its load is reported unknown and the Edge's own count of
  leases is all there is (https://github.com/ollama/ollama/blob/main/docs/api.md,
  "List Running Models");
* errors: the OpenAI shape ``{"error": {"message", "type", "param",
  "code"}}`` (``openai/openai.go``, ``ErrorResponse``); a model that is
  not pulled is 404 ``model "x" not found, try pulling it first``; in a
  stream, ``data: {"error": {...}}``. All read by the generic code.
"""

from __future__ import annotations

from typing import Optional

from twisted_iop.node.engines.base import EngineAdapter, HealthCheck
from twisted_iop.wire import control_pb2 as pb

#: What ``GET /`` of a running Ollama says.
RUNNING_BANNER = b"Ollama is running"


class OllamaAdapter(EngineAdapter):
    """Ollama's OpenAI-compatible API."""

    kind = "ollama"
    health_path = "/"

    def check_health(self, status: int, body: bytes) -> Optional[HealthCheck]:
        """200 with Ollama's banner is healthy; 200 with anything else is not Ollama."""
        if status == 200 and RUNNING_BANNER not in body[:256]:
            return HealthCheck(pb.PROVIDER_HEALTH_UNHEALTHY, "GET / answered 200 but not as Ollama does")
        return super().check_health(status, body)
