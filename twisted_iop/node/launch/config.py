"""The ``launch`` block of a provider in node.yaml: how the Node runs its engine.

Without a ``launch`` block a provider is *external*: someone else runs the
engine at its ``base_url``. With one, the Node starts the engine itself,
checks that it is ready, restarts it when it crashes (with backoff, up to a
limit of restarts in a window) and stops it (a signal, then SIGKILL after
a timeout). The supervisor that does this is
:mod:`twisted_iop.node.launch.supervisor`; this module only reads the settings
into frozen attrs classes, every error naming its dotted field
(``providers[0].launch.restart.policy: ...``).

The command is an argument list, run without a shell. Its executable is
looked up now (on ``launch.env``'s ``PATH`` if it sets one, else the
Node's; then among the programs installed with twisted-iop itself, the
``bin`` of its virtualenv, so ``iop-mock-provider`` is found when that
``bin`` is not on ``PATH``, as under ``make run-node`` or systemd), so
``twistd iop-node --check`` reports a missing one, and the engine is
started from that absolute path.
"""

from __future__ import annotations

import os
import shutil
import signal
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import attrs

from twisted_iop.configuration import ConfigError, Section

#: Restart policies: restart after any exit, only after a failure (an exit
#: code other than 0, or a signal), or never.
RESTART_POLICIES = ("always", "on-failure", "never")
#: Signals a ``stop.signal`` may name (with or without ``SIG``).
STOP_SIGNALS: Mapping[str, int] = {
    "TERM": signal.SIGTERM,
    "INT": signal.SIGINT,
    "QUIT": signal.SIGQUIT,
    "HUP": signal.SIGHUP,
    "KILL": signal.SIGKILL,
    "USR1": signal.SIGUSR1,
    "USR2": signal.SIGUSR2,
}

#: Log lines per second of one engine written to the Node's log (the rest are counted).
DEFAULT_LOG_LINES_PER_SECOND = 100
MAX_LOG_LINES_PER_SECOND = 10_000
#: Bytes of an engine's last output lines kept for ``provider.logs``.
DEFAULT_LOG_TAIL_BYTES = 64 * 1024
MIN_LOG_TAIL_BYTES = 1024
MAX_LOG_TAIL_BYTES = 4 * 1024 * 1024
#: Longest line kept of an engine's output; the rest of a longer line is dropped (and counted).
DEFAULT_MAX_LINE_BYTES = 4096
MIN_MAX_LINE_BYTES = 256
MAX_MAX_LINE_BYTES = 64 * 1024

#: At most this many arguments and environment entries.
MAX_ARGUMENTS = 1024
MAX_ENVIRONMENT = 256


@attrs.frozen
class RestartPolicy:
    """``launch.restart``: when a crashed engine is started again.

    The n-th restart in a row waits ``initial_seconds * 2**(n-1)``, at most
    ``max_seconds``; the streak starts over once the engine was ready.
    More than ``max_restarts`` restarts within ``window_seconds`` and the
    engine is ``failed``: it stays down until an operator starts it.
    """

    policy: str = "always"
    initial_seconds: float = 1.0
    max_seconds: float = 30.0
    max_restarts: int = 5
    window_seconds: float = 300.0


@attrs.frozen
class StopSettings:
    """``launch.stop``: the signal sent to the engine's process group, and how
    long it may take to exit before SIGKILL."""

    signal_name: str = "TERM"
    timeout_seconds: float = 10.0

    @property
    def signal_number(self) -> int:
        """The signal's number."""
        return STOP_SIGNALS[self.signal_name]


@attrs.frozen
class ReadinessSettings:
    """``launch.readiness``: when a started engine counts as ready.

    Without ``path`` the engine adapter's own check is used (the health
    endpoint of its kind, then the models list, as the probes do); with
    one, ``GET base_url + path`` answering 200 is ready. The engine is asked
    every ``interval_seconds``, each time within ``request_timeout_seconds``;
    one not ready ``start_timeout_seconds`` after it was started is killed
    and counts as a crash.
    """

    path: Optional[str] = None
    interval_seconds: float = 1.0
    request_timeout_seconds: float = 2.0
    start_timeout_seconds: float = 600.0


