"""control-plane.yaml -> frozen config objects (parsed once, at start-up)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

import attrs

from twisted_iop.configuration import (
    ConfigError,
    EnvironmentConfigError,
    LoggingConfig,
    Section,
    ShutdownConfig,
    parse_checked_credentials,
    parse_failed_hellos,
    parse_listen_setting,
    parse_logging,
    parse_max_hello_frame_bytes,
    parse_max_violations,
    parse_shutdown,
    parse_tls_listen,
    parse_yaml_mapping,
)
from twisted_iop.configuration import load_config as load_config_file
from twisted_iop.controlplane.cluster.settings import (
    BACKENDS,
    MEMORY,
    ClusterConfig,
    default_replica_id,
    parse_redis_url,
)
from twisted_iop.controlplane.fleet.memory import RegistryLimits
from twisted_iop.controlplane.history.settings import HistorySettings, parse_history
from twisted_iop.controlplane.http.auth import ROLES, ApiToken, ApiTokens, token_digest
from twisted_iop.controlplane.http.settings import HttpSettings
from twisted_iop.controlplane.rollouts.settings import RolloutSettings
from twisted_iop.controlplane.slo.settings import SloSettings, parse_slos
from twisted_iop.controlplane.store.settings import StoreSettings, parse_store
from twisted_iop.controlplane.wires.client_wire import ClientWireSettings
from twisted_iop.controlplane.wires.edge_wire import EdgeCredentials
from twisted_iop.controlplane.wires.hello_admission import HelloAdmissionSettings
from twisted_iop.endpoints import is_loopback_listen, is_tls_listen
from twisted_iop.ids import id_problem
from twisted_iop.tls import TLSListenConfig
from twisted_iop.web.http_site import SiteLimits
from twisted_iop.wire.limits import FailedHelloLimits
from twisted_iop.wire.settings import KeepaliveConfig, PeerSettings

DEFAULT_HTTP_LISTEN = "tcp:8080:interface=127.0.0.1"
DEFAULT_WIRE_LISTEN = "tcp:8081:interface=127.0.0.1"
DEFAULT_EDGE_WIRE_LISTEN = "tcp:7443:interface=127.0.0.1"

#: The HTTP methods the Control Plane's site lets through (PUT and DELETE: ``/slos/{name}``).
HTTP_METHODS = frozenset({b"GET", b"HEAD", b"POST", b"PUT", b"DELETE"})

#: Environment variables that override the listen addresses.
ENV_HTTP_LISTEN = "IOP_HTTP_LISTEN"
ENV_WIRE_LISTEN = "IOP_WIRE_LISTEN"
ENV_EDGE_WIRE_LISTEN = "IOP_EDGE_WIRE_LISTEN"

#: Keepalive of the client WebSocket (Autobahn auto-ping): a ping every
#: interval, the connection dropped when no pong came by the deadline.
CLIENT_KEEPALIVE = KeepaliveConfig(interval_seconds=20.0, deadline_seconds=30.0)
#: Keepalive of the edge wire: ping an idle Edge, drop one silent this long.
EDGE_KEEPALIVE = KeepaliveConfig(interval_seconds=15.0, deadline_seconds=45.0)


@attrs.frozen
class ControlPlaneConfig:
    """Everything the Control Plane needs to start."""

    http_listen: str = DEFAULT_HTTP_LISTEN
    wire_listen: str = DEFAULT_WIRE_LISTEN
    edge_wire_listen: str = DEFAULT_EDGE_WIRE_LISTEN
    http: HttpSettings = HttpSettings()
    http_site: SiteLimits = SiteLimits(methods=HTTP_METHODS)
    #: One access-log line per HTTP request (``http.access_log``).
    http_access_log: bool = True
    client_wire: ClientWireSettings = ClientWireSettings()
    edge_wire: PeerSettings = PeerSettings()
    credentials: EdgeCredentials = EdgeCredentials()
    #: Mutual TLS on the edge wire (``edge_wire.tls``); None: as ``edge_wire_listen`` says.
    edge_wire_tls: Optional[TLSListenConfig] = None
    edge_wire_failed_hellos: FailedHelloLimits = FailedHelloLimits()
    #: When a hello is admitted or told retry_later (``edge_wire.hello_admission``).
    hello_admission: HelloAdmissionSettings = HelloAdmissionSettings()
    registry: RegistryLimits = RegistryLimits()
    status_timeout_seconds: float = 5.0
    #: Warnings about a valid file (deprecated spellings), logged at start-up.
    notices: tuple[str, ...] = ()
    #: The file it was read from (None: embedded defaults).
    source_path: Optional[str] = None
    #: How long a finished fleet round serves later views and pages.
    fleet_max_age_seconds: float = 1.0
    #: How a stop drains (SIGTERM).
    shutdown: ShutdownConfig = ShutdownConfig()
    #: Cluster mode (several replicas through Redis); the default is memory.
    cluster: ClusterConfig = ClusterConfig()
    #: Rollouts: bounds and defaults (``rollouts``).
    rollouts: RolloutSettings = RolloutSettings()
    #: How log lines are written (``logging.format``: text or json).
    logging: LoggingConfig = LoggingConfig()
    #: What outlives the process (``store``): sqlite by default.
    store: StoreSettings = attrs.field(factory=StoreSettings)
    #: Capacity history: interval, tiers and bounds (``history``).
    history: HistorySettings = HistorySettings()
    #: SLOs: the evaluation interval, bounds and declared objectives (``slos``).
    slos: SloSettings = SloSettings()


def load_config(path: Optional[str], environ: Mapping[str, str] = os.environ) -> ControlPlaneConfig:
    """Read ``path`` (or the embedded defaults) and apply the environment.

    Errors name the file (or the environment variable) and the dotted field.
    """
    return load_config_file(path, environ, config_from_mapping)


def config_from_text(text: str, environ: Mapping[str, str] = {}) -> ControlPlaneConfig:
    """Parse a YAML document (for tests and tools)."""
    return config_from_mapping(parse_yaml_mapping(text), environ)


def config_from_mapping(data: Mapping[str, Any], environ: Mapping[str, str] = {}) -> ControlPlaneConfig:
    """Build the config from parsed YAML plus environment overrides."""
    root = Section(data, "")
    root.reject_unknown(
        {
            "http",
            "client_wire",
            "edge_wire",
            "registry",
            "status",
            "shutdown",
            "cluster",
            "rollouts",
            "logging",
            "store",
            "history",
            "slos",
        }
    )
    notices: list[str] = []
    http = root.section("http")
    http.reject_unknown(
        {
            "listen",
            "api_token",
            "status_timeout_seconds",
            "default_command_timeout_seconds",
            "engine_command_timeout_seconds",
            "max_command_timeout_seconds",
            "max_body_bytes",
            "tokens",
            "allowed_hosts",
            "header_timeout_seconds",
            "request_timeout_seconds",
            "idle_timeout_seconds",
            "max_connections",
            "max_connections_per_address",
            "access_log",
        }
    )
    wire = root.section("client_wire")
    wire.reject_unknown(
        {
            "listen",
            "public_url",
            "max_message_bytes",
            "keepalive",
            "auto_ping_interval_seconds",
            "auto_ping_timeout_seconds",
            "subscriber_queue",
            "subscriber_queue_bytes",
            "hello_timeout_seconds",
            "max_violations",
        }
    )
    edge = root.section("edge_wire")
    edge.reject_unknown(
        {
            "listen",
            "max_frame_bytes",
            "max_hello_frame_bytes",
            "max_violations",
            "hello_timeout_seconds",
            "tls_handshake_timeout_seconds",
            "keepalive",
            "keepalive_interval_seconds",
            "keepalive_deadline_seconds",
            "request_timeout_seconds",
            "credentials",
            "credentials_file",
            "shared_credential",
            "tls",
            "failed_hellos",
            "hello_admission",
            "max_hellos_per_second",
        }
    )
    status = root.section("status")
    status.reject_unknown({"fleet_max_age_seconds"})
    reg = root.section("registry")
    reg.reject_unknown(
        {
            "events_per_edge",
            "fleet_events",
            "operations_per_edge",
            "disconnected_edges",
            "event_bytes_per_edge",
            "fleet_event_bytes",
            "operation_bytes_per_edge",
            "disconnected_bytes",
        }
    )

    http_listen = parse_listen_setting(http, "listen", DEFAULT_HTTP_LISTEN, environ, ENV_HTTP_LISTEN)
    wire_listen = parse_listen_setting(wire, "listen", DEFAULT_WIRE_LISTEN, environ, ENV_WIRE_LISTEN)
    edge_wire_listen = parse_listen_setting(edge, "listen", DEFAULT_EDGE_WIRE_LISTEN, environ, ENV_EDGE_WIRE_LISTEN)

    tokens = parse_tokens(http)
    max_timeout = http.number("max_command_timeout_seconds", 300.0)
    default_timeout = http.number("default_command_timeout_seconds", 10.0)
    if default_timeout > max_timeout:
        raise ConfigError("http.default_command_timeout_seconds: must not exceed max_command_timeout_seconds")
    engine_timeout = http.number("engine_command_timeout_seconds", min(300.0, max_timeout))
    if engine_timeout > max_timeout:
        raise ConfigError("http.engine_command_timeout_seconds: must not exceed max_command_timeout_seconds")
    max_body_bytes = http.integer("max_body_bytes", 65536, minimum=1024)
    site_limits = SiteLimits(
        max_body_bytes=max_body_bytes,
        header_timeout_seconds=http.number("header_timeout_seconds", 10.0),
        request_timeout_seconds=http.number("request_timeout_seconds", 30.0),
        idle_timeout_seconds=http.number("idle_timeout_seconds", 60.0),
        max_connections=http.integer("max_connections", 1024, minimum=1),
        max_connections_per_address=http.integer("max_connections_per_address", 128, minimum=1),
        allowed_hosts=tuple(http.string_list("allowed_hosts")),
        methods=HTTP_METHODS,
    )
    http_settings = HttpSettings(
        tokens=tokens,
        default_command_timeout_seconds=default_timeout,
        max_command_timeout_seconds=max_timeout,
        engine_command_timeout_seconds=engine_timeout,
        max_body_bytes=max_body_bytes,
        wire_public_url=wire.string("public_url"),
        wire_port=_port_of(wire_listen),
        wire_tls=is_tls_listen(wire_listen),
    )
    client_keepalive = _keepalive(
        wire, CLIENT_KEEPALIVE, ("auto_ping_interval_seconds", "auto_ping_timeout_seconds"), notices
    )
    client_wire = ClientWireSettings(
        max_message_bytes=wire.integer("max_message_bytes", 1024 * 1024, minimum=1024),
        auto_ping_interval_seconds=client_keepalive.interval_seconds,
        auto_ping_timeout_seconds=client_keepalive.deadline_seconds - client_keepalive.interval_seconds,
        subscriber_queue=wire.integer("subscriber_queue", 1000, minimum=1),
        subscriber_queue_bytes=_bytes(wire, "subscriber_queue_bytes", ClientWireSettings().subscriber_queue_bytes),
        tokens=tokens,
        hello_timeout_seconds=wire.number("hello_timeout_seconds", 10.0),
        max_violations=wire.integer("max_violations", 10, minimum=1, maximum=10_000),
    )
    edge_keepalive = _keepalive(
        edge, EDGE_KEEPALIVE, ("keepalive_interval_seconds", "keepalive_deadline_seconds"), notices
    )
    max_frame_bytes = edge.integer("max_frame_bytes", 4 * 1024 * 1024, minimum=1024, maximum=2**31 - 1)
    edge_settings = PeerSettings(
        max_frame_bytes=max_frame_bytes,
        max_hello_frame_bytes=parse_max_hello_frame_bytes(edge, max_frame_bytes),
        max_violations=parse_max_violations(edge),
        hello_timeout_seconds=edge.number("hello_timeout_seconds", 10.0),
        tls_handshake_timeout_seconds=edge.number("tls_handshake_timeout_seconds", 30.0),
        keepalive_interval_seconds=edge_keepalive.interval_seconds,
        keepalive_deadline_seconds=edge_keepalive.deadline_seconds,
        request_timeout_seconds=edge.number("request_timeout_seconds", 10.0),
    )
    per_edge = parse_checked_credentials(edge, "credentials", "credentials_file")
    for edge_id in per_edge:
        problem = id_problem("edge_id", edge_id)
        if problem is not None:
            raise ConfigError(f"edge_wire.credentials: {problem}")
    credentials = EdgeCredentials(per_edge=per_edge, shared=edge.digests("shared_credential"))
    limits = RegistryLimits(
        events_per_edge=reg.integer("events_per_edge", 1000, minimum=1),
        fleet_events=reg.integer("fleet_events", 10000, minimum=1),
        operations_per_edge=reg.integer("operations_per_edge", 500, minimum=1),
        disconnected_edges=reg.integer("disconnected_edges", 10000, minimum=0),
        event_bytes_per_edge=_bytes(reg, "event_bytes_per_edge", DEFAULT_LIMITS.event_bytes_per_edge),
        fleet_event_bytes=_bytes(reg, "fleet_event_bytes", DEFAULT_LIMITS.fleet_event_bytes),
        operation_bytes_per_edge=_bytes(reg, "operation_bytes_per_edge", DEFAULT_LIMITS.operation_bytes_per_edge),
        disconnected_bytes=reg.integer(
            "disconnected_bytes", DEFAULT_LIMITS.disconnected_bytes, minimum=0, maximum=MAX_BUDGET_BYTES
        ),
    )
    cluster = parse_cluster(root.section("cluster"), environ)
    history = parse_history(root.section("history"))
    return ControlPlaneConfig(
        http_listen=http_listen,
        wire_listen=wire_listen,
        edge_wire_listen=edge_wire_listen,
        http=http_settings,
        http_site=site_limits,
        http_access_log=http.boolean("access_log", True),
        client_wire=client_wire,
        edge_wire=edge_settings,
        credentials=credentials,
        edge_wire_tls=parse_tls_listen(edge, "tls", edge_wire_listen),
        edge_wire_failed_hellos=parse_failed_hellos(edge.section("failed_hellos")),
        hello_admission=parse_hello_admission(edge, notices),
        registry=limits,
        status_timeout_seconds=http.number("status_timeout_seconds", 5.0),
        notices=tuple(notices),
        fleet_max_age_seconds=status.number("fleet_max_age_seconds", 1.0, minimum=0.0, exclusive_minimum=False),
        shutdown=parse_shutdown(root.section("shutdown")),
        cluster=cluster,
        rollouts=parse_rollouts(root.section("rollouts")),
        logging=parse_logging(root.section("logging")),
        store=attrs.evolve(
            parse_store(root.section("store"), environ, cluster.backend), history_max_bytes=history.max_bytes
        ),
        history=history,
        slos=parse_slos(root.section("slos")),
    )


def parse_rollouts(section: Section) -> RolloutSettings:
    """``rollouts``: how many are kept, how many targets each, and request defaults."""
    section.reject_unknown(
        {"max_kept", "max_targets", "max_in_flight", "wait_seconds", "max_dispatch_per_second", "latency_poll_seconds"}
    )
    return RolloutSettings(
        max_kept=section.integer("max_kept", 100, minimum=1, maximum=100_000),
        max_targets=section.integer("max_targets", 20_000, minimum=1, maximum=1_000_000),
        default_max_in_flight=section.integer("max_in_flight", 50, minimum=1, maximum=10_000),
        default_wait_seconds=section.number("wait_seconds", 300.0, minimum=0.0, exclusive_minimum=False),
        max_dispatch_per_second=section.number("max_dispatch_per_second", 1000.0, minimum=0.0, exclusive_minimum=False),
        latency_poll_seconds=section.number("latency_poll_seconds", 5.0),
    )


def parse_hello_admission(edge: Section, notices: list[str]) -> HelloAdmissionSettings:
    """``edge_wire.hello_admission``; the older ``edge_wire.max_hellos_per_second`` is read as its fixed cap."""
    section = edge.section("hello_admission")
    section.reject_unknown(
        {
            "max_pending_hellos",
            "max_pending_bytes",
            "slice_ms",
            "max_queue_wait_ms",
            "max_loop_lag_ms",
            "lag_grace_ms",
            "lagging_slice_ms",
            "max_per_second",
            "probe_interval_ms",
        }
    )
    default = HelloAdmissionSettings()
    old = "max_hellos_per_second"
    if edge.has(old):
        if section.has("max_per_second"):
            raise ConfigError(
                f"{edge.field_path(old)}: give either hello_admission.max_per_second or the older {old}, not both"
            )
        max_per_second = edge.number(old, 0.0, exclusive_minimum=False)
        notices.append(
            f"{edge.field_path(old)} is now {section.field_path('max_per_second')} (a fixed cap, off by default: "
            "hellos are queued and worked off as fast as the event loop keeps up); the old name is read for now"
        )
    else:
        max_per_second = section.number("max_per_second", default.max_per_second, exclusive_minimum=False)
    number = section.number
    return HelloAdmissionSettings(
        max_pending_hellos=section.integer(
            "max_pending_hellos", default.max_pending_hellos, minimum=1, maximum=10_000_000
        ),
        max_pending_bytes=section.integer(
            "max_pending_bytes", default.max_pending_bytes, minimum=64 * 1024, maximum=2**40
        ),
        slice_ms=min(number("slice_ms", default.slice_ms, minimum=1.0, exclusive_minimum=False), 1000.0),
        max_queue_wait_ms=number("max_queue_wait_ms", default.max_queue_wait_ms, minimum=1.0, exclusive_minimum=False),
        max_loop_lag_ms=number("max_loop_lag_ms", default.max_loop_lag_ms, minimum=1.0, exclusive_minimum=False),
        lag_grace_ms=number("lag_grace_ms", default.lag_grace_ms, exclusive_minimum=False),
        lagging_slice_ms=min(
            number("lagging_slice_ms", default.lagging_slice_ms, minimum=0.1, exclusive_minimum=False), 1000.0
        ),
        max_per_second=max_per_second,
        probe_interval_ms=min(
            number("probe_interval_ms", default.probe_interval_ms, minimum=1.0, exclusive_minimum=False), 1000.0
        ),
    )


#: Environment variable overriding ``cluster.redis_url``.
ENV_REDIS_URL = "IOP_REDIS_URL"
#: Environment variable overriding ``cluster.replica_id``.
ENV_REPLICA_ID = "IOP_REPLICA_ID"


def parse_cluster(section: Section, environ: Mapping[str, str]) -> ClusterConfig:
    """``cluster``: memory (the default) or redis, and how replicas share the fleet."""
    section.reject_unknown(
        {
            "backend",
            "redis_url",
            "replica_id",
            "key_prefix",
            "lease_ttl_seconds",
            "heartbeat_seconds",
            "redis_timeout_seconds",
            "idempotency_ttl_seconds",
            "fleet_stream_length",
        }
    )
    backend = section.string("backend", MEMORY)
    if backend not in BACKENDS:
        raise ConfigError(
            f"{section.field_path('backend')}: must be one of {', '.join(BACKENDS)}, not {backend[:40]!r}"
        )
    env_url = environ.get(ENV_REDIS_URL)
    url = env_url or section.string("redis_url", "redis://127.0.0.1:6379/0")
    try:
        address = parse_redis_url(url)
    except ValueError as e:
        if env_url:
            raise EnvironmentConfigError(
                f"environment variable {ENV_REDIS_URL} (overrides {section.field_path('redis_url')}): {e}"
            ) from None
        raise ConfigError(f"{section.field_path('redis_url')}: {e}") from None
    env_replica = environ.get(ENV_REPLICA_ID)
    replica_id = env_replica or section.string("replica_id", "") or default_replica_id()
    problem = id_problem("replica_id", replica_id)
    if problem is not None:
        if env_replica:
            raise EnvironmentConfigError(
                f"environment variable {ENV_REPLICA_ID} (overrides {section.field_path('replica_id')}): {problem}"
            )
        raise ConfigError(f"{section.field_path('replica_id')}: {problem}")
    prefix = section.string("key_prefix", "iop")
    if not prefix or len(prefix) > 64 or any(c.isspace() for c in prefix):
        raise ConfigError(f"{section.field_path('key_prefix')}: must be 1 to 64 characters without spaces")
    heartbeat = section.number("heartbeat_seconds", 2.0)
    ttl = section.number("lease_ttl_seconds", 6.0)
    if ttl < 2 * heartbeat:
        raise ConfigError(
            f"{section.field_path('lease_ttl_seconds')}: must be at least twice heartbeat_seconds ({heartbeat:g})"
        )
    return ClusterConfig(
        backend=backend,
        redis=address,
        replica_id=replica_id,
        key_prefix=prefix,
        lease_ttl_seconds=ttl,
        heartbeat_seconds=heartbeat,
        redis_timeout_seconds=section.number("redis_timeout_seconds", 5.0),
        idempotency_ttl_seconds=section.number("idempotency_ttl_seconds", 24 * 3600.0),
        fleet_stream_length=section.integer("fleet_stream_length", 100_000, minimum=1000),
    )


DEFAULT_LIMITS = RegistryLimits()
#: The smallest byte budget of a buffer: room for the largest single record.
MIN_BUDGET_BYTES = 64 * 1024
MAX_BUDGET_BYTES = 2**40


def _bytes(section: Section, key: str, default: int) -> int:
    """A byte budget of a buffer (at least :data:`MIN_BUDGET_BYTES`)."""
    return section.integer(key, default, minimum=MIN_BUDGET_BYTES, maximum=MAX_BUDGET_BYTES)


def _keepalive(
    section: Section, default: KeepaliveConfig, old_keys: tuple[str, str], notices: list[str]
) -> KeepaliveConfig:
    """``keepalive: {interval_seconds, deadline_seconds}`` of a wire section.

    The flat spelling that earlier sample configs shipped (``old_keys``:
    interval, then deadline or timeout) is still read, with a notice.
    """
    old_interval, old_second = old_keys
    if not (section.has(old_interval) or section.has(old_second)):
        keepalive = section.section("keepalive")
        keepalive.reject_unknown({"interval_seconds", "deadline_seconds"})
        interval = keepalive.number("interval_seconds", default.interval_seconds)
        ratio = default.deadline_seconds / default.interval_seconds
        deadline = keepalive.number("deadline_seconds", max(default.deadline_seconds, interval * ratio))
        if deadline <= interval:
            raise ConfigError(
                f"{keepalive.field_path('deadline_seconds')}: must be greater than interval_seconds ({interval:g})"
            )
        return KeepaliveConfig(interval_seconds=interval, deadline_seconds=deadline)
    if section.has("keepalive"):
        raise ConfigError(
            f"{section.field_path(old_interval)}: give either keepalive.interval_seconds / deadline_seconds "
            f"or the older {old_interval} / {old_second}, not both"
        )
    interval = section.number(old_interval, default.interval_seconds)
    if old_second.endswith("timeout_seconds"):
        # Autobahn's timeout counts from the ping; the deadline from the last message.
        timeout = section.number(old_second, default.deadline_seconds - default.interval_seconds)
        deadline = interval + timeout
    else:
        deadline = section.number(old_second, default.deadline_seconds)
        if deadline <= interval:
            raise ConfigError(f"{section.field_path(old_second)}: must be greater than {old_interval} ({interval:g})")
    notices.append(
        f"{section.field_path(old_interval)} / {old_second} are an older spelling: write "
        f"{section.field_path('keepalive')}: {{interval_seconds: {interval:g}, deadline_seconds: {deadline:g}}}"
    )
    return KeepaliveConfig(interval_seconds=interval, deadline_seconds=deadline)


def _port_of(endpoint: str) -> int:
    """The port of a ``tcp:PORT:...`` endpoint string (0 if not TCP)."""
    parts = endpoint.split(":")
    if parts[0] in ("tcp", "tcp6", "ssl") and len(parts) > 1:
        for part in parts[1:]:
            if part.isdigit():
                return int(part)
            if part.startswith("port="):
                return int(part[5:]) if part[5:].isdigit() else 0
    return 0


def parse_tokens(http: Section) -> ApiTokens:
    """``http.api_token`` (one operator token) and ``http.tokens`` (named, with roles).

    Each entry of ``http.tokens`` is ``{name, role, token}`` or
    ``{name, role, sha256}`` (the hex SHA-256 digest of the token, so the
    file need not hold the secret).
    """
    tokens: list[ApiToken] = []
    legacy = http.string("api_token")
    if legacy:
        tokens.append(ApiToken("api_token", "operator", token_digest(legacy.encode())))
    raw = http.raw("tokens", [])
    if not isinstance(raw, list):
        raise ConfigError(f"{http.field_path('tokens')}: must be a list of {{name, role, token or sha256}}")
    names = {t.name for t in tokens}
    for index, item in enumerate(raw):
        entry = Section(item, f"{http.field_path('tokens')}[{index}]")
        entry.reject_unknown({"name", "role", "token", "sha256"})
        name = entry.string("name", required=True)
        if name in names:
            raise ConfigError(f"{entry.field_path('name')}: token name {name!r} is used twice")
        names.add(name)
        role = entry.string("role", required=True)
        if role not in ROLES:
            raise ConfigError(f"{entry.field_path('role')}: must be one of {', '.join(ROLES)}, not {role!r}")
        secret = entry.string("token")
        digest_hex = entry.string("sha256")
        if bool(secret) == bool(digest_hex):
            raise ConfigError(f"{entry.field_path('token')}: give exactly one of token and sha256")
        if secret:
            if len(secret) < 16:
                raise ConfigError(f"{entry.field_path('token')}: must be at least 16 characters")
            digest = token_digest(secret.encode())
        else:
            try:
                digest = bytes.fromhex(digest_hex)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ConfigError(f"{entry.field_path('sha256')}: must be 64 hex digits (a SHA-256 digest)")
        tokens.append(ApiToken(name, role, digest))
    return ApiTokens(tuple(tokens))


def unauthenticated_exposures(config: ControlPlaneConfig) -> list[str]:
    """Listeners reachable from other machines with no authentication, in words.

    The daemon logs each of these loudly at start: anyone who can reach
    such a port can read the fleet (HTTP, client wire) or enroll as any
    edge (edge wire).
    """
    found = []
    if not config.http.tokens.required:
        for field, description in (("http.listen", config.http_listen), ("client_wire.listen", config.wire_listen)):
            if not is_loopback_listen(description):
                found.append(f"{field} ({description}) is reachable from other machines and no API token is set")
    edge_authenticated = config.credentials.required or config.edge_wire_tls is not None
    if not edge_authenticated and not is_loopback_listen(config.edge_wire_listen):
        found.append(
            f"edge_wire.listen ({config.edge_wire_listen}) is reachable from other machines "
            "and neither edge credentials nor edge_wire.tls are set: anyone can enroll as any edge"
        )
    return found
