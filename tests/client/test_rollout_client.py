"""The rollout client: repository methods, models and ``iopctl rollout``, on a
stand-in for the Control Plane's ``/rollouts`` endpoints.

:class:`StandInRollouts` is a small Klein app that serves the agreed
``/rollouts`` shapes (briefed to client and server alike). It STANDS IN
UNTIL THE REAL SERVER'S ``/rollouts`` LANDS; then these tests move onto the
real Klein app (``stub_repository``) and ``test_rollout_cli_integration.py``
covers the real Control Plane over sockets. It keeps only what the client
depends on: the documents' shapes, the error documents (400
``invalid_selector``, 404 ``unknown_rollout``, 409 ``invalid_transition``),
idempotent replays, paging, and a rollout that moves one batch further on
every ``GET /rollouts/{id}``.
"""

from __future__ import annotations

import argparse
import io
import json
from typing import Any, Optional

import pytest
import pytest_twisted
from klein import Klein
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.web.iweb import IRequest

from twisted_iop.client import ControlPlaneError
from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, UsageError, parse_arguments, run
from twisted_iop.client.errors import InvalidTransitionError, UnknownRolloutError
from twisted_iop.client.iopctl.rollout_cli import request_from_arguments
from twisted_iop.client.iopctl.rollout_render import progress_bar, progress_line
from twisted_iop.client.model_json import read, to_json
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.rollouts import (
    Rollout,
    RolloutAbort,
    RolloutCommand,
    RolloutRequest,
    RolloutStrategy,
)
from twisted_iop.label_selectors import SelectorError, parse_selector

#: The stand-in's edges and their hello labels.
EDGES = {
    f"edge-{i:02d}": {"region": "eu" if i < 6 else "us", "tier": "canary" if i == 0 else "main"} for i in range(10)
}
COUNT_NAMES = ("pending", "waiting", "in_flight", "succeeded", "failed", "timed_out", "skipped", "cancelled")


def _error(request: IRequest, status: int, code: str, message: str) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json")
    return json.dumps({"error": {"code": code, "message": message, "status": status}}).encode()


