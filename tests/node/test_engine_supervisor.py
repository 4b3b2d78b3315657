"""The Node runs its engines: real processes started, checked, restarted, logged and stopped.

The engines are ``iop-mock-provider`` on a free loopback port and small
Python scripts that misbehave; the supervisor runs in this reactor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest_twisted
from twisted.logger import ILogObserver, globalLogPublisher

from twisted_iop.node.launch import commands as provider_commands
from twisted_iop.node.launch.commands import answer_provider_command
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.node.launch.pidfiles import EngineRecord, PidfileDirectory, process_start_ticks
from twisted_iop.testing.engines.launch import (
    SupervisorRig,
    alive,
    free_port,
    launched_mock,
    launched_script,
    providers,
)
from twisted_iop.testing.harness import MOCK_PROVIDER, eventually
from twisted_iop.wire import control_pb2 as pb

#: Bound on an engine (iop-mock-provider: a Python process) becoming ready on this machine.
READY_SECONDS = 30.0


@pytest_twisted.async_yield_fixture
async def rigs(tmp_path: Path) -> AsyncIterator[list[SupervisorRig]]:
    """Supervisors a test built; each is stopped (with its engines) at the end."""
    held: list[SupervisorRig] = []
    yield held
    for rig in held:
        await rig.stop()


def rig(rigs: list[SupervisorRig], tmp_path: Path, *entries: dict[str, Any]) -> SupervisorRig:
    """A started supervisor of ``entries`` with its state in ``tmp_path/state``."""
    made = SupervisorRig(list(entries), tmp_path / "state")
    rigs.append(made)
    made.start()
    return made


@pytest_twisted.ensureDeferred
async def test_engine_starts_is_ready_then_stops_with_its_pidfile(rigs: list[SupervisorRig], tmp_path: Path) -> None:
    """An engine is spawned (starting), answers (ready) with a pidfile naming it; a stop ends it
    and removes the pidfile."""
    port = free_port()
    made = rig(rigs, tmp_path, launched_mock("mock-a", port))
    await eventually(lambda: made.state("mock-a") is EngineState.READY, timeout=READY_SECONDS, message="ready")
    states = made.states("mock-a")
    assert states[0] is EngineState.STARTING and states[-1] is EngineState.READY
    pid = made.pid("mock-a")
    assert pid is not None and alive(pid)
    pidfile = tmp_path / "state" / "engine-mock-a.pid"
    record = json.loads(pidfile.read_text())
    assert record["pid"] == pid and record["argv"][0] == MOCK_PROVIDER
    assert oct(pidfile.stat().st_mode & 0o777) == "0o600"
    ready = [c for c in made.changes if c.state is EngineState.READY]
    assert ready[0].ready_probe is not None and ready[0].ready_probe.health == pb.PROVIDER_HEALTH_HEALTHY
    report = made.supervisor.report("mock-a")
    assert report is not None and report.state == pb.ENGINE_STATE_READY and report.pid == pid
    outcome = await provider_commands.stop(made.supervisor, "mock-a", drain=False, drain_timeout=1, answer_within=10)
    assert outcome.ok and made.state("mock-a") is EngineState.STOPPED
    assert not alive(pid) and not pidfile.exists()


@pytest_twisted.ensureDeferred
async def test_kill_9_is_crashed_then_restarted_with_backoff_then_ready(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """kill -9 of a ready engine: crashed (killed by signal 9, one restart, a next try), then
    started again after the backoff and ready with a new pid."""
    restart = {"policy": "always", "initial_seconds": 1, "max_seconds": 5, "max_restarts": 3, "window_seconds": 60}
    made = rig(rigs, tmp_path, launched_mock("mock-a", free_port(), restart=restart))
    await eventually(lambda: made.state("mock-a") is EngineState.READY, timeout=READY_SECONDS, message="ready")
    first = made.pid("mock-a")
    assert first is not None
    os.kill(first, signal.SIGKILL)
    await eventually(lambda: made.state("mock-a") is EngineState.CRASHED, timeout=10, message="crashed")
    report = made.supervisor.report("mock-a")
    assert report is not None and report.state == pb.ENGINE_STATE_CRASHED
    assert report.reason == "killed by signal 9 (SIGKILL)" and report.restarts == 1
    assert 0 < report.next_try_at_ms - report.since_ms <= 1000
    assert made.supervisor.refusal("mock-a") == "the engine of provider mock-a is crashed"
    await eventually(lambda: made.state("mock-a") is EngineState.READY, timeout=READY_SECONDS, message="ready again")
    second = made.pid("mock-a")
    assert second is not None and second != first and alive(second)
    states = made.states("mock-a")
    assert states[states.index(EngineState.CRASHED) :][:2] == [EngineState.CRASHED, EngineState.STARTING]
    assert (made.supervisor.report("mock-a") or pb.EngineLaunch()).restarts == 1


@pytest_twisted.ensureDeferred
async def test_command_that_exits_at_once_fails_after_the_restart_limit(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """An engine that exits with 3 at once: crashed and restarted up to the limit, then failed
    with the reason; its output is kept; provider.start runs it again."""
    restart = {"policy": "on-failure", "initial_seconds": 0.05, "max_seconds": 0.1, "max_restarts": 2}
    script = "import sys; print('cannot open the model file', flush=True); sys.exit(3)"
    made = rig(rigs, tmp_path, launched_script("bad", script, restart=restart))
    await eventually(lambda: made.state("bad") is EngineState.FAILED, timeout=20, message="failed")
    report = made.supervisor.report("bad")
    assert report is not None
    assert report.reason == "exited with code 3; 2 restarts within 300s: the limit"
    assert report.restarts == 2 and report.next_try_at_ms == 0 and report.pid == 0
    assert made.states("bad").count(EngineState.CRASHED) == 2
    logs = provider_commands.logs(made.supervisor, "bad", 4096)
    assert logs.log_text.count("cannot open the model file\n") == 3 and logs.log_lines == 3
    assert made.supervisor.refusal("bad") == "the engine of provider bad is failed"
    outcome = await provider_commands.start(made.supervisor, "bad", answer_within=20)
    assert not outcome.ok and outcome.reason.startswith("failed: exited with code 3")
    assert made.states("bad")[-1] is EngineState.FAILED


@pytest_twisted.ensureDeferred
async def test_stop_signals_the_whole_group_and_kills_it_after_the_timeout(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """An engine that ignores SIGTERM and forks a worker: after the stop timeout both are killed."""
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)'])\n"
        "print('worker', worker.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    made = rig(rigs, tmp_path, launched_script("stubborn", script, stop={"timeout_seconds": 0.5}))
    engine = made.supervisor.engines["stubborn"]
    await eventually(lambda: "worker" in engine.tail.text(1024), timeout=10, message="the worker's pid")
    worker = int(engine.tail.text(1024).split()[1])
    pid = made.pid("stubborn")
    assert pid is not None and alive(worker)
    assert made.state("stubborn") in (EngineState.STARTING, EngineState.LOADING)  # nothing listens: never ready
    outcome = await provider_commands.stop(made.supervisor, "stubborn", drain=False, drain_timeout=1, answer_within=10)
    assert outcome.ok
    report = made.supervisor.report("stubborn")
    assert report is not None and report.reason == "stopped by provider.stop; killed by signal 9 (SIGKILL)"
    await eventually(lambda: not alive(worker) and not alive(pid), timeout=5, message="engine and worker gone")


@pytest_twisted.ensureDeferred
async def test_output_is_rate_limited_in_the_node_log_and_kept_in_the_tail(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """3000 lines at once: at most about lines_per_second reach the Node's log, one note counts
    the rest, and the tail keeps the newest lines within its bytes."""
    events: list[dict[str, Any]] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    try:
        script = "import time\nfor i in range(3000): print('line', i)\nimport sys; sys.stdout.flush(); time.sleep(60)"
        logs = {"lines_per_second": 50, "tail_bytes": 2048, "max_line_bytes": 256}
        made = rig(rigs, tmp_path, launched_script("chatty", script, logs=logs))
        engine = made.supervisor.engines["chatty"]
        await eventually(lambda: engine.tail.lines_total >= 3000, timeout=10, message="every line read")
        await eventually(
            lambda: any("lines of output suppressed" in str(e.get("log_format")) for e in events),
            timeout=5,
            message="the suppressed note",
        )
    finally:
        globalLogPublisher.removeObserver(observer)
    logged = [e for e in events if e.get("log_namespace") == "iop.engine" and "line" in e]
    assert 50 <= len(logged) <= 60
    note = next(e for e in events if "lines of output suppressed" in str(e.get("log_format")))
    assert note["count"] >= 2900 and note["provider_id"] == "chatty"
    assert engine.tail.bytes <= 2048
    text = engine.tail.text(2048)
    assert text.endswith("line 2999\n") and "line 2000\n" not in text


@pytest_twisted.ensureDeferred
async def test_leftover_engine_of_a_crashed_node_is_stopped_and_one_started(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """A running engine whose pidfile an earlier Node left is stopped first; then exactly one
    engine of ours runs on the port."""
    port = free_port()
    entry = launched_mock("mock-a", port)
    command = entry["launch"]["command"]
    leftover = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        state = tmp_path / "state"
        pidfiles = PidfileDirectory(str(state))
        pidfiles.prepare()
        pidfiles.write(EngineRecord("mock-a", leftover.pid, tuple(command), process_start_ticks(leftover.pid)))
        made = rig(rigs, tmp_path, entry)
        assert made.state("mock-a") is EngineState.STOPPING
        report = made.supervisor.report("mock-a")
        assert report is not None and f"(pid {leftover.pid})" in report.reason
        await eventually(lambda: leftover.poll() is not None, timeout=10, message="the leftover stopped")
        await eventually(lambda: made.state("mock-a") is EngineState.READY, timeout=READY_SECONDS, message="ready")
        assert made.pid("mock-a") != leftover.pid
        assert made.states("mock-a")[:2] == [EngineState.STOPPING, EngineState.STARTING]
    finally:
        if leftover.poll() is None:
            leftover.kill()
        leftover.wait(5)


@pytest_twisted.ensureDeferred
async def test_pidfile_naming_another_process_kills_nothing(rigs: list[SupervisorRig], tmp_path: Path) -> None:
    """A pidfile whose pid now belongs to an unrelated process (another command line) is stale:
    that process lives on, the file is replaced, our engine starts."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        entry = launched_mock("mock-a", free_port())
        pidfiles = PidfileDirectory(str(tmp_path / "state"))
        pidfiles.prepare()
        pidfiles.write(EngineRecord("mock-a", stranger.pid, tuple(entry["launch"]["command"]), None))
        made = rig(rigs, tmp_path, entry)
        assert made.state("mock-a") is EngineState.STARTING
        await eventually(lambda: made.state("mock-a") is EngineState.READY, timeout=READY_SECONDS, message="ready")
        assert stranger.poll() is None
        record, _ = pidfiles.read("mock-a")
        assert record is not None and record.pid == made.pid("mock-a")
    finally:
        stranger.kill()
        stranger.wait(5)


