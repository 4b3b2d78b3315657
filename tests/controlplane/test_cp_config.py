"""control-plane.yaml parsing, environment overrides and service wiring."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path
from typing import cast

import attrs
import pytest
import pytest_twisted
from twisted.internet.testing import MemoryReactorClock
from twisted.logger import ILogObserver, formatEvent, globalLogPublisher

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text, load_config, unauthenticated_exposures
from twisted_iop.daemon import ConfigurationExit
from twisted_iop.endpoints import EndpointError, connect_endpoint, listen_endpoint
from twisted_iop.listeners import DEFAULT_BACKLOG
from twisted_iop.testing.harness import self_signed, start_control_plane

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
    sample = load_config(str(ROOT / "configs" / "control-plane.yaml"), {})
    assert sample.notices == ()
    assert attrs.evolve(sample, source_path=None) == load_config(None, {})


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
    ("text", "field"),
    [
        ("http: [1, 2]", "http"),
        ("htp: {}", "htp"),
        ("http: {listen: 'nonsense'}", "http.listen"),
        ("edge_wire: {max_frame_bytes: -5}", "edge_wire.max_frame_bytes"),
        ("edge_wire: {max_frame_bytes: 'big'}", "edge_wire.max_frame_bytes"),
        ("edge_wire: {keepalive_interval_seconds: 50, keepalive_deadline_seconds: 10}", "keepalive_deadline_seconds"),
        (
            "edge_wire: {keepalive: {interval_seconds: 50, deadline_seconds: 10}}",
            "edge_wire.keepalive.deadline_seconds",
        ),
        ("edge_wire: {keepalive: {interval: 5}}", "edge_wire.keepalive.interval: unknown setting"),
        ("client_wire: {keepalive: {interval_seconds: 'x'}}", "client_wire.keepalive.interval_seconds"),
        (
            "edge_wire: {keepalive: {interval_seconds: 5}, keepalive_interval_seconds: 5}",
            "edge_wire.keepalive_interval_seconds: give either",
        ),
        ("http: {listen: 'tcp:http'}", "http.listen: cannot use 'tcp:http': the port must be a number"),
        ("http: {listen: 'tcp:99999'}", "http.listen: cannot use 'tcp:99999'"),
        (
            "http: {listen: 'tcp:80:interface=cp.example'}",
            "http.listen: cannot use 'tcp:80:interface=cp.example': interface",
        ),
        ("client_wire: {listen: 'unix:/nonexistent-iop/x.sock'}", "client_wire.listen: cannot use 'unix:/nonexist"),
        ("edge_wire: {credentials: {'bad id': 'x'}}", "edge_wire.credentials"),
        ("registry: {events_per_edge: 0}", "registry.events_per_edge"),
        ("http: {status_timeout_seconds: 0}", "http.status_timeout_seconds"),
        ("http: {engine_command_timeout_seconds: 301}", "http.engine_command_timeout_seconds: must not exceed"),
        ("http: {engine_command_timeout_seconds: 0}", "http.engine_command_timeout_seconds"),
        ("status: {fleet_max_age_seconds: -1}", "status.fleet_max_age_seconds"),
        ("status: {fleet_max_age_seconds: soon}", "status.fleet_max_age_seconds"),
        ("status: {max_age: 1}", "status.max_age"),
        ("shutdown: {grace_seconds: -1}", "shutdown.grace_seconds"),
        ("shutdown: {grace_seconds: 601}", "shutdown.grace_seconds: must be at most 600"),
        ("shutdown: {grace: 5}", "shutdown.grace: unknown setting"),
        ("edge_wire: {max_violations: 0}", "edge_wire.max_violations"),
        ("edge_wire: {max_frame_bytes: 2048, max_hello_frame_bytes: 4096}", "edge_wire.max_hello_frame_bytes"),
        ("client_wire: {hello_timeout_seconds: 0}", "client_wire.hello_timeout_seconds"),
        ("client_wire: {max_violations: many}", "client_wire.max_violations"),
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
    service = tap.ControlPlaneService(config_from_text("status: {fleet_max_age_seconds: 2.5}"), MemoryReactorClock())
    assert service.gateway.fleet_max_age_seconds == 2.5


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    """A bad IOP_HTTP_LISTEN names the variable and the field it overrides, not the file."""
    path = tmp_path / "cp.yaml"
    path.write_text("http: {listen: 'tcp:8080'}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {"IOP_HTTP_LISTEN": "tcp:web"})
    assert str(info.value).startswith("environment variable IOP_HTTP_LISTEN (overrides http.listen): ")
    assert str(path) not in str(info.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    """An error read from a file starts with the file's path, then the dotted field."""
    path = tmp_path / "cp.yaml"
    path.write_text("registry: {events_per_edge: 0}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: registry\.events_per_edge: must be at least 1, not 0$"):
        load_config(str(path), {})


