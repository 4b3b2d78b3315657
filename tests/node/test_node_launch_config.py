"""The ``launch`` block of node.yaml: every key read, every error naming its dotted field."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from twisted_iop.configuration import ConfigError
from twisted_iop.node.config import default_state_directory, parse_node_config
from twisted_iop.node.launch.config import LaunchConfig
from twisted_iop.testing.harness import MOCK_PROVIDER


def node(provider: dict[str, Any], **top: Any) -> dict[str, Any]:
    """node.yaml with one provider."""
    return {"node_id": "node-1", "providers": [provider], **top}


def engine(**launch: Any) -> dict[str, Any]:
    """A llamacpp provider launched with ``launch`` (the issue's example by default)."""
    block: dict[str, Any] = {
        "command": [MOCK_PROVIDER, "--listen", "tcp:8001:interface=127.0.0.1", "--models", "tiny"],
        "restart": {
            "policy": "always",
            "initial_seconds": 1,
            "max_seconds": 30,
            "max_restarts": 5,
            "window_seconds": 300,
        },
        "stop": {"signal": "TERM", "timeout_seconds": 20},
    }
    block.update(launch)
    return {
        "provider_id": "llama-a",
        "kind": "llamacpp",
        "models": ["tiny"],
        "base_url": "http://127.0.0.1:8001",
        "launch": block,
    }


def launch_of(data: dict[str, Any], environ: dict[str, str] | None = None) -> LaunchConfig:
    """The parsed launch block of the first provider."""
    launch = parse_node_config(data, environ or {}).providers[0].launch
    assert launch is not None
    return launch


def test_the_issue_example_and_its_defaults() -> None:
    """The example parses; what it leaves out takes the documented defaults."""
    launch = launch_of(node(engine()))
    assert launch.command[0] == MOCK_PROVIDER and launch.command[1:3] == ("--listen", "tcp:8001:interface=127.0.0.1")
    assert launch.restart.policy == "always" and launch.restart.max_restarts == 5
    assert launch.stop.signal_number == signal.SIGTERM and launch.stop.timeout_seconds == 20
    assert launch.readiness.path is None and launch.readiness.interval_seconds == 1
    assert launch.readiness.start_timeout_seconds == 600
    assert (launch.logs.lines_per_second, launch.logs.tail_bytes, launch.logs.max_line_bytes) == (100, 65536, 4096)
    assert launch.env == {} and launch.working_directory is None
    assert MOCK_PROVIDER not in repr(launch)  # the command never shows in a log line


def test_executable_found_on_path_environment_and_working_directory(tmp_path: Path) -> None:
    """A bare name is looked up on PATH (launch.env's PATH first) and kept absolute."""
    launch = launch_of(
        node(
            engine(
                command=["iop-mock-provider"],
                env={"CUDA_VISIBLE_DEVICES": "0", "PATH": str(Path(MOCK_PROVIDER).parent)},
                working_directory=str(tmp_path),
            )
        )
    )
    assert launch.command == (MOCK_PROVIDER,)
    assert launch.env["CUDA_VISIBLE_DEVICES"] == "0" and launch.working_directory == str(tmp_path)
    launch = launch_of(node(engine(command=["iop-mock-provider"])), {"PATH": str(Path(MOCK_PROVIDER).parent)})
    assert launch.command == (MOCK_PROVIDER,)


def test_a_program_installed_with_twisted_iop_is_found_off_path(tmp_path: Path) -> None:
    """iop-mock-provider is found in twisted-iop's own bin when PATH does not list it (``make
    run-node``, systemd), and a program on PATH comes first."""
    launch = launch_of(node(engine(command=["iop-mock-provider"])), {"PATH": str(tmp_path)})
    assert launch.command == (MOCK_PROVIDER,)
    shadow = tmp_path / "iop-mock-provider"
    shadow.write_text("#!/bin/sh\n")
    shadow.chmod(0o755)
    launch = launch_of(node(engine(command=["iop-mock-provider"])), {"PATH": str(tmp_path)})
    assert launch.command == (str(shadow),)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"command": []}, "providers[0].launch.command: must be a non-empty list of arguments"),
        ({"command": "vllm serve x"}, "providers[0].launch.command: must be a list of arguments (no shell runs it)"),
        (
            {"command": ["no-such-engine-here"]},
            "providers[0].launch.command[0]: 'no-such-engine-here' is not an executable on PATH",
        ),
        (
            {"command": ["/nonexistent/vllm"]},
            "providers[0].launch.command[0]: '/nonexistent/vllm' is not an executable file",
        ),
        ({"command": [MOCK_PROVIDER, {"a": 1}]}, "providers[0].launch.command[1]: must be a string"),
        (
            {"restart": {"policy": "sometimes"}},
            "providers[0].launch.restart.policy: must be one of always, on-failure, never",
        ),
        (
            {"restart": {"initial_seconds": 5, "max_seconds": 1}},
            "providers[0].launch.restart.max_seconds: must be at least initial_seconds",
        ),
        ({"restart": {"max_restarts": -1}}, "providers[0].launch.restart.max_restarts: must be between 0 and 10000"),
        (
            {"stop": {"signal": "TREM"}},
            "providers[0].launch.stop.signal: unknown signal 'TREM' (known: HUP, INT, KILL, QUIT, TERM, USR1, USR2)",
        ),
        ({"stop": {"timeout_seconds": 0}}, "providers[0].launch.stop.timeout_seconds: must be greater than 0"),
        ({"readiness": {"path": "health"}}, "providers[0].launch.readiness.path: must be a URL path such as /health"),
        ({"logs": {"tail_bytes": 10}}, "providers[0].launch.logs.tail_bytes: must be between 1024 and 4194304"),
        ({"logs": {"lines_per_second": 0}}, "providers[0].launch.logs.lines_per_second: must be between 1 and 10000"),
        ({"working_directory": "relative/dir"}, "providers[0].launch.working_directory: must be an absolute path"),
        ({"env": {"A=B": "x"}}, "providers[0].launch.env.A=B: not a usable environment variable"),
        ({"shell": True}, "providers[0].launch.shell: unknown setting"),
    ],
)
def test_bad_values_name_their_field(change: dict[str, Any], message: str) -> None:
    """Each bad value fails with its dotted field and what is wrong."""
    with pytest.raises(ConfigError) as error:
        parse_node_config(node(engine(**change)), {})
    assert str(error.value).startswith(message), str(error.value)