@pytest_twisted.ensureDeferred
async def test_stopping_the_supervisor_ends_every_engine(rigs: list[SupervisorRig], tmp_path: Path) -> None:
    """The Node's stop: every engine gets its signal and is gone when stopService fires; a
    command after that starts nothing."""
    made = rig(rigs, tmp_path, launched_mock("a", free_port()), launched_mock("b", free_port()))
    await eventually(
        lambda: made.state("a") is EngineState.READY and made.state("b") is EngineState.READY,
        timeout=READY_SECONDS,
        message="both ready",
    )
    pids = [made.pid("a"), made.pid("b")]
    await made.supervisor.stopService()
    assert all(pid is not None and not alive(pid) for pid in pids)
    assert [made.state("a"), made.state("b")] == [EngineState.STOPPED, EngineState.STOPPED]
    assert list((tmp_path / "state").iterdir()) == []
    request = pb.NodeProviderCommandRequest(provider_id="a", action=pb.PROVIDER_ACTION_START)
    answer = await answer_provider_command(made.supervisor, request)
    assert not answer.ok and answer.reason == "the node is stopping; its engines are being stopped"
    assert made.state("a") is EngineState.STOPPED


@pytest_twisted.ensureDeferred
async def test_provider_commands_from_the_wire_are_checked(rigs: list[SupervisorRig], tmp_path: Path) -> None:
    """An unknown action, an unknown provider: ok=false with the reason; logs are bounded."""
    made = rig(rigs, tmp_path, launched_script("quiet", "import time; print('hello', flush=True); time.sleep(60)"))
    engine = made.supervisor.engines["quiet"]
    await eventually(lambda: "hello" in engine.tail.text(1024), timeout=10, message="its first line")
    odd = pb.NodeProviderCommandRequest(provider_id="quiet", action=99)  # type: ignore[arg-type]  # an unknown enum value, on purpose
    answer = await answer_provider_command(made.supervisor, odd)
    assert not answer.ok and answer.reason == "unknown provider action 99"
    unknown = pb.NodeProviderCommandRequest(provider_id="nope", action=pb.PROVIDER_ACTION_LOGS)
    answer = await answer_provider_command(made.supervisor, unknown)
    assert not answer.ok and "no engine launched by this node" in answer.reason
    logs = pb.NodeProviderCommandRequest(provider_id="quiet", action=pb.PROVIDER_ACTION_LOGS, max_log_bytes=10**9)
    answer = await answer_provider_command(made.supervisor, logs)
    assert answer.ok and answer.log_text == "hello\n" and answer.log_lines == 1
    assert answer.launch.state in (pb.ENGINE_STATE_STARTING, pb.ENGINE_STATE_LOADING)


