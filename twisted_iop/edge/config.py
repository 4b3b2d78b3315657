"""edge.yaml: parsed once into frozen attrs classes.

Every bad value fails with :class:`~twisted_iop.configuration.ConfigError`
naming its dotted field (``nodes[1].providers[0].capacity: ...``). Nothing
else in the Edge reads YAML or passes raw mappings around.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Optional

import attrs

from twisted_iop.configuration import (
    PROVIDER_KINDS,
    ConfigError,
    EnvironmentConfigError,
    LoggingConfig,
    Section,
    ShutdownConfig,
    load_config,
    parse_backoff,
    parse_checked_credentials,
    parse_dialer_secret,
    parse_failed_hellos,
    parse_keepalive,
    parse_listen_setting,
    parse_logging,
    parse_max_frame_bytes,
    parse_max_hello_frame_bytes,
    parse_max_violations,
    parse_metrics_listen,
    parse_provider_basics,
    parse_shutdown,
    parse_tls_listen,
    parse_unique_list,
)
from twisted_iop.credentials import Digests
from twisted_iop.edge.inference.config import InferenceConfig, parse_inference_config
from twisted_iop.endpoints import check_connect_endpoint, is_loopback_listen
from twisted_iop.tls import TLSListenConfig
from twisted_iop.tracing.config import TracingConfig, parse_tracing_config
from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES
from twisted_iop.wire.limits import FailedHelloLimits
from twisted_iop.wire.settings import DialConfig, KeepaliveConfig, PeerSettings

#: Where the Edge dials the Control Plane unless configured otherwise.
DEFAULT_CONTROL_PLANE_ADDRESS = "127.0.0.1:7443"
#: Where Nodes dial this Edge unless configured otherwise.
DEFAULT_NODE_LISTEN = "tcp:7444:interface=127.0.0.1"

#: Environment variable overriding ``control_plane.address``/``addresses``
#: (one address, or several separated by commas).
ENV_CONTROL_PLANE_EDGE_WIRE = "IOP_CONTROL_PLANE_EDGE_WIRE"
#: At most this many Control Plane addresses (replicas) in ``control_plane.addresses``.
MAX_CONTROL_PLANE_ADDRESSES = 64
#: Environment variable overriding ``node_server.listen``.
ENV_NODE_LISTEN = "IOP_EDGE_NODE_LISTEN"
#: Where the Edge serves ``GET /metrics`` unless configured otherwise.
DEFAULT_METRICS_LISTEN = "tcp:9101:interface=127.0.0.1"
#: Environment variable overriding ``metrics.listen``.
ENV_METRICS_LISTEN = "IOP_EDGE_METRICS_LISTEN"
#: ``capacity: auto``: as many general leases as the engine says it runs at once.
AUTO_CAPACITY = "auto"


@attrs.frozen(kw_only=True)
class ControlPlaneLinkConfig(DialConfig):
    """Section ``control_plane``: how this Edge enrolls with the Control Plane.

    The dialling settings (address, backoff, keepalive, frame size, request
    deadline) are those of :class:`~twisted_iop.wire.settings.DialConfig`.
    ``addresses`` lists every Control Plane replica the Edge may dial, in
    the configured order (the dialer shuffles them); ``address`` is the
    first of them, and alone it is a list of one.
    """

    edge_id: str
    addresses: tuple[str, ...] = attrs.field(default=attrs.Factory(lambda self: (self.address,), takes_self=True))
    credential: str = attrs.field(default="", repr=False)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    outbox_size: int = 1000
    #: Estimated bytes of the events the outbox may hold.
    outbox_bytes: int = 4 * 1024 * 1024

    @addresses.validator
    def _starts_with_address(self, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
        if not value or value[0] != self.address:
            raise ValueError("addresses must start with address")


@attrs.frozen
class NodeServerConfig:
    """Section ``node_server``: the listener Nodes dial."""

    listen: str = DEFAULT_NODE_LISTEN
    hello_timeout_seconds: float = 10.0
    tls_handshake_timeout_seconds: float = 30.0
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    probe_timeout_seconds: float = 10.0
    #: Mutual TLS (``node_server.tls``): Nodes must show a certificate for their id.
    tls: Optional[TLSListenConfig] = None
    failed_hellos: FailedHelloLimits = FailedHelloLimits()
    max_hello_frame_bytes: int = 64 * 1024
    max_violations: int = 10

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of each Node connection."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            max_hello_frame_bytes=self.max_hello_frame_bytes,
            max_violations=self.max_violations,
            hello_timeout_seconds=self.hello_timeout_seconds,
            tls_handshake_timeout_seconds=self.tls_handshake_timeout_seconds,
            keepalive_interval_seconds=self.keepalive.interval_seconds,
            keepalive_deadline_seconds=self.keepalive.deadline_seconds,
            request_timeout_seconds=self.probe_timeout_seconds,
        )


@attrs.frozen
class ProviderConfig:
    """One provider of a configured Node, with the Edge's capacity for it."""

    provider_id: str
    kind: str
    models: tuple[str, ...]
    #: General leases at once; with ``capacity_auto``, the bound until the engine reports its own.
    capacity: int = 1
    long_context_capacity: int = 0
    #: ``capacity: auto``: the engine's reported parallelism is the bound (1 until it reports one).
    capacity_auto: bool = False


