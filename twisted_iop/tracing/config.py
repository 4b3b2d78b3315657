"""The ``tracing:`` section of edge.yaml.

``otlp_endpoint`` empty (the default) exports nothing; the Edge still
continues or starts each request's trace and passes it to the engine.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import attrs

from twisted_iop.configuration import ConfigError, Section

#: Where OTLP/HTTP receivers take traces (appended to an endpoint given without a path).
OTLP_TRACES_PATH = "/v1/traces"
DEFAULT_SERVICE_NAME = "iop-edge"


@attrs.frozen
class TracingConfig:
    """Section ``tracing``: where the Edge's spans go, and how many."""

    #: The OTLP/HTTP traces URL (``http://collector:4318/v1/traces``); "" exports nothing.
    otlp_endpoint: str = ""
    #: The ``service.name`` of the spans' resource.
    service_name: str = DEFAULT_SERVICE_NAME
    #: Share (0..1) of new traces recorded; a client's ``sampled`` flag decides for its own.
    sample_ratio: float = 1.0
    #: Finished traces waiting for export at most; more are dropped (and counted).
    max_queued_traces: int = 2048
    #: Traces in one export request at most.
    max_batch_traces: int = 256
    #: How often the queue is exported (sooner when a batch is full).
    export_interval_seconds: float = 2.0
    #: How long one export request may take.
    export_timeout_seconds: float = 10.0


def parse_tracing_config(section: Section) -> TracingConfig:
    """Read ``tracing``; every error names its field."""
    section.reject_unknown(
        {
            "otlp_endpoint",
            "service_name",
            "sample_ratio",
            "max_queued_traces",
            "max_batch_traces",
            "export_interval_seconds",
            "export_timeout_seconds",
        }
    )
    endpoint = _otlp_endpoint(section)
    service_name = section.string("service_name", DEFAULT_SERVICE_NAME).strip()
    if not service_name or len(service_name) > 128:
        raise ConfigError(f"{section.field_path('service_name')}: must be 1 to 128 characters")
    ratio = section.number("sample_ratio", 1.0, minimum=0.0, exclusive_minimum=False)
    if ratio > 1.0:
        raise ConfigError(f"{section.field_path('sample_ratio')}: must be between 0 and 1, not {ratio:g}")
    max_queued = section.integer("max_queued_traces", 2048, minimum=1, maximum=1_000_000)
    max_batch = section.integer("max_batch_traces", 256, minimum=1, maximum=100_000)
    if max_batch > max_queued:
        raise ConfigError(
            f"{section.field_path('max_batch_traces')}: must not exceed max_queued_traces ({max_queued}), not {max_batch}"
        )
    return TracingConfig(
        otlp_endpoint=endpoint,
        service_name=service_name,
        sample_ratio=ratio,
        max_queued_traces=max_queued,
        max_batch_traces=max_batch,
        export_interval_seconds=section.number("export_interval_seconds", 2.0),
        export_timeout_seconds=section.number("export_timeout_seconds", 10.0),
    )


def _otlp_endpoint(section: Section) -> str:
    """An ``http(s)://host[:port][/path]`` URL; without a path, ``/v1/traces`` is appended."""
    value = section.string("otlp_endpoint", "").strip()
    if not value:
        return ""
    field = section.field_path("otlp_endpoint")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as e:
        raise ConfigError(f"{field}: not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{field}: must be an http:// or https:// URL (OTLP over HTTP), not {value[:80]!r}")
    if not parts.hostname:
        raise ConfigError(f"{field}: the URL names no host")
    if parts.username or parts.password:
        raise ConfigError(f"{field}: must not carry credentials in the URL")
    if parts.query or parts.fragment:
        raise ConfigError(f"{field}: must not have a query or fragment")
    if port == 0:
        raise ConfigError(f"{field}: port 0 is not a port to send to")
    if parts.path in ("", "/"):
        return value.rstrip("/") + OTLP_TRACES_PATH
    return value
