"""edge.yaml: parsed once into frozen attrs classes.

Every bad value fails with :class:`~twisted_iop.configuration.ConfigError`
naming its dotted field (``nodes[1].providers[0].capacity: ...``). Nothing
else in the Edge reads YAML or passes raw mappings around.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import attrs

from twisted_iop.configuration import ConfigError, Section, load_yaml_mapping
from twisted_iop.endpoints import EndpointError, connect_endpoint, listen_endpoint
from twisted_iop.ids import id_problem
from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES
from twisted_iop.wire.peer import PeerSettings

#: Where the Edge dials the Control Plane unless configured otherwise.
DEFAULT_CONTROL_PLANE_ADDRESS = "127.0.0.1:7443"
#: Where Nodes dial this Edge unless configured otherwise.
DEFAULT_NODE_LISTEN = "tcp:7444:interface=127.0.0.1"

#: Environment variable overriding ``control_plane.address``.
ENV_CONTROL_PLANE_EDGE_WIRE = "IOP_CONTROL_PLANE_EDGE_WIRE"
#: Environment variable overriding ``node_server.listen``.
ENV_NODE_LISTEN = "IOP_EDGE_NODE_LISTEN"

#: Provider kinds a Node can host.
PROVIDER_KINDS = ("openai", "vllm", "ollama", "mock")


@attrs.frozen
class BackoffConfig:
    """Reconnect delays: exponential with full jitter between the bounds."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0


@attrs.frozen
class KeepaliveConfig:
    """Ping an idle peer after ``interval``; drop it after ``deadline``."""

    interval_seconds: float = 15.0
    deadline_seconds: float = 45.0


@attrs.frozen
class ControlPlaneConfig:
    """Section ``control_plane``: how this Edge enrolls with the Control Plane."""

    address: str
    edge_id: str
    credential: str = attrs.field(default="", repr=False)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    backoff: BackoffConfig = BackoffConfig()
    keepalive: KeepaliveConfig = KeepaliveConfig()
    outbox_size: int = 1000
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    request_timeout_seconds: float = 10.0

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of the connection to the Control Plane."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            keepalive_interval_seconds=self.keepalive.interval_seconds,
            keepalive_deadline_seconds=self.keepalive.deadline_seconds,
            request_timeout_seconds=self.request_timeout_seconds,
        )


@attrs.frozen
class NodeServerConfig:
    """Section ``node_server``: the listener Nodes dial."""

    listen: str = DEFAULT_NODE_LISTEN
    hello_timeout_seconds: float = 10.0
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    probe_timeout_seconds: float = 10.0

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of each Node connection."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            hello_timeout_seconds=self.hello_timeout_seconds,
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
    capacity: int = 1
    long_context_capacity: int = 0


@attrs.frozen
class NodeConfig:
    """One Node this Edge accepts (a Node not listed here is rejected)."""

    node_id: str
    credential: str = attrs.field(default="", repr=False)
    labels: Mapping[str, str] = attrs.field(factory=dict)
    providers: tuple[ProviderConfig, ...] = ()


