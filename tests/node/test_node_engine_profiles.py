"""node.yaml ``engines:`` and ``gpus:``: engine profiles parse, and every error names its field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from twisted_iop.configuration import ConfigError
from twisted_iop.node.config import parse_node_config
from twisted_iop.testing.harness import MOCK_PROVIDER

#: The profile of the issue, as an owner writes it.
ISSUE_PROFILE = """
node_id: node-1
engines:
  - name: mock
    kind: openai
    launch:
      command: [iop-mock-provider, --listen, "tcp:{port}:interface=127.0.0.1", --models, "{model}",
                --tokens-per-second, "{tokens_per_second}"]
      readiness: {path: /v1/models}
    ports: [28200, 28299]            # the ports its instances may take
    parameters:
      tokens_per_second: {type: int, min: 1, max: 1000, default: 50}
"""


def _environ() -> dict[str, str]:
    """An environment whose PATH finds ``iop-mock-provider`` (the package's console script)."""
    return {"PATH": str(Path(MOCK_PROVIDER).parent)}


def node(**profile: Any) -> dict[str, Any]:
    """A node.yaml mapping with one profile built from the issue's, ``profile`` overriding its keys."""
    data = yaml.safe_load(ISSUE_PROFILE)
    data["engines"][0].update(profile)
    return cast("dict[str, Any]", data)


def parse(data: dict[str, Any]) -> Any:
    """Parse ``data`` as node.yaml with ``iop-mock-provider`` on PATH."""
    return parse_node_config(data, _environ())


def test_the_issue_profile_parses_with_no_providers() -> None:
    """The issue's exact profile is valid, with no ``providers:`` at all."""
    config = parse(yaml.safe_load(ISSUE_PROFILE))
    assert config.providers == ()
    (profile,) = config.engines
    assert profile.name == "mock" and profile.kind == "openai"
    assert profile.ports == (28200, 28299)
    assert profile.gpus_per_instance == 0
    (parameter,) = profile.parameters
    assert (parameter.name, parameter.type, parameter.minimum, parameter.maximum, parameter.default) == (
        "tokens_per_second",
        "int",
        1.0,
        1000.0,
        "50",
    )
    assert profile.launch.command[0].endswith("/iop-mock-provider")
    assert profile.launch.command[-1] == "{tokens_per_second}"
    assert profile.launch.readiness.path == "/v1/models"
    assert config.gpus == 0


def test_every_parameter_type_parses() -> None:
    """int, number, string (with a pattern), enum (with choices) and bool parameters, with defaults as text."""
    config = parse(
        node(
            parameters={
                "a": {"type": "int", "min": 1, "max": 4},
                "b": {"type": "number", "min": 0.1, "max": 0.95, "default": 0.9},
                "c": {"type": "string", "pattern": "[a-z]+", "default": "abc"},
                "d": {"type": "enum", "choices": ["bf16", "fp8"], "default": "fp8"},
                "e": {"type": "bool", "default": True},
                "tokens_per_second": {"type": "int"},
            }
        )
    )
    by_name = {p.name: p for p in config.engines[0].parameters}
    assert by_name["a"].default is None
    assert by_name["b"].default == "0.9"
    assert by_name["c"].pattern == "[a-z]+"
    assert by_name["d"].choices == ("bf16", "fp8")
    assert by_name["e"].default == "true"


def test_node_gpus_and_a_gpu_profile() -> None:
    """``gpus:`` declares the slots; a profile may take some per instance and use ``{gpu}``."""
    data = node(
        gpus_per_instance=2,
        launch={"command": ["iop-mock-provider", "--x", "{gpu}"], "env": {"CUDA_VISIBLE_DEVICES": "{gpu}"}},
    )
    data["gpus"] = 4
    config = parse(data)
    assert config.gpus == 4
    assert config.engines[0].gpus_per_instance == 2
    assert config.engines[0].launch.env == {"CUDA_VISIBLE_DEVICES": "{gpu}"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"launch": {"command": ["iop-mock-provider", "{nope}"]}},
            "engines[0].launch.command[1]: {nope} names no declared parameter",
        ),
        (
            {"launch": {"command": ["iop-mock-provider"], "env": {"X": "{nope}"}}},
            "engines[0].launch.env.X: {nope} names no declared parameter",
        ),
        ({"launch": {"command": ["{model}"]}}, "engines[0].launch.command[0]: the executable is fixed"),
        ({"ports": [10, 5]}, "engines[0].ports: must be [first, last]"),
        ({"ports": None}, "engines[0].ports: required"),
        ({"kind": "mock"}, "engines[0].kind: must be one of"),
        ({"name": "bad name"}, "engines[0].name: name 'bad name' is malformed"),
        ({"parameters": {"x": {"type": "float"}}}, "engines[0].parameters.x.type: must be one of"),
        (
            {"parameters": {"x": {"type": "int", "min": 5, "max": 1}}},
            "engines[0].parameters.x.max: must be at least min",
        ),
        ({"parameters": {"x": {"type": "int", "min": 1.5}}}, "engines[0].parameters.x.min: must be a whole number"),
        (
            {"parameters": {"x": {"type": "int", "max": 10, "default": 11}}},
            "engines[0].parameters.x.default: must be at most 10",
        ),
        ({"parameters": {"x": {"type": "enum"}}}, "engines[0].parameters.x.choices: required for type enum"),
        (
            {"parameters": {"x": {"type": "string", "pattern": "("}}},
            "engines[0].parameters.x.pattern: not a regular expression",
        ),
        (
            {"parameters": {"x": {"type": "string", "min": 1}}},
            "engines[0].parameters.x.min: only for types int and number",
        ),
        ({"parameters": {"port": {"type": "int"}}}, "engines[0].parameters.port: 'port' is set by the Node itself"),
        (
            {"parameters": {"Bad": {"type": "int"}}},
            "engines[0].parameters.Bad: a parameter name is a lower-case identifier",
        ),
        ({"parameters": {"x": {"type": "int", "step": 1}}}, "engines[0].parameters.x.step: unknown setting"),
        ({"gpus_per_instance": 1}, "engines[0].gpus_per_instance: 1 is more than the node's gpus (0)"),
        ({"color": "red"}, "engines[0].color: unknown setting"),
    ],
)
def test_a_bad_profile_names_its_field(change: dict[str, Any], message: str) -> None:
    """Each mistake in a profile fails with an error naming the dotted field."""
    data = node(**change)
    if data["engines"][0].get("ports") is None:
        del data["engines"][0]["ports"]
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(data)