class StandInRollouts:
    """The agreed ``/rollouts`` endpoints over an in-memory fleet (stands in
    until the real server lands; see the module docstring).

    Each ``GET /rollouts/{id}`` of a running rollout ends one more batch of
    executions: ``succeeded``, or ``failed`` for the edges in ``failing``.
    """

    app = Klein()

    def __init__(self, failing: frozenset[str] = frozenset()) -> None:
        self.failing = failing
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.executions: dict[str, list[dict[str, Any]]] = {}
        self.bodies: list[Any] = []

    def _json(self, request: IRequest, document: Any, status: int = 200) -> bytes:
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(document).encode()

    def _advance(self, rollout: dict[str, Any]) -> None:
        if rollout["state"] != "running":
            return
        runs = self.executions[rollout["rollout_id"]]
        pending = [e for e in runs if e["state"] == "pending"]
        size = rollout["strategy"].get("batch_size") or 2
        for execution in pending[:size]:
            failed = execution["edge_id"] in self.failing
            execution.update(
                state="failed" if failed else "succeeded",
                reason="told to fail" if failed else None,
                operation_ids=[f"op-{execution['edge_id']}"],
                started_at="2026-01-01T00:00:00.000Z",
                finished_at="2026-01-01T00:00:01.000Z",
            )
        number = (rollout["batch"] or {"number": 0})["number"] + 1
        rollout["batch"] = {"number": number, "size": size}
        self._count(rollout)
        counts = rollout["counts"]
        if rollout["abort"].get("any_failure") and counts["failed"]:
            rollout.update(state="aborted", reason=f"{counts['failed']} failed (any failure aborts)")
        elif counts["pending"] == 0:
            rollout["state"] = "failed" if counts["failed"] else "succeeded"
        if rollout["state"] != "running":
            rollout["finished_at"] = "2026-01-01T00:01:00.000Z"
            rollout["batch"] = None

    def _count(self, rollout: dict[str, Any]) -> None:
        runs = self.executions[rollout["rollout_id"]]
        counts = {name: sum(1 for e in runs if e["state"] == name) for name in COUNT_NAMES}
        rollout["counts"] = counts
        ended = counts["succeeded"] + counts["failed"] + counts["timed_out"] + counts["skipped"] + counts["cancelled"]
        rollout["progress"] = ended / len(runs) if runs else 1.0

    @app.route("/rollouts", methods=["POST"])
    def create(self, request: IRequest) -> bytes:
        """``POST /rollouts``."""
        body = json.loads(request.content.read())
        self.bodies.append(body)
        command = body.get("command")
        if not isinstance(command, dict) or not isinstance(command.get("name"), str):
            return _error(request, 400, "bad_request", "command.name: required")
        try:
            selector = parse_selector(body.get("selector", ""))
        except SelectorError as e:
            return _error(request, 400, "invalid_selector", str(e))
        key = body.get("idempotency_key")
        for rollout in self.rollouts.values():
            if key is not None and rollout["idempotency_key"] == key:
                return self._json(request, rollout, 200)
        rollout_id = f"ro-{len(self.rollouts) + 1}"
        targets = sorted(edge for edge, labels in EDGES.items() if selector.matches(labels))
        self.executions[rollout_id] = [
            {
                "edge_id": e,
                "state": "pending",
                "operation_ids": [],
                "reason": None,
                "started_at": None,
                "finished_at": None,
            }
            for e in targets
        ]
        rollout = {
            "rollout_id": rollout_id,
            "state": "running",
            "reason": None,
            "command": {"arguments": {}, **command},
            "selector": body["selector"],
            "strategy": body.get("strategy", {}),
            "abort": body.get("abort", {}),
            "timeout_seconds": body.get("timeout_seconds"),
            "disconnected": body.get("disconnected", "wait"),
            "created_at": "2026-01-01T00:00:00.000Z",
            "started_at": "2026-01-01T00:00:00.000Z",
            "finished_at": None,
            "targets": len(targets),
            "batch": None,
            "idempotency_key": key,
        }
        self._count(rollout)
        self.rollouts[rollout_id] = rollout
        return self._json(request, rollout, 201)

    @app.route("/rollouts", methods=["GET"])
    def listing(self, request: IRequest) -> bytes:
        """``GET /rollouts``, newest first."""
        limit = int(request.args.get(b"limit", [b"100"])[0])
        items = list(reversed(self.rollouts.values()))
        return self._json(
            request,
            {"items": items[:limit], "total": len(items), "next_cursor": "more" if len(items) > limit else None},
        )

    @app.route("/rollouts/<rollout_id>", methods=["GET"])
    def one(self, request: IRequest, rollout_id: str) -> bytes:
        """``GET /rollouts/{id}`` (one batch further each time)."""
        rollout = self.rollouts.get(rollout_id)
        if rollout is None:
            return _error(request, 404, "unknown_rollout", f"no rollout {rollout_id!r}")
        self._advance(rollout)
        return self._json(request, rollout)

    @app.route("/rollouts/<rollout_id>/executions", methods=["GET"])
    def execution_page(self, request: IRequest, rollout_id: str) -> bytes:
        """``GET /rollouts/{id}/executions``, paged by an offset cursor."""
        if rollout_id not in self.rollouts:
            return _error(request, 404, "unknown_rollout", f"no rollout {rollout_id!r}")
        state = request.args.get(b"state", [b""])[0].decode()
        limit = min(int(request.args.get(b"limit", [b"100"])[0]), 3)  # small pages: the client must follow them
        start = int(request.args.get(b"cursor", [b"0"])[0])
        runs = [e for e in self.executions[rollout_id] if not state or e["state"] == state]
        page = runs[start : start + limit]
        next_cursor = str(start + limit) if start + limit < len(runs) else None
        return self._json(request, {"items": page, "total": len(runs), "next_cursor": next_cursor})

    @app.route("/rollouts/<rollout_id>/<action>", methods=["POST"])
    def transition(self, request: IRequest, rollout_id: str, action: str) -> bytes:
        """``POST /rollouts/{id}/pause|resume|cancel``."""
        rollout = self.rollouts.get(rollout_id)
        if rollout is None:
            return _error(request, 404, "unknown_rollout", f"no rollout {rollout_id!r}")
        allowed = {"pause": {"running": "paused"}, "resume": {"paused": "running"}}.get(
            action, {"running": "cancelled", "paused": "cancelled", "pending": "cancelled"}
        )
        if rollout["state"] not in allowed:
            return _error(request, 409, "invalid_transition", f"cannot {action} a rollout that is {rollout['state']}")
        rollout["state"] = allowed[rollout["state"]]
        if action == "cancel":
            for execution in self.executions[rollout_id]:
                if execution["state"] == "pending":
                    execution["state"] = "cancelled"
            self._count(rollout)
        return self._json(request, rollout)

    def repository(self) -> ControlPlaneStatusRepository:
        """A repository on this app through StubTreq."""
        return ControlPlaneStatusRepository("http://cp.test:8080", http_client=StubTreq(self.app.resource()))


class Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        """Yes."""
        return True


class Result:
    """What one iopctl run printed and returned."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err


async def iopctl(
    argv: list[str],
    server: StandInRollouts,
    out: Optional[io.StringIO] = None,
    interrupted: Optional[Deferred[None]] = None,
) -> Result:
    """Run iopctl's ``run`` on the stand-in."""
    args = parse_arguments(argv)
    out = out if out is not None else io.StringIO()
    err = io.StringIO()
    code = await run(reactor, args, server.repository(), lambda a: None, out, err, interrupted)
    return Result(code, out.getvalue(), err.getvalue())


# -- parsing -----------------------------------------------------------------------


def test_create_options_become_the_agreed_body() -> None:
    """Every create option lands in its member of the POST /rollouts body; options not given are left out."""
    args = parse_arguments(
        [
            "rollout",
            "create",
            "--command",
            "node.drain",
            "--target",
            "node-1",
            "--arg",
            "reason=maintenance",
            "-l",
            "region=eu,tier!=canary",
            "--batch-size",
            "50",
            "--max-in-flight",
            "40",
            "--pause",
            "0",
            "--increase-factor",
            "2",
            "--abort-percent",
            "10",
            "--min-executed",
            "20",
            "--timeout",
            "30",
            "--wait-seconds",
            "60",
            "--idempotency-key",
            "drain-eu-1",
        ]
    )
    assert request_from_arguments(args).body() == {
        "command": {"name": "node.drain", "target": "node-1", "arguments": {"reason": "maintenance"}},
        "selector": "region=eu,tier!=canary",
        "strategy": {"batch_size": 50, "max_in_flight": 40, "pause_seconds": 0.0, "increase_factor": 2.0},
        "abort": {"failure_percent": 10.0, "min_executed": 20},
        "timeout_seconds": 30.0,
        "wait_seconds": 60.0,
        "idempotency_key": "drain-eu-1",
    }
    minimal = parse_arguments(
        [
            "rollout",
            "create",
            "--command",
            "edge.diagnostics",
            "-l",
            "",
            "--node-selector",
            "gpu in (h100)",
            "--batch-percent",
            "5",
            "--abort-on-any-failure",
            "--skip-disconnected",
        ]
    )
    assert request_from_arguments(minimal).body() == {
        "command": {"name": "edge.diagnostics", "node_selector": "gpu in (h100)", "arguments": {}},
        "selector": "",
        "strategy": {"batch_percent": 5.0},
        "abort": {"any_failure": True},
        "disconnected": "skip",
    }


CREATE = ["rollout", "create", "--command", "node.drain", "-l", "region=eu"]


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout"],
        ["rollout", "create", "-l", "region=eu"],
        ["rollout", "create", "--command", "node.drain"],
        [*CREATE[:-1], "region in (eu"],
        [*CREATE, "--node-selector", "gpu in"],
        [*CREATE, "--target", "n1", "--node-selector", "gpu"],
        [*CREATE, "--batch-size", "5", "--batch-percent", "5"],
        [*CREATE, "--batch-size", "0"],
        [*CREATE, "--batch-percent", "101"],
        [*CREATE, "--max-in-flight", "many"],
        [*CREATE, "--increase-factor", "0.5"],
        [*CREATE, "--abort-percent", "5", "--abort-on-any-failure"],
        [*CREATE, "--skip-disconnected", "--wait-seconds", "5"],
        [*CREATE, "--timeout", "301"],
        [*CREATE, "--watch", "--interval", "0"],
        ["rollout", "show"],
        ["rollout", "pause"],
        ["rollout", "list", "--limit", "0"],
    ],
)
def test_usage_errors(argv: list[str]) -> None:
    """Bad or conflicting rollout options are usage errors, before anything is sent."""
    with pytest.raises(UsageError):
        parse_arguments(argv)


