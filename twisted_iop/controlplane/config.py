"""control-plane.yaml -> frozen config objects (parsed once, at start-up)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Optional

import attrs

from twisted_iop.configuration import ConfigError, Section, load_yaml_mapping, parse_yaml_mapping
from twisted_iop.controlplane.client_wire import ClientWireSettings
from twisted_iop.controlplane.edge_wire import EdgeCredentials
from twisted_iop.controlplane.http_routes import HttpSettings
from twisted_iop.controlplane.registry import RegistryLimits
from twisted_iop.endpoints import EndpointError, listen_endpoint
from twisted_iop.ids import id_problem
from twisted_iop.wire.peer import PeerSettings

DEFAULT_HTTP_LISTEN = "tcp:8080:interface=127.0.0.1"
DEFAULT_WIRE_LISTEN = "tcp:8081:interface=127.0.0.1"
DEFAULT_EDGE_WIRE_LISTEN = "tcp:7443:interface=127.0.0.1"

#: Environment variables that override the listen addresses.
ENV_OVERRIDES = {
    "IOP_HTTP_LISTEN": ("http", "listen"),
    "IOP_WIRE_LISTEN": ("client_wire", "listen"),
    "IOP_EDGE_WIRE_LISTEN": ("edge_wire", "listen"),
}


@attrs.frozen
class ControlPlaneConfig:
    """Everything the Control Plane needs to start."""

    http_listen: str = DEFAULT_HTTP_LISTEN
    wire_listen: str = DEFAULT_WIRE_LISTEN
    edge_wire_listen: str = DEFAULT_EDGE_WIRE_LISTEN
    http: HttpSettings = HttpSettings()
    client_wire: ClientWireSettings = ClientWireSettings()
    edge_wire: PeerSettings = PeerSettings()
    credentials: EdgeCredentials = EdgeCredentials()
    registry: RegistryLimits = RegistryLimits()
    status_timeout_seconds: float = 5.0
    #: How long a finished fleet round serves later views and pages.
    fleet_max_age_seconds: float = 1.0


def load_config(path: Optional[str], environ: Mapping[str, str] = os.environ) -> ControlPlaneConfig:
    """Read ``path`` (or the embedded defaults) and apply the environment."""
    return config_from_mapping(load_yaml_mapping(path), environ)


def config_from_text(text: str, environ: Mapping[str, str] = {}) -> ControlPlaneConfig:
    """Parse a YAML document (for tests and tools)."""
    return config_from_mapping(parse_yaml_mapping(text), environ)


def config_from_mapping(data: dict, environ: Mapping[str, str] = {}) -> ControlPlaneConfig:
    """Build the config from parsed YAML plus environment overrides."""
    root = Section(data, "")
    root.reject_unknown({"http", "client_wire", "edge_wire", "registry", "status"})
    http = root.section("http")
    http.reject_unknown(
        {
            "listen",
            "api_token",
            "status_timeout_seconds",
            "default_command_timeout_seconds",
            "max_command_timeout_seconds",
            "max_body_bytes",
        }
    )
    wire = root.section("client_wire")
    wire.reject_unknown(
        {
            "listen",
            "public_url",
            "max_message_bytes",
            "auto_ping_interval_seconds",
            "auto_ping_timeout_seconds",
            "subscriber_queue",
        }
    )
    edge = root.section("edge_wire")
    edge.reject_unknown(
        {
            "listen",
            "max_frame_bytes",
            "hello_timeout_seconds",
            "keepalive_interval_seconds",
            "keepalive_deadline_seconds",
            "request_timeout_seconds",
            "credentials",
            "shared_credential",
        }
    )
    status = root.section("status")
    status.reject_unknown({"fleet_max_age_seconds"})
    reg = root.section("registry")
    reg.reject_unknown({"events_per_edge", "fleet_events", "operations_per_edge", "disconnected_edges"})

    listens = {
        ("http", "listen"): http.listen("listen", DEFAULT_HTTP_LISTEN),
        ("client_wire", "listen"): wire.listen("listen", DEFAULT_WIRE_LISTEN),
        ("edge_wire", "listen"): edge.listen("listen", DEFAULT_EDGE_WIRE_LISTEN),
    }
    for variable, field in ENV_OVERRIDES.items():
        value = environ.get(variable)
        if value:
            try:
                listens[field] = listen_endpoint(value)
            except EndpointError as e:
                raise ConfigError(f"{variable}: {e}") from None

    api_token = http.string("api_token")
    max_timeout = http.number("max_command_timeout_seconds", 300.0)
    default_timeout = http.number("default_command_timeout_seconds", 10.0)
    if default_timeout > max_timeout:
        raise ConfigError("http.default_command_timeout_seconds: must not exceed max_command_timeout_seconds")
    wire_listen = listens[("client_wire", "listen")]
    http_settings = HttpSettings(
        api_token=api_token,
        default_command_timeout_seconds=default_timeout,
        max_command_timeout_seconds=max_timeout,
        max_body_bytes=http.integer("max_body_bytes", 65536, minimum=1024),
        wire_public_url=wire.string("public_url"),
        wire_port=_port_of(wire_listen),
    )
    client_wire = ClientWireSettings(
        max_message_bytes=wire.integer("max_message_bytes", 1024 * 1024, minimum=1024),
        auto_ping_interval_seconds=wire.number("auto_ping_interval_seconds", 20.0),
        auto_ping_timeout_seconds=wire.number("auto_ping_timeout_seconds", 10.0),
        subscriber_queue=wire.integer("subscriber_queue", 1000, minimum=1),
        api_token=api_token,
    )
    interval = edge.number("keepalive_interval_seconds", 15.0)
    deadline = edge.number("keepalive_deadline_seconds", 45.0)
    if deadline <= interval:
        raise ConfigError("edge_wire.keepalive_deadline_seconds: must be greater than keepalive_interval_seconds")
    edge_settings = PeerSettings(
        max_frame_bytes=edge.integer("max_frame_bytes", 4 * 1024 * 1024, minimum=1024, maximum=2**31 - 1),
        hello_timeout_seconds=edge.number("hello_timeout_seconds", 10.0),
        keepalive_interval_seconds=interval,
        keepalive_deadline_seconds=deadline,
        request_timeout_seconds=edge.number("request_timeout_seconds", 10.0),
    )
    per_edge = edge.string_map("credentials")
    for edge_id in per_edge:
        problem = id_problem("edge_id", edge_id)
        if problem is not None:
            raise ConfigError(f"edge_wire.credentials: {problem}")
    credentials = EdgeCredentials(per_edge=per_edge, shared=edge.string("shared_credential"))
    limits = RegistryLimits(
        events_per_edge=reg.integer("events_per_edge", 1000, minimum=1),
        fleet_events=reg.integer("fleet_events", 10000, minimum=1),
        operations_per_edge=reg.integer("operations_per_edge", 500, minimum=1),
        disconnected_edges=reg.integer("disconnected_edges", 10000, minimum=0),
    )
    return ControlPlaneConfig(
        http_listen=listens[("http", "listen")],
        wire_listen=wire_listen,
        edge_wire_listen=listens[("edge_wire", "listen")],
        http=http_settings,
        client_wire=client_wire,
        edge_wire=edge_settings,
        credentials=credentials,
        registry=limits,
        status_timeout_seconds=http.number("status_timeout_seconds", 5.0),
        fleet_max_age_seconds=status.number("fleet_max_age_seconds", 1.0, minimum=0.0, exclusive_minimum=False),
    )


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
