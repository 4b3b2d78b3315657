"""``iopctl completion bash|zsh``: scripts written from the argument parser,
tried in a real bash (and zsh where it is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from twisted_iop.client.cli import FLEET_STATES, build_parser, parse_arguments
from twisted_iop.client.iopctl.completion import script

IOPCTL = str(Path(sys.executable).parent / "iopctl")
BASH = shutil.which("bash")
ZSH = shutil.which("zsh")


def printed(shell: str) -> str:
    """What the installed ``iopctl completion SHELL`` prints (exit 0)."""
    done = subprocess.run([IOPCTL, "completion", shell], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The printed bash script, in a file."""
    path = tmp_path_factory.mktemp("completion") / "iopctl.bash"
    path.write_text(printed("bash"))
    return path


def complete(script_path: Path, *words: str) -> list[str]:
    """What bash's completion offers for the command line ``words`` (the last
    word is the one being completed), through COMP_WORDS/COMP_CWORD."""
    assert BASH is not None
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"source {script_path}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 )); COMPREPLY=()\n"
        # The function complete -F registered for iopctl, as bash would call it.
        "fn=$(complete -p iopctl | sed -E 's/.*-F ([^ ]+).*/\\1/')\n"
        '"$fn" iopctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run([BASH, "--norc", "--noprofile", "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stderr, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_completion_parses_and_prints_the_generated_script() -> None:
    """``completion`` takes bash or zsh only; what it prints is the script written from the parser."""
    assert parse_arguments(["completion", "zsh"]).shell == "zsh"
    with pytest.raises(Exception, match="invalid choice"):
        parse_arguments(["completion", "fish"])
    assert printed("bash") == script(build_parser(), "bash")


def test_bash_completes_subcommands(bash_script: Path) -> None:
    """Subcommand names complete from a prefix, also after a global option and its value."""
    assert complete(bash_script, "iopctl", "fl") == ["fleet"]
    assert complete(bash_script, "iopctl", "--url", "http://cp:8080", "comp") == ["completion"]
    assert set(complete(bash_script, "iopctl", "")) >= {"edges", "fleet", "command", "completion"}


def test_bash_completes_options_and_their_values(bash_script: Path) -> None:
    """A subcommand's options complete, and so do the fixed values of --state and of completion's shell."""
    assert complete(bash_script, "iopctl", "fleet", "--sel") == ["--selector"]
    assert complete(bash_script, "iopctl", "events", "edge-a", "--limit", "5", "--fo") == ["--follow"]
    assert complete(bash_script, "iopctl", "fleet", "--state", "") == list(FLEET_STATES)
    assert complete(bash_script, "iopctl", "edges", "-l", "region=eu", "--state", "d") == ["disconnected"]
    assert complete(bash_script, "iopctl", "completion", "") == ["bash", "zsh"]
    # A free value (a selector) offers nothing rather than the wrong words.
    assert complete(bash_script, "iopctl", "fleet", "--selector", "") == []
    # Top-level options are not a subcommand's: edges has no --version.
    assert "--version" not in complete(bash_script, "iopctl", "edges", "--")


def test_zsh_script_structure() -> None:
    """The zsh script is a #compdef function naming every subcommand and
    option of the parser, with --state's values, registered for iopctl."""
    text = printed("zsh")
    lines = text.splitlines()
    assert lines[0] == "#compdef iopctl"
    assert "compdef _iopctl iopctl" in text and '_iopctl "$@"' in text
    commands = re.findall(r"^ {16}'([a-z]+):", text, re.MULTILINE)
    assert set(commands) >= {"edges", "edge", "status", "fleet", "events", "command", "hello", "completion"}
    branches = re.findall(r"^ {16}([a-z]+)\)$", text, re.MULTILINE)
    assert branches == commands
    assert "'--state[only edges in one of these states" in text
    assert ":STATE:(" + " ".join(FLEET_STATES) + ")'" in text
    assert "'(-l --selector)-l[" in text and "'1:value:(bash zsh)'" in text
    # Every spec line is one single-quoted word (quotes balanced once '\'' is taken out).
    for line in lines:
        assert line.replace("'\\''", "").count("'") % 2 == 0, line


def test_zsh_loads_the_script(tmp_path: Path) -> None:
    """A real zsh parses the script, and sourcing it after compinit registers _iopctl for iopctl."""
    assert ZSH is not None
    path = tmp_path / "_iopctl"
    path.write_text(printed("zsh"))
    check = subprocess.run([ZSH, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    program = f"autoload -U compinit; compinit -u -D; source {path}; print -r -- ${{_comps[iopctl]}}"
    done = subprocess.run([ZSH, "-f", "-c", program], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "_iopctl", done.stderr
