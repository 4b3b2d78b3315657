"""edge.yaml parsing: defaults, overrides and errors that name the field."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from twisted_iop.configuration import ConfigError, EnvironmentConfigError
from twisted_iop.credentials import token_digest
from twisted_iop.edge.config import load_edge_config, parse_edge_config
from twisted_iop.edge.config import unauthenticated_exposures as edge_unauthenticated_exposures
from twisted_iop.node.config import parse_node_config
from twisted_iop.node.config import unauthenticated_exposures as node_unauthenticated_exposures
from twisted_iop.testing.configs import edge_mapping, node_yaml

REPO = Path(__file__).resolve().parents[2]


def test_sample_config_parses() -> None:
    """configs/edge.yaml is valid and matches the Control Plane defaults."""
    config = load_edge_config(str(REPO / "configs" / "edge.yaml"), environ={})
    assert config.control_plane.address == "tcp:host=127.0.0.1:port=7443"
    assert config.node_server.listen == "tcp:7444:interface=127.0.0.1"
    assert [n.node_id for n in config.nodes] == ["node-1", "node-2"]
    assert config.metrics_listen == "tcp:9101:interface=127.0.0.1"
    assert config.source_path is not None


def test_values_are_read() -> None:
    """Every section reaches the frozen config."""
    config = parse_edge_config(
        edge_mapping(backoff={"initial_seconds": 0.1, "max_seconds": 2}, outbox_size=5, outbox_bytes=70000)
    )
    assert config.control_plane.edge_id == "edge-a"
    assert config.control_plane.backoff.initial_seconds == 0.1
    assert config.control_plane.backoff.max_seconds == 2
    assert config.control_plane.outbox_size == 5
    assert config.control_plane.outbox_bytes == 70000
    assert config.control_plane.labels == {"site": "lab"}
    node2 = config.node("node-2")
    assert node2 is not None and node2.credentials == (token_digest(b"s3cret"),)
    assert node2.providers[0].models == ("llama-3-8b", "qwen-2-7b")
    assert node2.providers[0].long_context_capacity == 2


def test_credential_not_in_repr() -> None:
    """Credentials never show up in a config's repr (and so in logs)."""
    config = parse_edge_config(edge_mapping(credential="topsecret"))
    assert "topsecret" not in repr(config)
    assert "s3cret" not in repr(config)


def test_environment_overrides_addresses() -> None:
    """IOP_CONTROL_PLANE_EDGE_WIRE and IOP_EDGE_NODE_LISTEN win over the file."""
    config = parse_edge_config(
        edge_mapping(),
        {"IOP_CONTROL_PLANE_EDGE_WIRE": "10.0.0.1:9000", "IOP_EDGE_NODE_LISTEN": ":9001"},
    )
    assert config.control_plane.address == "tcp:host=10.0.0.1:port=9000"
    assert config.node_server.listen == "tcp:9001:interface=127.0.0.1"


def _addresses(value: Any) -> dict[str, Any]:
    """:func:`edge_mapping` with ``control_plane.addresses: value`` instead of ``address``."""
    data = edge_mapping()
    del data["control_plane"]["address"]
    data["control_plane"]["addresses"] = value
    return data


def test_addresses_list_is_read_in_order() -> None:
    """control_plane.addresses takes host:port and endpoint strings, normalized, in the configured order."""
    config = parse_edge_config(_addresses(["10.0.0.2:7443", "tcp:host=10.0.0.1:port=7443", "cp-3.example:7443"]))
    assert config.control_plane.addresses == (
        "tcp:host=10.0.0.2:port=7443",
        "tcp:host=10.0.0.1:port=7443",
        "tcp:host=cp-3.example:port=7443",
    )
    assert config.control_plane.address == "tcp:host=10.0.0.2:port=7443"


def test_single_address_is_a_list_of_one() -> None:
    """The old control_plane.address still works, and so does leaving it out (the default)."""
    assert parse_edge_config(edge_mapping(address="10.0.0.5:9000")).control_plane.addresses == (
        "tcp:host=10.0.0.5:port=9000",
    )
    data = edge_mapping()
    del data["control_plane"]["address"]
    assert parse_edge_config(data).control_plane.addresses == ("tcp:host=127.0.0.1:port=7443",)


