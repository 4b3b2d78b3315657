"""End to end: ``twistd -n iop-control-plane`` on its default store, restarted
with SIGTERM and with ``kill -9``, as an operator would."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted

from twisted_iop.controlplane.store import sqlite_schema
from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV
from twisted_iop.testing.harness import (
    TWISTD,
    ControlPlaneHarness,
    Daemon,
    eventually,
    start_daemon,
    wait_for_ports,
)
from twisted_iop.testing.wires.peers import connect_edge

pytestmark = pytest.mark.e2e

#: Where the daemon keeps its store when nothing says otherwise (under its working directory).
DEFAULT_FILE = Path("state") / "control-plane.sqlite"


class DaemonHttp(ControlPlaneHarness):
    """The harness's HTTP helpers, pointed at a daemon's HTTP port."""

    def __init__(self, port: int) -> None:
        self.port = port

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _start(directory: Path) -> tuple[Daemon, DaemonHttp, int]:
    daemon = start_daemon(["iop-control-plane"], directory, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
    ports = await wait_for_ports(daemon, {"http", "edge_wire", "client_wire"})
    return daemon, DaemonHttp(ports["http"]), ports["edge_wire"]


def _stored_operation(path: Path, operation_id: str) -> Any:
    """The operation's row as the file has it now (read-only), or None."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return connection.execute("SELECT finished FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
    finally:
        connection.close()


@pytest_twisted.ensureDeferred
async def test_the_daemon_keeps_its_audit_across_sigterm_and_kill_9(tmp_path: Path) -> None:
    """Events, operations and idempotency keys survive a SIGTERM and a kill -9;
    numbers continue; what the API answered is on disk before the kill."""
    daemon, cp, edge_port = await _start(tmp_path)
    try:
        edge, _ = await connect_edge(edge_port, "edge-a")
        code, first = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-1"}
        )
        assert code == 200 and first["state"] == "succeeded"
        edge.event("node.ready", message="before the SIGTERM")
        seen: list[str] = []

        async def relayed() -> bool:
            _, events = await cp.get_json("/edges/edge-a/events")
            seen[:] = [e["message"] for e in events["items"]]
            return "before the SIGTERM" in seen

        await eventually(relayed, message="the relayed event recorded")
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
    assert (tmp_path / DEFAULT_FILE).is_file()

    daemon, cp, edge_port = await _start(tmp_path)
    try:
        code, view = await cp.get_json("/edges/edge-a")
        assert code == 200 and view["connected"] is False
        code, events = await cp.get_json("/edges/edge-a/events")
        kinds = [e["kind"] for e in events["items"]]
        assert kinds[:1] == ["edge.connected"] and "operation.succeeded" in kinds
        assert "edge.disconnected" in kinds
        assert "before the SIGTERM" in [e["message"] for e in events["items"]]
        before_kill = max(e["sequence"] for e in events["items"])
        code, ops = await cp.get_json("/edges/edge-a/operations")
        assert [o["operation_id"] for o in ops["items"]] == [first["operation_id"]]

        edge, _ = await connect_edge(edge_port, "edge-a")
        code, replay = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.drain", "target": "node-1", "idempotency_key": "drain-1"}
        )
        assert code == 200 and replay["replayed"] is True and edge.commands_seen == []
        code, second = await cp.post_json(
            "/edges/edge-a/commands", {"name": "node.undrain", "target": "node-1", "idempotency_key": "undrain-1"}
        )
        assert code == 200 and second["state"] == "succeeded"
        # Answered as recorded: on disk within the flush interval (0.5 s) and a commit.
        await eventually(
            lambda: _stored_operation(tmp_path / DEFAULT_FILE, second["operation_id"]) == (1,),
            timeout=5,
            message="the operation on disk",
        )
    finally:
        daemon.kill()

    daemon, cp, edge_port = await _start(tmp_path)
    try:
        code, ops = await cp.get_json("/edges/edge-a/operations")
        assert [(o["operation_id"], o["state"]) for o in ops["items"]] == [
            (second["operation_id"], "succeeded"),
            (first["operation_id"], "succeeded"),
        ]
        code, events = await cp.get_json("/edges/edge-a/events")
        last = events["items"][-1]
        assert last["kind"] == "edge.disconnected" and "without closing" in last["message"]
        edge, _ = await connect_edge(edge_port, "edge-a")
        code, events = await cp.get_json("/edges/edge-a/events")
        assert events["items"][-1]["kind"] == "edge.connected"
        assert events["items"][-1]["sequence"] > before_kill
        sequences = [e["sequence"] for e in events["items"]]
        assert sequences == sorted(set(sequences))
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
    check = sqlite3.connect(str(tmp_path / DEFAULT_FILE)).execute("PRAGMA integrity_check").fetchone()
    assert check == ("ok",)


def _newer_file(path: Path) -> None:
    sqlite_schema.connect(str(path)).close()
    raw = sqlite3.connect(str(path))
    raw.execute("PRAGMA user_version=99")
    raw.close()


def _garbage_file(path: Path) -> None:
    path.write_bytes(b"\x00 not an SQLite database \xff" * 512)


@pytest.mark.parametrize(
    ("make", "line"),
    [
        (_newer_file, "written by a newer twisted-iop (schema version 99"),
        (_garbage_file, "not a usable SQLite file"),
    ],
    ids=["newer", "corrupt"],
)
@pytest_twisted.ensureDeferred
async def test_a_store_file_it_cannot_use_stops_start_up_in_one_line(tmp_path: Path, make: Any, line: str) -> None:
    """Start-up refuses a newer or corrupt file: exit 1, one line naming it, no traceback, the file untouched."""
    path = tmp_path / DEFAULT_FILE
    path.parent.mkdir()
    make(path)
    before = path.read_bytes()
    daemon = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
    code = daemon.process.wait(30)
    log = daemon.log()
    assert code == 1
    assert f"iop-control-plane: store.path {DEFAULT_FILE}: " in log and line in log
    assert "Traceback" not in log
    assert path.read_bytes() == before


def test_check_names_a_store_path_that_cannot_be_used(tmp_path: Path) -> None:
    """``--check`` reads the store: a directory where the file should be is one line and exit 1."""
    (tmp_path / DEFAULT_FILE).mkdir(parents=True)
    result = subprocess.run(
        [TWISTD, "iop-control-plane", "--check"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"iop-control-plane: embedded defaults: store.path {DEFAULT_FILE}: is a directory, not a file"
    ]
    ok = subprocess.run(
        [TWISTD, "iop-control-plane", "--check"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"IOP_STORE_PATH": str(tmp_path / "elsewhere.sqlite"), "PATH": "/usr/bin:/bin"},
    )
    assert ok.returncode == 0 and "a new file will be created" in ok.stdout
    assert not (tmp_path / "elsewhere.sqlite").exists()
