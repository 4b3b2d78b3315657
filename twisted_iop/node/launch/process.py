"""One launched engine's process: spawned in its own session, its output read as lines, signalled as a group.

Why ``reactor.spawnProcess`` with this protocol rather than
``twisted.runner.procmon.ProcessMonitor``: procmon restarts every process
it holds with one backoff and no limit, has no hook for a readiness check
(so no ``loading`` / ``ready``), signals only the process it spawned (not
the workers an engine forks), sends SIGTERM and kills after one
``killTime`` for all, and logs every output line with no rate limit and
no kept tail. The restart rules are therefore the pure
:mod:`~twisted_iop.node.launch.lifecycle`, and this module does what
procmon's ``LoggingProtocol`` and ``startProcess`` did, with those hooks.

* :func:`spawn_engine` starts the command through a tiny launcher
  (``python -I -S -c`` that calls ``os.setsid()`` and ``exec``s the
  engine, keeping its pid), so the engine leads its own process group and
  session: a stop signal sent to the group reaches every worker it forked,
  and a Ctrl-C in the Node's terminal does not reach it directly. Its
  stdin is ``/dev/null``; ``PYTHONUNBUFFERED=1`` is set unless the launch
  environment says otherwise, so Python engines' lines arrive as written.
* :class:`EngineProcessProtocol` splits stdout and stderr into lines
  (:mod:`~twisted_iop.node.launch.logs`), keeps every line in the engine's
  tail, writes at most ``logs.lines_per_second`` of them to the Node's log
  tagged with the provider id (one "N lines suppressed" line for the
  rest), and reports the exit.
* :func:`signal_group` signals the engine's process group (its pid, as
  leader), or only the process in the instant before it became a leader.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

from twisted.internet.interfaces import IDelayedCall, IReactorProcess, IReactorTime
from twisted.internet.protocol import ProcessProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.node.launch.config import LaunchConfig
from twisted_iop.node.launch.lifecycle import Exit
from twisted_iop.node.launch.logs import Line, LineRateLimit, LineSplitter, LogTail

#: The launcher: a new session (the engine leads its own process group), then the engine, same pid.
SESSION_LAUNCHER = "import os,sys;os.setsid();os.execv(sys.argv[1],sys.argv[1:])"
#: How soon after the first suppressed line the "N lines suppressed" line is written.
SUPPRESSED_NOTE_SECONDS = 1.0


def launcher_argv(command: tuple[str, ...]) -> tuple[str, ...]:
    """The argv that runs ``command`` in a new session (see :data:`SESSION_LAUNCHER`)."""
    return (sys.executable, "-I", "-S", "-c", SESSION_LAUNCHER, *command)


def engine_environment(launch: LaunchConfig, base: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: ``base`` (the Node's), with ``launch.env`` on top."""
    env = dict(base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(launch.env)
    return env


class EngineProcessProtocol(ProcessProtocol):
    """The Node's end of one engine process: its lines and its exit."""

    def __init__(
        self,
        provider_id: str,
        launch: LaunchConfig,
        clock: IReactorTime,
        tail: LogTail,
        on_exit: Callable[[Exit], None],
        log: Logger,
    ) -> None:
        self.provider_id = provider_id
        self._clock = clock
        self._tail = tail
        self._on_exit = on_exit
        self._log = log
        settings = launch.logs
        self._splitters = {
            1: LineSplitter("stdout", settings.max_line_bytes),
            2: LineSplitter("stderr", settings.max_line_bytes),
        }
        self.limit = LineRateLimit(settings.lines_per_second, clock.seconds())
        self._note: Optional[IDelayedCall] = None
        self.exit: Optional[Exit] = None
        self.ended = False

    def childDataReceived(self, childFD: int, data: bytes) -> None:
        splitter = self._splitters.get(childFD)
        if splitter is not None:
            for line in splitter.feed(data):
                self._line(line)

    def processExited(self, reason: Failure) -> None:
        value: Any = reason.value
        self.exit = Exit(code=getattr(value, "exitCode", None), signal=getattr(value, "signal", None))
        self._on_exit(self.exit)

    def processEnded(self, reason: Failure) -> None:
        self.ended = True
        for splitter in self._splitters.values():
            for line in splitter.flush():
                self._line(line)
        self._write_note()

    def _line(self, line: Line) -> None:
        self._tail.add(line)
        if self.limit.admit(self._clock.seconds()):
            self._log.info(
                "{provider_id} {stream}: {line}", provider_id=self.provider_id, stream=line.stream, line=line.text
            )
        elif self._note is None:
            self._note = self._clock.callLater(SUPPRESSED_NOTE_SECONDS, self._write_note)

    def _write_note(self) -> None:
        if self._note is not None and self._note.active():
            self._note.cancel()
        self._note = None
        count = self.limit.take_suppressed()
        if count:
            self._log.warn(
                "{provider_id}: {count} lines of output suppressed (over {rate} lines/s); "
                "all are kept in its last lines (provider.logs)",
                provider_id=self.provider_id,
                count=count,
                rate=self.limit.lines_per_second,
            )

    def stop_notes(self) -> None:
        """Write a pending suppressed-lines note now (the engine is gone)."""
        self._write_note()


def spawn_engine(
    reactor: IReactorProcess,
    launch: LaunchConfig,
    protocol: EngineProcessProtocol,
    environ: Mapping[str, str],
    stdin_fd: int,
) -> int:
    """Start the engine (raises ``OSError`` when it cannot be); return its pid."""
    argv = launcher_argv(launch.command)
    transport = reactor.spawnProcess(
        protocol,
        argv[0],
        list(argv),
        env=engine_environment(launch, environ),
        path=launch.working_directory,
        childFDs={0: stdin_fd, 1: "r", 2: "r"},
    )
    pid = transport.pid
    if pid is None:
        raise OSError("the process ended at once")
    return int(pid)


def signal_group(pid: int, number: int) -> bool:
    """Send ``number`` to the process group led by ``pid`` (or to ``pid`` alone before it leads
    one); whether anything was there to signal."""
    try:
        os.killpg(pid, number)
        return True
    except ProcessLookupError:
        pass  # not a group leader (yet), or the group is gone
    except PermissionError:
        return False
    try:
        os.kill(pid, number)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_group_members(pid: int) -> None:
    """SIGKILL whatever is left of the group ``pid`` led (its workers, once the engine itself exited)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` (not our child) is gone: no such process, or a zombie
    (exited, waiting for a parent that may never reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return process_state(pid) == "Z"


def process_state(pid: int) -> Optional[str]:
    """The state letter of process ``pid`` in ``/proc`` (``R``, ``S``, ``Z`` ...), or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = stat[stat.rfind(b")") + 2 :]
    return rest[:1].decode("ascii", errors="replace") or None