def test_environment_may_list_several_addresses() -> None:
    """IOP_CONTROL_PLANE_EDGE_WIRE holds one address or a comma-separated list; it wins over the file."""
    config = parse_edge_config(
        _addresses(["10.0.0.9:1"]), {"IOP_CONTROL_PLANE_EDGE_WIRE": "10.0.0.1:9000, tcp:host=10.0.0.2:port=9000"}
    )
    assert config.control_plane.addresses == ("tcp:host=10.0.0.1:port=9000", "tcp:host=10.0.0.2:port=9000")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "10.0.0.1:1,",
            r"^environment variable IOP_CONTROL_PLANE_EDGE_WIRE \(overrides control_plane.address\): "
            r"entry 2: empty address$",
        ),
        ("10.0.0.1:1,nowhere", r"^environment variable IOP_CONTROL_PLANE_EDGE_WIRE .*: entry 2: cannot understand"),
        ("10.0.0.1:1,10.0.0.1:1", r"entry 2: '10.0.0.1:1' is listed twice \(also .*entry 1\)$"),
    ],
)
def test_bad_environment_list_names_the_variable_and_entry(value: str, message: str) -> None:
    """A bad entry of the environment's list is one line naming the variable and the entry."""
    with pytest.raises(EnvironmentConfigError, match=message):
        parse_edge_config(edge_mapping(), {"IOP_CONTROL_PLANE_EDGE_WIRE": value})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], r"^control_plane.addresses: list at least one address$"),
        ("10.0.0.1:7443", r"^control_plane.addresses: must be a list of addresses"),
        ({"a": "10.0.0.1:7443"}, r"^control_plane.addresses: must be a list of addresses"),
        (None, r"^control_plane.addresses: must be a list of addresses"),
        (["10.0.0.1:1", "10.0.0.2:1", 7443], r"^control_plane.addresses\[2\]: must be an address string, not 7443$"),
        (
            ["10.0.0.1:1", "10.0.0.2:1", "nowhere"],
            r"^control_plane.addresses\[2\]: cannot understand address 'nowhere'",
        ),
        (["10.0.0.1:1", " "], r"^control_plane.addresses\[1\]: empty address$"),
        (["10.0.0.1:http"], r"^control_plane.addresses\[0\]: "),
        (
            ["10.0.0.1:1", "10.0.0.2:1", "tcp:host=10.0.0.1:port=1"],
            r"^control_plane.addresses\[2\]: 'tcp:host=10.0.0.1:port=1' is listed twice "
            r"\(also control_plane.addresses\[0\]\)$",
        ),
        ([f"10.0.0.1:{port}" for port in range(1, 66)], r"^control_plane.addresses: at most 64 addresses, not 65$"),
    ],
)
def test_bad_addresses_give_one_line_naming_the_field(value: Any, message: str) -> None:
    """Each bad form of control_plane.addresses is one error line naming the dotted field (and entry)."""
    with pytest.raises(ConfigError, match=message) as caught:
        parse_edge_config(_addresses(value))
    assert "\n" not in str(caught.value)


def test_address_and_addresses_together_is_an_error() -> None:
    """Giving both forms is a config error naming the field, not a silent choice."""
    data = edge_mapping(addresses=["10.0.0.2:7443"])
    with pytest.raises(ConfigError, match=r"^control_plane.addresses: give either address or addresses, not both"):
        parse_edge_config(data)


def test_config_addresses_must_start_with_address() -> None:
    """The frozen config keeps address and addresses consistent: address is the first of the list."""
    config = parse_edge_config(_addresses(["10.0.0.2:7443", "10.0.0.3:7443"]))
    with pytest.raises(ValueError, match="addresses must start with address"):
        attrs.evolve(config.control_plane, address="tcp:host=10.0.0.3:port=7443")


def _with(path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(edge_mapping())
    target: Any = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["control_plane", "edge_id"], "bad id!", "control_plane.edge_id"),
        (["control_plane", "edge_id"], None, "control_plane.edge_id: required"),
        (["control_plane", "address"], "nowhere", "control_plane.address"),
        (["control_plane", "outbox_size"], 0, "control_plane.outbox_size"),
        (["control_plane", "outbox_bytes"], 1000, "control_plane.outbox_bytes"),
        (["control_plane", "backoff"], {"initial_seconds": 5, "max_seconds": 1}, "control_plane.backoff.max_seconds"),
        (
            ["control_plane", "keepalive"],
            {"interval_seconds": 5, "deadline_seconds": 5},
            "control_plane.keepalive.deadline_seconds",
        ),
        (["control_plane", "typo"], 1, "control_plane.typo: unknown setting"),
        (["node_server", "listen"], "what", "node_server.listen"),
        (["nodes", 0, "node_id"], "", "nodes[0].node_id"),
        (["nodes", 1, "node_id"], "node-1", "nodes[1].node_id: 'node-1' is listed twice"),
        (["nodes", 0, "providers", 0, "kind"], "triton", "nodes[0].providers[0].kind"),
        (["nodes", 0, "providers", 0, "capacity"], -1, "nodes[0].providers[0].capacity"),
        (["nodes", 0, "providers", 0, "capacity"], "four", "nodes[0].providers[0].capacity: must be a whole number"),
        (["nodes", 0, "providers", 0, "models"], [], "nodes[0].providers[0].models"),
        (["nodes"], {"node-1": {}}, "nodes: must be a list"),
        (["metrics"], {"listen": "what"}, "metrics.listen"),
        (["metrics"], {"listen": "tcp:99999"}, "metrics.listen"),
        (["metrics"], {"port": 9101}, "metrics.port: unknown setting"),
        (["metrics"], "9101", "metrics"),
    ],
)
def test_bad_values_name_their_field(path: list[Any], value: Any, field: str) -> None:
    """A bad value fails with the dotted name of its field."""
    with pytest.raises(ConfigError) as caught:
        parse_edge_config(_with(path, value))
    assert field in str(caught.value)


