"""One writer of an operation's state, found by reading the source.

An operation's ``state``, ``finished_at``, ``history`` and ``late_outcome``
are written only by the state machine (``controlplane/requests/operation_states.py``);
which transition to ask for is decided only by the gateway's command room
(``controlplane/requests/command_dispatch.py``), through the registry's operation
log, which records it. These tests parse every module under ``twisted_iop/`` and fail when a
second writer or decider appears.

How it tells an operation's fields from other objects' (the AST knows no
types):

* **By the attribute set.** Only the four names above count, on any object
  but ``self`` in a class of its own: ``self.state = ...`` in a method of a
  class other than ``OperationRecord`` sets that class's own attribute and
  is not flagged; ``op.state = ...``, ``kept.history = ...`` are, whatever
  the variable is called. Nothing else in the tree assigns these names
  today; an unrelated object that does (``conn.state = ...`` from outside
  its class) is listed in :data:`ALLOWED` with the reason, or better, names
  its attribute for what it is.
* **Every way to write**: assignment (plain, annotated, augmented, in a
  tuple, to an item: ``op.history[0] = ...``), ``del``, a mutating call on
  the history (``op.history.append(...)``), ``setattr(op, "state", ...)``,
  and ``attrs.evolve(op, state=...)`` / ``dataclasses.replace``.
* **Who decides**: calls of the operation log's ``start_operation``,
  ``advance_operation`` and ``record_late_outcome`` come only from the
  command room; ``.advance(state, at, ...)`` (two arguments or more: a
  clock's ``advance`` takes one) and ``.note_late_outcome(...)`` only from
  the operation log and the records.

``test_the_scan_finds_every_kind_of_write`` checks the scanner itself on
a stray writer of each kind.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "twisted_iop"

#: The fields only the state machine writes.
FIELDS = frozenset({"state", "finished_at", "history", "late_outcome"})
#: The one module that writes them.
STATE_MACHINE = "twisted_iop/controlplane/requests/operation_states.py"
#: Writes of those fields outside the state machine that are allowed:
#: (module, enclosing function) -> why. An entry that matches no write fails
#: (it must not outlive what it excused).
ALLOWED: dict[tuple[str, str], str] = {
    (
        "twisted_iop/controlplane/slo/evaluator.py",
        "SloState.evaluate",
    ): "an SLO alert's state (firing, resolved), not an operation's",
    (
        "twisted_iop/edge/deployments.py",
        "_checked_status",
    ): "an instance's state as a Node reported it (a wire field), not an operation's",
}
#: Mutating calls on a list (the history).
LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"})
#: The operation log's writers, and the one module that calls them.
DECISIONS = frozenset({"start_operation", "advance_operation", "record_late_outcome"})
DECIDER = "twisted_iop/controlplane/requests/command_dispatch.py"
#: The record's own transitions, and the modules that call them (the recorders).
TRANSITIONS = frozenset({"advance", "note_late_outcome"})
RECORDERS = frozenset(
    {"twisted_iop/controlplane/fleet/operation_log.py", "twisted_iop/controlplane/fleet/operations.py"}
)


@attrs.frozen
class Write:
    """One write of an operation field (or one decision call) in the source."""

    module: str
    function: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} in {self.function or '<module>'}: {self.what}"


class _Scanner(ast.NodeVisitor):
    """Collects the writes of :data:`FIELDS` and the calls of
    :data:`DECISIONS` / :data:`TRANSITIONS` in one module."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.classes: list[str] = []
        self.writes: list[Write] = []
        self.decisions: list[Write] = []
        self.transitions: list[Write] = []

    def _note(self, into: list[Write], node: ast.AST, what: str) -> None:
        into.append(Write(self.module, ".".join(self.scope), getattr(node, "lineno", 0), what))

    # -- scopes ---------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]  # both kinds of function are visited alike

    # -- targets --------------------------------------------------------------

    def _own_attribute(self, node: ast.Attribute) -> bool:
        """``self.<field>`` in a class of its own (not an operation record)."""
        in_own_class = bool(self.classes) and self.classes[-1] != "OperationRecord"
        return in_own_class and isinstance(node.value, ast.Name) and node.value.id == "self"

    def _target(self, target: ast.expr, how: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, how)
        elif isinstance(target, ast.Starred):
            self._target(target.value, how)
        elif isinstance(target, ast.Attribute):
            if target.attr in FIELDS and not self._own_attribute(target):
                self._note(self.writes, target, f"{how} {ast.unparse(target)}")
        elif isinstance(target, ast.Subscript):
            value = target.value
            if isinstance(value, ast.Attribute) and value.attr in FIELDS and not self._own_attribute(value):
                self._note(self.writes, target, f"{how} {ast.unparse(target)}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target, "assigns")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._target(node.target, "assigns")
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, "updates")
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._target(target, "deletes")
        self.generic_visit(node)

    # -- calls ----------------------------------------------------------------

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if (
            isinstance(func, ast.Attribute)
            and name in LIST_MUTATORS
            and isinstance(func.value, ast.Attribute)
            and func.value.attr in FIELDS
            and not self._own_attribute(func.value)
        ):
            self._note(self.writes, node, f"calls {ast.unparse(func)}(...)")
        if name in ("evolve", "replace") and any(k.arg in FIELDS for k in node.keywords):
            fields = sorted(k.arg for k in node.keywords if k.arg in FIELDS)
            self._note(self.writes, node, f"calls {ast.unparse(func)}(..., {', '.join(fields)}=...)")
        if (
            name in ("setattr", "__setattr__")
            and any(isinstance(a, ast.Constant) and a.value in FIELDS for a in node.args[:2])
            and not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self" and self.classes)
        ):
            self._note(self.writes, node, f"calls {ast.unparse(func)}(...)")
        if isinstance(func, ast.Attribute) and name in DECISIONS:
            self._note(self.decisions, node, f"calls {ast.unparse(func)}(...)")
        if isinstance(func, ast.Attribute) and (
            name == "note_late_outcome" or (name == "advance" and len(node.args) + len(node.keywords) >= 2)
        ):
            self._note(self.transitions, node, f"calls {ast.unparse(func)}(...)")
        self.generic_visit(node)


