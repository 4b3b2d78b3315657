"""What every iopctl subcommand shares: exit codes, usage errors, argument types, the console.

``cli.py`` builds the parser and runs the subcommands; ``rollout_cli.py``
adds the ``rollout`` subcommand. Both build on this module, so neither
imports the other back.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, Optional, TextIO

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from twisted_iop.client.models import to_json

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

#: Commands may run at most this long on the Control Plane (docs/http-api.md).
MAX_COMMAND_TIMEOUT_SECONDS = 300.0


class UsageError(Exception):
    """A command line that cannot be run; reported with exit code 2."""

    def __init__(self, message: str, usage: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage


class ArgumentParser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> Any:
        """Raise instead of printing and exiting, so callers choose the output."""
        raise UsageError(message, self.format_usage())


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def page_limit(text: str) -> int:
    value = non_negative_int(text)
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1000, not {value}")
    return value


def command_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_COMMAND_TIMEOUT_SECONDS:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most {MAX_COMMAND_TIMEOUT_SECONDS:g} seconds")
    return value


def argument_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


class Console:
    """Where iopctl writes: results to ``out``, diagnostics to ``err``."""

    def __init__(self, out: TextIO, err: TextIO, as_json: bool) -> None:
        self.out = out
        self.err = err
        self.as_json = as_json

    def result(self, model: Any, text: Callable[[Any], str]) -> None:
        """Print a model as a table, or as JSON with ``--json``."""
        if self.as_json:
            self.json(to_json(model))
        else:
            self.line(text(model))

    def json(self, value: Any, compact: bool = False) -> None:
        """Print one JSON document."""
        if compact:
            self.line(json.dumps(value, sort_keys=True, separators=(",", ":")))
        else:
            self.line(json.dumps(value, indent=2, sort_keys=True))

    def line(self, text: str) -> None:
        """Print ``text`` and a newline, flushed (``--follow`` is read live)."""
        self.out.write(text + "\n")
        self.out.flush()

    def error(self, code: str, message: str) -> None:
        """The one-line error on stderr."""
        self.err.write(f"iopctl: {code}: {message}\n")
        self.err.flush()

    def note(self, message: str) -> None:
        """A diagnostic line on stderr."""
        self.err.write(f"iopctl: {message}\n")
        self.err.flush()


def add_argument_option(parser: argparse.ArgumentParser) -> None:
    """``--arg KEY=VALUE`` (repeatable): a command's arguments, for ``command`` and ``rollout create``."""
    parser.add_argument(
        "--arg",
        dest="arguments",
        action="append",
        type=argument_pair,
        default=[],
        metavar="KEY=VALUE",
        help="a command argument (repeatable)",
    )


#: Moves to the start of the line and clears it (a watch's redraw on a terminal).
REDRAW = "\r\x1b[2K"


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is a terminal (a watch redraws one line there)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


#: Seconds between the polls of a ``--watch`` on a terminal, and otherwise; the most one may ask.
WATCH_INTERVAL_TTY_SECONDS = 1.0
WATCH_INTERVAL_PLAIN_SECONDS = 5.0
MAX_WATCH_INTERVAL_SECONDS = 3600.0


def watch_interval(text: str) -> float:
    """``--interval``: seconds above 0, at most :data:`MAX_WATCH_INTERVAL_SECONDS`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= MAX_WATCH_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most {MAX_WATCH_INTERVAL_SECONDS:g} seconds")
    return value


def add_watch_options(parser: argparse.ArgumentParser, watch_help: str) -> None:
    """``--watch`` (what it shows: ``watch_help``) and ``--interval``, the same for every watch."""
    parser.add_argument("--watch", "-w", action="store_true", help=watch_help)
    parser.add_argument(
        "--interval",
        type=watch_interval,
        default=None,
        metavar="S",
        help=f"seconds between polls with --watch (default {WATCH_INTERVAL_TTY_SECONDS:g} on a terminal, "
        f"else {WATCH_INTERVAL_PLAIN_SECONDS:g})",
    )


def polling_interval(given: Optional[float], terminal: bool) -> float:
    """The seconds between a watch's polls: ``given``, or the default for where it draws."""
    if given is not None:
        return given
    return WATCH_INTERVAL_TTY_SECONDS if terminal else WATCH_INTERVAL_PLAIN_SECONDS


class WatchPause:
    """Waits between polls; an interruption ends the wait at once and for good."""

    def __init__(self, reactor: IReactorTime, interrupted: Optional[Deferred[None]]) -> None:
        self.reactor = reactor
        self.interrupted = False
        self._waiting: Optional[Deferred[None]] = None
        self._call: Any = None
        if interrupted is not None:
            interrupted.addBoth(self._interrupt)

    def _interrupt(self, result: object) -> object:
        self.interrupted = True
        self._wake()
        return result

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, None
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        if waiting is not None:
            waiting.callback(None)

    def wait(self, seconds: float) -> Deferred[None]:
        """Fires after ``seconds``, or as soon as the watch is interrupted."""
        waiting: Deferred[None] = Deferred()
        if self.interrupted:
            waiting.callback(None)
            return waiting
        self._waiting = waiting
        self._call = self.reactor.callLater(seconds, self._wake)
        return waiting
