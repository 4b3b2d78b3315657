"""Hello admission: hellos pass while the event loop keeps up, on a Clock."""

from __future__ import annotations

from typing import Optional

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.logger import capturedLogs

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text, load_config
from twisted_iop.controlplane.wires.hello_admission import (
    MAX_RETRY_SECONDS,
    HelloAdmission,
    HelloAdmissionSettings,
)

SETTINGS = HelloAdmissionSettings(
    max_pending_hellos=10,
    max_pending_bytes=1000,
    slice_ms=10,
    max_queue_wait_ms=1000,
    max_loop_lag_ms=50,
    lag_grace_ms=100,
    probe_interval_ms=20,
)


class TurnClock(Clock):
    """A Clock whose :meth:`turn` runs like one reactor turn: calls scheduled meanwhile wait for the next."""

    def turn(self) -> None:
        """Run the calls due now, not those they schedule."""
        for call in [call for call in self.calls if call.getTime() <= self.seconds()]:
            if call in self.calls:
                self.calls.remove(call)
                call.called = 1
                call.func(*call.args, **call.kw)


class Hello:
    """A queued hello that notes when its turn came, and can spend clock time being processed."""

    def __init__(self, name: str, log: list[str], clock: Clock, cost: float = 0.0) -> None:
        self.name = name
        self.log = log
        self.clock = clock
        self.cost = cost

    def hello_turn(self) -> None:
        """Note the turn and spend ``cost`` seconds of the clock."""
        self.log.append(self.name)
        self.clock.rightNow += self.cost


def started(settings: HelloAdmissionSettings = SETTINGS) -> tuple[TurnClock, HelloAdmission]:
    """An admission queue whose lag probe runs on a fresh Clock."""
    clock = TurnClock()
    admission = HelloAdmission(clock, settings)
    admission.start()
    return clock, admission


def offer_all(
    clock: Clock, admission: HelloAdmission, names: list[str], cost: float, size: int = 10
) -> tuple[list[str], list[Optional[float]]]:
    """Offer one hello per name in one reactor turn; the order processed so far, and each offer's answer."""
    log: list[str] = []
    answers = [admission.offer(Hello(name, log, clock, cost), size) for name in names]
    return log, answers


def test_an_idle_loop_processes_a_hello_at_once() -> None:
    """A hello at an empty queue is processed inside offer, with no refusal."""
    clock, admission = started()
    log, answers = offer_all(clock, admission, ["a"], cost=0.001)
    assert log == ["a"] and answers == [None]
    assert admission.pending == 0 and admission.processed_total == 1


def test_a_burst_is_worked_off_in_slices_in_arrival_order() -> None:
    """Hellos costing 3 ms each: 4 fit the 10 ms slice of the turn they arrive in, the rest follow
    4 per later turn, first come first served, and nobody is refused."""
    clock, admission = started()
    names = [f"e{i}" for i in range(10)]
    log, answers = offer_all(clock, admission, names, cost=0.003)
    assert answers == [None] * 10
    assert log == names[:4] and admission.pending == 6
    clock.turn()
    assert log == names[:8]
    clock.turn()
    assert log == names and admission.pending == 0
    assert admission.refused_total == 0


def test_each_turn_stops_once_its_slice_is_used() -> None:
    """However long the queue, one turn spends about one slice: the lag stays bounded by it."""
    clock, admission = started(attrs.evolve(SETTINGS, max_pending_hellos=1000, max_queue_wait_ms=100_000))
    offer_all(clock, admission, [f"e{i}" for i in range(100)], cost=0.004)
    while admission.pending:
        before = clock.seconds()
        clock.turn()
        assert clock.seconds() - before <= 0.010 + 0.004


def test_a_full_queue_answers_retry_later() -> None:
    """Past max_pending_hellos waiting hellos, the next one is refused (``queue_full``) with a hint."""
    clock, admission = started()
    log, answers = offer_all(clock, admission, [f"e{i}" for i in range(15)], cost=0.02)
    # The first one used the whole slice; 10 are queued; the rest refused.
    assert log == ["e0"] and admission.pending == 10
    assert answers[:11] == [None] * 11
    assert all(answer is not None and answer > 0 for answer in answers[11:])
    assert admission.refused["queue_full"] == 4


def test_the_byte_bound_refuses_too() -> None:
    """Waiting frames over max_pending_bytes are refused even with room in count."""
    clock, admission = started()
    log, answers = offer_all(clock, admission, ["a", "b", "c"], cost=0.02, size=600)
    assert answers[:2] == [None, None] and answers[2] is not None
    assert log == ["a"] and admission.pending_bytes == 600 and admission.refused["queue_full"] == 1


