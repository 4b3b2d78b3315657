"""Hello admission: hellos pass while the event loop keeps up, on a Clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text, load_config
from twisted_iop.controlplane.hello_admission import (
    MAX_RETRY_SECONDS,
    HelloAdmission,
    HelloAdmissionSettings,
)

SETTINGS = HelloAdmissionSettings(max_loop_lag_ms=50, max_pending_hellos=10, probe_interval_ms=20)


def started(settings: HelloAdmissionSettings = SETTINGS) -> tuple[Clock, HelloAdmission]:
    """An admission rule whose probe runs on a fresh Clock."""
    clock = Clock()
    admission = HelloAdmission(clock, settings)
    admission.start()
    return clock, admission


def test_an_idle_loop_admits_every_hello_of_a_window_up_to_the_pending_bound() -> None:
    """With no lag, the first max_pending_hellos hellos of a window pass."""
    _clock, admission = started()
    assert [admission.admit() for _ in range(10)] == [None] * 10
    assert admission.admitted_total == 10 and admission.refused_total == 0


def test_past_the_pending_bound_hellos_wait_until_the_probe_has_run() -> None:
    """The 11th hello of one window is refused (``pending``); once the probe ran, hellos pass again."""
    clock, admission = started()
    for _ in range(10):
        admission.admit()
    wait = admission.admit()
    assert wait is not None and wait > 0
    assert admission.refused["pending"] == 1
    clock.advance(0.02)
    assert admission.admit() is None


def test_a_lagging_loop_refuses_until_the_probe_runs_on_time_again() -> None:
    """A probe run 180 ms late refuses hellos (``loop_lag``); the next punctual run admits them."""
    clock, admission = started()
    clock.advance(0.2)  # the probe due at 0.02 ran at 0.2
    assert admission.probe.last_lag == pytest.approx(0.18)
    assert admission.admit() is not None
    assert admission.refused["loop_lag"] == 1
    clock.advance(0.02)
    assert admission.probe.last_lag == 0
    assert admission.admit() is None


def test_a_long_turn_under_way_counts_as_lag_before_the_probe_can_run() -> None:
    """While the probe is overdue by more than the bound (one long reactor turn), hellos are refused."""
    clock, admission = started()
    clock.rightNow += 0.03  # overdue by 10 ms: under the bound
    assert admission.admit() is None
    clock.rightNow += 0.05  # overdue by 60 ms
    assert admission.admit() is not None
    assert admission.refused["loop_lag"] == 1


def test_refused_hellos_are_told_successive_slots_after_the_lag() -> None:
    """Hints grow one slot per refused hello, start after the current lag, and stay bounded."""
    clock, admission = started()
    clock.advance(0.2)
    hints = [admission.admit() for _ in range(5)]
    assert all(hint is not None for hint in hints)
    values = [hint for hint in hints if hint is not None]
    assert values[0] >= 0.18
    assert values == sorted(values) and len(set(values)) == 5


def test_the_hints_spread_at_the_rate_a_full_window_admitted() -> None:
    """After a full window (10 hellos in 20 ms: 500/s) refused hellos are 2 ms apart."""
    clock, admission = started()
    for _ in range(10):
        admission.admit()
    clock.advance(0.02)
    admission.admit()  # opens the next window; the last one was full
    assert admission.rate == pytest.approx(500.0)
    for _ in range(9):
        admission.admit()
    first, second = admission.admit(), admission.admit()
    assert first is not None and second is not None
    assert second - first == pytest.approx(0.002)


def test_a_fixed_cap_applies_when_configured() -> None:
    """max_per_second 1: a burst of two passes, the third is refused (``fixed_rate``)."""
    _clock, admission = started(HelloAdmissionSettings(max_per_second=1))
    assert admission.admit() is None and admission.admit() is None
    wait = admission.admit()
    assert wait is not None and wait > 0
    assert admission.refused["fixed_rate"] == 1


def test_without_a_running_probe_only_the_fixed_cap_applies() -> None:
    """A rule never started (no listener) admits any number of hellos."""
    admission = HelloAdmission(Clock(), SETTINGS)
    assert all(admission.admit() is None for _ in range(100))


def test_stop_cancels_the_probe() -> None:
    """After stop no call is left on the clock."""
    clock, admission = started()
    admission.stop()
    assert clock.getDelayedCalls() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 30)), max_size=20))
def test_hints_are_positive_and_bounded(steps: list[tuple[float, int]]) -> None:
    """Whatever the lag and the burst sizes, every refusal's hint is in (0, MAX_RETRY_SECONDS]
    and a hello is refused only when the loop lags or the window is full."""
    clock, admission = started()
    for delay, burst in steps:
        clock.advance(delay)
        for _ in range(burst):
            lagging = admission.probe.lag_now(clock.seconds()) > 0.05
            before = admission.admitted_total
            wait = admission.admit()
            if wait is None:
                assert not lagging
            else:
                assert 0 < wait <= MAX_RETRY_SECONDS
                assert lagging or admission.admitted_total == before
    assert admission.admitted_total + admission.refused_total == sum(burst for _, burst in steps)


# -- settings -------------------------------------------------------------------


def test_the_shipped_config_admits_adaptively_without_a_fixed_cap() -> None:
    """configs/control-plane.yaml: 50 ms lag, 1000 pending, no fixed cap, probe every 20 ms."""
    config = load_config("configs/control-plane.yaml", {})
    assert config.hello_admission == HelloAdmissionSettings(
        max_loop_lag_ms=50, max_pending_hellos=1000, max_per_second=0, probe_interval_ms=20
    )
    assert config_from_text("").hello_admission == HelloAdmissionSettings()


def test_the_older_rate_setting_still_loads_as_the_fixed_cap_with_a_notice() -> None:
    """A config written with edge_wire.max_hellos_per_second keeps its cap and is told the new name."""
    config = config_from_text("edge_wire:\n  max_hellos_per_second: 500\n")
    assert config.hello_admission.max_per_second == 500
    assert any("edge_wire.hello_admission.max_per_second" in notice for notice in config.notices)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (
            "edge_wire:\n  max_hellos_per_second: 5\n  hello_admission:\n    max_per_second: 5\n",
            "edge_wire.max_hellos_per_second",
        ),
        ("edge_wire:\n  hello_admission:\n    max_loop_lag_ms: 0\n", "edge_wire.hello_admission.max_loop_lag_ms"),
        ("edge_wire:\n  hello_admission:\n    max_pending_hellos: 0\n", "edge_wire.hello_admission.max_pending_hellos"),
        ("edge_wire:\n  hello_admission:\n    max_per_second: -1\n", "edge_wire.hello_admission.max_per_second"),
        ("edge_wire:\n  hello_admission:\n    burst: 3\n", "edge_wire.hello_admission"),
    ],
)
def test_bad_admission_settings_name_the_field(text: str, field: str) -> None:
    """Each bad value is an error naming its dotted field."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_from_text(text)
