"""node.yaml parsing: defaults, overrides and errors that name the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from twisted_iop.configuration import ConfigError
from twisted_iop.credentials import matches
from twisted_iop.daemon import ConfigurationExit
from twisted_iop.edge.config import load_edge_config
from twisted_iop.node.config import load_node_config, parse_node_config
from twisted_iop.node.tap import Options

REPO = Path(__file__).resolve().parents[2]

#: The sample node config of every node in configs/edge.yaml.
SAMPLE_NODE_CONFIGS = {"node-1": "node.yaml", "node-2": "node-2.yaml"}


def mapping(**extra: Any) -> dict[str, Any]:
    """A valid node.yaml mapping."""
    data: dict[str, Any] = {
        "node_id": "node-1",
        "edge": {"address": "127.0.0.1:7444"},
        "providers": [
            {"provider_id": "mock-a", "kind": "mock", "models": ["m"]},
            {"provider_id": "v", "kind": "vllm", "models": ["m"], "base_url": "http://127.0.0.1:8000/"},
        ],
    }
    data.update(extra)
    return data


def test_sample_config_parses() -> None:
    """configs/node.yaml is valid and dials the sample Edge's node listener."""
    config = load_node_config(str(REPO / "configs" / "node.yaml"), environ={})
    assert config.node_id == "node-1"
    assert config.edge.address == "tcp:host=127.0.0.1:port=7444"
    assert [p.provider_id for p in config.providers] == ["mock-a"]


def test_second_sample_config_parses() -> None:
    """configs/node-2.yaml is valid: node-2 of the sample fleet, dialling the same Edge."""
    config = load_node_config(str(REPO / "configs" / "node-2.yaml"), environ={})
    assert config.node_id == "node-2"
    assert config.edge.address == "tcp:host=127.0.0.1:port=7444"
    # Not node-1's metrics port: the README runs both Nodes on one machine.
    assert config.metrics_listen == "tcp:9103:interface=127.0.0.1"
    assert load_node_config(str(REPO / "configs" / "node.yaml"), environ={}).metrics_listen == (
        "tcp:9102:interface=127.0.0.1"
    )
    assert [p.provider_id for p in config.providers] == ["mock-b"]


def test_every_sample_edge_node_has_a_sample_node_config() -> None:
    """Each node of configs/edge.yaml has a sample node config the Edge would accept as is.

    Same node id and credential, and the providers the Edge configures for
    that node (id, kind and models) are the ones the sample Node hosts.
    """
    edge = load_edge_config(str(REPO / "configs" / "edge.yaml"), environ={})
    assert {node.node_id for node in edge.nodes} == set(SAMPLE_NODE_CONFIGS)
    for node in edge.nodes:
        config = load_node_config(str(REPO / "configs" / SAMPLE_NODE_CONFIGS[node.node_id]), environ={})
        assert config.node_id == node.node_id
        # The Edge keeps digests only; the Node's secret must match one (or none is needed).
        assert matches(config.credential, node.credentials) or (not node.credentials and not config.credential)
        hosted = {(p.provider_id, p.kind, p.models) for p in config.providers}
        assert hosted == {(p.provider_id, p.kind, p.models) for p in node.providers}


def test_values_and_defaults() -> None:
    """Providers, probes and edge settings are read; base_url loses its trailing slash."""
    config = parse_node_config(mapping(probes={"interval_seconds": 2, "timeout_seconds": 1}))
    assert config.probes.interval_seconds == 2 and config.probes.timeout_seconds == 1
    assert config.providers[1].base_url == "http://127.0.0.1:8000"
    assert config.providers[0].mock.health == "healthy"
    assert "127.0.0.1:8000" not in repr(config.providers[1])


def test_load_interval_default_and_off() -> None:
    """probes.load_interval_seconds is 5 unless set; 0 turns the load rounds off."""
    assert parse_node_config(mapping()).probes.load_interval_seconds == 5
    assert parse_node_config(mapping(probes={"load_interval_seconds": 0})).probes.load_interval_seconds == 0


@pytest.mark.parametrize("kind", ["openai", "vllm", "sglang", "llamacpp", "tgi", "ollama"])
def test_every_engine_kind_is_accepted(kind: str) -> None:
    """Each engine kind is a valid provider kind with a base_url."""
    providers = [{"provider_id": "e", "kind": kind, "models": ["m"], "base_url": "http://127.0.0.1:8000"}]
    assert parse_node_config(mapping(providers=providers)).providers[0].kind == kind