def scan(source: str, module: str) -> _Scanner:
    """The writes and calls found in ``source`` (named ``module``)."""
    scanner = _Scanner(module)
    scanner.visit(ast.parse(source, module))
    return scanner


def modules() -> Iterator[tuple[str, str]]:
    """Every module of the package: (path from the repository root, source)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def _scans() -> list[_Scanner]:
    return [scan(source, module) for module, source in modules()]


def test_only_the_state_machine_writes_an_operations_state() -> None:
    """No module but operation_states.py assigns, updates or mutates an
    operation's state, finished_at, history or late_outcome (but the
    writes in ALLOWED, each with its reason)."""
    stray = [
        str(write)
        for scanner in _scans()
        if scanner.module != STATE_MACHINE
        for write in scanner.writes
        if (write.module, write.function) not in ALLOWED
    ]
    assert stray == [], "a second writer of an operation's state:\n" + "\n".join(stray)


def test_every_allowed_write_still_exists() -> None:
    """An ALLOWED entry that matches no write has outlived its reason: it fails."""
    found = {(write.module, write.function) for scanner in _scans() for write in scanner.writes}
    assert set(ALLOWED) <= found, f"stale entries: {sorted(set(ALLOWED) - found)}"


def test_the_state_machine_does_write_them() -> None:
    """The scan sees the state machine's own writes (it is not blind)."""
    [machine] = [scanner for scanner in _scans() if scanner.module == STATE_MACHINE]
    assert {
        "assigns operation.state",
        "assigns operation.finished_at",
        "assigns operation.late_outcome",
        "calls operation.history.append(...)",
        "assigns kept.state",
    } <= {write.what for write in machine.writes}


def test_only_the_command_room_decides_an_operations_state() -> None:
    """The operation log's writers are called from the gateway's command
    room only; a record's own transitions only from the operation log and the records."""
    deciders = [str(call) for scanner in _scans() if scanner.module != DECIDER for call in scanner.decisions]
    assert deciders == [], "a second decider of an operation's state:\n" + "\n".join(deciders)
    movers = [str(call) for scanner in _scans() if scanner.module not in RECORDERS for call in scanner.transitions]
    assert movers == [], "an operation moved outside the operation log:\n" + "\n".join(movers)


STRAY = """
import attrs

class Other:
    def __init__(self):
        self.state = "connecting"          # its own attribute: not an operation's
        self.history = []
        self.history.append("x")
        setattr(self, "state", "open")

def stray(op, kept, other):
    op.state = "failed"
    kept.finished_at += 1.0
    op.history.append(("failed", 1.0, ""))
    op.history[0] = ("sent", 0.0, "")
    a, op.late_outcome = 1, None
    del kept.history[1:]
    attrs.evolve(op, state="succeeded")
    setattr(op, "late_outcome", None)
    registry.advance_operation("e", "op", "failed")
    op.advance("failed", 1.0)
    op.note_late_outcome(None)
    clock.advance(1)

class OperationRecord:
    def advance(self):
        self.state = "failed"              # the record's own field: an operation's
"""


def test_the_scan_finds_every_kind_of_write() -> None:
    """Each kind of stray write is found, with its line; a class's own
    ``self.state`` and a clock's ``advance`` are not."""
    scanner = scan(STRAY, "twisted_iop/stray.py")
    assert [(w.function, w.line) for w in scanner.writes] == [
        ("stray", 12),
        ("stray", 13),
        ("stray", 14),
        ("stray", 15),
        ("stray", 16),
        ("stray", 17),
        ("stray", 18),
        ("stray", 19),
        ("OperationRecord.advance", 27),
    ]
    assert [w.line for w in scanner.decisions] == [20]
    assert [w.line for w in scanner.transitions] == [21, 22]
