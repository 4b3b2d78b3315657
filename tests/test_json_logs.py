"""JSON logs: every daemon writes one JSON object per line when told to."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.logger import Logger, LogLevel, LogPublisher
from twisted.python.failure import Failure

from twisted_iop.configuration import ConfigError, LoggingConfig, parse_yaml_mapping
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.json_logs import JSON_OBSERVER_NAME, JsonLineObserver
from twisted_iop.node.config import parse_node_config
from twisted_iop.testing.configs import LOOPBACK_ZERO
from twisted_iop.testing.harness import Daemon, eventually, sleep, start_daemon, wait_for_ports
from twisted_iop.testing.wires.peers import ScriptedEdge

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def logged_lines(emit: Any) -> list[str]:
    """The lines a JsonLineObserver writes for what ``emit(log)`` logs."""
    out = io.StringIO()
    publisher = LogPublisher(JsonLineObserver(out))
    emit(Logger(namespace="test", observer=publisher))
    return out.getvalue().splitlines()


def test_each_event_is_one_json_line_with_its_fields() -> None:
    """Fields, format, level, the formatted text; no record separator."""
    [line] = logged_lines(lambda log: log.warn("edge {edge_id} said {count} things", edge_id="e-1", count=3))
    assert "\x1e" not in line
    event = json.loads(line)
    assert event["log_format"] == "edge {edge_id} said {count} things"
    assert event["log_level"]["name"] == "warn" and event["level"] == "warn"
    assert event["edge_id"] == "e-1" and event["count"] == 3
    assert event["text"] == "edge e-1 said 3 things"


def test_a_failure_and_a_value_json_cannot_hold_still_make_a_json_line() -> None:
    """A logged failure keeps its traceback; an arbitrary object becomes ``unpersistable``, not an exception."""

    def emit(log: Logger) -> None:
        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError:
            log.failure("the round failed for {thing}", Failure(), thing=object())

    [line] = logged_lines(emit)
    event = json.loads(line)
    assert event["level"] == LogLevel.critical.name
    assert event["thing"] == {"unpersistable": True}
    assert "ZeroDivisionError" in json.dumps(event["log_failure"])
    assert "ZeroDivisionError" in event["text"]


def test_every_daemon_config_takes_a_logging_format() -> None:
    """control-plane.yaml, edge.yaml and node.yaml accept ``logging.format``; text is the default."""
    assert config_from_text("").logging == LoggingConfig("text")
    assert config_from_text("logging:\n  format: json\n").logging == LoggingConfig("json")
    for name, parse in (("edge.yaml", parse_edge_config), ("node.yaml", parse_node_config)):
        data = parse_yaml_mapping((CONFIGS / name).read_text())
        assert parse(data, {}).logging.format == "text"
        assert parse({**data, "logging": {"format": "json"}}, {}).logging.format == "json"


@pytest.mark.parametrize("text", ["logging:\n  format: xml\n", "logging:\n  style: json\n"])
def test_a_bad_logging_section_names_the_field(text: str) -> None:
    """An unknown format or key is an error naming ``logging``."""
    with pytest.raises(ConfigError, match=r"logging"):
        config_from_text(text)


def parsed_lines(daemon: Daemon) -> list[dict[str, Any]]:
    """Every line of ``daemon``'s output, each parsed as JSON (any other line fails the test)."""
    lines = [line for line in daemon.log().splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_a_control_plane_with_logging_format_json_writes_only_json_lines(tmp_path: Path) -> None:
    """``twistd -n iop-control-plane`` with ``logging.format: json``: every line parses, with our fields."""
    config = tmp_path / "control-plane.yaml"
    config.write_text(
        "logging:\n  format: json\n"
        + "".join(f"{section}:\n  listen: {LOOPBACK_ZERO}\n" for section in ("http", "client_wire", "edge_wire"))
    )
    cp = start_daemon(["iop-control-plane", "--config", str(config)], tmp_path, name="cp")
    try:
        ports = await wait_for_ports(cp, {"edge_wire", "http"})
        for _ in range(20):
            # A Control Plane just started may still say retry_later (its loop lagged).
            edge = ScriptedEdge("json-edge")
            await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", ports["edge_wire"]), edge)
            answer = await edge.hello()
            if answer.accepted or answer.reason_code != "retry_later":
                break
            edge.tcp.loseConnection()
            await sleep(answer.retry_after_ms / 1000.0)
        assert answer.accepted
        await eventually(lambda: "json-edge connected" in cp.log(), timeout=10, message="the edge's line")
        edge.tcp.loseConnection()
    finally:
        assert cp.stop() == 0
    events = parsed_lines(cp)
    assert all("log_format" in event and "log_level" in event for event in events)
    [listening] = [event for event in events if event.get("label") == "edge_wire"]
    assert listening["port"] == ports["edge_wire"] and listening["level"] == "info"
    [connected] = [event for event in events if event.get("edge_id") == "json-edge" and "enrollments" in event]
    assert connected["log_format"] == "edge {edge_id} connected (enrollment {enrollments})"
    assert any(event["text"] == "Server Shut Down." for event in events)


@pytest.mark.e2e
@pytest_twisted.ensureDeferred
async def test_twistds_logger_option_switches_an_edge_to_json(tmp_path: Path) -> None:
    """``twistd --logger twisted_iop.json_logs.json_log_observer iop-edge``: JSON lines without a config change."""
    edge = start_daemon(
        ["--logger", JSON_OBSERVER_NAME, "iop-edge", "--config", str(CONFIGS / "edge.yaml")],
        tmp_path,
        env={"IOP_CONTROL_PLANE_EDGE_WIRE": "127.0.0.1:1", "IOP_EDGE_NODE_LISTEN": LOOPBACK_ZERO},
        name="edge",
    )
    try:
        await wait_for_ports(edge, {"node_server"})
        await eventually(lambda: "Scheduling retry" in edge.log(), timeout=20, message="the edge retrying")
    finally:
        edge.stop()
    events = parsed_lines(edge)
    assert all("log_format" in event and "log_level" in event for event in events)
    assert any(event.get("label") == "node_server" for event in events)