def test_a_bad_selector_names_its_position() -> None:
    """The selector is checked with the one parser; the message names where it broke."""
    with pytest.raises(UsageError, match="at position 13"):
        parse_arguments([*CREATE[:-1], "region in (eu"])


def test_request_refuses_conflicting_members() -> None:
    """The library's request refuses what the server would (either of two exclusive members)."""
    with pytest.raises(ValueError, match="target or a node_selector"):
        RolloutCommand("node.drain", target="n", node_selector="gpu")
    with pytest.raises(ValueError, match="batch_size or batch_percent"):
        RolloutStrategy(batch_size=1, batch_percent=5.0)
    with pytest.raises(ValueError, match="failure_percent or any_failure"):
        RolloutAbort(failure_percent=5.0, any_failure=True)
    with pytest.raises(ValueError, match="wait_seconds"):
        RolloutRequest(RolloutCommand("x"), "", disconnected="skip", wait_seconds=5.0)


def test_progress_bar_is_clamped_and_sized() -> None:
    """The bar has its width whatever the share, full at 1 and empty at 0."""
    assert progress_bar(0.0, 10) == "[..........]"
    assert progress_bar(0.55, 10) == "[#####.....]"
    assert progress_bar(1.0, 10) == "[##########]"
    assert progress_bar(7.0, 10) == progress_bar(1.0, 10)
    assert progress_bar(-1.0, 10) == progress_bar(0.0, 10)


# -- the repository ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_repository_round_trip() -> None:
    """Create, read, list, page executions, pause/resume/cancel; each answer reads as its model."""
    server = StandInRollouts(failing=frozenset({"edge-03"}))
    repo = server.repository()
    request = RolloutRequest(
        RolloutCommand("node.drain", target="node-1"),
        "region=eu",
        RolloutStrategy(batch_size=2),
        idempotency_key="k",
    )
    created = await repo.create_rollout(request)
    assert (created.state, created.targets, created.counts.pending) == ("running", 6, 6)
    assert server.bodies[-1] == request.body()
    again = await repo.create_rollout(request)
    assert again.rollout_id == created.rollout_id and len(server.rollouts) == 1
    first = await repo.rollout(created.rollout_id)
    assert first.counts.succeeded == 2 and first.batch is not None and first.batch.number == 1
    assert first.progress == pytest.approx(2 / 6)
    paused = await repo.pause_rollout(created.rollout_id)
    assert paused.state == "paused"
    assert (await repo.rollout(created.rollout_id)).counts.ended == 2  # paused: no further batch
    assert (await repo.resume_rollout(created.rollout_id)).state == "running"
    await repo.rollout(created.rollout_id)
    executions = await repo.all_rollout_executions(created.rollout_id)
    assert [e.edge_id for e in executions.items] == [f"edge-{i:02d}" for i in range(6)]
    failed = await repo.all_rollout_executions(created.rollout_id, state="failed")
    assert [(e.edge_id, e.reason, e.operation_ids) for e in failed.items] == [
        ("edge-03", "told to fail", ("op-edge-03",))
    ]
    cancelled = await repo.cancel_rollout(created.rollout_id)
    assert (cancelled.state, cancelled.counts.cancelled, cancelled.counts.ended) == ("cancelled", 2, 6)
    page = await repo.rollouts()
    assert page.total == 1 and page.items[0].rollout_id == created.rollout_id


@pytest_twisted.ensureDeferred
async def test_repository_errors_carry_the_server_code() -> None:
    """404 unknown_rollout, 409 invalid_transition and 400 invalid_selector raise with the server's words."""
    server = StandInRollouts()
    repo = server.repository()
    with pytest.raises(UnknownRolloutError, match="no rollout 'nope'"):
        await repo.rollout("nope")
    created = await repo.create_rollout(RolloutRequest(RolloutCommand("node.drain"), "region=us"))
    with pytest.raises(InvalidTransitionError) as transition:
        await repo.resume_rollout(created.rollout_id)
    assert transition.value.status == 409
    with pytest.raises(ControlPlaneError) as selector:
        await repo.create_rollout(RolloutRequest(RolloutCommand("node.drain"), "region in (eu"))
    assert (selector.value.code, selector.value.status) == ("invalid_selector", 400)
    assert "position" in selector.value.message