@attrs.frozen
class EdgeConfig:
    """The whole of edge.yaml, plus the file it came from (for refresh)."""

    control_plane: ControlPlaneConfig
    node_server: NodeServerConfig
    nodes: tuple[NodeConfig, ...]
    source_path: Optional[str] = None

    def node(self, node_id: str) -> Optional[NodeConfig]:
        """The configured Node ``node_id``, if any."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        return None


def load_edge_config(path: Optional[str], environ: Optional[Mapping[str, str]] = None) -> EdgeConfig:
    """Read and validate edge.yaml at ``path`` (environment overrides applied)."""
    data = load_yaml_mapping(path)
    config = parse_edge_config(data, environ if environ is not None else os.environ)
    return attrs.evolve(config, source_path=path)


def parse_edge_config(data: Mapping[str, Any], environ: Mapping[str, str] = {}) -> EdgeConfig:
    """Validate a parsed edge.yaml mapping into an :class:`EdgeConfig`."""
    top = Section(data, "")
    top.reject_unknown({"control_plane", "node_server", "nodes"})
    control_plane = _control_plane(top.section("control_plane"), environ)
    node_server = _node_server(top.section("node_server"), environ)
    credentials = _credential_map(top.section("node_server"))
    nodes = parse_nodes(top.raw("nodes"), credentials)
    return EdgeConfig(control_plane=control_plane, node_server=node_server, nodes=nodes)


def _backoff(section: Section) -> BackoffConfig:
    section.reject_unknown({"initial_seconds", "max_seconds"})
    initial = section.number("initial_seconds", 0.5)
    maximum = section.number("max_seconds", max(30.0, initial))
    if maximum < initial:
        raise ConfigError(
            f"{section.field_path('max_seconds')}: must be at least initial_seconds ({initial:g})"
        )
    return BackoffConfig(initial_seconds=initial, max_seconds=maximum)


def parse_keepalive(section: Section) -> KeepaliveConfig:
    """Read a ``keepalive`` section (shared with node.yaml)."""
    section.reject_unknown({"interval_seconds", "deadline_seconds"})
    interval = section.number("interval_seconds", 15.0)
    deadline = section.number("deadline_seconds", max(45.0, interval * 3))
    if deadline <= interval:
        raise ConfigError(
            f"{section.field_path('deadline_seconds')}: must be greater than interval_seconds ({interval:g})"
        )
    return KeepaliveConfig(interval_seconds=interval, deadline_seconds=deadline)


def parse_backoff(section: Section) -> BackoffConfig:
    """Read a ``backoff`` section (shared with node.yaml)."""
    return _backoff(section)


def _control_plane(section: Section, environ: Mapping[str, str]) -> ControlPlaneConfig:
    section.reject_unknown(
        {
            "address",
            "edge_id",
            "credential",
            "labels",
            "backoff",
            "keepalive",
            "outbox_size",
            "max_frame_bytes",
            "request_timeout_seconds",
        }
    )
    override = environ.get(ENV_CONTROL_PLANE_EDGE_WIRE, "").strip()
    if override:
        try:
            address = connect_endpoint(override)
        except EndpointError as e:
            raise ConfigError(f"{ENV_CONTROL_PLANE_EDGE_WIRE}: {e}") from None
    else:
        address = section.connect("address", DEFAULT_CONTROL_PLANE_ADDRESS)
    edge_id = section.string("edge_id", required=True)
    problem = id_problem("edge_id", edge_id)
    if problem:
        raise ConfigError(f"{section.field_path('edge_id')}: {problem}")
    return ControlPlaneConfig(
        address=address,
        edge_id=edge_id,
        credential=section.string("credential"),
        labels=section.string_map("labels"),
        backoff=_backoff(section.section("backoff")),
        keepalive=parse_keepalive(section.section("keepalive")),
        outbox_size=section.integer("outbox_size", 1000, minimum=1, maximum=1_000_000),
        max_frame_bytes=section.integer(
            "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1024, maximum=256 * 1024 * 1024
        ),
        request_timeout_seconds=section.number("request_timeout_seconds", 10.0),
    )


def _node_server(section: Section, environ: Mapping[str, str]) -> NodeServerConfig:
    section.reject_unknown(
        {"listen", "hello_timeout_seconds", "keepalive", "max_frame_bytes", "probe_timeout_seconds", "credentials"}
    )
    override = environ.get(ENV_NODE_LISTEN, "").strip()
    if override:
        try:
            listen = listen_endpoint(override)
        except EndpointError as e:
            raise ConfigError(f"{ENV_NODE_LISTEN}: {e}") from None
    else:
        listen = section.listen("listen", DEFAULT_NODE_LISTEN)
    return NodeServerConfig(
        listen=listen,
        hello_timeout_seconds=section.number("hello_timeout_seconds", 10.0),
        keepalive=parse_keepalive(section.section("keepalive")),
        max_frame_bytes=section.integer(
            "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1024, maximum=256 * 1024 * 1024
        ),
        probe_timeout_seconds=section.number("probe_timeout_seconds", 10.0),
    )


def _credential_map(section: Section) -> dict[str, str]:
    return section.string_map("credentials")


def parse_nodes(raw: Any, credentials: Mapping[str, str] = {}) -> tuple[NodeConfig, ...]:
    """Read the ``nodes`` list (also used by ``providers.refresh``)."""
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError("nodes: must be a list of nodes")
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        node = _node(Section(item, f"nodes[{index}]"), credentials)
        if node.node_id in seen:
            raise ConfigError(f"nodes[{index}].node_id: {node.node_id!r} is listed twice")
        seen.add(node.node_id)
        nodes.append(node)
    for node_id in credentials:
        if node_id not in seen:
            raise ConfigError(f"node_server.credentials.{node_id}: no such node in nodes")
    return tuple(nodes)


def _node(section: Section, credentials: Mapping[str, str]) -> NodeConfig:
    section.reject_unknown({"node_id", "credential", "labels", "providers"})
    node_id = section.string("node_id", required=True)
    problem = id_problem("node_id", node_id)
    if problem:
        raise ConfigError(f"{section.field_path('node_id')}: {problem}")
    credential = section.string("credential")
    shared = credentials.get(node_id, "")
    if credential and shared and credential != shared:
        raise ConfigError(
            f"{section.field_path('credential')}: differs from node_server.credentials.{node_id}"
        )
    raw = section.raw("providers")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError(f"{section.field_path('providers')}: must be a list of providers")
    providers: list[ProviderConfig] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        provider = parse_provider(Section(item, f"{section.field_path('providers')}[{index}]"))
        if provider.provider_id in seen:
            raise ConfigError(
                f"{section.field_path('providers')}[{index}].provider_id: "
                f"{provider.provider_id!r} is listed twice"
            )
        seen.add(provider.provider_id)
        providers.append(provider)
    return NodeConfig(
        node_id=node_id,
        credential=credential or shared,
        labels=section.string_map("labels"),
        providers=tuple(providers),
    )


def parse_provider(section: Section) -> ProviderConfig:
    """Read one provider entry of a node."""
    section.reject_unknown({"provider_id", "kind", "models", "capacity", "long_context_capacity"})
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
    return ProviderConfig(
        provider_id=provider_id,
        kind=kind,
        models=tuple(models),
        capacity=section.integer("capacity", 1, minimum=0, maximum=100_000),
        long_context_capacity=section.integer("long_context_capacity", 0, minimum=0, maximum=100_000),
    )
