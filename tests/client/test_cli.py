"""iopctl: argument parsing, tables, --json, exit codes (injected repository)."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import pytest_twisted
from iop_client_fakes import EDGE_STATUS, OPERATION, FakeControlPlaneResource, FakeWireServer, error_body, fleet_event
from support import eventually
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred

from twisted_iop.client.cli import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    main,
    parse_arguments,
    run,
)
from twisted_iop.client.render import render_table
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient

IOPCTL = str(Path(sys.executable).parent / "iopctl")


class Result:
    """What one iopctl run printed and returned."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    def json(self) -> Any:
        """stdout parsed as one JSON document."""
        return json.loads(self.out)


async def iopctl(
    argv: list[str],
    fake: Optional[FakeControlPlaneResource] = None,
    wire_url: str = "ws://127.0.0.1:1/client",
    interrupted: Optional[Deferred[None]] = None,
    out: Optional[io.StringIO] = None,
) -> Result:
    """Run iopctl's ``run`` with a StubTreq repository on ``fake``."""
    fake = fake or FakeControlPlaneResource()
    args = parse_arguments(argv)
    repository = ControlPlaneStatusRepository("http://cp.test", http_client=StubTreq(fake))
    out = out or io.StringIO()
    err = io.StringIO()

    def wire_factory(a: Any) -> ClientWireClient:
        return ClientWireClient(a.wire_url or wire_url, reactor=reactor, api_token=a.token)

    code = await run(reactor, args, repository, wire_factory, out, err, interrupted)
    return Result(code, out.getvalue(), err.getvalue())


# -- parsing ---------------------------------------------------------------------


def test_global_options_before_or_after_the_command() -> None:
    """--url, --token and --json work on either side of the subcommand."""
    before = parse_arguments(["--url", "http://a:1", "--json", "status", "edge-a"])
    after = parse_arguments(["status", "edge-a", "--url", "http://a:1", "--json"])
    for args in (before, after):
        assert (args.command, args.edge_id, args.url, args.json) == ("status", "edge-a", "http://a:1", True)
    plain = parse_arguments(["fleet"])
    assert (plain.url, plain.wire_url, plain.token, plain.json) == (None, None, None, False)


def test_command_arguments_are_parsed() -> None:
    """command takes --target, repeated --arg k=v, --timeout and --idempotency-key."""
    args = parse_arguments(
        [
            "command",
            "edge-a",
            "node.drain",
            "--target",
            "node-1",
            "--arg",
            "reason=maint",
            "--arg",
            "x=a=b",
            "--timeout",
            "2.5",
            "--idempotency-key",
            "k1",
        ]
    )
    assert args.arguments == [("reason", "maint"), ("x", "a=b")]
    assert (args.target, args.timeout, args.idempotency_key) == ("node-1", 2.5, "k1")


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["status"],
        ["events", "edge-a", "--since", "-1"],
        ["events", "edge-a", "--limit", "0"],
        ["command", "edge-a", "node.drain", "--arg", "novalue"],
        ["command", "edge-a", "node.drain", "--timeout", "301"],
        ["command", "edge-a", "node.drain", "--timeout", "soon"],
    ],
)
def test_usage_errors(argv: list[str]) -> None:
    """Bad command lines raise UsageError (exit 2 in main)."""
    with pytest.raises(UsageError):
        parse_arguments(argv)


def test_main_exits_2_on_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """main() prints usage and one error line, and exits 2 without starting a reactor."""
    with pytest.raises(SystemExit) as caught:
        main(["command", "edge-a", "x", "--arg", "oops"])
    assert caught.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("usage: iopctl command") and "iopctl: error: argument --arg" in err


def test_render_table_aligns_columns() -> None:
    """Columns line up; numeric columns are right-aligned; no trailing spaces."""
    text = render_table(("NAME", "N", "NOTE"), [("a", 1, ""), ("long-name", 100, "x")], numeric=(1,))
    assert text.splitlines() == ["NAME         N  NOTE", "a            1", "long-name  100  x"]


# -- views -----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_edges_table() -> None:
    """iopctl edges prints one aligned row per edge."""
    result = await iopctl(["edges"])
    assert result.code == EXIT_OK and result.err == ""
    lines = result.out.splitlines()
    assert lines[0].split()[:3] == ["EDGE", "CONNECTED", "VERSION"]
    assert lines[1].split()[:2] == ["edge-a", "yes"] and lines[2].split()[:2] == ["edge-b", "no"]
    assert lines[0].index("CONNECTED") == lines[1].index("yes") == lines[2].index("no")


