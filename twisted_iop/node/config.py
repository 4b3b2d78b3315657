"""node.yaml: parsed once into frozen attrs classes.

Every bad value fails with :class:`~twisted_iop.configuration.ConfigError`
naming its dotted field. A provider's ``base_url`` stays on the Node: only
its id, kind and models are ever sent to the Edge.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

import attrs

from twisted_iop.configuration import ConfigError, Section, load_yaml_mapping
from twisted_iop.edge.config import BackoffConfig, KeepaliveConfig, parse_backoff, parse_keepalive
from twisted_iop.endpoints import EndpointError, connect_endpoint
from twisted_iop.ids import id_problem
from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES
from twisted_iop.wire.peer import PeerSettings

#: Where a Node dials its Edge unless configured otherwise.
DEFAULT_EDGE_ADDRESS = "127.0.0.1:7444"
#: Environment variable overriding ``edge.address``.
ENV_EDGE_NODE_WIRE = "IOP_EDGE_NODE_WIRE"

#: Provider kinds probed over the OpenAI-compatible ``GET /v1/models``.
HTTP_KINDS = ("openai", "vllm", "ollama")
#: Every provider kind.
PROVIDER_KINDS = HTTP_KINDS + ("mock",)
#: Health values a mock provider (or its health file) may take.
MOCK_HEALTH_VALUES = ("healthy", "degraded", "unhealthy", "offline")


@attrs.frozen
class EdgeLinkConfig:
    """Section ``edge``: how this Node reaches its Edge."""

    address: str = "tcp:host=127.0.0.1:port=7444"
    backoff: BackoffConfig = BackoffConfig()
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    request_timeout_seconds: float = 10.0

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of the connection to the Edge."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            keepalive_interval_seconds=self.keepalive.interval_seconds,
            keepalive_deadline_seconds=self.keepalive.deadline_seconds,
            request_timeout_seconds=self.request_timeout_seconds,
        )


@attrs.frozen
class ProbeConfig:
    """Section ``probes``: how often and how patiently providers are probed."""

    interval_seconds: float = 10.0
    timeout_seconds: float = 3.0


@attrs.frozen
class MockOptions:
    """Behaviour of a built-in mock provider."""

    health: str = "healthy"
    reason: str = ""
    #: If set and the file exists, its first word is the health (demos, tests).
    health_file: Optional[str] = None


@attrs.frozen
class NodeProviderConfig:
    """One provider hosted by this Node."""

    provider_id: str
    kind: str
    models: tuple[str, ...]
    base_url: str = attrs.field(default="", repr=False)
    mock: MockOptions = MockOptions()


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


def load_node_config(path: Optional[str], environ: Optional[Mapping[str, str]] = None) -> NodeRuntimeConfig:
    """Read and validate node.yaml at ``path`` (environment overrides applied)."""
    data = load_yaml_mapping(path)
    config = parse_node_config(data, environ if environ is not None else os.environ)
    return attrs.evolve(config, source_path=path)


def parse_node_config(data: Mapping[str, Any], environ: Mapping[str, str] = {}) -> NodeRuntimeConfig:
    """Validate a parsed node.yaml mapping."""
    top = Section(data, "")
    top.reject_unknown({"node_id", "credential", "labels", "edge", "probes", "providers"})
    node_id = top.string("node_id", required=True)
    problem = id_problem("node_id", node_id)
    if problem:
        raise ConfigError(f"node_id: {problem}")
    return NodeRuntimeConfig(
        node_id=node_id,
        credential=top.string("credential"),
        labels=top.string_map("labels"),
        edge=_edge(top.section("edge"), environ),
        probes=_probes(top.section("probes")),
        providers=parse_node_providers(top.raw("providers")),
    )


def _edge(section: Section, environ: Mapping[str, str]) -> EdgeLinkConfig:
    section.reject_unknown({"address", "backoff", "keepalive", "max_frame_bytes", "request_timeout_seconds"})
    override = environ.get(ENV_EDGE_NODE_WIRE, "").strip()
    if override:
        try:
            address = connect_endpoint(override)
        except EndpointError as e:
            raise ConfigError(f"{ENV_EDGE_NODE_WIRE}: {e}") from None
    else:
        address = section.connect("address", DEFAULT_EDGE_ADDRESS)
    return EdgeLinkConfig(
        address=address,
        backoff=parse_backoff(section.section("backoff")),
        keepalive=parse_keepalive(section.section("keepalive")),
        max_frame_bytes=section.integer(
            "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1024, maximum=256 * 1024 * 1024
        ),
        request_timeout_seconds=section.number("request_timeout_seconds", 10.0),
    )


def _probes(section: Section) -> ProbeConfig:
    section.reject_unknown({"interval_seconds", "timeout_seconds"})
    return ProbeConfig(
        interval_seconds=section.number("interval_seconds", 10.0),
        timeout_seconds=section.number("timeout_seconds", 3.0),
    )


def parse_node_providers(raw: Any) -> tuple[NodeProviderConfig, ...]:
    """Read the ``providers`` list (also used when the Edge asks for a re-probe)."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError("providers: must be a list of providers")
    providers: list[NodeProviderConfig] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        provider = _provider(Section(item, f"providers[{index}]"))
        if provider.provider_id in seen:
            raise ConfigError(f"providers[{index}].provider_id: {provider.provider_id!r} is listed twice")
        seen.add(provider.provider_id)
        providers.append(provider)
    return tuple(providers)


def _provider(section: Section) -> NodeProviderConfig:
    section.reject_unknown({"provider_id", "kind", "models", "base_url", "mock"})
    provider_id = section.string("provider_id", required=True)
    problem = id_problem("provider_id", provider_id)
    if problem:
        raise ConfigError(f"{section.field_path('provider_id')}: {problem}")
    kind = section.string("kind", required=True)
    if kind not in PROVIDER_KINDS:
        raise ConfigError(f"{section.field_path('kind')}: must be one of {', '.join(PROVIDER_KINDS)}, not {kind!r}")
    models = section.string_list("models")
    if not models:
        raise ConfigError(f"{section.field_path('models')}: list at least one model")
    base_url = section.string("base_url")
    if kind in HTTP_KINDS:
        if not base_url:
            raise ConfigError(f"{section.field_path('base_url')}: required for kind {kind}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{section.field_path('base_url')}: must be an http:// or https:// URL")
    elif base_url:
        raise ConfigError(f"{section.field_path('base_url')}: only for kinds {', '.join(HTTP_KINDS)}")
    mock = MockOptions()
    if section.has("mock"):
        if kind != "mock":
            raise ConfigError(f"{section.field_path('mock')}: only for kind mock")
        mock = _mock(section.section("mock"))
    return NodeProviderConfig(
        provider_id=provider_id, kind=kind, models=tuple(models), base_url=base_url.rstrip("/"), mock=mock
    )


def _mock(section: Section) -> MockOptions:
    section.reject_unknown({"healthy", "health", "reason", "health_file"})
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
    return MockOptions(health=health, reason=section.string("reason"), health_file=health_file)