def test_older_keepalive_spelling_is_read_with_a_notice() -> None:
    """The flat keepalive keys of earlier sample configs still work, and say what to write instead."""
    config = config_from_text(
        "edge_wire: {keepalive_interval_seconds: 5, keepalive_deadline_seconds: 20}\n"
        "client_wire: {auto_ping_interval_seconds: 4, auto_ping_timeout_seconds: 2}\n"
    )
    nested = config_from_text(
        "edge_wire: {keepalive: {interval_seconds: 5, deadline_seconds: 20}}\n"
        "client_wire: {keepalive: {interval_seconds: 4, deadline_seconds: 6}}\n"
    )
    assert attrs.evolve(config, notices=()) == nested
    assert nested.notices == ()
    assert nested.client_wire.auto_ping_timeout_seconds == 2
    assert [n.split(" ", 1)[0] for n in config.notices] == [
        "client_wire.auto_ping_interval_seconds",
        "edge_wire.keepalive_interval_seconds",
    ]


def test_service_logs_the_notices_of_its_config(tmp_path: Path) -> None:
    """A config with an older spelling starts, and its service carries the notice to log at start-up."""
    path = tmp_path / "cp.yaml"
    path.write_text("client_wire: {auto_ping_interval_seconds: 4}\n")
    options = tap.Options()
    options.parseOptions(["--config", str(path)])
    service = tap.makeService(options, reactor=MemoryReactorClock())
    assert len(service.notices) == 1 and "client_wire.keepalive: {interval_seconds: 4" in service.notices[0]
    assert service.config.client_wire.auto_ping_interval_seconds == 4


def test_missing_config_file_exits_with_one_line(tmp_path: Path) -> None:
    """--config pointing nowhere ends option parsing with the path in one line."""
    options = tap.Options()
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigurationExit) as info:
        options.parseOptions(["--config", str(missing)])
    assert str(info.value) == f"iop-control-plane: {missing}: cannot read the config file: No such file or directory"


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
    """makeService composes the store and the registry first, then three listeners on the configured ports."""
    monkeypatch.setenv("IOP_STORE_BACKEND", "memory")
    monkeypatch.setenv("IOP_EDGE_WIRE_LISTEN", "tcp:17443:interface=127.0.0.1")
    monkeypatch.setenv("IOP_HTTP_LISTEN", "tcp:18080:interface=127.0.0.1")
    monkeypatch.delenv("IOP_WIRE_LISTEN", raising=False)
    threshold = gc.get_threshold()
    options = tap.Options()
    options.parseOptions([])
    reactor = MemoryReactorClock()
    service = tap.makeService(options, reactor=reactor)
    assert [s.name for s in service][:2] == ["store", "registry"]
    service.privilegedStartService()
    service.startService()
    ports = sorted((port, interface) for port, _, _, interface in reactor.tcpServers)
    assert ports == [(8081, "127.0.0.1"), (17443, "127.0.0.1"), (18080, "127.0.0.1")]
    assert {backlog for _, _, backlog, _ in reactor.tcpServers} == {DEFAULT_BACKLOG}
    assert service.readiness.ready
    service.stopService()
    # makeService tunes the collector for the daemon; undo it for this process.
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_tokens_with_roles_and_digests() -> None:
    """http.tokens takes named tokens with roles, as secrets or SHA-256 digests; api_token is an operator."""
    digest = hashlib.sha256(b"viewer-secret-0123").hexdigest()
    config = config_from_text(
        "http:\n"
        "  api_token: legacy-secret\n"
        "  tokens:\n"
        "    - {name: ops, role: operator, token: operator-secret-01}\n"
        f"    - {{name: dash, role: viewer, sha256: {digest}}}\n"
    )
    tokens = config.http.tokens
    assert config.client_wire.tokens == tokens
    assert [(t.name, t.role) for t in tokens.tokens] == [
        ("api_token", "operator"),
        ("ops", "operator"),
        ("dash", "viewer"),
    ]
    dash = tokens.identify(b"viewer-secret-0123")
    assert dash is not None and dash.name == "dash" and not dash.may("operator") and dash.may("viewer")
    assert tokens.identify(b"operator-secret-01") is not None
    assert tokens.identify(b"legacy-secret") is not None
    assert tokens.identify(b"nope") is None
    assert "operator-secret" not in repr(config)


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (
            "[{name: a, role: admin, token: 0123456789abcdef}]",
            r"http.tokens\[0\].role: must be one of viewer, operator",
        ),
        ("[{name: a, role: viewer}]", r"http.tokens\[0\].token: give exactly one of token and sha256"),
        ("[{name: a, role: viewer, token: short}]", r"http.tokens\[0\].token: must be at least 16 characters"),
        ("[{name: a, role: viewer, sha256: abc}]", r"http.tokens\[0\].sha256: must be 64 hex digits"),
        (
            "[{name: a, role: viewer, token: 0123456789abcdef}, {name: a, role: viewer, token: 0123456789abcdeg}]",
            r"http.tokens\[1\].name: token name 'a' is used twice",
        ),
        ("{name: a}", r"http.tokens: must be a list"),
    ],
)
def test_bad_tokens_name_the_field(tokens: str, message: str) -> None:
    """Every bad token entry is reported with its dotted field."""
    with pytest.raises(ConfigError, match=message):
        config_from_text(f"http:\n  tokens: {tokens}\n")