def test_a_hello_whose_expected_wait_is_too_long_is_refused() -> None:
    """Paced at 5 per second (burst 10) with max_queue_wait_ms 1000: ten pass at once and five more
    within a second, so the 16th waiting hello would wait over a second: ``queue_wait``."""
    clock, admission = started(attrs.evolve(SETTINGS, max_per_second=5, max_pending_hellos=100))
    log, answers = offer_all(clock, admission, [f"e{i}" for i in range(17)], cost=0.0)
    assert admission.drain_rate() == 5 and log == []  # a pace works only from the queue's turns
    assert answers[:15] == [None] * 15 and all(answer is not None for answer in answers[15:])
    assert admission.refused["queue_wait"] == 2


def test_a_closed_connection_is_dropped_from_the_queue() -> None:
    """A withdrawn hello never gets its turn; the others keep their order."""
    clock, admission = started()
    log: list[str] = []
    hellos = [Hello(f"e{i}", log, clock, 0.02) for i in range(4)]
    for hello in hellos:
        assert admission.offer(hello, 10) is None
    admission.withdraw(hellos[2])
    admission.withdraw(hellos[2])  # twice: no harm
    for _ in range(5):
        clock.turn()
    assert log == ["e0", "e1", "e3"]
    assert admission.withdrawn_total == 1 and admission.pending == 0 and admission.pending_bytes == 0


def test_the_hint_follows_the_measured_drain_rate() -> None:
    """After turns working off 4 hellos per 10 ms slice (400/s, half of it expected: 200/s; the average
    starts from its guess), refused hellos are told to come back once half the queue is worked off, 5 ms apart."""
    clock, admission = started(attrs.evolve(SETTINGS, max_pending_hellos=200, max_queue_wait_ms=100_000))
    log: list[str] = []
    for i in range(200):
        admission.offer(Hello(f"e{i}", log, clock, 0.0025), 1)
    for _ in range(24):
        clock.rightNow += 0.01  # the I/O between turns
        clock.turn()
    assert admission.rate == pytest.approx(400, rel=0.1)
    assert admission.drain_rate() == pytest.approx(200, rel=0.1)
    for i in range(admission.pending, 200):
        assert admission.offer(Hello(f"f{i}", log, clock, 0.0), 1) is None
    first = admission.offer(Hello("x", log, clock, 0), 1)
    second = admission.offer(Hello("y", log, clock, 0), 1)
    assert first is not None and second is not None
    assert first == pytest.approx(200 / admission.drain_rate() / 2 + 1 / admission.drain_rate())
    assert second - first == pytest.approx(1 / admission.drain_rate())


def test_a_lagging_loop_queues_hellos_instead_of_refusing_them() -> None:
    """Probe runs late past the grace: hellos are queued (not processed on arrival, not refused);
    a punctual run makes a hello at an empty queue pass at once again."""
    clock, admission = started()
    clock.advance(0.1)  # the probe due at 0.02 runs at 0.1: over 50 ms since 0.07
    log: list[str] = []
    assert admission.offer(Hello("a", log, clock, 0), 1) is None
    clock.rightNow += 0.05  # lagging for 80 ms: within the grace
    assert admission.offer(Hello("b", log, clock, 0), 1) is None
    clock.advance(0.1)  # next probe (due 0.12) runs at 0.25: still lagging, for 180 ms now
    assert log == ["a", "b"]
    assert admission.lagging(clock.seconds())
    assert admission.offer(Hello("c", log, clock, 0), 1) is None
    assert log == ["a", "b"] and admission.pending == 1
    assert admission.refused_total == 0 and admission.lag_queued_total == 1
    clock.turn()
    assert log == ["a", "b", "c"]
    clock.advance(0.02)  # on time
    assert not admission.lagging(clock.seconds())
    assert admission.offer(Hello("d", log, clock, 0), 1) is None
    assert log == ["a", "b", "c", "d"]


def test_a_lagging_loop_works_the_queue_off_in_smaller_slices() -> None:
    """Lagging past the grace, a turn processes hellos for ``lagging_slice_ms`` (2 ms), not
    ``slice_ms`` (10 ms): 1 ms hellos go two per turn, none on arrival."""
    settings = attrs.evolve(SETTINGS, lagging_slice_ms=2, max_pending_hellos=100, max_queue_wait_ms=100_000)
    clock, admission = started(settings)
    clock.advance(0.1)
    clock.rightNow += 0.1  # lagging for 130 ms, past the 100 ms grace
    log, answers = offer_all(clock, admission, [str(i) for i in range(30)], cost=0.001)
    assert answers == [None] * 30 and log == []
    clock.turn()
    assert len(log) == 2 and admission.lagging_turns == 1
    clock.turn()
    assert len(log) == 4
    assert admission.refused_total == 0


