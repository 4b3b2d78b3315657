"""control-plane.yaml parsing, environment overrides and service wiring."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from twisted.internet.testing import MemoryReactor
from twisted.python import usage

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text, load_config
from twisted_iop.endpoints import EndpointError, connect_endpoint, listen_endpoint

ROOT = Path(__file__).resolve().parents[2]


def test_embedded_defaults_bind_loopback() -> None:
    """With no file, every listener binds 127.0.0.1 on its default port."""
    config = load_config(None, {})
    assert config.http_listen == "tcp:8080:interface=127.0.0.1"
    assert config.wire_listen == "tcp:8081:interface=127.0.0.1"
    assert config.edge_wire_listen == "tcp:7443:interface=127.0.0.1"
    assert config.edge_wire.max_frame_bytes == 4 * 1024 * 1024


def test_sample_config_matches_defaults() -> None:
    """configs/control-plane.yaml spells out exactly the embedded defaults."""
    assert load_config(str(ROOT / "configs" / "control-plane.yaml"), {}) == load_config(None, {})


def test_environment_overrides_listeners() -> None:
    """IOP_*_LISTEN variables win over the file and accept every form."""
    config = load_config(
        None,
        {"IOP_EDGE_WIRE_LISTEN": "tcp:17443", "IOP_HTTP_LISTEN": ":18080", "IOP_WIRE_LISTEN": "0.0.0.0:18081"},
    )
    assert config.edge_wire_listen == "tcp:17443"
    assert config.http_listen == "tcp:18080:interface=127.0.0.1"
    assert config.wire_listen == "tcp:18081:interface=0.0.0.0"
    assert config.http.wire_port == 18081


@pytest.mark.parametrize(
    "text, field",
    [
        ("http: [1, 2]", "http"),
        ("htp: {}", "htp"),
        ("http: {listen: 'nonsense'}", "http.listen"),
        ("edge_wire: {max_frame_bytes: -5}", "edge_wire.max_frame_bytes"),
        ("edge_wire: {max_frame_bytes: 'big'}", "edge_wire.max_frame_bytes"),
        ("edge_wire: {keepalive_interval_seconds: 50, keepalive_deadline_seconds: 10}", "keepalive_deadline_seconds"),
        ("edge_wire: {credentials: {'bad id': 'x'}}", "edge_wire.credentials"),
        ("registry: {events_per_edge: 0}", "registry.events_per_edge"),
        ("http: {status_timeout_seconds: 0}", "http.status_timeout_seconds"),
        ("status: {fleet_max_age_seconds: -1}", "status.fleet_max_age_seconds"),
        ("status: {fleet_max_age_seconds: soon}", "status.fleet_max_age_seconds"),
        ("status: {max_age: 1}", "status.max_age"),
        ("- just a list", "top level"),
        ("http: {listen: [", "not valid YAML"),
    ],
)
def test_bad_config_names_the_field(text: str, field: str) -> None:
    """Every bad value fails with a message naming its field."""
    with pytest.raises(ConfigError) as info:
        config_from_text(text)
    assert field in str(info.value)


def test_fleet_max_age_is_parsed_and_reaches_the_gateway() -> None:
    """status.fleet_max_age_seconds defaults to 1 s, may be 0, and is what the gateway uses."""
    assert config_from_text("").fleet_max_age_seconds == 1.0
    config = config_from_text("status: {fleet_max_age_seconds: 0}")
    assert config.fleet_max_age_seconds == 0.0
    service = tap.ControlPlaneService(config_from_text("status: {fleet_max_age_seconds: 2.5}"), MemoryReactor())
    assert service.gateway.fleet_max_age_seconds == 2.5


def test_bad_environment_value_names_the_variable() -> None:
    """A bad IOP_HTTP_LISTEN names the variable."""
    with pytest.raises(ConfigError, match="IOP_HTTP_LISTEN"):
        load_config(None, {"IOP_HTTP_LISTEN": "what"})


def test_missing_config_file_is_a_usage_error(tmp_path: Path) -> None:
    """--config pointing nowhere fails option parsing with the path in the message."""
    options = tap.Options()
    with pytest.raises(usage.UsageError, match="cannot read config file"):
        options.parseOptions(["--config", str(tmp_path / "missing.yaml")])


def test_endpoint_forms() -> None:
    """host:port and :port become Twisted endpoint strings; junk is refused."""
    assert listen_endpoint("127.0.0.1:80") == "tcp:80:interface=127.0.0.1"
    assert listen_endpoint("[::1]:80") == "tcp:80:interface=\\:\\:1"
    assert listen_endpoint("unix:/tmp/x.sock") == "unix:/tmp/x.sock"
    assert connect_endpoint("cp.example:7443") == "tcp:host=cp.example:port=7443"
    for bad in ("", "80", "host:99999", "a:b:c"):
        with pytest.raises(EndpointError):
            listen_endpoint(bad)


def test_make_service_listens_where_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    """makeService composes registry first, then three listeners on the configured ports."""
    monkeypatch.setenv("IOP_EDGE_WIRE_LISTEN", "tcp:17443:interface=127.0.0.1")
    monkeypatch.setenv("IOP_HTTP_LISTEN", "tcp:18080:interface=127.0.0.1")
    monkeypatch.delenv("IOP_WIRE_LISTEN", raising=False)
    threshold = gc.get_threshold()
    options = tap.Options()
    options.parseOptions([])
    reactor = MemoryReactor()
    service = tap.makeService(options, reactor=reactor)
    assert [s.name for s in service][0] == "registry"
    service.privilegedStartService()
    service.startService()
    ports = sorted((port, interface) for port, _, _, interface in reactor.tcpServers)
    assert ports == [(8081, "127.0.0.1"), (17443, "127.0.0.1"), (18080, "127.0.0.1")]
    assert {backlog for _, _, backlog, _ in reactor.tcpServers} == {1024}
    assert service.readiness.ready
    service.stopService()
    # makeService tunes the collector for the daemon; undo it for this process.
    gc.unfreeze()
    gc.set_threshold(*threshold)