@attrs.frozen
class LivenessSettings:
    """``launch.liveness``: when a ready engine that stopped answering is restarted.

    After ``failures`` periodic probes in a row (``probes.interval_seconds``
    apart) found a ready engine ``offline`` or ``unhealthy`` (not busy: a
    probe that timed out while this Node runs requests on it does not
    count), it is stopped and that counts as a crash. 0 (the default)
    never restarts a running engine for its health.
    """

    failures: int = 0


@attrs.frozen
class LogSettings:
    """``launch.logs``: how an engine's output reaches the Node's log and is kept."""

    lines_per_second: int = DEFAULT_LOG_LINES_PER_SECOND
    tail_bytes: int = DEFAULT_LOG_TAIL_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


@attrs.frozen
class LaunchConfig:
    """How the Node runs one provider's engine.

    ``command[0]`` is the absolute path of the executable. Neither the
    command nor the environment ever leaves the Node (``repr`` hides them).
    """

    command: tuple[str, ...] = attrs.field(repr=False)
    env: Mapping[str, str] = attrs.field(factory=dict, repr=False)
    working_directory: Optional[str] = None
    readiness: ReadinessSettings = ReadinessSettings()
    liveness: LivenessSettings = LivenessSettings()
    restart: RestartPolicy = RestartPolicy()
    stop: StopSettings = StopSettings()
    logs: LogSettings = LogSettings()


def parse_launch(section: Section, environ: Mapping[str, str]) -> LaunchConfig:
    """Read a provider's ``launch`` block (the executable is looked up on ``PATH`` now)."""
    section.reject_unknown({"command", "env", "working_directory", "readiness", "liveness", "restart", "stop", "logs"})
    env = _environment(section)
    working_directory = _working_directory(section)
    command = _command(section, env.get("PATH", environ.get("PATH", os.defpath)), working_directory)
    return LaunchConfig(
        command=command,
        env=env,
        working_directory=working_directory,
        readiness=_readiness(section.section("readiness")),
        liveness=_liveness(section.section("liveness")),
        restart=_restart(section.section("restart")),
        stop=_stop(section.section("stop")),
        logs=_logs(section.section("logs")),
    )


def _command(section: Section, search_path: str, working_directory: Optional[str]) -> tuple[str, ...]:
    field = section.field_path("command")
    raw = section.raw("command")
    if raw is None:
        raise ConfigError(f"{field}: required (the engine's command as a list of arguments)")
    if isinstance(raw, str):
        raise ConfigError(f"{field}: must be a list of arguments (no shell runs it), e.g. [vllm, serve, MODEL]")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{field}: must be a non-empty list of arguments")
    if len(raw) > MAX_ARGUMENTS:
        raise ConfigError(f"{field}: at most {MAX_ARGUMENTS} arguments")
    arguments: list[str] = []
    for index, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{field}[{index}]: must be a string")
        text = str(value)
        if "\0" in text:
            raise ConfigError(f"{field}[{index}]: must not contain a NUL character")
        arguments.append(text)
    executable = arguments[0]
    if not executable:
        raise ConfigError(f"{field}[0]: the executable must not be empty")
    arguments[0] = _executable(f"{field}[0]", executable, search_path, working_directory)
    return tuple(arguments)


def installed_scripts() -> str:
    """The directory of the programs installed with twisted-iop (its virtualenv's ``bin``)."""
    return sysconfig.get_path("scripts")


def _executable(field: str, name: str, search_path: str, working_directory: Optional[str]) -> str:
    """The absolute path of ``name``: itself if it names a file, else found on ``search_path``, else
    among the programs installed with twisted-iop."""
    if "/" in name:
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = Path(working_directory or os.getcwd()) / path
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"{field}: {name!r} is not an executable file")
        return str(path)
    found = shutil.which(name, path=search_path) or shutil.which(name, path=installed_scripts())
    if found is None:
        raise ConfigError(f"{field}: {name!r} is not an executable on PATH")
    return str(Path(found).absolute())