def test_launch_needs_an_http_engine_with_its_address() -> None:
    """launch is only for HTTP kinds, which need base_url (where the engine listens)."""
    mock = {"provider_id": "m", "kind": "mock", "models": ["x"], "launch": {"command": [sys.executable]}}
    with pytest.raises(ConfigError, match=r"^providers\[0\]\.launch: only for engines reached over HTTP"):
        parse_node_config(node(mock), {})
    without = engine()
    del without["base_url"]
    with pytest.raises(ConfigError, match=r"^providers\[0\]\.base_url: required for kind llamacpp: where the launched"):
        parse_node_config(node(without), {})


def test_two_launched_engines_on_one_address_are_refused() -> None:
    """Two launched engines cannot both listen where one base_url points."""
    second = engine()
    second["provider_id"] = "llama-b"
    with pytest.raises(ConfigError, match=r"^providers\[1\]\.base_url: the same address as providers\[0\]"):
        parse_node_config({"node_id": "node-1", "providers": [engine(), second]}, {})


def test_state_directory_default_and_setting(tmp_path: Path) -> None:
    """state_directory: systemd's STATE_DIRECTORY, else XDG_STATE_HOME/twisted-iop/<node>; absolute only."""
    assert default_state_directory("node-1", {"STATE_DIRECTORY": "/var/lib/iop-node:/x"}) == "/var/lib/iop-node"
    assert default_state_directory("node-1", {"XDG_STATE_HOME": "/s"}) == "/s/twisted-iop/node-1"
    assert default_state_directory("node-1", {"HOME": "/home/u"}) == "/home/u/.local/state/twisted-iop/node-1"
    assert parse_node_config(node(engine(), state_directory=str(tmp_path)), {}).state_directory == str(tmp_path)
    with pytest.raises(ConfigError, match=r"^state_directory: must be an absolute path"):
        parse_node_config(node(engine(), state_directory="state"), {})


def test_the_commented_launch_example_of_the_sample_config_is_valid() -> None:
    """configs/node.yaml's commented launch example parses once uncommented (its command is
    found on the PATH of this checkout's virtualenv)."""
    lines = (Path(__file__).resolve().parents[2] / "configs" / "node.yaml").read_text().splitlines()
    start = lines.index("  # - provider_id: llama-a")
    block = []
    for line in lines[start:]:
        if not line.startswith("  # "):
            break
        block.append("  " + line[4:])
    data = yaml.safe_load("providers:\n" + "\n".join(block))
    config = parse_node_config({"node_id": "node-1", **data}, {"PATH": str(Path(MOCK_PROVIDER).parent)})
    launch = config.providers[0].launch
    assert launch is not None and launch.command[0] == MOCK_PROVIDER and launch.stop.timeout_seconds == 20
