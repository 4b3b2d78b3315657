"""Packaging: the generated wire code matches the .proto, and both a regular
and an editable install make twistd list the plugins."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_wire_code_matches_proto(tmp_path: Path) -> None:
    """Regenerating control_pb2 from proto/iop/control.proto gives the committed files."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto' / 'iop'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            str(ROOT / "proto" / "iop" / "control.proto"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    for name in ("control_pb2.py", "control_pb2.pyi"):
        committed = (ROOT / "twisted_iop" / "wire" / name).read_text()
        assert (tmp_path / name).read_text() == committed, f"{name} drifted: run `make proto`"


def _venv_with_dependencies(path: Path) -> Path:
    """A fresh venv that sees this environment's dependencies but not the project."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Dependencies come from the test environment's site-packages, through a
    # .pth file, so the test needs no network; the project itself does not.
    outer = sysconfig.get_paths()["purelib"]
    (Path(site) / "outer.pth").write_text(outer + "\n")
    return python


@pytest.mark.parametrize("editable", [False, True], ids=["pip-install", "editable"])
def test_install_registers_twistd_plugins(tmp_path: Path, editable: bool) -> None:
    """After `pip install .` or `pip install -e .`, `twistd --help` lists iop-control-plane."""
    python = _venv_with_dependencies(tmp_path / "venv")
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", "*.egg-info", "node_modules"),
    )
    args = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-build-isolation"]
    if editable:
        args += ["-e", str(source), "--config-settings", "editable_mode=compat"]
    else:
        args += [str(source)]
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    install = subprocess.run(args, capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert install.returncode == 0, install.stderr[-2000:]
    helptext = subprocess.run(
        [str(python), "-c", "import sys; sys.argv=['twistd','--help']; from twisted.scripts.twistd import run; run()"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
    )
    assert "iop-control-plane" in helptext.stdout, helptext.stdout + helptext.stderr
    where = subprocess.run(
        [str(python), "-c", "import twisted_iop; print(twisted_iop.__file__)"],
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
    ).stdout
    assert str(source) in where if editable else "site-packages" in where


NEWS_TYPES = {"feature", "bugfix", "removal", "doc", "misc"}


def test_every_news_fragment_has_an_issue_and_a_known_type() -> None:
    """Each file in newsfragments/ is ``ISSUE.TYPE.md`` (or towncrier's
    ``ISSUE.TYPE.N.md`` for a further fragment of one issue and type) with a
    type the changelog's configuration declares, and says something."""
    declared = set(re.findall(r'directory = "(\w+)"\nname', (ROOT / "pyproject.toml").read_text()))
    assert declared == NEWS_TYPES
    fragments = [p for p in (ROOT / "newsfragments").iterdir() if p.name != ".gitignore"]
    assert fragments, "the unreleased changes have their fragments"
    for fragment in fragments:
        issue, kind, suffix = fragment.name.split(".", 2)
        counter = suffix[: -len(".md")] if suffix.endswith(".md") else ""
        assert issue.isdigit() and kind in NEWS_TYPES, fragment.name
        assert suffix == "md" or counter.isdigit(), fragment.name
        assert fragment.read_text().strip(), f"{fragment.name} is empty"


def test_the_changelog_builds_from_the_fragments() -> None:
    """``towncrier build --draft`` renders every fragment into the changelog."""
    towncrier = Path(sys.executable).parent / "towncrier"
    done = subprocess.run(
        [str(towncrier), "build", "--draft", "--version", "0.0.0"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    for fragment in (ROOT / "newsfragments").glob("*.md"):
        first_words = " ".join(fragment.read_text().split()[:6])
        assert first_words in " ".join(done.stdout.split()), fragment.name
