"""iopctl: argument parsing, tables, --json and exit codes, against the real Control Plane.

Every view runs ``cli.run`` with a repository on a real Control Plane fed by
scripted edges (``twisted_iop.testing.harness.start_fleet``); ``--json`` output is compared
with what the server itself answers and validated against its OpenAPI
document.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import pytest_twisted
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
from twisted_iop.client.iopctl.render import render_table
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient
from twisted_iop.testing.harness import Fleet, contract_validator, eventually, start_fleet
from twisted_iop.testing.wires.peers import set_engine, set_launch, snapshot
from twisted_iop.wire import control_pb2 as pb

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
    fleet: Fleet,
    interrupted: Optional[Deferred[None]] = None,
    out: Optional[io.StringIO] = None,
) -> Result:
    """Run iopctl's ``run`` against ``fleet``'s real Control Plane (HTTP and wire)."""
    args = parse_arguments(argv)
    repository = ControlPlaneStatusRepository(args.url or fleet.cp.http_url, api_token=args.token, timeout=10)
    out = out or io.StringIO()
    err = io.StringIO()

    def wire_factory(a: Any) -> ClientWireClient:
        return ClientWireClient(a.wire_url or fleet.cp.wire_url, reactor=reactor, api_token=a.token)

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

#: Keys whose values change from one request to the next (fresh snapshots, clocks).
VOLATILE = {"generated_at", "received_at", "round_at", "last_seen", "connected_since"}


def without_volatile(document: Any) -> Any:
    """``document`` with the per-request times removed, for comparing two answers."""
    if isinstance(document, dict):
        return {k: without_volatile(v) for k, v in document.items() if k not in VOLATILE}
    if isinstance(document, list):
        return [without_volatile(v) for v in document]
    return document


@pytest_twisted.ensureDeferred
async def test_tables_of_every_view() -> None:
    """edges, edge, status, fleet, events, operations, operation and commands print tables and exit 0."""
    fleet = await start_fleet("edge-a", "edge-b")
    try:
        await fleet.disconnect("edge-b")
        operation = await fleet.repository().send_command("edge-a", "node.drain", target="node-1")
        edges = await iopctl(["edges"], fleet)
        assert edges.code == EXIT_OK and edges.err == ""
        lines = edges.out.splitlines()
        assert lines[0].split()[:3] == ["EDGE", "CONNECTED", "VERSION"]
        assert lines[1].split()[:3] == ["edge-a", "yes", "test-edge"] and lines[2].split()[:2] == ["edge-b", "no"]
        assert lines[0].index("CONNECTED") == lines[1].index("yes") == lines[2].index("no")

        status = await iopctl(["status", "edge-a"], fleet)
        assert status.code == EXIT_OK
        header, totals, nodes, providers = status.out.strip("\n").split("\n\n")
        assert header.startswith("edge edge-a: connected, fresh snapshot")
        assert "nodes      2/2 connected" in totals and "long ctx   0/2 in flight, 2 queued" in totals
        assert [line.split()[:3] for line in nodes.splitlines()[1:]] == [
            ["node-1", "yes", "no"],
            ["node-2", "yes", "no"],
        ]
        provider_lines = providers.splitlines()
        assert provider_lines[0].split()[:5] == ["NODE", "PROVIDER", "KIND", "STATUS", "HEALTH"]
        assert provider_lines[1].split() == [
            "node-1",
            "mock-1",
            "mock",
            "available",
            "healthy",
            "4",
            "1",
            "2",
            "1",
            "0",
            "1",
            "-",
            "-",
            "-",
            "0.0",
            "-",  # TTFT p95: no request yet
            "-",  # TPOT p95
            "-",
            "-",
            "llama-3-8b",
        ]
        cap_end = provider_lines[0].index("CAP ") + 3
        assert provider_lines[1][cap_end - 1] == "4"  # right-aligned under its header

        expectations = {
            ("edge", "edge-a"): "last snapshot     fresh",
            ("fleet",): "edges      1/2 connected",
            ("events", "edge-a", "--since", "0"): "edge.connected",
            ("operations", "edge-a"): operation.operation_id,
            ("operation", "edge-a", operation.operation_id): "succeeded",
            ("commands", "edge-a"): "edge.diagnostics",
        }
        for argv, needle in expectations.items():
            result = await iopctl(list(argv), fleet)
            assert result.code == EXIT_OK, (argv, result.err)
            assert needle in result.out, (argv, result.out)
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_status_shows_each_engine_beside_its_capacity() -> None:
    """iopctl status: a provider's engine running/waiting, KV cache, tokens/s
    and flags sit beside its counters, totalled in an engines line; --json
    is the server's view with the engine's members."""
    fleet = await start_fleet("edge-a")
    try:

        def status() -> pb.EdgeStatusResponse:
            response = snapshot("edge-a")
            set_engine(response.nodes[0].providers[0], saturated=True, cooling_down=True)
            set_launch(response.nodes[1].providers[0])
            response.nodes[1].providers[0].health_reason = "engine crashed: exited with code 1"
            return response

        fleet.edges["edge-a"].status = status
        result = await iopctl(["status", "edge-a"], fleet)
        assert result.code == EXIT_OK and result.err == ""
        _, totals, _, providers = result.out.strip("\n").split("\n\n")
        assert "engines    1 running, 3 waiting (1 of 2 report); 37.5 tokens/s; 1 saturated, 1 cooling down" in totals
        header, first, second = providers.splitlines()
        assert header.split()[11:20] == [
            "ENG-RUN",
            "ENG-WAIT",
            "KV",
            "TOK/S",
            "TTFT-P95",
            "TPOT-P95",
            "FLAGS",
            "LAUNCH",
            "MODELS",
        ]
        assert first.split()[11:19] == ["1", "3", "42%", "37.5", "-", "-", "saturated,cooling-down", "-"]
        assert second.split()[11:19] == ["-", "-", "-", "0.0", "-", "-", "-", "crashed(2)"]
        assert second.endswith("engine crashed: exited with code 1; next try 2023-11-14 22:13:24")
        assert first.index("42%") + 3 == header.index("KV") + 2  # right-aligned under its header

        printed = (await iopctl(["--json", "status", "edge-a"], fleet)).json()
        contract_validator("EdgeStatus").validate(printed)
        code, served = await fleet.cp.get_json("/edges/edge-a/status")
        assert code == 200 and without_volatile(printed) == without_volatile(served)
        shown = printed["nodes"][0]["providers"][0]
        assert shown["engine"] == {
            "running": 1,
            "waiting": 3,
            "kv_cache_usage": 0.42,
            "parallel": 1,
            "age_seconds": 1.2,
        }
        assert shown["tokens"] == {"prompt": 1200, "completion": 3400, "estimated": {"prompt": 0, "completion": 0}}
        assert shown["saturated"] is True
        assert printed["nodes"][1]["providers"][0]["engine"] is None
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_fleet_with_a_frozen_edge() -> None:
    """iopctl fleet: the frozen edge's row says timeout and why; the other rows are normal; --json too."""
    fleet = await start_fleet("edge-a", "edge-b", "edge-c")
    try:
        fleet.freeze("edge-b")
        result = await iopctl(["fleet"], fleet)
        assert result.code == EXIT_OK and result.err == ""
        table = result.out.strip("\n").split("\n\n")[-1].splitlines()
        assert table[0].split()[:2] == ["EDGE", "STATE"] and table[0].rstrip().endswith("ERROR")
        rows = {line.split()[0]: line for line in table[1:]}
        assert rows["edge-b"].split()[1:3] == ["timeout", "yes"]
        assert rows["edge-b"].endswith("edge_timeout: edge 'edge-b' did not answer within 0.5s")
        for edge_id in ("edge-a", "edge-c"):
            # state, connected, nodes, providers, the six counters, TTFT/TPOT p95 (none), and no error text
            assert rows[edge_id].split()[1:] == ["ok", "yes", "2/2", "2", "8", "2", "4", "2", "0", "2", "-", "-"]
        as_json = (await iopctl(["--json", "fleet"], fleet)).json()
        contract_validator("FleetStatus").validate(as_json)
        json_rows = {row["edge_id"]: row for row in as_json["items"]}
        assert json_rows["edge-b"]["state"] == "timeout" and json_rows["edge-b"]["stale"] is True
        assert json_rows["edge-b"]["error"] == {
            "code": "edge_timeout",
            "message": "edge 'edge-b' did not answer within 0.5s",
        }
        assert [json_rows[e]["error"] for e in ("edge-a", "edge-c")] == [None, None]
        assert as_json["totals"]["edges_connected"] == 3 and as_json["totals"]["nodes_configured"] == 4
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_every_json_command_prints_the_server_shape() -> None:
    """--json prints what the server answers for the view (edges: all pages as one GET /edges page)."""
    fleet = await start_fleet("edge-a", "edge-b")
    try:
        operation = await fleet.repository().send_command("edge-a", "node.drain", target="node-1")
        views = [
            (["edges"], "/edges?limit=1000", "EdgesPage"),
            (["edge", "edge-a"], "/edges/edge-a", "EdgeDetail"),
            (["status", "edge-a"], "/edges/edge-a/status", "EdgeStatus"),
            (["fleet"], "/fleet/status", "FleetStatus"),
            (["events", "edge-a"], "/edges/edge-a/events", "EdgeEventPage"),
            (["operations", "edge-a"], "/edges/edge-a/operations", "EdgeOperationPage"),
            (
                ["operation", "edge-a", operation.operation_id],
                f"/edges/edge-a/operations/{operation.operation_id}",
                "Operation",
            ),
            (["commands", "edge-a"], "/edges/edge-a/commands", "CommandCatalog"),
        ]
        for argv, path, schema in views:
            printed = (await iopctl(["--json", *argv], fleet)).json()
            code, served = await fleet.cp.get_json(path)
            assert code == 200
            contract_validator(schema).validate(printed)
            assert without_volatile(printed) == without_volatile(served), argv
        printed = (await iopctl(["--json", "command", "edge-a", "node.undrain", "--target", "node-2"], fleet)).json()
        contract_validator("CommandAnswer").validate(printed)
        assert printed["state"] == "succeeded" and printed["result"] == {"target": "node-2"}
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_server_error_is_one_line_and_exit_1() -> None:
    """An error answer prints 'iopctl: <code>: <message>' on stderr and exits 1; --json prints the document."""
    fleet = await start_fleet()
    try:
        result = await iopctl(["status", "nope"], fleet)
        assert result.code == EXIT_ERROR and result.out == ""
        assert result.err == "iopctl: unknown_edge: no edge named 'nope' is known\n"
        as_json = await iopctl(["status", "nope", "--json"], fleet)
        contract_validator("Error").validate(as_json.json())
        assert as_json.json()["error"] == {
            "code": "unknown_edge",
            "message": "no edge named 'nope' is known",
            "status": 404,
        }
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_not_connected_status_shows_the_stale_snapshot() -> None:
    """A disconnected edge: the last snapshot marked STALE, then the error line; exit 1; --json the 409 body."""
    fleet = await start_fleet("edge-b")
    try:
        await fleet.repository().edge_status("edge-b")
        await fleet.disconnect("edge-b")
        result = await iopctl(["status", "edge-b"], fleet)
        assert result.code == EXIT_ERROR
        assert "edge edge-b: not connected, STALE snapshot" in result.out and "mock-2" in result.out
        assert result.err == "iopctl: edge_not_connected: edge 'edge-b' is not connected\n"
        document = (await iopctl(["--json", "status", "edge-b"], fleet)).json()
        contract_validator("StatusNotConnectedError").validate(document)
        assert document["error"]["code"] == "edge_not_connected" and document["snapshot"]["stale"] is True
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_command_sends_and_prints_the_operation() -> None:
    """command sends name, target, arguments and key; prints the operation; exit 0 on success."""
    fleet = await start_fleet("edge-a")
    try:
        argv = [
            "command",
            "edge-a",
            "node.drain",
            "--target",
            "node-1",
            "--arg",
            "reason=maintenance",
            "--idempotency-key",
            "drain-1",
            "--timeout",
            "4",
        ]
        result = await iopctl(argv, fleet)
        assert result.code == EXIT_OK, result.err
        (sent,) = fleet.edges["edge-a"].commands_seen
        assert (sent.name, sent.target, dict(sent.arguments)) == ("node.drain", "node-1", {"reason": "maintenance"})
        pairs = dict(line.split(None, 1) for line in result.out.splitlines() if len(line.split(None, 1)) == 2)
        assert pairs["state"] == "succeeded" and pairs["target"] == "node-1" and "replayed" not in result.out
        again = await iopctl(argv, fleet)
        assert again.code == EXIT_OK and len(fleet.edges["edge-a"].commands_seen) == 1
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_failed_rejected_and_timed_out_commands_exit_1() -> None:
    """A failed or rejected command exits 1 with its reason; a timeout prints the operation and the error."""
    fleet = await start_fleet("edge-a")
    edge = fleet.edges["edge-a"]
    try:
        edge.command_behaviour = "fail"
        failed = await iopctl(["command", "edge-a", "node.drain"], fleet)
        assert failed.code == EXIT_ERROR and failed.err == "iopctl: failed: told to fail\n"
        edge.command_behaviour = "reject"
        rejected = await iopctl(["command", "edge-a", "node.drain"], fleet)
        assert rejected.code == EXIT_ERROR and rejected.err == "iopctl: rejected: told to reject\n"
        edge.command_behaviour = "silent"
        timed_out = await iopctl(["command", "edge-a", "node.drain", "--timeout", "0.2"], fleet)
        assert timed_out.code == EXIT_ERROR and "timed_out" in timed_out.out
        assert timed_out.err.startswith("iopctl: edge_timeout: ") and len(timed_out.err.splitlines()) == 1
        as_json = await iopctl(["--json", "command", "edge-a", "node.drain", "--timeout", "0.2"], fleet)
        contract_validator("CommandError").validate(as_json.json())
        assert as_json.json()["operation"]["state"] == "timed_out"
    finally:
        await fleet.stop()