def _environment(section: Section) -> dict[str, str]:
    env = section.string_map("env")
    if len(env) > MAX_ENVIRONMENT:
        raise ConfigError(f"{section.field_path('env')}: at most {MAX_ENVIRONMENT} variables")
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ConfigError(f"{section.field_path('env')}.{name}: not a usable environment variable")
    return env


def _working_directory(section: Section) -> Optional[str]:
    value = section.string("working_directory")
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise ConfigError(f"{section.field_path('working_directory')}: must be an absolute path, not {value!r}")
    if not path.is_dir():
        raise ConfigError(f"{section.field_path('working_directory')}: {value!r} is not a directory")
    return str(path)


def _readiness(section: Section) -> ReadinessSettings:
    section.reject_unknown({"path", "interval_seconds", "request_timeout_seconds", "start_timeout_seconds"})
    path = section.string("path") or None
    if path is not None and (not path.startswith("/") or any(c.isspace() for c in path)):
        raise ConfigError(f"{section.field_path('path')}: must be a URL path such as /health, not {path!r}")
    return ReadinessSettings(
        path=path,
        interval_seconds=section.number("interval_seconds", 1.0),
        request_timeout_seconds=section.number("request_timeout_seconds", 2.0),
        start_timeout_seconds=section.number("start_timeout_seconds", 600.0),
    )


def _liveness(section: Section) -> LivenessSettings:
    section.reject_unknown({"failures"})
    return LivenessSettings(failures=section.integer("failures", 0, minimum=0, maximum=100))


def _restart(section: Section) -> RestartPolicy:
    section.reject_unknown({"policy", "initial_seconds", "max_seconds", "max_restarts", "window_seconds"})
    policy = section.string("policy", "always")
    if policy not in RESTART_POLICIES:
        raise ConfigError(
            f"{section.field_path('policy')}: must be one of {', '.join(RESTART_POLICIES)}, not {policy[:40]!r}"
        )
    initial = section.number("initial_seconds", 1.0)
    maximum = section.number("max_seconds", max(30.0, initial))
    if maximum < initial:
        raise ConfigError(f"{section.field_path('max_seconds')}: must be at least initial_seconds ({initial:g})")
    return RestartPolicy(
        policy=policy,
        initial_seconds=initial,
        max_seconds=maximum,
        max_restarts=section.integer("max_restarts", 5, minimum=0, maximum=10_000),
        window_seconds=section.number("window_seconds", 300.0),
    )


def _stop(section: Section) -> StopSettings:
    section.reject_unknown({"signal", "timeout_seconds"})
    name = section.string("signal", "TERM").upper()
    name = name.removeprefix("SIG")
    if name not in STOP_SIGNALS:
        known = ", ".join(sorted(STOP_SIGNALS))
        raise ConfigError(
            f"{section.field_path('signal')}: unknown signal {section.string('signal')[:40]!r} (known: {known})"
        )
    return StopSettings(signal_name=name, timeout_seconds=section.number("timeout_seconds", 10.0))


def _logs(section: Section) -> LogSettings:
    section.reject_unknown({"lines_per_second", "tail_bytes", "max_line_bytes"})
    return LogSettings(
        lines_per_second=section.integer(
            "lines_per_second", DEFAULT_LOG_LINES_PER_SECOND, minimum=1, maximum=MAX_LOG_LINES_PER_SECOND
        ),
        tail_bytes=section.integer(
            "tail_bytes", DEFAULT_LOG_TAIL_BYTES, minimum=MIN_LOG_TAIL_BYTES, maximum=MAX_LOG_TAIL_BYTES
        ),
        max_line_bytes=section.integer(
            "max_line_bytes", DEFAULT_MAX_LINE_BYTES, minimum=MIN_MAX_LINE_BYTES, maximum=MAX_MAX_LINE_BYTES
        ),
    )
