"""Pidfiles of launched engines, and telling a leftover engine from a stranger.

A Node writes one pidfile per engine it starts, in its state directory
(``state_directory`` in node.yaml; under systemd ``StateDirectory=``):
``engine-<provider_id>.pid``, a small JSON record of the process id, its
command line and its start time (``/proc/<pid>/stat``'s start ticks). A
Node that crashed leaves engines running; the next Node reads the
pidfile and stops such an engine before it starts its own, instead of
starting a second copy on the same port.

It stops only a process that is really that engine: the pid is alive,
its start time is the recorded one (a reused pid has another), and its
command line still ends with the recorded one (the kernel puts the
interpreter in front of a script's arguments). Where ``/proc`` cannot be
read, nothing is stopped. The file is private (mode 0600) and is removed
when the engine is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Optional

import attrs

#: A pidfile larger than this is not a pidfile of ours.
MAX_PIDFILE_BYTES = 256 * 1024
_PROC = Path("/proc")


@attrs.frozen
class EngineRecord:
    """What a pidfile says of one running engine."""

    provider_id: str
    pid: int
    #: The command the engine was started with (its absolute executable first).
    argv: tuple[str, ...]
    #: The process's start time in clock ticks since boot (``/proc/<pid>/stat``), when known.
    start_ticks: Optional[int] = None

    def to_json(self) -> str:
        """The file's contents."""
        return json.dumps(
            {"provider_id": self.provider_id, "pid": self.pid, "argv": list(self.argv), "start_ticks": self.start_ticks}
        )

    @classmethod
    def from_json(cls, text: str) -> Optional[EngineRecord]:
        """A record from a file's contents; ``None`` when they are not one."""
        try:
            data = json.loads(text)
            pid = data["pid"]
            argv = data["argv"]
            start_ticks = data.get("start_ticks")
            provider_id = data["provider_id"]
        except (ValueError, KeyError, TypeError):
            return None
        if (
            not isinstance(pid, int)
            or isinstance(pid, bool)
            or pid <= 1
            or not isinstance(argv, list)
            or not argv
            or not all(isinstance(a, str) for a in argv)
            or not isinstance(provider_id, str)
            or not (start_ticks is None or (isinstance(start_ticks, int) and not isinstance(start_ticks, bool)))
        ):
            return None
        return cls(provider_id, pid, tuple(argv), start_ticks)


def process_start_ticks(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot, or ``None`` (gone, or no ``/proc``)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')'.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def process_argv(pid: int) -> Optional[tuple[str, ...]]:
    """The command line of process ``pid``, or ``None`` (gone, a zombie, or no ``/proc``)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    if not raw:
        return None
    return tuple(part.decode("utf-8", errors="surrogateescape") for part in raw.rstrip(b"\0").split(b"\0"))


def command_matches(recorded: tuple[str, ...], actual: tuple[str, ...]) -> bool:
    """Whether ``actual`` is the recorded command: the same, or it with an interpreter (and its
    one option) in front, as the kernel runs a script with a ``#!`` line."""
    extra = len(actual) - len(recorded)
    return 0 <= extra <= 2 and actual[extra:] == recorded


def is_recorded_engine(record: EngineRecord, also: tuple[str, ...] = ()) -> bool:
    """Whether the process ``record.pid`` is alive and is the recorded engine.

    ``also`` is another command the process may still show (the launcher
    that becomes the engine, in the instant before it does).
    """
    argv = process_argv(record.pid)
    if argv is None:
        return False
    if record.start_ticks is not None and process_start_ticks(record.pid) != record.start_ticks:
        return False
    return command_matches(record.argv, argv) or (bool(also) and argv == also)


class PidfileDirectory:
    """The engines' pidfiles in one directory (created, private, on :meth:`prepare`)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def prepare(self) -> None:
        """Create the directory (mode 0700) if it is missing; raise ``OSError`` if that fails."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise PermissionError(f"{self.path} is not writable")

    def file_of(self, provider_id: str) -> Path:
        """The pidfile of ``provider_id``'s engine (provider ids are safe file names)."""
        return self.path / f"engine-{provider_id}.pid"

    def write(self, record: EngineRecord) -> None:
        """Write ``record`` (whole, or not at all: a temporary file renamed)."""
        target = self.file_of(record.provider_id)
        temporary = target.with_name(target.name + ".new")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(record.to_json())
        os.replace(temporary, target)

    def read(self, provider_id: str) -> tuple[Optional[EngineRecord], bool]:
        """The record of ``provider_id``'s engine, and whether a file was there at all."""
        path = self.file_of(provider_id)
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_PIDFILE_BYTES + 1)
        except FileNotFoundError:
            return None, False
        except OSError:
            return None, True
        if len(data) > MAX_PIDFILE_BYTES:
            return None, True
        record = EngineRecord.from_json(data.decode("utf-8", errors="replace"))
        if record is not None and record.provider_id != provider_id:
            return None, True
        return record, True

    def remove(self, provider_id: str) -> None:
        """Remove ``provider_id``'s pidfile, if any."""
        with contextlib.suppress(FileNotFoundError):
            self.file_of(provider_id).unlink()