def test_http_site_limits_are_configurable() -> None:
    """The HTTP listener's deadlines, caps and allowed host names come from http.*."""
    config = config_from_text(
        "http:\n  header_timeout_seconds: 3\n  max_connections: 10\n  max_connections_per_address: 2\n"
        "  allowed_hosts: [iop.example.org]\n  max_body_bytes: 2048\n"
    )
    limits = config.http_site
    assert (limits.header_timeout_seconds, limits.max_connections, limits.max_connections_per_address) == (3, 10, 2)
    assert limits.allowed_hosts == ("iop.example.org",)
    assert limits.max_body_bytes == config.http.max_body_bytes == 2048


def test_exposed_listeners_without_authentication_are_named() -> None:
    """Listeners bound beyond loopback without tokens or edge credentials are reported for a loud warning."""
    assert unauthenticated_exposures(load_config(None, {})) == []
    exposed = load_config(None, {"IOP_HTTP_LISTEN": "0.0.0.0:8080", "IOP_EDGE_WIRE_LISTEN": "tcp:7443"})
    found = unauthenticated_exposures(exposed)
    assert len(found) == 2
    assert found[0].startswith("http.listen") and found[1].startswith("edge_wire.listen")
    guarded = config_from_text(
        "http: {api_token: a-long-operator-secret}\nedge_wire: {shared_credential: s}\n",
        {"IOP_HTTP_LISTEN": "0.0.0.0:8080", "IOP_EDGE_WIRE_LISTEN": "tcp:7443"},
    )
    assert unauthenticated_exposures(guarded) == []


def test_console_uses_wss_when_the_client_wire_is_tls(tmp_path: Path) -> None:
    """A TLS client-wire listener makes the console's wire URL wss://."""
    assert not load_config(None, {}).http.wire_tls
    key, cert = self_signed(tmp_path)
    config = load_config(None, {"IOP_WIRE_LISTEN": f"ssl:8443:privateKey={key}:certKey={cert}:interface=127.0.0.1"})
    assert config.http.wire_tls


def test_stop_and_wire_limits_reach_the_services() -> None:
    """shutdown.grace_seconds and the wire limits are read and used by the service they configure."""
    assert config_from_text("").shutdown.grace_seconds == 10.0
    config = config_from_text(
        "shutdown: {grace_seconds: 3}\n"
        "edge_wire: {max_hello_frame_bytes: 4096, max_violations: 3}\n"
        "client_wire: {hello_timeout_seconds: 2, max_violations: 4}"
    )
    service = tap.ControlPlaneService(config, MemoryReactorClock())
    assert service.grace_seconds == 3.0
    assert service.edge_factory.settings.max_hello_frame_bytes == 4096
    assert service.edge_factory.settings.max_violations == 3
    assert config.client_wire.hello_timeout_seconds == 2.0 and config.client_wire.max_violations == 4


async def _access_lines(enabled: bool) -> list[str]:
    """The log lines of one GET /healthz on a Control Plane with http.access_log ``enabled``."""
    cp = await start_control_plane(config_text=f"http: {{access_log: {str(enabled).lower()}}}")
    lines: list[str] = []
    observer = cast(ILogObserver, lambda event: lines.append(formatEvent(event)))
    globalLogPublisher.addObserver(observer)
    try:
        code, _ = await cp.get_json("/healthz")
        assert code == 200
        await cp.stop()
    finally:
        globalLogPublisher.removeObserver(observer)
    return lines


@pytest_twisted.ensureDeferred
async def test_the_access_log_can_be_turned_off() -> None:
    """http.access_log: true (the default) writes one line per request;
    false writes none, and the request is served the same."""
    assert config_from_text("").http_access_log is True
    for enabled in (True, False):
        lines = await _access_lines(enabled)
        assert any('"GET /healthz HTTP/1.1" 200' in line for line in lines) is enabled


def test_engine_commands_get_their_own_default_deadline() -> None:
    """provider.restart and provider.start wait for a model to load: 300 s by
    default (at most the maximum), every other command the general default."""
    settings = config_from_text("").http
    assert settings.command_timeout("provider.restart") == settings.command_timeout("provider.start") == 300.0
    assert settings.command_timeout("node.drain") == settings.command_timeout("provider.stop") == 10.0
    capped = config_from_text("http: {max_command_timeout_seconds: 60}").http
    assert capped.command_timeout("provider.restart") == 60.0
    chosen = config_from_text("http: {engine_command_timeout_seconds: 120, default_command_timeout_seconds: 5}")
    assert chosen.http.command_timeout("provider.start") == 120.0
    assert chosen.http.command_timeout("edge.reload") == 5.0
