"""The package's layers point one way.

The client library loads no server code, and no two modules of
``twisted_iop`` import each other, directly or around a longer circle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "twisted_iop"

CLIENT_MODULES = [
    "twisted_iop.client",
    "twisted_iop.client.repository",
    "twisted_iop.client.wire",
    "twisted_iop.client.wire_connection",
    "twisted_iop.client.cli",
    "twisted_iop.client.models",
    "twisted_iop.client.model_json",
    "twisted_iop.client.iopctl.render",
    "twisted_iop.client.errors",
]

#: What a program that only talks to a Control Plane must never load: the
#: daemons, their HTTP site and the Prometheus exposition.
SERVER_MODULES = (
    "twisted_iop.controlplane",
    "twisted_iop.edge",
    "twisted_iop.node",
    "twisted_iop.web.http_site",
    "twisted_iop.web.request_guard",
    "twisted_iop.metrics",
    "prometheus_client",
)


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_client_modules_load_no_server_code(module: str) -> None:
    """Importing a client module in a fresh interpreter loads no daemon, HTTP site or Prometheus module."""
    script = f"import sys, {module}\nprint('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    loaded = result.stdout.split()
    assert module in loaded
    server = [name for name in loaded if _within(name, SERVER_MODULES)]
    assert not server, f"{module} loads server code: {', '.join(server)}"


# -- the import graph, read from the source ---------------------------------------------


def _modules(package: Path) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports anywhere in its source.

    Every import counts: at module level, inside functions and under ``if
    TYPE_CHECKING:`` (a circle of types is still a tangle). A package is not
    counted as imported by its own submodules, which Python runs first: a
    package's ``__init__`` naming its submodules would otherwise make a
    circle of every package.
    """

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(filter(None, (known(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in modules else known(source)
                if target is not None:
                    found.add(target)
    found.discard(module)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module to the modules of the same package it imports."""
    modules = _modules(package)
    return {name: _imported(name, path, modules) for name, path in modules.items()}


def _circle_through(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A shortest import circle from ``start`` back to itself, or None."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph[name]):
                if target == start:
                    circle = [name]
                    while circle[-1] != start:
                        circle.append(came_from[circle[-1]])
                    return [start, *reversed(circle[:-1]), start]
                if target not in came_from:
                    came_from[target] = name
                    following.append(target)
        frontier = following
    return None


def import_circles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """One shortest circle for every module on a circle not already named."""
    named: set[str] = set()
    for name in sorted(graph):
        if name in named:
            continue
        circle = _circle_through(name, graph)
        if circle is not None:
            named.update(circle)
            yield circle


def test_import_circles_are_found_and_named() -> None:
    """The circle finder names a two-module circle and a longer one, and nothing else."""
    graph = {
        "a": {"b"},
        "b": {"a", "c"},
        "c": set(),
        "d": {"e"},
        "e": {"f"},
        "f": {"d", "c"},
    }
    assert list(import_circles(graph)) == [["a", "b", "a"], ["d", "e", "f", "d"]]
    assert list(import_circles({"a": {"b"}, "b": {"c"}, "c": set()})) == []


def test_import_graph_reads_every_kind_of_import(tmp_path: Path) -> None:
    """Plain, from, relative, in-function and TYPE_CHECKING imports all count; a package's own parent does not."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import leaf\n")
    (package / "sub" / "leaf.py").write_text("")
    (package / "a.py").write_text("import pkg.b\nfrom . import c\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.leaf import X\n"
    )
    (package / "c.py").write_text("def f() -> None:\n    from .sub import leaf\n")
    assert import_graph(package) == {
        "pkg": set(),
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": set(),
        "pkg.a": {"pkg.b", "pkg.c"},
        "pkg.b": {"pkg.sub.leaf"},
        "pkg.c": {"pkg.sub.leaf"},
    }


def test_no_module_of_the_package_imports_itself_round_a_circle() -> None:
    """No import circle in twisted_iop, counting imports in functions and under TYPE_CHECKING."""
    graph = import_graph(PACKAGE)
    assert "twisted_iop.wire.peer" in graph["twisted_iop.wire.hello_dialer"]  # the graph was read
    circles = [" -> ".join(circle) for circle in import_circles(graph)]
    assert not circles, "import circles: " + "; ".join(circles)
