"""Label selectors: Kubernetes' language, parsed once, matched against labels.

One language for every filter and target of the fleet (edge labels from
hello, node labels from the snapshot)::

    region=eu,tier!=canary,gpu in (h100,a100),!legacy,zone

Requirements are joined by ``,`` (all must hold):

* ``key=value`` or ``key==value``: the label is present with that value;
* ``key!=value``: the label is absent or has another value;
* ``key in (v1,v2)`` / ``key notin (v1,v2)``: the value is (not) one of the
  set (``notin`` also holds when the label is absent);
* ``key``: the label exists; ``!key``: it does not.

Keys and values follow Kubernetes' syntax (an optional DNS prefix and
``/``, then up to 63 of ``[A-Za-z0-9_.-]`` beginning and ending
alphanumeric; values may be empty). A syntax error raises
:class:`SelectorError` naming the position (0-based character offset) and
what was expected there. The empty selector matches everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

import attrs

#: Longest selector text accepted (a query parameter).
MAX_SELECTOR_CHARS = 4096
#: Most requirements in one selector.
MAX_REQUIREMENTS = 64

_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")
_WORD_RE = re.compile(r"[A-Za-z0-9_./-]+")


def _selector_pattern() -> str:
    """The whole grammar as one regular expression, for the OpenAPI document.

    Built from the same pieces as the parser's checks and its bound of 64
    requirements; ``tests/test_label_selectors.py`` checks that the pattern
    and :func:`parse_selector` agree. A set of values has no count bound of
    its own (the text's 4,096 characters bound it, and a set is looked up,
    not scanned): validators compile a pattern with two bounded repeats of
    this size into more than their limit.
    """
    space = "[ \\t]*"
    name = "[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
    key = f"(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{name}"
    value = f"(?:{name})?"
    values = f"\\({space}{value}{space}(?:,{space}{value}{space})*\\)"
    requirement = f"(?:!{space}{key}|{key}(?:{space}(?:==|!=|=){space}{value}|[ \\t]+(?:in|notin){space}{values})?)"
    one = f"{space}{requirement}{space}"
    return f"^(?:\\s*|{one}(?:,{one}){{0,{MAX_REQUIREMENTS - 1}}})$"


#: :func:`parse_selector`'s language as a JSON Schema ``pattern`` (the
#: OpenAPI document's selector parameters and fields carry it).
SELECTOR_PATTERN = _selector_pattern()

EQUALS = "="
NOT_EQUALS = "!="
IN = "in"
NOT_IN = "notin"
EXISTS = "exists"
NOT_EXISTS = "!"


class SelectorError(ValueError):
    """A selector that does not parse: ``position`` is the character offset of the problem."""

    def __init__(self, position: int, message: str) -> None:
        super().__init__(f"selector: at position {position}: {message}")
        self.position = position
        self.detail = message


@attrs.frozen
class Requirement:
    """One requirement: ``key``, an operator and its values."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement."""
        value = labels.get(self.key)
        operator = self.operator
        if operator in (EQUALS, IN):
            return value is not None and value in self.values
        if operator in (NOT_EQUALS, NOT_IN):
            return value is None or value not in self.values
        if operator == EXISTS:
            return value is not None
        return value is None

    def __str__(self) -> str:
        if self.operator == EXISTS:
            return self.key
        if self.operator == NOT_EXISTS:
            return "!" + self.key
        if self.operator in (IN, NOT_IN):
            return f"{self.key} {self.operator} ({','.join(sorted(self.values))})"
        (value,) = self.values
        return f"{self.key}{self.operator}{value}"


@attrs.frozen
class Selector:
    """A parsed selector: every requirement must hold (none: everything matches)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy every requirement."""
        return all(requirement.matches(labels) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        """Whether this selector matches everything."""
        return not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


#: The selector that matches everything.
EVERYTHING = Selector()


def parse_selector(text: Optional[str]) -> Selector:
    """Parse ``text``; :class:`SelectorError` names the position of a syntax error."""
    if text is None or not text.strip():
        return EVERYTHING
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(MAX_SELECTOR_CHARS, f"longer than {MAX_SELECTOR_CHARS} characters")
    return Selector(tuple(_Parser(text).requirements()))


class _Parser:
    """A hand-written scanner over the selector text (positions kept for errors)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def requirements(self) -> list[Requirement]:
        found: list[Requirement] = []
        while True:
            self._space()
            found.append(self._requirement())
            if len(found) > MAX_REQUIREMENTS:
                raise SelectorError(self.at, f"more than {MAX_REQUIREMENTS} requirements")
            self._space()
            if self.at == len(self.text):
                return found
            if self.text[self.at] != ",":
                raise SelectorError(self.at, f"expected ',' or the end, found {self.text[self.at]!r}")
            self.at += 1

    def _requirement(self) -> Requirement:
        if self._peek("!") and not self._peek("!="):
            self.at += 1
            self._space()
            return Requirement(self._key(), NOT_EXISTS)
        key = self._key()
        self._space()
        if self.at == len(self.text) or self.text[self.at] == ",":
            return Requirement(key, EXISTS)
        if self._peek("=="):
            self.at += 2
            return Requirement(key, EQUALS, frozenset({self._value()}))
        if self._peek("!="):
            self.at += 2
            return Requirement(key, NOT_EQUALS, frozenset({self._value()}))
        if self._peek("="):
            self.at += 1
            return Requirement(key, EQUALS, frozenset({self._value()}))
        start = self.at
        word = self._word()
        if word in (IN, NOT_IN):
            return Requirement(key, word, self._set())
        raise SelectorError(start, "expected one of =, ==, !=, in, notin, ',' or the end")

    def _key(self) -> str:
        start = self.at
        key = self._word()
        if not key:
            raise SelectorError(start, "expected a label key")
        if not _KEY_RE.match(key):
            raise SelectorError(start, f"{key!r} is not a valid label key")
        return key

    def _value(self) -> str:
        self._space()
        start = self.at
        value = self._word()
        if not _VALUE_RE.match(value):
            raise SelectorError(start, f"{value!r} is not a valid label value")
        return value

    def _set(self) -> frozenset[str]:
        self._space()
        if not self._peek("("):
            raise SelectorError(self.at, "expected '(' to open the set of values")
        self.at += 1
        values: set[str] = set()
        while True:
            values.add(self._value())
            self._space()
            if self._peek(")"):
                self.at += 1
                return frozenset(values)
            if not self._peek(","):
                raise SelectorError(self.at, "expected ',' or ')' in the set of values")
            self.at += 1

    def _word(self) -> str:
        match = _WORD_RE.match(self.text, self.at)
        if match is None:
            return ""
        self.at = match.end()
        return match.group()

    def _peek(self, token: str) -> bool:
        return self.text.startswith(token, self.at)

    def _space(self) -> None:
        while self.at < len(self.text) and self.text[self.at] in " \t":
            self.at += 1
