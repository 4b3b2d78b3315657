"""Section ``inference`` of edge.yaml: the OpenAI-compatible gateway."""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from twisted_iop.configuration import ConfigError, Section, parse_listen_setting
from twisted_iop.edge.providers.cooldown import CooldownRule
from twisted_iop.edge.providers.load import SaturationRule

#: Where the inference API listens unless configured otherwise.
DEFAULT_INFERENCE_LISTEN = "tcp:8090:interface=127.0.0.1"
#: Environment variable overriding ``inference.listen``.
ENV_INFERENCE_LISTEN = "IOP_EDGE_INFERENCE_LISTEN"
#: Retries on another provider of a request that failed before its first byte.
DEFAULT_MAX_RETRIES = 2


@attrs.frozen
class InferenceConfig:
    """How the Edge serves and admits inference requests."""

    listen: str = DEFAULT_INFERENCE_LISTEN
    #: Bearer keys a client must present; empty means no key is asked for.
    api_keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    #: Requests that may wait per model and class; one more gets 429.
    max_queued_per_model: int = 100
    #: A queued request that gets no lease within this gets 504.
    queue_timeout_seconds: float = 30.0
    #: Estimated prompt tokens (characters/4 + max_tokens) above this are long-context.
    long_context_threshold_tokens: int = 8192
    #: Largest request body accepted (413 above).
    max_request_bytes: int = 1024 * 1024
    #: Seconds a client is told to wait in ``Retry-After`` of a 429.
    retry_after_seconds: int = 1
    #: A running request with no word from its Node for this long fails (504).
    idle_timeout_seconds: float = 300.0
    #: Bytes a slow streaming client may leave unread before it is cut off.
    max_client_buffer_bytes: int = 4 * 1024 * 1024
    #: Host names (besides IP addresses and localhost) clients may call the listener by.
    allowed_hosts: tuple[str, ...] = ()
    #: Connections to the listener in all, and from one address; more are closed at once.
    max_connections: int = 1024
    max_connections_per_address: int = 256
    #: ``inference.saturation``: when an engine's own load takes it out of rotation.
    saturation: SaturationRule = SaturationRule()
    #: ``inference.failover``: retries elsewhere, and cool-downs of failing providers.
    max_retries: int = DEFAULT_MAX_RETRIES
    cooldown: CooldownRule = CooldownRule()


def parse_inference_config(section: Section, environ: Mapping[str, str]) -> InferenceConfig:
    """Read section ``inference``; every bad value names its field."""
    section.reject_unknown(
        {
            "listen",
            "api_keys",
            "max_queued_per_model",
            "queue_timeout_seconds",
            "long_context_threshold_tokens",
            "max_request_bytes",
            "retry_after_seconds",
            "idle_timeout_seconds",
            "max_client_buffer_bytes",
            "allowed_hosts",
            "max_connections",
            "max_connections_per_address",
            "saturation",
            "failover",
        }
    )
    keys = tuple(section.string_list("api_keys"))
    for index, key in enumerate(keys):
        if not key:
            raise ConfigError(f"{section.field_path('api_keys')}[{index}]: must not be empty")
    return InferenceConfig(
        listen=parse_listen_setting(section, "listen", DEFAULT_INFERENCE_LISTEN, environ, ENV_INFERENCE_LISTEN),
        api_keys=keys,
        max_queued_per_model=section.integer("max_queued_per_model", 100, minimum=0, maximum=1_000_000),
        queue_timeout_seconds=section.number("queue_timeout_seconds", 30.0),
        long_context_threshold_tokens=section.integer(
            "long_context_threshold_tokens", 8192, minimum=1, maximum=100_000_000
        ),
        max_request_bytes=section.integer("max_request_bytes", 1024 * 1024, minimum=1024, maximum=64 * 1024 * 1024),
        retry_after_seconds=section.integer("retry_after_seconds", 1, minimum=1, maximum=3600),
        idle_timeout_seconds=section.number("idle_timeout_seconds", 300.0),
        max_client_buffer_bytes=section.integer(
            "max_client_buffer_bytes", 4 * 1024 * 1024, minimum=64 * 1024, maximum=1024 * 1024 * 1024
        ),
        allowed_hosts=tuple(section.string_list("allowed_hosts")),
        max_connections=section.integer("max_connections", 1024, minimum=1),
        max_connections_per_address=section.integer("max_connections_per_address", 256, minimum=1),
        saturation=_saturation(section.section("saturation")),
        max_retries=section.section("failover").integer("max_retries", DEFAULT_MAX_RETRIES, minimum=0, maximum=16),
        cooldown=_cooldown(section.section("failover")),
    )


def _saturation(section: Section) -> SaturationRule:
    section.reject_unknown({"max_waiting", "max_kv_cache", "stale_after_seconds"})
    max_kv_cache = _finite(section, "max_kv_cache", 0.8)
    if max_kv_cache > 1.0:
        raise ConfigError(f"{section.field_path('max_kv_cache')}: a fraction of the KV cache, at most 1")
    return SaturationRule(
        max_waiting=section.integer("max_waiting", 5, minimum=0, maximum=1_000_000),
        max_kv_cache=max_kv_cache,
        stale_after_seconds=_finite(section, "stale_after_seconds", 30.0),
    )


def _cooldown(section: Section) -> CooldownRule:
    section.reject_unknown({"max_retries", "cooldown_seconds", "failure_window_seconds", "min_requests"})
    return CooldownRule(
        cooldown_seconds=_finite(section, "cooldown_seconds", 5.0, exclusive_minimum=False),
        failure_window_seconds=_finite(section, "failure_window_seconds", 60.0),
        min_requests=section.integer("min_requests", 5, minimum=1, maximum=1_000_000),
    )


def _finite(section: Section, key: str, default: float, exclusive_minimum: bool = True) -> float:
    value = section.number(key, default, exclusive_minimum=exclusive_minimum)
    if not math.isfinite(value):
        raise ConfigError(f"{section.field_path(key)}: must be a finite number, not {value}")
    return value
