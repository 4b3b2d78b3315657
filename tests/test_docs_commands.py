"""Every command the README and docs/*.md tell a person to type works as written.

Shell lines are taken from the fenced code blocks (``sh``, ``console`` or
unlabelled; in a block with ``$`` prompts, only the prompted lines), plus
``twistd`` and ``make`` commands in inline code. Each is checked against
the real thing:

* ``twistd ... iop-*``: runs with ``--check`` against the config it names
  (``/etc/iop/X.yaml`` is the installed copy of ``configs/X.yaml``); a
  foreground (``-n``) line in a code block also says ``--pidfile=``, or a
  second daemon in the same directory refuses to start;
* ``iopctl ...``: parses with iopctl's own argument parser;
* ``curl ...``: names a route of the Control Plane's HTTP app;
* ``make X``: X is a Makefile target and every ``VAR=value`` a Makefile variable;
* any ``configs/``, ``docs/``, ``tests/`` or ``bench/`` path exists.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest

from twisted_iop.client.cli import UsageError, build_parser, parse_arguments
from twisted_iop.controlplane.http.routes import ControlPlaneHttp
from twisted_iop.edge.inference.api import InferenceAPI
from twisted_iop.testing.harness import TWISTD

ROOT = Path(__file__).resolve().parents[1]

DOCUMENTS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = ("twistd", "iopctl", "curl", "make")
PLUGINS = ("iop-control-plane", "iop-edge", "iop-node")
SHELL_BLOCKS = ("", "sh", "shell", "bash", "console")
REPO_PATH = re.compile(r"^(configs|docs|tests|bench)/")
_FENCE = re.compile(r"^```(\S*)\s*$")
_INLINE = re.compile(r"`([^`\n]+)`")


@attrs.frozen
class DocCommand:
    """One command line of a document, split as the shell would split it."""

    where: str
    text: str
    words: tuple[str, ...]
    in_block: bool

    @property
    def program(self) -> str:
        """The command's name without its directory (``.venv/bin/twistd`` -> ``twistd``)."""
        return Path(self.words[0]).name


def _first_command(text: str) -> list[str]:
    """The words of the first simple command of ``text``: up to a pipe, ``;``, ``&`` or redirection,
    without comments and leading ``VAR=value`` assignments."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for word in lexer:
        if word and all(c in "();<>|&" for c in word):
            break
        words.append(word)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    return words


def _block_lines(lines: list[tuple[int, str]]) -> Iterator[tuple[int, str]]:
    """The command lines of one code block (continuations joined), with their index."""
    prompted = any(line.startswith("$ ") for _, line in lines)
    pending = ""
    start = 0
    for index, line in lines:
        if prompted and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending:
            start = index
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def iopctl_commands() -> list[str]:
    """The subcommands iopctl's parser knows, sorted."""
    subparsers: Any = build_parser()._subparsers
    return sorted(subparsers._group_actions[0].choices)


def document_commands(path: Path) -> Iterator[DocCommand]:
    """The commands of ``path`` that run one of :data:`PROGRAMS`."""
    name = path.relative_to(ROOT).as_posix()
    block: list[tuple[int, str]] | None = None
    shell_block = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = _FENCE.match(line)
        if fence:
            if block is None:
                block, shell_block = [], fence.group(1) in SHELL_BLOCKS
            else:
                if shell_block:
                    for start, text in _block_lines(block):
                        yield from _command(f"{name}:{start}", text, in_block=True)
                block = None
            continue
        if block is not None:
            block.append((number, line))
            continue
        for span in _INLINE.findall(line):
            # Inline code mostly names things ("`twistd -n`"); a command has a plugin or a target.
            for command in _command(f"{name}:{number}", span, in_block=False):
                if (command.program == "twistd" and any(w.startswith("iop-") for w in command.words)) or (
                    command.program == "make" and len(command.words) > 1
                ):
                    yield command


def _command(where: str, text: str, in_block: bool) -> Iterator[DocCommand]:
    try:
        words = _first_command(text)
    except ValueError:  # unbalanced quotes: prose, not a command
        return
    if words and Path(words[0]).name in PROGRAMS:
        yield DocCommand(where, text.strip(), tuple(words), in_block)


COMMANDS = [command for document in DOCUMENTS for command in document_commands(document)]


def _ids(command: DocCommand) -> str:
    return f"{command.where} {' '.join(command.words)[:60]}"


def _is_synopsis(command: DocCommand) -> bool:
    """A usage summary such as ``iopctl [--url URL] COMMAND ...`` (not a runnable line)."""
    return any(word.startswith("[") for word in command.words) or "COMMAND" in command.words


def test_the_documents_have_commands_of_every_kind() -> None:
    """The extraction finds the commands the docs are known to hold (it cannot silently find none)."""
    kinds = {program: sum(1 for c in COMMANDS if c.program == program) for program in PROGRAMS}
    assert kinds["twistd"] >= 8 and kinds["iopctl"] >= 10 and kinds["curl"] >= 4 and kinds["make"] >= 3, kinds