@pytest_twisted.ensureDeferred
async def test_status_shows_node_and_provider_rows() -> None:
    """iopctl status shows node rows and provider rows with status, health and both counter sets."""
    result = await iopctl(["status", "edge-a"])
    assert result.code == EXIT_OK
    out = result.out
    assert "edge edge-a: connected, fresh snapshot" in out
    header, totals, nodes, providers = out.strip("\n").split("\n\n")
    assert "nodes      1/2 connected" in totals and "long ctx   0/1 in flight, 2 queued" in totals
    node_lines = nodes.splitlines()
    assert node_lines[0].split()[:4] == ["NODE", "CONNECTED", "DRAINED", "PROVIDERS"]
    assert [line.split()[:3] for line in node_lines[1:]] == [["node-1", "yes", "no"], ["node-2", "no", "no"]]
    provider_lines = providers.splitlines()
    assert provider_lines[0].split() == [
        "NODE",
        "PROVIDER",
        "KIND",
        "STATUS",
        "HEALTH",
        "CAP",
        "IN-FLIGHT",
        "QUEUED",
        "LC-CAP",
        "LC-IN-FLIGHT",
        "LC-QUEUED",
        "MODELS",
        "REASON",
    ]
    first, second = (line.split() for line in provider_lines[1:])
    assert first == ["node-1", "mock-a", "mock", "available", "healthy", "4", "1", "0", "1", "0", "2", "llama-3-8b"]
    assert second[:5] == ["node-2", "vllm-b", "vllm", "unavailable", "offline"]
    assert provider_lines[2].endswith("node not connected")
    # Right-aligned numbers end under the end of their header.
    cap_end = provider_lines[0].index("CAP ") + 3
    assert provider_lines[1][cap_end - 1] == "4"


@pytest_twisted.ensureDeferred
async def test_json_output_parses_and_mirrors_the_api() -> None:
    """--json prints the documented JSON shape."""
    result = await iopctl(["--json", "status", "edge-a"])
    assert result.code == EXIT_OK and result.json() == EDGE_STATUS
    fleet = (await iopctl(["fleet", "--json"])).json()
    assert [row["edge_id"] for row in fleet["items"]] == ["edge-a", "edge-b"]
    assert fleet["totals"]["edges_known"] == 2


@pytest_twisted.ensureDeferred
async def test_every_view_renders() -> None:
    """edge, fleet, events, operations, operation and commands all print and exit 0."""
    expectations = {
        ("edge", "edge-a"): "1000",
        ("fleet",): "edges      1/2 connected",
        ("events", "edge-a", "--since", "6"): "node.disconnected",
        ("operations", "edge-a"): "0f3c9a",
        ("operation", "edge-a", "0f3c9a"): "drained",
        ("commands", "edge-a"): "edge.diagnostics",
    }
    for argv, needle in expectations.items():
        result = await iopctl(list(argv))
        assert result.code == EXIT_OK, (argv, result.err)
        assert needle in result.out, (argv, result.out)


@pytest_twisted.ensureDeferred
async def test_server_error_is_one_line_and_exit_1() -> None:
    """An error answer prints 'iopctl: <code>: <message>' on stderr and exits 1."""
    result = await iopctl(["status", "nope"])
    assert result.code == EXIT_ERROR and result.out == ""
    assert result.err == "iopctl: unknown_edge: no edge named 'nope' is known\n"
    as_json = await iopctl(["status", "nope", "--json"])
    assert as_json.json()["error"]["code"] == "unknown_edge"


@pytest_twisted.ensureDeferred
async def test_not_connected_status_shows_the_stale_snapshot() -> None:
    """A disconnected edge: the last snapshot, marked STALE, then the error line; exit 1."""
    result = await iopctl(["status", "edge-b"])
    assert result.code == EXIT_ERROR
    assert "edge edge-b: not connected, STALE snapshot" in result.out
    assert result.err == "iopctl: edge_not_connected: edge 'edge-b' is not connected\n"


@pytest_twisted.ensureDeferred
async def test_command_sends_and_prints_the_operation() -> None:
    """command posts the request and prints the operation's result; exit 0 on success."""
    fake = FakeControlPlaneResource()
    result = await iopctl(
        [
            "command",
            "edge-a",
            "node.drain",
            "--target",
            "node-1",
            "--arg",
            "reason=maintenance",
            "--idempotency-key",
            "drain-1",
        ],
        fake,
    )
    assert result.code == EXIT_OK
    assert json.loads(fake.requests[-1]["body"]) == {
        "name": "node.drain",
        "target": "node-1",
        "arguments": {"reason": "maintenance"},
        "idempotency_key": "drain-1",
    }
    assert "state" in result.out and "succeeded" in result.out and "drained" in result.out


@pytest_twisted.ensureDeferred
async def test_failed_and_timed_out_commands_exit_1() -> None:
    """A failed command exits 1 with its reason; a timeout prints the operation and the error."""
    fake = FakeControlPlaneResource()
    fake.routes[("POST", "/edges/edge-a/commands")] = (200, dict(OPERATION, state="failed", reason="node busy"))
    failed = await iopctl(["command", "edge-a", "node.drain"], fake)
    assert failed.code == EXIT_ERROR and failed.err == "iopctl: failed: node busy\n"
    fake.routes[("POST", "/edges/edge-a/commands")] = (
        504,
        error_body("edge_timeout", "no answer within 2 s", 504, operation=dict(OPERATION, state="timed_out")),
    )
    timed_out = await iopctl(["command", "edge-a", "node.drain", "--timeout", "2"], fake)
    assert timed_out.code == EXIT_ERROR and "timed_out" in timed_out.out
    assert timed_out.err == "iopctl: edge_timeout: no answer within 2 s\n"