def test_credentials_section_must_name_known_nodes() -> None:
    """node_server.credentials for a node that is not configured is an error."""
    data = edge_mapping()
    data["node_server"]["credentials"] = {"node-9": "x"}
    with pytest.raises(ConfigError, match=r"node_server.credentials.node-9"):
        parse_edge_config(data)


def test_credentials_section_applies() -> None:
    """node_server.credentials gives a node its credential."""
    data = edge_mapping()
    data["node_server"]["credentials"] = {"node-1": "k1"}
    node = parse_edge_config(data).node("node-1")
    assert node is not None and node.credentials == (token_digest(b"k1"),)


def test_missing_file_is_config_error(tmp_path: Path) -> None:
    """A config path that does not exist is a ConfigError, not an OSError."""
    with pytest.raises(ConfigError, match=re.escape("absent.yaml: cannot read the config file")):
        load_edge_config(str(tmp_path / "absent.yaml"), environ={})


def test_stop_and_node_wire_limits_are_read() -> None:
    """shutdown.grace_seconds and node_server's hello frame and violation limits reach the config."""
    data = edge_mapping()
    data["shutdown"] = {"grace_seconds": 0}
    data["node_server"] = {"max_hello_frame_bytes": 2048, "max_violations": 2}
    config = parse_edge_config(data)
    assert config.shutdown.grace_seconds == 0.0
    settings = config.node_server.peer_settings()
    assert settings.max_hello_frame_bytes == 2048 and settings.max_violations == 2
    data["node_server"] = {"max_violations": 0}
    with pytest.raises(ConfigError, match=re.escape("node_server.max_violations")):
        parse_edge_config(data)


def test_metrics_listen_default_override_and_off() -> None:
    """metrics.listen defaults to 127.0.0.1:9101, IOP_EDGE_METRICS_LISTEN wins, "" turns it off."""
    assert parse_edge_config(edge_mapping(), {}).metrics_listen == "tcp:9101:interface=127.0.0.1"
    data = edge_mapping()
    data["metrics"] = {"listen": ":9200"}
    assert parse_edge_config(data, {}).metrics_listen == "tcp:9200:interface=127.0.0.1"
    assert parse_edge_config(data, {"IOP_EDGE_METRICS_LISTEN": "tcp:0"}).metrics_listen == "tcp:0"
    data["metrics"] = {"listen": ""}
    assert parse_edge_config(data, {}).metrics_listen == ""
    with pytest.raises(ConfigError, match=r"IOP_EDGE_METRICS_LISTEN \(overrides metrics.listen\)"):
        parse_edge_config(data, {"IOP_EDGE_METRICS_LISTEN": "nowhere"})


def test_exposed_listeners_without_authentication_are_named() -> None:
    """Edge listeners beyond loopback without credentials, keys or TLS are reported for a loud warning."""
    assert edge_unauthenticated_exposures(parse_edge_config(edge_mapping(), {})) == []
    data = edge_mapping()
    data["node_server"]["listen"] = "tcp:7444:interface=0.0.0.0"
    data["inference"] = {"listen": "tcp:8090:interface=0.0.0.0"}
    data["metrics"] = {"listen": "tcp:9101:interface=0.0.0.0"}
    found = edge_unauthenticated_exposures(parse_edge_config(data, {}))
    assert [line.split(" ", 1)[0] for line in found] == ["node_server.listen", "inference.listen", "metrics.listen"]
    for node in data["nodes"]:
        node["credential"] = "a-node-secret"
    data["inference"]["api_keys"] = ["a-key"]
    del data["metrics"]
    assert edge_unauthenticated_exposures(parse_edge_config(data, {})) == []


def test_node_metrics_beyond_loopback_are_named() -> None:
    """A Node's metrics listener beyond loopback is reported; on loopback it is not."""
    mapping = node_yaml("node-1", 7444)
    config = parse_node_config(mapping, {})
    assert node_unauthenticated_exposures(config) == []
    exposed = parse_node_config(dict(mapping, metrics={"listen": "tcp:9102:interface=0.0.0.0"}), {})
    assert [line.split(" ", 1)[0] for line in node_unauthenticated_exposures(exposed)] == ["metrics.listen"]
