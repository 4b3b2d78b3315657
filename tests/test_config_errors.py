"""Configuration errors and ``--check``, through the real ``twistd`` as a user runs it.

Every configuration error is one line on stderr naming the file (or the
environment variable) and the dotted field, with exit code 1, before
anything binds; ``--check`` validates and exits 0 with one OK line.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import attrs
import pytest

from twisted_iop.testing.harness import TWISTD

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = ROOT / "configs"


@attrs.frozen
class Run:
    """What a finished ``twistd`` process printed and returned."""

    code: int
    stdout: str
    stderr: str


def twistd(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> Run:
    """Run ``twistd -n --pidfile= <args>`` to completion (it must not start serving)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
    full_env.update(env or {})
    done = subprocess.run(
        [TWISTD, "-n", "--pidfile=", *args],
        cwd=str(cwd),
        env=full_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(run: Run, prefix: str) -> str:
    """The run failed with exit code 1 and exactly one line, starting with ``prefix``, on stderr."""
    assert run.code == 1, run
    assert run.stdout == "", run
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(prefix), lines[0]
    assert "Traceback" not in run.stderr and "Usage:" not in run.stderr
    return lines[0]


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    """A YAML syntax error names the file, the line and the column, not "<unicode string>"."""
    path = tmp_path / "cp.yaml"
    path.write_text("http:\n  listen: [tcp:0\n")
    line = assert_one_line_error(twistd(["iop-control-plane", "--config", str(path)], tmp_path), "iop-control-plane: ")
    assert f"{path}: line 3, column 1: not valid YAML" in line
    assert "unicode string" not in line


def test_a_word_where_a_port_belongs(tmp_path: Path) -> None:
    """A word in an endpoint's port is named as such, not as Python's int() error."""
    path = tmp_path / "cp.yaml"
    path.write_text("http:\n  listen: tcp:http:interface=127.0.0.1\n")
    line = assert_one_line_error(twistd(["iop-control-plane", "--config", str(path)], tmp_path), "iop-control-plane: ")
    assert line == (
        f"iop-control-plane: {path}: http.listen: cannot use 'tcp:http:interface=127.0.0.1': "
        "the port must be a number from 0 to 65535, not 'http'"
    )
    assert "invalid literal" not in line


def test_a_bad_environment_endpoint_names_the_variable(tmp_path: Path) -> None:
    """A bad IOP_EDGE_NODE_LISTEN is blamed on the variable, not on the YAML field."""
    run = twistd(
        ["iop-edge", "--config", str(CONFIGS / "edge.yaml")], tmp_path, env={"IOP_EDGE_NODE_LISTEN": "tcp:nodes"}
    )
    line = assert_one_line_error(
        run, "iop-edge: environment variable IOP_EDGE_NODE_LISTEN (overrides node_server.listen): "
    )
    assert "edge.yaml" not in line


def test_an_unbindable_endpoint_fails_before_anything_binds(tmp_path: Path) -> None:
    """A port out of range on the last listener fails before the first one binds."""
    path = tmp_path / "cp.yaml"
    path.write_text(
        "http: {listen: 'tcp:99999:interface=127.0.0.1'}\n"
        "client_wire: {listen: 'tcp:0:interface=127.0.0.1'}\n"
        "edge_wire: {listen: 'tcp:0:interface=127.0.0.1'}\n"
    )
    run = twistd(["iop-control-plane", "--config", str(path)], tmp_path)
    line = assert_one_line_error(run, f"iop-control-plane: {path}: http.listen: cannot use 'tcp:99999")
    assert "listening on" not in run.stdout + run.stderr
    assert "0 to 65535" in line


def test_a_bad_field_in_each_daemon(tmp_path: Path) -> None:
    """Each daemon names the file and the dotted field of a bad value."""
    node = tmp_path / "node.yaml"
    node.write_text("node_id: node-1\nedge: {keepalive: {interval_seconds: 'often'}}\n")
    line = assert_one_line_error(twistd(["iop-node", "--config", str(node)], tmp_path), "iop-node: ")
    assert line == f"iop-node: {node}: edge.keepalive.interval_seconds: must be a number, not 'often'"
    edge = tmp_path / "edge.yaml"
    edge.write_text((CONFIGS / "edge.yaml").read_text().replace("capacity: 4 ", "capacity: four "))
    line = assert_one_line_error(twistd(["iop-edge", "--config", str(edge)], tmp_path), "iop-edge: ")
    assert line == f"iop-edge: {edge}: nodes[0].providers[0].capacity: must be a whole number or 'auto', not 'four'"
    missing = assert_one_line_error(twistd(["iop-edge"], tmp_path), "iop-edge: ")
    assert missing == "iop-edge: --config PATH is required (see configs/edge.yaml)"


def test_node_check_validates_a_launched_engines_executable(tmp_path: Path) -> None:
    """``--check`` finds a launched engine's executable on PATH, or names the field when it cannot."""
    node = tmp_path / "node.yaml"
    launch = "{command: [%s, --listen, 'tcp:8001:interface=127.0.0.1'], stop: {signal: TERM, timeout_seconds: 20}}"
    template = (
        "node_id: node-1\nstate_directory: %s\nproviders:\n"
        "  - {provider_id: llama-a, kind: llamacpp, models: [tiny], base_url: 'http://127.0.0.1:8001', launch: %s}\n"
    )
    node.write_text(template % (tmp_path / "state", launch % "iop-mock-provider"))
    path = os.pathsep.join([str(Path(TWISTD).parent), os.environ.get("PATH", "")])
    run = twistd(["iop-node", "--config", str(node), "--check"], tmp_path, env={"PATH": path})
    assert run.code == 0, run
    assert "engines launched: 1" in run.stdout and not (tmp_path / "state").exists()
    node.write_text(template % (tmp_path / "state", launch % "no-such-engine"))
    line = assert_one_line_error(twistd(["iop-node", "--config", str(node), "--check"], tmp_path), "iop-node: ")
    assert line == f"iop-node: {node}: providers[0].launch.command[0]: 'no-such-engine' is not an executable on PATH"


@pytest.mark.parametrize(
    ("plugin", "config"),
    [
        ("iop-control-plane", "control-plane.yaml"),
        ("iop-edge", "edge.yaml"),
        ("iop-node", "node.yaml"),
        ("iop-node", "node-2.yaml"),
    ],
)
def test_check_accepts_every_shipped_config(tmp_path: Path, plugin: str, config: str) -> None:
    """``--check`` on each shipped config exits 0 with one OK line and binds nothing."""
    path = CONFIGS / config
    run = twistd([plugin, "--config", str(path), "--check"], tmp_path)
    assert run.code == 0, run
    assert run.stderr == ""
    (line,) = run.stdout.splitlines()
    assert line.startswith(f"{plugin}: {path}: configuration OK (")
    assert not (tmp_path / "twistd.log").exists()


def test_check_reports_the_error_and_older_spellings(tmp_path: Path) -> None:
    """``--check`` on a bad file exits 1 with the error; on an older spelling it warns and passes."""
    path = tmp_path / "cp.yaml"
    path.write_text("registry: {fleet_events: 0}\n")
    run = twistd(["iop-control-plane", "--config", str(path), "--check"], tmp_path)
    assert_one_line_error(run, f"iop-control-plane: {path}: registry.fleet_events: must be at least 1")
    path.write_text("edge_wire: {keepalive_interval_seconds: 5, keepalive_deadline_seconds: 20}\n")
    run = twistd(["iop-control-plane", "--config", str(path), "--check"], tmp_path)
    assert run.code == 0 and "configuration OK" in run.stdout
    assert run.stderr.splitlines() == [
        "iop-control-plane: warning: edge_wire.keepalive_interval_seconds / keepalive_deadline_seconds are an "
        "older spelling: write edge_wire.keepalive: {interval_seconds: 5, deadline_seconds: 20}"
    ]