def closed_port() -> int:
    """A loopback port with nothing listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest_twisted.ensureDeferred
async def test_unreachable_is_one_line_and_exit_3() -> None:
    """A Control Plane that refuses connections: one clear line, exit 3."""
    url = f"http://127.0.0.1:{closed_port()}"
    args = parse_arguments(["--url", url, "fleet"])
    err = io.StringIO()
    code = await run(reactor, args, ControlPlaneStatusRepository(url), lambda a: None, io.StringIO(), err)
    assert code == EXIT_UNREACHABLE
    assert err.getvalue() == f"iopctl: cannot reach the Control Plane at {url}: connection refused\n"


# -- wire -----------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_hello_over_the_wire() -> None:
    """iopctl hello prints the server's answer; --json parses."""
    server = FakeWireServer()
    url = await server.listen(reactor)
    try:
        result = await iopctl(["hello", "--wire-url", url])
        assert result.code == EXIT_OK and "fake-1" in result.out and "events.subscribe" in result.out
        as_json = (await iopctl(["hello", "--wire-url", url, "--json"])).json()
        assert as_json["accepted"] is True and as_json["protocol"] == "1.0"
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_hello_rejected_exits_1() -> None:
    """A refused hello prints the reason as one error line and exits 1."""
    server = FakeWireServer(token="right")
    url = await server.listen(reactor)
    try:
        result = await iopctl(["hello", "--wire-url", url, "--token", "wrong"])
        assert result.code == EXIT_ERROR
        assert result.err == "iopctl: hello_rejected: the API token is missing or wrong\n"
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_events_follow_prints_live_until_interrupted() -> None:
    """events --follow prints each event as it arrives and lost-event notices; Ctrl-C ends it with 0."""
    server = FakeWireServer()
    url = await server.listen(reactor)
    interrupted: Deferred[None] = Deferred()
    out = io.StringIO()
    try:
        running = Deferred.fromCoroutine(
            iopctl(["events", "edge-a", "--follow", "--wire-url", url], interrupted=interrupted, out=out)
        )
        await eventually(
            lambda: any(c.subscribed == "edge-a" for c in server.connections), timeout=5, message="subscribed"
        )
        server.publish(fleet_event("edge-a", 1, 1, kind="node.ready"))
        server.send_lost(2, 2, 3)
        server.publish(fleet_event("edge-a", 4, 4, kind="node.disconnected"))
        await eventually(lambda: "node.disconnected" in out.getvalue(), timeout=5, message="second event printed")
        interrupted.callback(None)
        result = await running
        assert result.code == EXIT_OK
        lines = result.out.splitlines()
        assert lines[0].split()[0] == "1" and "node.ready" in lines[0] and "node=node-1" in lines[0]
        assert lines[1] == "-- 2 events lost (sequences 2..3, slow_consumer) --"
        assert "node.disconnected" in lines[2]
        await eventually(lambda: not server.connections, timeout=5, message="connection closed")
    finally:
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_events_follow_json_lines() -> None:
    """events --follow --json prints one JSON object per line, in the HTTP event shape."""
    server = FakeWireServer()
    url = await server.listen(reactor)
    interrupted: Deferred[None] = Deferred()
    out = io.StringIO()
    try:
        running = Deferred.fromCoroutine(
            iopctl(["events", "edge-a", "-f", "--json", "--wire-url", url], interrupted=interrupted, out=out)
        )
        await eventually(
            lambda: any(c.subscribed == "edge-a" for c in server.connections), timeout=5, message="subscribed"
        )
        server.publish(fleet_event("edge-a", 1, 1))
        await eventually(lambda: out.getvalue().count("\n") == 1, timeout=5, message="one line")
        interrupted.callback(None)
        result = await running
        event = json.loads(result.out.splitlines()[0])
        assert (event["sequence"], event["edge_id"], event["kind"]) == (1, "edge-a", "node.ready")
        assert event["occurred_at"].endswith("Z")
    finally:
        await server.stop()


# -- the installed console script --------------------------------------------------


def test_console_script_unreachable_and_usage() -> None:
    """The real iopctl script: unreachable -> one line, exit 3; usage error -> exit 2; no tracebacks."""
    url = f"http://127.0.0.1:{closed_port()}"
    done = subprocess.run([IOPCTL, "--url", url, "fleet"], capture_output=True, text=True, timeout=30)
    assert done.returncode == EXIT_UNREACHABLE
    assert done.stderr == f"iopctl: cannot reach the Control Plane at {url}: connection refused\n"
    assert done.stdout == ""
    usage = subprocess.run([IOPCTL, "status"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == EXIT_USAGE and "Traceback" not in usage.stderr
    assert usage.stderr.splitlines()[-1].startswith("iopctl: error:")