def test_environment_overrides_edge_address() -> None:
    """IOP_EDGE_NODE_WIRE wins over edge.address."""
    config = parse_node_config(mapping(), {"IOP_EDGE_NODE_WIRE": "10.1.1.1:9"})
    assert config.edge.address == "tcp:host=10.1.1.1:port=9"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"node_id": "no spaces"}, "node_id"),
        ({"edge": {"address": "??"}}, "edge.address"),
        ({"probes": {"interval_seconds": 0}}, "probes.interval_seconds"),
        ({"probes": {"load_interval_seconds": -1}}, "probes.load_interval_seconds"),
        ({"probes": {"load_interval_seconds": "often"}}, "probes.load_interval_seconds"),
        ({"providers": [{"provider_id": "v", "kind": "vllm", "models": ["m"]}]}, "providers[0].base_url: required"),
        (
            {"providers": [{"provider_id": "v", "kind": "vllm", "models": ["m"], "base_url": "ftp://x"}]},
            "providers[0].base_url",
        ),
        ({"providers": [{"provider_id": "v", "kind": "triton", "models": ["m"]}]}, "providers[0].kind"),
        (
            {"providers": [{"provider_id": "m", "kind": "mock", "models": ["m"], "mock": {"health": "sad"}}]},
            "providers[0].mock.health",
        ),
        (
            {"providers": [{"provider_id": "m", "kind": "mock", "models": ["m"], "base_url": "http://x"}]},
            "providers[0].base_url",
        ),
        ({"typo": 1}, "typo: unknown setting"),
        ({"metrics": {"listen": "nowhere"}}, "metrics.listen"),
        ({"metrics": {"listen": "tcp:70000"}}, "metrics.listen"),
        ({"metrics": {"interface": "0.0.0.0"}}, "metrics.interface: unknown setting"),
    ],
)
def test_bad_values_name_their_field(change: dict[str, Any], field: str) -> None:
    """A bad value fails with the dotted name of its field."""
    with pytest.raises(ConfigError) as caught:
        parse_node_config(mapping(**change))
    assert field in str(caught.value)


def test_options_end_on_a_bad_config(tmp_path: Path) -> None:
    """twistd iop-node with a bad config ends option parsing with one line naming the file and field."""
    path = tmp_path / "node.yaml"
    path.write_text("node_id: node-1\nprobes:\n  timeout_seconds: -1\n")
    with pytest.raises(ConfigurationExit, match=rf"^iop-node: {path}: probes.timeout_seconds: must be greater than 0"):
        Options().parseOptions(["--config", str(path)])
    with pytest.raises(ConfigurationExit, match="--config"):
        Options().parseOptions([])


def test_shutdown_grace_is_read_and_checked() -> None:
    """node.yaml's shutdown.grace_seconds defaults to 10 s; a bad one names its field."""
    base: dict[str, Any] = {"node_id": "node-1", "edge": {"address": "127.0.0.1:7444"}}
    assert parse_node_config(base).shutdown.grace_seconds == 10.0
    assert parse_node_config({**base, "shutdown": {"grace_seconds": 2.5}}).shutdown.grace_seconds == 2.5
    with pytest.raises(ConfigError, match=re.escape("shutdown.grace_seconds")):
        parse_node_config({**base, "shutdown": {"grace_seconds": "soon"}})


def test_metrics_listen_default_override_and_off() -> None:
    """metrics.listen defaults to 127.0.0.1:9102, IOP_NODE_METRICS_LISTEN wins, "" turns it off."""
    assert parse_node_config(mapping(), {}).metrics_listen == "tcp:9102:interface=127.0.0.1"
    assert (
        parse_node_config(mapping(), {"IOP_NODE_METRICS_LISTEN": ":9300"}).metrics_listen
        == "tcp:9300:interface=127.0.0.1"
    )
    assert parse_node_config(mapping(metrics={"listen": ""}), {}).metrics_listen == ""
    with pytest.raises(ConfigError, match=r"IOP_NODE_METRICS_LISTEN \(overrides metrics.listen\)"):
        parse_node_config(mapping(), {"IOP_NODE_METRICS_LISTEN": "nowhere"})


def test_edge_coalesce_ms_default_zero_and_bounds() -> None:
    """edge.coalesce_ms is 2 unless set; 0 is allowed (end of turn); negative, past 50 or not a number is refused."""
    assert parse_node_config(mapping()).edge.coalesce_seconds == 0.002
    edge = {"address": "127.0.0.1:7444", "coalesce_ms": 0}
    assert parse_node_config(mapping(edge=edge)).edge.coalesce_seconds == 0
    for bad in (-1, 51, "fast"):
        with pytest.raises(ConfigError, match=r"edge\.coalesce_ms"):
            parse_node_config(mapping(edge={"address": "127.0.0.1:7444", "coalesce_ms": bad}))
