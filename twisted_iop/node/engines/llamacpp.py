"""llama.cpp's server (``llama-server``) and llama-cpp-python's (``python -m llama_cpp.server``): kind ``llamacpp``.

Both are one kind: what one lacks answers 404 and is skipped.

* health: llama.cpp's ``GET /health`` answers 200 ``{"status": "ok"}``,
  and 503 ``{"error": {"code": 503, "message": "Loading model", "type":
  "unavailable_error"}}`` while the model loads (``tools/server/README.md``,
  "GET /health"); older builds answered 503 ``{"status": "no slot
  available"}`` when every slot was busy, which is busy, not down.
  llama-cpp-python has no ``/health`` (404): its models list is the
  health check, and it answers that only between generations (a probe
  then times out while it serves: see the probes' busy rule);
* models: ``GET /v1/models`` (OpenAI shape, both servers);
* load: ``GET /slots`` (a JSON list, one object per slot with
  ``is_processing``; its length is the parallelism ``--parallel``; off
  with ``--no-slots``, then 501), ``GET /props`` (``total_slots``: the
  parallelism when ``/slots`` is off) and ``GET /metrics`` (only with
  ``--metrics``): ``llamacpp:requests_processing``,
  ``llamacpp:requests_deferred`` (``tools/server/README.md``, "GET
  /slots", "GET /props", "GET /metrics"). llama-server exports no KV-cache
  use (the ``llamacpp:kv_cache_usage_ratio`` of older builds is gone from
  the one vendored in llama-cpp-python 0.3.36): KV is unknown, and
  ``max_kv_cache`` never applies to it. A ``kv_cache_usage_ratio`` an
  older build still exports is read. llama-cpp-python exports none of these;
* errors: llama.cpp's ``{"error": {"code", "message", "type"}}`` with
  ``type`` ``exceed_context_size_error`` for a prompt over the context
  (``tools/server/utils.hpp``, ``format_error_response``);
  llama-cpp-python's OpenAI shape with ``code``
  ``context_length_exceeded`` (``llama_cpp/server/errors.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from twisted_iop.node.engines.base import EngineAdapter, HealthCheck, LoadReading, error_message
from twisted_iop.node.engines.readings import MAX_REQUESTS, json_body, metrics_load
from twisted_iop.wire import control_pb2 as pb

PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
KV_CACHE = "llamacpp:kv_cache_usage_ratio"


class LlamaCppAdapter(EngineAdapter):
    """llama.cpp's server, or llama-cpp-python's."""

    kind = "llamacpp"
    health_path = "/health"
    load_paths = ("/slots", "/props", "/metrics")

    def check_health(self, status: int, body: bytes) -> Optional[HealthCheck]:
        """Loading is unhealthy ("loading model"); "no slot available" is busy; 404 is llama-cpp-python."""
        if status == 503:
            parsed = json_body(body)
            if isinstance(parsed, dict) and parsed.get("status") == "no slot available":
                return HealthCheck(pb.PROVIDER_HEALTH_HEALTHY, "busy: no slot available")
            if "loading model" in error_message(body).lower():
                return HealthCheck(pb.PROVIDER_HEALTH_UNHEALTHY, "loading model")
        return super().check_health(status, body)

    def read_load(self, answers: Mapping[str, bytes]) -> Optional[LoadReading]:
        """Slots in use and their number from ``/slots`` (their number from ``/props`` when it is off); the rest from ``/metrics``."""
        processing, deferred, kv_cache = metrics_load(answers, (PROCESSING,), (DEFERRED,), (KV_CACHE,))
        busy_slots, slots = _slots(answers.get("/slots"))
        if slots is None:
            slots = _total_slots(answers.get("/props"))
        running = processing if processing is not None else busy_slots
        return LoadReading.of(running, deferred, kv_cache, slots)


def _slots(body: Optional[bytes]) -> tuple[Optional[int], Optional[int]]:
    """(slots processing, slots) from a ``/slots`` answer; ``(None, None)`` if it is not that shape."""
    if body is None:
        return None, None
    parsed: Any = json_body(body)
    if not isinstance(parsed, list) or not parsed or len(parsed) > MAX_REQUESTS:
        return None, None
    if not all(isinstance(slot, dict) for slot in parsed):
        return None, None
    # ``is_processing`` since 2024; before it, ``state`` (0 idle, 1 processing).
    busy = sum(1 for slot in parsed if slot.get("is_processing") is True or slot.get("state") == 1)
    return busy, len(parsed)


def _total_slots(body: Optional[bytes]) -> Optional[int]:
    """``total_slots`` of a ``/props`` answer; ``None`` if it has none that makes sense."""
    if body is None:
        return None
    parsed: Any = json_body(body)
    total = parsed.get("total_slots") if isinstance(parsed, dict) else None
    if isinstance(total, bool) or not isinstance(total, int) or not 0 < total <= MAX_REQUESTS:
        return None
    return total