@attrs.frozen
class NodeConfig:
    """One Node this Edge accepts (a Node not listed here is rejected).

    ``credentials`` holds the digests of the secrets the Node may present
    (empty: it needs none); the secrets themselves are never kept.
    """

    node_id: str
    credentials: Digests = attrs.field(default=(), repr=False)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    providers: tuple[ProviderConfig, ...] = ()


@attrs.frozen
class DeploymentsConfig:
    """Section ``deployments``: what the Edge does with the Control Plane's desired instances."""

    #: Maintenance hold at start: the desired set is kept and acknowledged, not applied to the nodes.
    hold: bool = False
    #: How long a node has to answer its desired set.
    node_timeout_seconds: float = 30.0


@attrs.frozen
class EdgeConfig:
    """The whole of edge.yaml, plus the file it came from (for refresh)."""

    control_plane: ControlPlaneLinkConfig
    node_server: NodeServerConfig
    nodes: tuple[NodeConfig, ...]
    source_path: Optional[str] = None
    inference: InferenceConfig = InferenceConfig()
    #: How a stop drains (SIGTERM).
    shutdown: ShutdownConfig = ShutdownConfig()
    #: Section ``metrics``: where ``GET /metrics`` is served ("" = nowhere).
    metrics_listen: str = DEFAULT_METRICS_LISTEN
    #: How log lines are written (``logging.format``: text or json).
    logging: LoggingConfig = LoggingConfig()
    #: Section ``tracing``: where the inference path's spans are exported (see docs/tracing.md).
    tracing: TracingConfig = TracingConfig()
    #: Section ``deployments``.
    deployments: DeploymentsConfig = DeploymentsConfig()

    def node(self, node_id: str) -> Optional[NodeConfig]:
        """The configured Node ``node_id``, if any."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        return None


def load_edge_config(path: Optional[str], environ: Optional[Mapping[str, str]] = None) -> EdgeConfig:
    """Read and validate edge.yaml at ``path`` (environment overrides applied)."""
    return load_config(path, environ, parse_edge_config)


def parse_edge_config(data: Mapping[str, Any], environ: Mapping[str, str] = {}) -> EdgeConfig:
    """Validate a parsed edge.yaml mapping into an :class:`EdgeConfig`."""
    top = Section(data, "")
    top.reject_unknown(
        {
            "control_plane",
            "node_server",
            "nodes",
            "inference",
            "shutdown",
            "metrics",
            "logging",
            "tracing",
            "deployments",
        }
    )
    control_plane = _control_plane(top.section("control_plane"), environ)
    node_server = _node_server(top.section("node_server"), environ)
    credentials = parse_checked_credentials(top.section("node_server"), "credentials", "credentials_file")
    nodes = parse_nodes(top.raw("nodes"), credentials)
    inference = parse_inference_config(top.section("inference"), environ)
    metrics_listen = parse_metrics_listen(top.section("metrics"), DEFAULT_METRICS_LISTEN, environ, ENV_METRICS_LISTEN)
    return EdgeConfig(
        control_plane=control_plane,
        node_server=node_server,
        nodes=nodes,
        inference=inference,
        shutdown=parse_shutdown(top.section("shutdown")),
        metrics_listen=metrics_listen,
        logging=parse_logging(top.section("logging")),
        tracing=parse_tracing_config(top.section("tracing")),
        deployments=_deployments(top.section("deployments")),
    )


def _deployments(section: Section) -> DeploymentsConfig:
    section.reject_unknown({"hold", "node_timeout_seconds"})
    return DeploymentsConfig(
        hold=section.boolean("hold", False),
        node_timeout_seconds=section.number("node_timeout_seconds", 30.0),
    )


def _control_plane(section: Section, environ: Mapping[str, str]) -> ControlPlaneLinkConfig:
    section.reject_unknown(
        {
            "address",
            "addresses",
            "edge_id",
            "credential",
            "credential_file",
            "labels",
            "backoff",
            "keepalive",
            "outbox_size",
            "outbox_bytes",
            "max_frame_bytes",
            "request_timeout_seconds",
        }
    )
    addresses = _control_plane_addresses(section, environ)
    edge_id = section.identifier("edge_id")
    return ControlPlaneLinkConfig(
        address=addresses[0],
        addresses=addresses,
        edge_id=edge_id,
        credential=parse_dialer_secret(section, "credential", "credential_file"),
        labels=section.string_map("labels"),
        backoff=parse_backoff(section.section("backoff")),
        keepalive=parse_keepalive(section.section("keepalive")),
        outbox_size=section.integer("outbox_size", 1000, minimum=1, maximum=1_000_000),
        outbox_bytes=section.integer("outbox_bytes", 4 * 1024 * 1024, minimum=64 * 1024, maximum=2**40),
        max_frame_bytes=parse_max_frame_bytes(section),
        request_timeout_seconds=section.number("request_timeout_seconds", 10.0),
    )


def _control_plane_addresses(section: Section, environ: Mapping[str, str]) -> tuple[str, ...]:
    """``control_plane.addresses`` (or ``address``, a list of one), or the environment's list."""
    if section.has("address") and section.has("addresses"):
        raise ConfigError(
            f"{section.field_path('addresses')}: give either address or addresses, not both (address is a list of one)"
        )
    override = environ.get(ENV_CONTROL_PLANE_EDGE_WIRE, "").strip()
    if override:
        # The environment wins over the file, so its errors name the variable.
        field = section.field_path("addresses" if section.has("addresses") else "address")
        where = f"environment variable {ENV_CONTROL_PLANE_EDGE_WIRE} (overrides {field})"
        try:
            return _address_list(override.split(","), where, lambda index: f"{where}: entry {index + 1}")
        except ConfigError as e:
            raise EnvironmentConfigError(str(e)) from None
    if not section.has("addresses"):
        return (section.connect("address", DEFAULT_CONTROL_PLANE_ADDRESS),)
    raw = section.raw("addresses")
    path = section.field_path("addresses")
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: must be a list of addresses (host:port or endpoint strings)")
    return _address_list(raw, path, lambda index: f"{path}[{index}]")