def test_two_profiles_may_not_share_a_name() -> None:
    """A profile name listed twice is refused."""
    data = yaml.safe_load(ISSUE_PROFILE)
    data["engines"].append(dict(data["engines"][0]))
    with pytest.raises(ConfigError, match=re.escape("engines[1].name: 'mock' is listed twice")):
        parse(data)


def test_gpus_is_bounded() -> None:
    """``gpus`` is a whole number from 0."""
    data = yaml.safe_load(ISSUE_PROFILE)
    data["gpus"] = -1
    with pytest.raises(ConfigError, match=re.escape("gpus: must be between 0 and 1024")):
        parse(data)


def test_the_sample_configs_declare_the_mock_profile_on_ports_apart() -> None:
    """configs/node.yaml and node-2.yaml declare the mock profile on port ranges that do not overlap
    (both run on one machine), and node.yaml's commented optional parameters are valid uncommented."""
    configs = Path(__file__).resolve().parents[2] / "configs"
    ranges = []
    for name in ("node.yaml", "node-2.yaml"):
        config = parse(yaml.safe_load((configs / name).read_text()))
        (profile,) = config.engines
        assert (profile.name, profile.kind) == ("mock", "openai")
        assert profile.launch.command[0] == MOCK_PROVIDER
        assert [p.name for p in profile.parameters] == ["tokens_per_second"]
        ranges.append(range(profile.ports[0], profile.ports[1] + 1))
    assert not set(ranges[0]) & set(ranges[1]), ranges
    lines = (configs / "node.yaml").read_text().splitlines()
    start = lines.index("    parameters:")
    block = ["parameters:"]
    for line in lines[start + 1 :]:
        if not line.startswith("      "):
            break
        block.append(line[4:].replace("# ", "", 1))
    data = yaml.safe_load("\n".join(block))
    declared = {
        "node_id": "n",
        "engines": [{**yaml.safe_load((configs / "node.yaml").read_text())["engines"][0], **data}],
    }
    config = parse(declared)
    assert [p.name for p in config.engines[0].parameters] == [
        "tokens_per_second",
        "dtype",
        "revision",
        "gpu_memory_utilization",
        "enforce_eager",
    ]