@pytest_twisted.ensureDeferred
async def test_a_reread_configuration_starts_new_engines_and_stops_removed_ones(
    rigs: list[SupervisorRig], tmp_path: Path
) -> None:
    """providers re-read (providers.refresh): a provider no longer launched has its engine
    stopped and forgotten; a newly launched one starts; one whose block changed keeps running."""
    port_a, port_b = free_port(), free_port()
    made = rig(rigs, tmp_path, launched_mock("a", port_a), launched_mock("c", free_port()))
    await eventually(
        lambda: made.state("a") is EngineState.READY and made.state("c") is EngineState.READY,
        timeout=READY_SECONDS,
        message="a and c ready",
    )
    a_pid, c_pid = made.pid("a"), made.pid("c")
    assert a_pid is not None and c_pid is not None
    changed_c = launched_mock("c", free_port(), stop={"signal": "INT", "timeout_seconds": 3})
    made.supervisor.configure(providers(launched_mock("b", port_b), changed_c))
    await eventually(
        lambda: "a" not in made.supervisor.engines and made.state("b") is EngineState.READY,
        timeout=READY_SECONDS,
        message="a gone, b ready",
    )
    assert not alive(a_pid)
    assert made.pid("c") == c_pid and made.supervisor.engines["c"].provider == providers(changed_c)[0]
