"""The spec hash both sides compute for an instance."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.deployments.spec import SPEC_HASH_LENGTH, spec_hash


def test_spec_hash_is_the_sha256_of_the_canonical_document() -> None:
    """The hash is the first 16 hex characters of SHA-256 over sorted, spaceless JSON of the four fields."""
    expected = hashlib.sha256(
        b'{"capacity":4,"model":"m1","parameters":{"a":"2","tokens_per_second":"100"},"profile":"mock"}'
    ).hexdigest()[:16]
    assert spec_hash("mock", "m1", {"tokens_per_second": "100", "a": "2"}, 4) == expected
    assert len(expected) == SPEC_HASH_LENGTH


@given(
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=6),
    st.integers(min_value=0, max_value=1000),
)
def test_spec_hash_ignores_parameter_order(parameters: dict[str, str], capacity: int) -> None:
    """The same parameters in any order hash alike."""
    reordered = dict(reversed(list(parameters.items())))
    assert spec_hash("p", "m", parameters, capacity) == spec_hash("p", "m", reordered, capacity)


def test_spec_hash_changes_with_every_field() -> None:
    """A different profile, model, parameter value or capacity is a different spec."""
    base = spec_hash("p", "m", {"x": "1"}, 1)
    assert base != spec_hash("q", "m", {"x": "1"}, 1)
    assert base != spec_hash("p", "n", {"x": "1"}, 1)
    assert base != spec_hash("p", "m", {"x": "2"}, 1)
    assert base != spec_hash("p", "m", {"x": "1"}, 2)
    assert base != spec_hash("p", "m", {}, 1)