def test_rollout_model_round_trips_its_json() -> None:
    """to_json(read(document)) gives the document back (times in the server's format)."""
    document = {
        "rollout_id": "ro-1",
        "state": "aborted",
        "reason": "failure share 12% above 10% after 20 executed",
        "command": {"name": "node.drain", "target": "node-1", "arguments": {"reason": "m"}},
        "selector": "region=eu",
        "strategy": {"batch_size": 50, "max_in_flight": 50, "pause_seconds": 0.0, "increase_factor": 2.0},
        "abort": {"failure_percent": 10.0, "min_executed": 20},
        "timeout_seconds": 30.0,
        "disconnected": "wait",
        "created_at": "2026-01-01T00:00:00.000Z",
        "started_at": "2026-01-01T00:00:00.000Z",
        "finished_at": "2026-01-01T00:00:05.000Z",
        "targets": 200,
        "counts": dict.fromkeys(COUNT_NAMES, 0) | {"succeeded": 22, "failed": 3, "cancelled": 175},
        "progress": 1.0,
        "batch": {"number": 2, "size": 100},
        "idempotency_key": "drain-eu-1",
    }
    rollout = read(Rollout, document)
    assert rollout.ended and rollout.counts.ended == 200
    assert to_json(rollout) == document
    assert "aborted" in progress_line(rollout) and "failed 3" in progress_line(rollout)


# -- iopctl rollout --------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_create_show_list_and_json() -> None:
    """create prints the rollout; --json prints the server's document; list and show find it."""
    server = StandInRollouts()
    created = await iopctl([*CREATE, "--target", "node-1", "--json"], server)
    assert created.code == EXIT_OK, created.err
    document = json.loads(created.out)
    assert document == server.rollouts["ro-1"]
    table = await iopctl(["rollout", "show", "ro-1"], server)
    assert table.code == EXIT_OK
    assert "node.drain on node-1" in table.out and "region=eu" in table.out and "batch" in table.out
    listed = await iopctl(["rollout", "list"], server)
    assert listed.code == EXIT_OK and "ro-1" in listed.out and "1 of 1 rollouts" in listed.out
    executions = await iopctl(["rollout", "show", "ro-1", "--executions", "--state", "succeeded"], server)
    assert executions.code == EXIT_OK
    assert executions.out.count("succeeded") == 2  # one GET of the rollout so far: one batch of two


@pytest_twisted.ensureDeferred
async def test_watch_plain_lines_until_success() -> None:
    """Without a terminal, --watch prints one plain line per poll, ending at 100%, and exits 0."""
    server = StandInRollouts()
    result = await iopctl([*CREATE, "--batch-size", "2", "--watch", "--interval", "0.01"], server)
    assert result.code == EXIT_OK, result.err
    lines = result.out.splitlines()
    assert "\r" not in result.out and "\x1b" not in result.out
    assert len(lines) == 4  # created (0 of 6), then 2, 4 and 6 ended
    assert [line.split()[4] for line in lines] == ["0/6", "2/6", "4/6", "6/6"]
    assert "succeeded" in lines[-1] and "100.0%" in lines[-1]
    assert "rollout ro-1 created: 6 target edges" in result.err


@pytest_twisted.ensureDeferred
async def test_watch_redraws_in_place_on_a_terminal() -> None:
    """On a terminal, --watch redraws one line with carriage return and erase, then ends the line."""
    server = StandInRollouts()
    out = Terminal()
    result = await iopctl([*CREATE, "--batch-size", "3", "--watch", "--interval", "0.01"], server, out=out)
    assert result.code == EXIT_OK
    assert result.out.count("\r\x1b[2K") == 3 and result.out.count("\n") == 1
    assert result.out.endswith("100.0% 6/6  succeeded 6\n")