@cache
def _twistd_check(args: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
    return subprocess.run(
        [TWISTD, *args], cwd=str(ROOT), env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def _check_paths(command: DocCommand) -> None:
    for word in command.words:
        for part in word.split("="):
            if REPO_PATH.match(part):
                assert (ROOT / part).exists(), f"{command.where}: {part} does not exist"


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "twistd"], ids=_ids)
def test_twistd_lines_pass_check(command: DocCommand) -> None:
    """A documented ``twistd`` line runs with ``--check`` and its config is valid."""
    _check_paths(command)
    args = [word.replace("/etc/iop/", "configs/") for word in command.words[1:]]
    plugins = [word for word in args if word.startswith("iop-")]
    if not plugins:
        assert "--help" in args, f"{command.where}: a twistd line that starts no daemon"
        done = _twistd_check(tuple(args))
        assert done.returncode == 0
        assert all(plugin in done.stdout for plugin in PLUGINS), done.stdout
        return
    assert plugins[0] in PLUGINS, f"{command.where}: no plugin {plugins[0]}"
    if command.in_block and ("-n" in args or "--nodaemon" in args):
        assert "--pidfile=" in args, f"{command.where}: a second daemon started this way refuses to run"
    done = _twistd_check(tuple(args if "--check" in args else [*args, "--check"]))
    assert done.returncode == 0, f"{command.where}: {done.stdout}{done.stderr}"
    assert "configuration OK" in done.stdout


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "iopctl" and not _is_synopsis(c)], ids=_ids)
def test_iopctl_lines_parse(command: DocCommand, capsys: pytest.CaptureFixture[str]) -> None:
    """A documented ``iopctl`` line is accepted by iopctl's own argument parser."""
    try:
        args = parse_arguments(command.words[1:])
    except UsageError as e:
        pytest.fail(f"{command.where}: iopctl rejects it: {e.message}")
    except SystemExit as e:  # --version and --help print and exit 0
        exit_code = e.code
        assert exit_code == 0, f"{command.where}: iopctl exits {exit_code}"
        assert capsys.readouterr().out.startswith(("iopctl", "usage: iopctl"))
        return
    assert args.command in iopctl_commands()


def test_iopctl_synopsis_names_every_global_option() -> None:
    """docs/iopctl.md's usage lines name every option iopctl takes before the command, --version included."""
    # The global synopsis is the line naming COMMAND; a subcommand's own usage lines name its options.
    synopsis = [c for c in COMMANDS if c.program == "iopctl" and "COMMAND" in c.words and c.where.startswith("docs/")]
    assert synopsis, "docs/iopctl.md has no usage line"
    documented = {w.strip("[]") for c in synopsis for w in c.words if w.strip("[]").startswith("--")}
    documented |= {w for c in COMMANDS if c.program == "iopctl" for w in c.words[1:2] if w == "--version"}
    parser = build_parser()
    options = {s for action in parser._actions for s in action.option_strings if s.startswith("--")}
    assert documented == options - {"--help"}


def test_iopctl_command_table_lists_every_command() -> None:
    """docs/iopctl.md's command table has one row per iopctl command."""
    text = (ROOT / "docs" / "iopctl.md").read_text()
    rows = re.findall(r"^\| `([a-z]+)[^`]*` \|", text, flags=re.M)
    assert sorted(rows) == iopctl_commands()


#: The Edge's metrics listener (``metrics.listen``), by its default port.
EDGE_METRICS_PORT = 9101


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "curl"], ids=_ids)
def test_curl_lines_name_routes(command: DocCommand) -> None:
    """A documented ``curl`` line names a route that its daemon's HTTP app serves, with its method.

    Port 8080 is the Control Plane's HTTP listener, 8090 the Edge's
    inference API, 9101 the Edge's metrics listener, which serves
    ``GET /metrics`` alone (their defaults).
    """
    urls = [w for w in command.words if w.startswith(("http://", "https://"))]
    assert len(urls) == 1, command.words
    words = list(command.words)
    method = words[words.index("-X") + 1] if "-X" in words else ("POST" if "-d" in words else "GET")
    parts = urlsplit(urls[0])
    if parts.port == EDGE_METRICS_PORT:
        assert (method, parts.path) == ("GET", "/metrics"), f"{command.where}: the metrics listener serves GET /metrics"
        return
    apps = {8080: ControlPlaneHttp.app, 8090: InferenceAPI.app}
    assert parts.port in apps, f"{command.where}: 8080 is the Control Plane's HTTP port, 8090 the Edge's inference API"
    endpoint, _ = apps[parts.port].url_map.bind("127.0.0.1").match(parts.path, method=method)
    assert endpoint != "not_found", f"{command.where}: no route {method} {parts.path}"


def _makefile() -> tuple[set[str], set[str]]:
    text = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, flags=re.M))
    variables = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:]?=", text, flags=re.M))
    return targets, variables


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.program == "make"], ids=_ids)
def test_make_lines_name_targets(command: DocCommand) -> None:
    """A documented ``make`` line names Makefile targets and variables that exist."""
    targets, variables = _makefile()
    _check_paths(command)
    for word in command.words[1:]:
        if "=" in word:
            assert word.split("=", 1)[0] in variables, f"{command.where}: no Makefile variable in {word}"
        else:
            assert word in targets, f"{command.where}: no Makefile target {word}"


def test_makefile_daemons_pass_check() -> None:
    """The daemons ``make run``, ``make run-edge`` and ``make run-node`` start have valid configs."""
    lines = [line.split("twistd", 1)[1] for line in (ROOT / "Makefile").read_text().splitlines() if "/twistd " in line]
    assert len(lines) == 3
    for line in lines:
        done = _twistd_check((*shlex.split(line), "--check"))
        assert done.returncode == 0 and "configuration OK" in done.stdout, line


def test_screenshot_claims_name_the_switch() -> None:
    """Where a doc says a test writes docs/console.png, it names IOP_UPDATE_SCREENSHOT, as the test needs it."""
    test = (ROOT / "tests" / "console" / "test_console_screenshots.py").read_text()
    assert "IOP_UPDATE_SCREENSHOT" in test
    for document in DOCUMENTS:
        for paragraph in document.read_text().split("\n\n"):
            flat = " ".join(paragraph.split())
            if "console.png" in flat and re.search(r"\b(saves|writes|takes|refresh)", flat):
                assert "IOP_UPDATE_SCREENSHOT" in flat, f"{document.name}: {flat[:120]}"