def _address_list(raw: list[Any], path: str, entry: Callable[[int], str]) -> tuple[str, ...]:
    """Check each item of ``raw`` as a dial address; errors name ``path`` or ``entry(index)``."""
    if not raw:
        raise ConfigError(f"{path}: list at least one address")
    if len(raw) > MAX_CONTROL_PLANE_ADDRESSES:
        raise ConfigError(f"{path}: at most {MAX_CONTROL_PLANE_ADDRESSES} addresses, not {len(raw)}")
    addresses: list[str] = []
    for index, item in enumerate(raw):
        if isinstance(item, bool) or not isinstance(item, str):
            shown = repr(item) if len(repr(item)) <= 60 else repr(item)[:57] + "..."
            raise ConfigError(f"{entry(index)}: must be an address string, not {shown}")
        if not item.strip():
            raise ConfigError(f"{entry(index)}: empty address")
        problem, description = check_connect_endpoint(item.strip())
        if problem is not None:
            raise ConfigError(f"{entry(index)}: {problem}")
        if description in addresses:
            first = entry(addresses.index(description))
            raise ConfigError(f"{entry(index)}: {item.strip()!r} is listed twice (also {first})")
        addresses.append(description)
    return tuple(addresses)


def _node_server(section: Section, environ: Mapping[str, str]) -> NodeServerConfig:
    section.reject_unknown(
        {
            "listen",
            "hello_timeout_seconds",
            "tls_handshake_timeout_seconds",
            "keepalive",
            "max_frame_bytes",
            "max_hello_frame_bytes",
            "max_violations",
            "probe_timeout_seconds",
            "credentials",
            "credentials_file",
            "tls",
            "failed_hellos",
        }
    )
    listen = parse_listen_setting(section, "listen", DEFAULT_NODE_LISTEN, environ, ENV_NODE_LISTEN)
    max_frame_bytes = parse_max_frame_bytes(section)
    return NodeServerConfig(
        listen=listen,
        tls=parse_tls_listen(section, "tls", listen),
        failed_hellos=parse_failed_hellos(section.section("failed_hellos")),
        hello_timeout_seconds=section.number("hello_timeout_seconds", 10.0),
        tls_handshake_timeout_seconds=section.number("tls_handshake_timeout_seconds", 30.0),
        keepalive=parse_keepalive(section.section("keepalive")),
        max_frame_bytes=max_frame_bytes,
        probe_timeout_seconds=section.number("probe_timeout_seconds", 10.0),
        max_hello_frame_bytes=parse_max_hello_frame_bytes(section, max_frame_bytes),
        max_violations=parse_max_violations(section),
    )