def test_a_punctual_loop_works_the_queue_off_in_whole_slices() -> None:
    """The same backlog on a loop that runs on time: ten 1 ms hellos per 10 ms turn."""
    settings = attrs.evolve(SETTINGS, lagging_slice_ms=2, max_pending_hellos=100, max_queue_wait_ms=100_000)
    clock, admission = started(settings)
    log, answers = offer_all(clock, admission, [str(i) for i in range(30)], cost=0.001)
    assert answers == [None] * 30 and len(log) == 10
    clock.turn()
    assert len(log) == 20 and admission.lagging_turns == 0


def test_a_lagging_loop_still_refuses_what_the_queue_cannot_hold() -> None:
    """Lagging, a full queue still answers ``retry_later`` (counted as ``queue_full``)."""
    clock, admission = started(attrs.evolve(SETTINGS, max_queue_wait_ms=100_000))
    clock.advance(0.1)
    clock.rightNow += 0.1
    _, answers = offer_all(clock, admission, [str(i) for i in range(11)], cost=0.001)
    assert answers[:10] == [None] * 10
    assert answers[10] is not None and answers[10] > 0
    assert admission.refused == {"queue_full": 1, "queue_wait": 0}


def test_a_fixed_cap_paces_the_queue() -> None:
    """max_per_second 1: a burst of two is processed, the third waits about a second, still in order."""
    clock, admission = started(attrs.evolve(SETTINGS, max_per_second=1, max_queue_wait_ms=10_000))
    log, answers = offer_all(clock, admission, ["a", "b", "c"], cost=0.0)
    assert answers == [None, None, None]
    clock.turn()
    assert log == ["a", "b"]
    clock.advance(1.0)
    assert log == ["a", "b", "c"]


def test_a_failing_hello_does_not_stop_the_turn() -> None:
    """An exception from one hello's turn is logged; the next hellos are still processed."""
    clock, admission = started()
    log: list[str] = []

    class Broken:
        def hello_turn(self) -> None:
            """Fail."""
            clock.rightNow += 0.02
            raise RuntimeError("boom")

    with capturedLogs() as logged:
        admission.offer(Broken(), 1)
        admission.offer(Hello("b", log, clock, 0), 1)
        clock.turn()
    assert log == ["b"]
    failures = [event for event in logged if "log_failure" in event]
    assert len(failures) == 1 and failures[0]["log_failure"].check(RuntimeError)


def test_stop_cancels_the_probe_and_the_turn() -> None:
    """After stop no call is left on the clock and the queue is empty."""
    clock, admission = started()
    offer_all(clock, admission, ["a", "b"], cost=0.02)
    admission.stop()
    assert clock.getDelayedCalls() == [] and admission.pending == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 0.5), st.integers(0, 30), st.floats(0, 0.02)), max_size=20))
def test_every_hello_is_processed_once_in_order_or_refused(steps: list[tuple[float, int, float]]) -> None:
    """Whatever the lag, burst sizes and costs: every hello is refused (with a hint in
    (0, MAX_RETRY_SECONDS]) or processed exactly once, in arrival order, and the queue stays bounded."""
    clock, admission = started()
    log: list[str] = []
    taken: list[str] = []
    count = 0
    for delay, burst, cost in steps:
        clock.advance(delay)
        for _ in range(burst):
            name = f"e{count}"
            count += 1
            wait = admission.offer(Hello(name, log, clock, cost), 10)
            if wait is None:
                taken.append(name)
            else:
                assert 0 < wait <= MAX_RETRY_SECONDS
            assert admission.pending <= SETTINGS.max_pending_hellos
    for _ in range(100):
        clock.advance(0.001)
    assert log == taken
    assert admission.processed_total + admission.refused_total == count


# -- settings -------------------------------------------------------------------


def test_the_shipped_config_admits_adaptively_without_a_fixed_cap() -> None:
    """configs/control-plane.yaml: the defaults, written out (20,000 queued, 10 ms slices, no fixed cap)."""
    config = load_config("configs/control-plane.yaml", {})
    assert config.hello_admission == HelloAdmissionSettings()
    assert config.hello_admission.max_pending_hellos == 20_000 and config.hello_admission.max_per_second == 0
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
        ("edge_wire:\n  hello_admission:\n    slice_ms: 0\n", "edge_wire.hello_admission.slice_ms"),
        ("edge_wire:\n  hello_admission:\n    max_queue_wait_ms: x\n", "edge_wire.hello_admission.max_queue_wait_ms"),
        ("edge_wire:\n  hello_admission:\n    max_pending_bytes: 10\n", "edge_wire.hello_admission.max_pending_bytes"),
        ("edge_wire:\n  hello_admission:\n    lag_grace_ms: -1\n", "edge_wire.hello_admission.lag_grace_ms"),
        ("edge_wire:\n  hello_admission:\n    lagging_slice_ms: 0\n", "edge_wire.hello_admission.lagging_slice_ms"),
    ],
)
def test_bad_admission_settings_name_the_field(text: str, field: str) -> None:
    """Each bad value is an error naming its dotted field."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        config_from_text(text)
