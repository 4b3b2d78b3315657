"""The one token bucket: starts full, refills at its rate up to its burst, never lends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.token_bucket import TokenBucket


def test_a_full_bucket_gives_its_burst_then_says_how_long_to_wait() -> None:
    """A bucket of 8/s with burst 2 gives two at once, then the third waits 1/8 s, and is there after it."""
    bucket = TokenBucket(8.0, 2.0)
    assert bucket.take(100.0) is None and bucket.take(100.0) is None
    assert bucket.take(100.0) == 0.125
    assert bucket.wait(100.0625) == 0.0625
    assert bucket.take(100.125) is None


def test_it_refills_to_its_burst_and_no_further() -> None:
    """An hour of rest leaves the burst, not an hour's tokens; time going backwards adds nothing."""
    bucket = TokenBucket(1000.0, 5.0)
    bucket.took(5)
    assert bucket.available(0.0) == 0.0
    assert bucket.available(3600.0) == 5.0
    bucket.took(5)
    assert bucket.available(3599.0) == 0.0


def test_a_rate_or_burst_of_zero_is_refused() -> None:
    """A bucket that could never give a token is a programming error, said at once."""
    with pytest.raises(ValueError, match="above 0"):
        TokenBucket(0.0, 1.0)
    with pytest.raises(ValueError, match="above 0"):
        TokenBucket(1.0, 0.0)


@given(
    st.floats(0.5, 1000.0),
    st.floats(1.0, 50.0),
    st.lists(st.floats(0.0, 2.0), min_size=1, max_size=200),
)
def test_what_it_gives_over_any_time_is_at_most_its_burst_plus_rate_times_time(
    rate: float, burst: float, steps: list[float]
) -> None:
    """Taking one at every step, as often as it allows: the tokens given by time T never pass
    ``burst + rate * T``, and a refused take's wait is exactly when the next one is there."""
    bucket = TokenBucket(rate, burst)
    now, given_out = 0.0, 0
    for step in steps:
        now += step
        wait = bucket.take(now)
        if wait is None:
            given_out += 1
        else:
            assert wait > 0
            assert bucket.take(now + wait + 1e-9) is None
            now += wait + 1e-9
            given_out += 1
        assert given_out <= burst + rate * now + 1e-6
