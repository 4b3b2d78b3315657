"""The label selector language: parsing, errors with positions, matching."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.label_selectors import (
    EVERYTHING,
    MAX_SELECTOR_CHARS,
    SELECTOR_PATTERN,
    SelectorError,
    parse_selector,
)

LABELS = {"region": "eu", "tier": "prod", "gpu": "h100"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("region=eu", True),
        ("region==eu", True),
        ("region=us", False),
        ("region!=us", True),
        ("missing!=x", True),
        ("gpu in (h100,a100)", True),
        ("gpu in (a100)", False),
        ("gpu notin (a100, l4)", True),
        ("missing notin (a)", True),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("!tier", False),
        ("region=eu,tier!=canary,gpu in (h100,a100),!legacy", True),
        ("region=eu,tier=canary", False),
        (" region = eu , tier ", True),
        ("example.com/team=x", False),
        ("empty=", False),
    ],
)
def test_kubernetes_operators_match_as_kubernetes_does(text: str, matches: bool) -> None:
    """Each operator of Kubernetes' selector language, alone and joined by commas."""
    assert parse_selector(text).matches(LABELS) is matches


def test_an_empty_value_matches_an_empty_label() -> None:
    """``key=`` asks for the label with the empty value, not for its absence."""
    assert parse_selector("note=").matches({"note": ""})
    assert not parse_selector("note=").matches({})


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("region=eu,", 10),
        ("region=eu;tier=x", 9),
        ("region in eu", 10),
        ("region in (eu", 13),
        ("region ~ eu", 7),
        ("=eu", 0),
        ("-bad=x", 0),
        ("region=e u", 9),
        ("region=-eu", 7),
    ],
)
def test_a_syntax_error_names_its_position(text: str, position: int) -> None:
    """A bad selector raises SelectorError whose position points at the problem."""
    with pytest.raises(SelectorError) as raised:
        parse_selector(text)
    assert raised.value.position == position
    assert f"at position {position}" in str(raised.value)


def test_limits_are_errors_not_hangs() -> None:
    """Over-long selectors and too many requirements are refused with a reason."""
    with pytest.raises(SelectorError, match="longer than"):
        parse_selector("a" * 5000)
    with pytest.raises(SelectorError, match="more than 64 requirements"):
        parse_selector(",".join(f"k{i}" for i in range(65)))


def test_blank_is_everything() -> None:
    """No selector (None or blanks) matches every label set."""
    assert parse_selector(None) is EVERYTHING
    assert parse_selector("   ").matches({})


_names = st.from_regex(r"\A[a-z0-9]([a-z0-9_.-]{0,10}[a-z0-9])?\Z")
_labels = st.dictionaries(_names, _names, max_size=4)


@st.composite
def _requirements(draw: st.DrawFn) -> str:
    key = draw(_names)
    kind = draw(st.sampled_from(["=", "==", "!=", "in", "notin", "exists", "!"]))
    if kind == "exists":
        return key
    if kind == "!":
        return "!" + key
    if kind in ("in", "notin"):
        values = draw(st.lists(_names, min_size=1, max_size=3))
        return f"{key} {kind} ({','.join(values)})"
    return f"{key}{kind}{draw(_names)}"


@given(st.lists(_requirements(), min_size=1, max_size=5), _labels)
def test_the_printed_form_parses_to_the_same_selector(parts: list[str], labels: dict[str, str]) -> None:
    """str() of a parsed selector parses back to an equal one that matches alike; all of them are each one."""
    selector = parse_selector(",".join(parts))
    again = parse_selector(str(selector))
    assert again == selector
    assert again.matches(labels) == selector.matches(labels)
    assert selector.matches(labels) == all(parse_selector(p).matches(labels) for p in parts)


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_selector_error(text: str) -> None:
    """Garbage never raises anything but SelectorError."""
    position = 0
    try:
        parse_selector(text)
    except SelectorError as e:
        position = e.position
    assert 0 <= position <= max(len(text), 4096)


#: Characters a selector is made of, and some it is not.
_SELECTOR_ALPHABET = "az09AZ._-/=!(), \t\n\u00e9"


@given(st.text(alphabet=_SELECTOR_ALPHABET, max_size=40) | st.sampled_from(["a in (x,)", "a notin(b)", "!a", " a = "]))
def test_the_documents_pattern_is_the_parsers_language(text: str) -> None:
    """SELECTOR_PATTERN (the OpenAPI document's) matches exactly what parse_selector accepts."""
    try:
        parse_selector(text)
        parsed = True
    except SelectorError:
        parsed = False
    # fullmatch: a JSON Schema pattern's $ is the end (Python's would also take a final newline).
    assert bool(re.fullmatch(SELECTOR_PATTERN, text)) is parsed, text


@given(st.from_regex(SELECTOR_PATTERN, fullmatch=True).filter(lambda t: len(t) <= MAX_SELECTOR_CHARS))
def test_what_the_pattern_generates_parses(text: str) -> None:
    """Selectors generated from the pattern (as a fuzzer does) all parse."""
    parse_selector(text)


def test_a_set_may_hold_many_values() -> None:
    """A set's values are bounded by the selector's length only (the pattern cannot count them)."""
    values = ",".join(f"v{i}" for i in range(600))
    assert len(parse_selector(f"k in ({values})").requirements[0].values) == 600