async def real_operation(fleet: Fleet) -> dict[str, Any]:
    """The JSON of a real succeeded command answer."""
    code, answer = await fleet.cp.post_json("/edges/edge-a/commands", {"name": "node.drain", "target": "node-1"})
    assert code == 200
    return dict(answer)


@pytest_twisted.ensureDeferred
async def test_replayed_answer_and_late_outcome_are_shown() -> None:
    """A replayed command answer says so; an operation whose answer came late shows it (real answers)."""
    fleet = await start_fleet("edge-a")
    try:
        argv = ["command", "edge-a", "node.drain", "--target", "node-1", "--idempotency-key", "drain-once"]
        first = await iopctl(argv, fleet)
        assert first.code == 0 and not re.search(r"^replayed", first.out, re.M)
        again = await iopctl(argv, fleet)
        assert again.code == 0
        assert re.search(
            r"^replayed +yes: the key matched an earlier identical command; it was not sent again$", again.out, re.M
        )
        assert (await iopctl(["--json", *argv], fleet)).json()["replayed"] is True
        assert len(fleet.edges["edge-a"].commands_seen) == 1

        edge = fleet.edges["edge-a"]
        edge.command_behaviour = "hold"
        code, timed_out = await fleet.cp.post_json(
            "/edges/edge-a/commands", {"name": "node.undrain", "target": "node-1", "timeout_seconds": 0.2}
        )
        assert code == 504 and timed_out["operation"]["state"] == "timed_out"
        operation_id = timed_out["operation"]["operation_id"]
        edge.answer_held(reason="undrained late", undrained="true")

        async def late_recorded() -> bool:
            _, served = await fleet.cp.get_json(f"/edges/edge-a/operations/{operation_id}")
            return served["late_outcome"] is not None

        await eventually(late_recorded, message="late outcome recorded")
        shown = await iopctl(["operation", "edge-a", operation_id], fleet)
        assert re.search(r"^late outcome +succeeded at .*: undrained late$", shown.out, re.M)
        assert "late result:\n  undrained  true\n" in shown.out
        table = (await iopctl(["operations", "edge-a"], fleet)).out.splitlines()
        assert table[0].split()[:5] == ["OPERATION", "NAME", "TARGET", "STATE", "LATE"]
        assert table[1].split()[3:5] == ["timed_out", "succeeded"]
        printed = (await iopctl(["--json", "operation", "edge-a", operation_id], fleet)).json()
        contract_validator("Operation").validate(printed)
        assert printed["late_outcome"]["result"] == {"undrained": "true"}
    finally:
        await fleet.stop()


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
    """iopctl hello prints the real server's answer; --json parses; a wrong token exits 1 with the reason."""
    fleet = await start_fleet(api_token="s3cret")
    try:
        result = await iopctl(["hello", "--token", "s3cret"], fleet)
        assert result.code == EXIT_OK and "events.subscribe" in result.out
        as_json = (await iopctl(["hello", "--json", "--token", "s3cret"], fleet)).json()
        assert as_json["accepted"] is True and as_json["url"] == fleet.cp.wire_url
        refused = await iopctl(["hello", "--token", "wrong"], fleet)
        assert refused.code == EXIT_ERROR and refused.err.startswith("iopctl: hello_rejected: ")
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_events_follow_prints_live_and_lost_events_until_interrupted() -> None:
    """events --follow --since 0: a resume_gap notice for events the buffer dropped, then events live."""
    fleet = await start_fleet("edge-a", config_text="registry:\n  events_per_edge: 3\n")
    edge = fleet.edges["edge-a"]
    interrupted: Deferred[None] = Deferred()
    out = io.StringIO()
    try:
        for i in range(5):
            edge.event("provider.health_changed", node_id="node-1", message=f"change {i}")
        await eventually(
            lambda: fleet.cp.registry.get("edge-a").events.last_sequence == 6, timeout=5, message="6 events"
        )
        running = Deferred.fromCoroutine(
            iopctl(["events", "edge-a", "--follow", "--since", "0"], fleet, interrupted=interrupted, out=out)
        )
        await eventually(lambda: out.getvalue().count("\n") == 4, timeout=5, message="notice and kept events")
        edge.event("node.ready", node_id="node-1", message="node node-1 is ready")
        await eventually(lambda: "node.ready" in out.getvalue(), timeout=5, message="the live event")
        interrupted.callback(None)
        result = await running
        assert result.code == EXIT_OK
        lines = result.out.splitlines()
        assert lines[0] == "-- 3 events lost (sequences 1..3, resume_gap) --"
        assert [line.split()[0] for line in lines[1:]] == ["4", "5", "6", "7"]
        assert "node.ready" in lines[4] and "node=node-1" in lines[4] and "node node-1 is ready" in lines[4]
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_events_follow_json_lines() -> None:
    """events --follow --json prints one JSON object per line, in the HTTP event shape."""
    fleet = await start_fleet("edge-a")
    interrupted: Deferred[None] = Deferred()
    out = io.StringIO()
    try:
        # --since the current end: the event below arrives whether it is
        # relayed before or after the subscription is in place.
        since = str(fleet.cp.registry.get("edge-a").events.last_sequence)
        argv = ["events", "edge-a", "-f", "--json", "--since", since]
        running = Deferred.fromCoroutine(iopctl(argv, fleet, interrupted=interrupted, out=out))
        fleet.edges["edge-a"].event("node.ready", node_id="node-1")
        await eventually(lambda: out.getvalue().count("\n") == 1, timeout=5, message="one line")
        interrupted.callback(None)
        result = await running
        event = json.loads(result.out.splitlines()[0])
        contract_validator("Event").validate(event)
        assert (event["edge_id"], event["kind"], event["node_id"]) == ("edge-a", "node.ready", "node-1")
        _code, served = await fleet.cp.get_json(f"/edges/edge-a/events?since={event['sequence'] - 1}&limit=1")
        assert without_volatile(served["items"][0]) == without_volatile(event)
    finally:
        await fleet.stop()


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