@pytest_twisted.ensureDeferred
async def test_watch_of_an_aborted_rollout_exits_1_with_the_reason() -> None:
    """A rollout that aborts ends the watch with exit 1 and the server's reason."""
    server = StandInRollouts(failing=frozenset({"edge-02"}))
    await iopctl([*CREATE, "--batch-size", "2", "--abort-on-any-failure"], server)
    result = await iopctl(["rollout", "show", "ro-1", "--watch", "--interval", "0.01"], server)
    assert result.code == EXIT_ERROR
    assert "iopctl: aborted: 1 failed (any failure aborts)" in result.err
    failed = await iopctl(
        [*CREATE[:-1], "region=us", "--watch", "--interval", "0.01"], StandInRollouts(frozenset({"edge-07"}))
    )
    assert failed.code == EXIT_ERROR and "iopctl: failed: the rollout ended failed" in failed.err


@pytest_twisted.ensureDeferred
async def test_watch_json_prints_one_document_per_poll() -> None:
    """--watch --json prints compact documents, the last one terminal."""
    server = StandInRollouts()
    result = await iopctl([*CREATE, "--batch-size", "4", "--watch", "--interval", "0.01", "--json"], server)
    documents = [json.loads(line) for line in result.out.splitlines()]
    assert [d["counts"]["succeeded"] for d in documents] == [0, 4, 6]
    assert documents[-1]["state"] == "succeeded" and result.code == EXIT_OK and result.err == ""


@pytest_twisted.ensureDeferred
async def test_interrupted_watch_exits_1_and_says_the_rollout_goes_on() -> None:
    """Ctrl-C during --watch stops watching (not the rollout): exit 1 and a note."""
    server = StandInRollouts()
    await iopctl([*CREATE, "--batch-size", "1"], server)
    interrupted: Deferred[None] = Deferred()
    reactor.callLater(0.05, interrupted.callback, None)
    result = await iopctl(["rollout", "show", "ro-1", "--watch", "--interval", "10"], server, interrupted=interrupted)
    assert result.code == EXIT_ERROR
    assert "stopped watching; rollout ro-1 is running" in result.err
    assert server.rollouts["ro-1"]["state"] == "running"


@pytest_twisted.ensureDeferred
async def test_pause_resume_cancel_and_their_errors() -> None:
    """pause/resume/cancel print the rollout; 409 and 404 print the server's code and message, exit 1."""
    server = StandInRollouts()
    await iopctl(CREATE, server)
    paused = await iopctl(["rollout", "pause", "ro-1"], server)
    assert paused.code == EXIT_OK and "paused" in paused.out
    again = await iopctl(["rollout", "pause", "ro-1"], server)
    assert again.code == EXIT_ERROR
    assert again.err == "iopctl: invalid_transition: cannot pause a rollout that is paused\n"
    assert (await iopctl(["rollout", "resume", "ro-1"], server)).code == EXIT_OK
    cancelled = await iopctl(["rollout", "cancel", "ro-1", "--json"], server)
    assert cancelled.code == EXIT_OK and json.loads(cancelled.out)["state"] == "cancelled"
    missing = await iopctl(["rollout", "show", "ro-9"], server)
    assert (missing.code, missing.err) == (EXIT_ERROR, "iopctl: unknown_rollout: no rollout 'ro-9'\n")
    missing_json = await iopctl(["rollout", "cancel", "ro-9", "--json"], server)
    assert json.loads(missing_json.out)["error"]["code"] == "unknown_rollout"


@pytest_twisted.ensureDeferred
async def test_options_that_conflict_only_together_are_usage_errors() -> None:
    """--min-executed without --abort-percent and --state without --executions exit 2, sending nothing."""
    server = StandInRollouts()
    result = await iopctl([*CREATE, "--min-executed", "5"], server)
    assert (result.code, result.err) == (EXIT_USAGE, "iopctl: error: --min-executed needs --abort-percent\n")
    assert server.bodies == []
    result = await iopctl(["rollout", "show", "ro-1", "--state", "failed"], server)
    assert result.code == EXIT_USAGE and "--state needs --executions" in result.err


def test_global_options_after_the_action() -> None:
    """--url, --token and --json work after the rollout action too."""
    args = parse_arguments(["rollout", "list", "--url", "http://x:1", "--json", "--token", "t"])
    assert isinstance(args, argparse.Namespace)
    assert (args.url, args.json, args.token, args.rollout_action) == ("http://x:1", True, "t", "list")