def parse_nodes(raw: Any, credentials: Mapping[str, Digests] = {}) -> tuple[NodeConfig, ...]:
    """Read the ``nodes`` list (also used by ``providers.refresh``)."""
    nodes = parse_unique_list(raw, "nodes", "nodes", "node_id", lambda section: _node(section, credentials))
    configured = {node.node_id for node in nodes}
    for node_id in credentials:
        if node_id not in configured:
            raise ConfigError(f"node_server.credentials.{node_id}: no such node in nodes")
    return nodes


def _node(section: Section, credentials: Mapping[str, Digests]) -> NodeConfig:
    section.reject_unknown({"node_id", "credential", "labels", "providers"})
    node_id = section.identifier("node_id")
    credential = section.digests("credential")
    shared = credentials.get(node_id, ())
    if credential and shared and set(credential) != set(shared):
        raise ConfigError(f"{section.field_path('credential')}: differs from node_server.credentials.{node_id}")
    providers = parse_unique_list(
        section.raw("providers"), section.field_path("providers"), "providers", "provider_id", parse_provider
    )
    return NodeConfig(
        node_id=node_id,
        credentials=credential or shared,
        labels=section.string_map("labels"),
        providers=providers,
    )


def parse_provider(section: Section) -> ProviderConfig:
    """Read one provider entry of a node."""
    section.reject_unknown({"provider_id", "kind", "models", "capacity", "long_context_capacity"})
    provider_id, kind, models = parse_provider_basics(section, PROVIDER_KINDS)
    auto = section.raw("capacity") == AUTO_CAPACITY
    if isinstance(section.raw("capacity"), str) and not auto:
        raise ConfigError(
            f"{section.field_path('capacity')}: must be a whole number or {AUTO_CAPACITY!r}, "
            f"not {section.raw('capacity')!r}"[:200]
        )
    return ProviderConfig(
        provider_id=provider_id,
        kind=kind,
        models=models,
        capacity=1 if auto else section.integer("capacity", 1, minimum=0, maximum=100_000),
        long_context_capacity=section.integer("long_context_capacity", 0, minimum=0, maximum=100_000),
        capacity_auto=auto,
    )


def unauthenticated_exposures(config: EdgeConfig) -> list[str]:
    """The Edge's listeners reachable from other machines with no authentication, in words."""
    found = []
    nodes_authenticated = config.node_server.tls is not None or all(node.credentials for node in config.nodes)
    if not nodes_authenticated and not is_loopback_listen(config.node_server.listen):
        found.append(
            f"node_server.listen ({config.node_server.listen}) is reachable from other machines and not every "
            "node has a credential (nor is node_server.tls set): anyone can take a node's place"
        )
    if not config.inference.api_keys and not is_loopback_listen(config.inference.listen):
        found.append(
            f"inference.listen ({config.inference.listen}) is reachable from other machines and no API key is set"
        )
    if config.metrics_listen and not is_loopback_listen(config.metrics_listen):
        found.append(
            f"metrics.listen ({config.metrics_listen}) is reachable from other machines (metrics are not authenticated)"
        )
    return found
