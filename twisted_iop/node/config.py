"""node.yaml: parsed once into frozen attrs classes.

Every bad value fails with :class:`~twisted_iop.configuration.ConfigError`
naming its dotted field. A provider's ``base_url`` stays on the Node: only
its id, kind and models are ever sent to the Edge.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

import attrs

from twisted_iop.configuration import (
    HTTP_PROVIDER_KINDS,
    PROVIDER_KINDS,
    ConfigError,
    LoggingConfig,
    Section,
    ShutdownConfig,
    load_config,
    parse_backoff,
    parse_connect_setting,
    parse_dialer_secret,
    parse_keepalive,
    parse_logging,
    parse_max_frame_bytes,
    parse_metrics_listen,
    parse_provider_basics,
    parse_shutdown,
    parse_unique_list,
)
from twisted_iop.endpoints import is_loopback_listen
from twisted_iop.node.deployments.profiles import EngineProfileConfig, check_gpu_needs, parse_engines, parse_gpus
from twisted_iop.node.launch.config import LaunchConfig, parse_launch
from twisted_iop.wire.settings import DialConfig

#: Where a Node dials its Edge unless configured otherwise.
DEFAULT_EDGE_ADDRESS = "127.0.0.1:7444"
#: Environment variable overriding ``edge.address``.
ENV_EDGE_NODE_WIRE = "IOP_EDGE_NODE_WIRE"
#: Where the Node serves ``GET /metrics`` unless configured otherwise.
DEFAULT_METRICS_LISTEN = "tcp:9102:interface=127.0.0.1"
#: Environment variable overriding ``metrics.listen``.
ENV_METRICS_LISTEN = "IOP_NODE_METRICS_LISTEN"

#: How often the engines' load is read unless ``probes.load_interval_seconds`` says otherwise.
DEFAULT_LOAD_INTERVAL_SECONDS = 5.0

#: Environment variable systemd sets to the unit's ``StateDirectory=`` (the
#: default ``state_directory``).
ENV_STATE_DIRECTORY = "STATE_DIRECTORY"

#: Default ``edge.coalesce_ms``, and its largest value (a token may wait this long on the Node).
DEFAULT_COALESCE_MS = 2.0
MAX_COALESCE_MS = 50.0

#: Health values a mock provider (or its health file) may take.
MOCK_HEALTH_VALUES = ("healthy", "degraded", "unhealthy", "offline")


@attrs.frozen(kw_only=True)
class EdgeLinkConfig(DialConfig):
    """Section ``edge``: how this Node reaches its Edge (dialling settings, and how streamed frames leave)."""

    address: str = "tcp:host=127.0.0.1:port=7444"
    #: How long a streamed frame may wait for others to leave in the same send
    #: (``edge.coalesce_ms``; 0: at the end of the reactor turn it was written in).
    coalesce_seconds: float = DEFAULT_COALESCE_MS / 1000


@attrs.frozen
class ProbeConfig:
    """Section ``probes``: how often and how patiently providers are probed."""

    interval_seconds: float = 10.0
    timeout_seconds: float = 3.0
    #: How often the engines' own load is read and sent to the Edge (0: never).
    load_interval_seconds: float = DEFAULT_LOAD_INTERVAL_SECONDS


@attrs.frozen
class MockOptions:
    """Behaviour of a built-in mock provider."""

    health: str = "healthy"
    reason: str = ""
    #: If set and the file exists, its first word is the health (demos, tests).
    health_file: Optional[str] = None
    # Inference behaviour (twisted_iop.node.inference runs the mock in process).
    tokens_per_second: float = 0.0
    latency_seconds: float = 0.0
    failure_rate: float = 0.0
    completion_tokens: int = 16


@attrs.frozen
class NodeProviderConfig:
    """One provider hosted by this Node."""

    provider_id: str
    kind: str
    models: tuple[str, ...]
    base_url: str = attrs.field(default="", repr=False)
    mock: MockOptions = MockOptions()
    #: How the Node runs this provider's engine; ``None``: someone else runs it.
    launch: Optional[LaunchConfig] = None


@attrs.frozen
class NodeRuntimeConfig:
    """The whole of node.yaml, plus the file it came from (for re-reads)."""

    node_id: str
    edge: EdgeLinkConfig
    probes: ProbeConfig
    providers: tuple[NodeProviderConfig, ...]
    credential: str = attrs.field(default="", repr=False)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    source_path: Optional[str] = None
    #: How a stop drains (SIGTERM).
    shutdown: ShutdownConfig = ShutdownConfig()
    #: Section ``metrics``: where ``GET /metrics`` is served ("" = nowhere).
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    #: How log lines are written (``logging.format``: text or json).
    logging: LoggingConfig = LoggingConfig()
    #: Where the pidfiles of launched engines are kept (``state_directory``).
    state_directory: str = ""
    #: The engine profiles a deployment may start here (``engines``).
    engines: tuple[EngineProfileConfig, ...] = ()
    #: GPU slots of this Node (``gpus``); an instance's ``{gpu}`` is the slot index(es) it holds.
    gpus: int = 0


def load_node_config(path: Optional[str], environ: Optional[Mapping[str, str]] = None) -> NodeRuntimeConfig:
    """Read and validate node.yaml at ``path`` (environment overrides applied)."""
    return load_config(path, environ, parse_node_config)


def parse_node_config(data: Mapping[str, Any], environ: Mapping[str, str] = {}) -> NodeRuntimeConfig:
    """Validate a parsed node.yaml mapping."""
    top = Section(data, "")
    top.reject_unknown(
        {
            "node_id",
            "credential",
            "credential_file",
            "labels",
            "edge",
            "probes",
            "providers",
            "shutdown",
            "metrics",
            "logging",
            "state_directory",
            "engines",
            "gpus",
        }
    )
    node_id = top.identifier("node_id")
    engines = parse_engines(top.raw("engines"), environ)
    gpus = parse_gpus(top)
    check_gpu_needs(engines, gpus)
    return NodeRuntimeConfig(
        node_id=node_id,
        credential=parse_dialer_secret(top, "credential", "credential_file"),
        labels=top.string_map("labels"),
        edge=_edge(top.section("edge"), environ),
        probes=_probes(top.section("probes")),
        providers=parse_node_providers(top.raw("providers"), environ),
        shutdown=parse_shutdown(top.section("shutdown")),
        metrics_listen=parse_metrics_listen(
            top.section("metrics"), DEFAULT_METRICS_LISTEN, environ, ENV_METRICS_LISTEN
        ),
        logging=parse_logging(top.section("logging")),
        state_directory=_state_directory(top, node_id, environ),
        engines=engines,
        gpus=gpus,
    )


def default_state_directory(node_id: str, environ: Mapping[str, str]) -> str:
    """Where a Node keeps its state unless ``state_directory`` says: systemd's
    ``$STATE_DIRECTORY`` (its first entry), else ``$XDG_STATE_HOME/twisted-iop/<node_id>``
    (``~/.local/state`` when unset)."""
    systemd = environ.get(ENV_STATE_DIRECTORY, "").split(":")[0]
    if systemd:
        return systemd
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return str(Path(base) / "twisted-iop" / node_id)


def _state_directory(top: Section, node_id: str, environ: Mapping[str, str]) -> str:
    value = top.string("state_directory")
    if not value:
        return default_state_directory(node_id, environ)
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"{top.field_path('state_directory')}: must be an absolute path, not {value!r}")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{top.field_path('state_directory')}: {value!r} is not a directory")
    return str(path)


def _edge(section: Section, environ: Mapping[str, str]) -> EdgeLinkConfig:
    section.reject_unknown(
        {"address", "backoff", "coalesce_ms", "keepalive", "max_frame_bytes", "request_timeout_seconds"}
    )
    coalesce_ms = section.number("coalesce_ms", DEFAULT_COALESCE_MS, exclusive_minimum=False)
    if coalesce_ms > MAX_COALESCE_MS:
        raise ConfigError(f"{section.field_path('coalesce_ms')}: at most {MAX_COALESCE_MS:g} (milliseconds)")
    return EdgeLinkConfig(
        address=parse_connect_setting(section, "address", DEFAULT_EDGE_ADDRESS, environ, ENV_EDGE_NODE_WIRE),
        backoff=parse_backoff(section.section("backoff")),
        keepalive=parse_keepalive(section.section("keepalive")),
        max_frame_bytes=parse_max_frame_bytes(section),
        request_timeout_seconds=section.number("request_timeout_seconds", 10.0),
        coalesce_seconds=coalesce_ms / 1000,
    )


def _probes(section: Section) -> ProbeConfig:
    section.reject_unknown({"interval_seconds", "timeout_seconds", "load_interval_seconds"})
    return ProbeConfig(
        interval_seconds=section.number("interval_seconds", 10.0),
        timeout_seconds=section.number("timeout_seconds", 3.0),
        load_interval_seconds=section.number(
            "load_interval_seconds", DEFAULT_LOAD_INTERVAL_SECONDS, minimum=0.0, exclusive_minimum=False
        ),
    )


def parse_node_providers(raw: Any, environ: Optional[Mapping[str, str]] = None) -> tuple[NodeProviderConfig, ...]:
    """Read the ``providers`` list (also used when the Edge asks for a re-probe).

    ``environ`` (the process's environment when ``None``) gives the ``PATH``
    a launched engine's executable is looked up on.
    """
    env = os.environ if environ is None else environ
    providers = parse_unique_list(raw, "providers", "providers", "provider_id", lambda s: _provider(s, env))
    launched: dict[str, int] = {}
    for index, provider in enumerate(providers):
        if provider.launch is None:
            continue
        address = urlsplit(provider.base_url).netloc
        if address in launched:
            raise ConfigError(
                f"providers[{index}].base_url: the same address as providers[{launched[address]}], "
                "whose engine this Node launches too"
            )
        launched[address] = index
    return providers


def _provider(section: Section, environ: Mapping[str, str]) -> NodeProviderConfig:
    section.reject_unknown({"provider_id", "kind", "models", "base_url", "mock", "launch"})
    provider_id, kind, models = parse_provider_basics(section, PROVIDER_KINDS)
    base_url = section.string("base_url")
    if section.has("launch") and kind not in HTTP_PROVIDER_KINDS:
        raise ConfigError(
            f"{section.field_path('launch')}: only for engines reached over HTTP "
            f"(kinds {', '.join(HTTP_PROVIDER_KINDS)}), not kind {kind}"
        )
    if kind in HTTP_PROVIDER_KINDS:
        if not base_url:
            if section.has("launch"):
                raise ConfigError(
                    f"{section.field_path('base_url')}: required for kind {kind}: where the launched engine "
                    "listens (its readiness is checked and its requests sent there)"
                )
            raise ConfigError(f"{section.field_path('base_url')}: required for kind {kind}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{section.field_path('base_url')}: must be an http:// or https:// URL")
    elif base_url:
        raise ConfigError(f"{section.field_path('base_url')}: only for kinds {', '.join(HTTP_PROVIDER_KINDS)}")
    mock = MockOptions()
    if section.has("mock"):
        if kind != "mock":
            raise ConfigError(f"{section.field_path('mock')}: only for kind mock")
        mock = _mock(section.section("mock"))
    launch = parse_launch(section.section("launch"), environ) if section.has("launch") else None
    return NodeProviderConfig(
        provider_id=provider_id, kind=kind, models=models, base_url=base_url.rstrip("/"), mock=mock, launch=launch
    )


def _mock(section: Section) -> MockOptions:
    section.reject_unknown({"healthy", "health", "reason", "health_file", *MOCK_INFERENCE_KEYS})
    health = section.string("health", "healthy")
    if section.has("healthy"):
        if section.has("health"):
            raise ConfigError(f"{section.field_path('healthy')}: give either healthy or health, not both")
        health = "healthy" if section.boolean("healthy", True) else "unhealthy"
    if health not in MOCK_HEALTH_VALUES:
        raise ConfigError(
            f"{section.field_path('health')}: must be one of {', '.join(MOCK_HEALTH_VALUES)}, not {health!r}"
        )
    health_file = section.string("health_file") or None
    return MockOptions(
        health=health, reason=section.string("reason"), health_file=health_file, **_mock_inference(section)
    )


#: The mock options that shape its inference answers.
MOCK_INFERENCE_KEYS = ("tokens_per_second", "latency_seconds", "failure_rate", "completion_tokens")


def _mock_inference(section: Section) -> dict[str, Any]:
    failure_rate = section.number("failure_rate", 0.0, minimum=0.0, exclusive_minimum=False)
    if failure_rate > 1.0:
        raise ConfigError(f"{section.field_path('failure_rate')}: must be between 0 and 1")
    return {
        "tokens_per_second": section.number("tokens_per_second", 0.0, minimum=0.0, exclusive_minimum=False),
        "latency_seconds": section.number("latency_seconds", 0.0, minimum=0.0, exclusive_minimum=False),
        "failure_rate": failure_rate,
        "completion_tokens": section.integer("completion_tokens", 16, minimum=1, maximum=100_000),
    }


def unauthenticated_exposures(config: NodeRuntimeConfig) -> list[str]:
    """The Node's listeners reachable from other machines with no authentication, in words."""
    if config.metrics_listen and not is_loopback_listen(config.metrics_listen):
        return [
            f"metrics.listen ({config.metrics_listen}) is reachable from other machines (metrics are not authenticated)"
        ]
    return []
