"""The reactor's polls paced while busy: what waits, what does not, and when pacing gives way.

The unit tests drive :class:`PacedPolls` with a fake clock whose
``sleep`` advances it; the last one polls a real epoll reactor (not the
installed one) over real socket pairs. The daemons' end-to-end tests run
``twistd`` with the default interval, so every streamed test crosses it.
"""

from __future__ import annotations

import socket
from typing import Any, Optional

import pytest
from twisted.internet import reactor as global_reactor
from twisted.internet.epollreactor import EPollReactor
from twisted.python import log

from twisted_iop.configuration import (
    MAX_POLL_INTERVAL_MS,
    ConfigError,
    EventLoopConfig,
    Section,
    parse_event_loop,
)
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.node.config import parse_node_config
from twisted_iop.paced_polls import CONTENDED_SECONDS, PacedPolls, pace_polls


class FakeTime:
    """A clock, a sleep that advances it (plus any oversleep), and a poll that waits as told."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []
        self.polls: list[Optional[float]] = []
        #: How long the next polls wait before their events come (popped per poll; 0 when empty).
        self.poll_waits: list[float] = []
        #: Added to every sleep (a contended CPU gives the turn back late).
        self.oversleep = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + self.oversleep

    def poll(self, timeout: Optional[float]) -> None:
        self.polls.append(timeout)
        self.now += self.poll_waits.pop(0) if self.poll_waits else 0.0


def paced(time: FakeTime, interval: float = 0.002) -> PacedPolls:
    return PacedPolls(time.poll, interval, clock=time.clock, sleep=time.sleep)


def test_an_idle_process_polls_at_once() -> None:
    """A poll that waited at least the interval (nothing was coming) is followed by one that does not wait."""
    time = FakeTime()
    polls = paced(time)
    time.poll_waits = [0.5, 0.5]
    polls(None)
    polls(None)
    assert time.slept == []
    assert time.polls == [None, None]


def test_a_busy_process_waits_for_the_rest_of_the_interval() -> None:
    """Events came at once: the next poll waits until an interval has passed since the last one ended."""
    time = FakeTime()
    polls = paced(time)
    time.poll_waits = [0.0001]  # busy: events were there almost at once
    polls(None)
    time.now += 0.0005  # the turn's work
    polls(None)
    assert time.slept == [pytest.approx(0.0015)]
    assert polls.waits == 1


def test_a_turn_longer_than_the_interval_polls_at_once() -> None:
    time = FakeTime()
    polls = paced(time)
    time.poll_waits = [0.0]
    polls(None)
    time.now += 0.003  # the work of the turn took longer than the interval
    polls(None)
    assert time.slept == []


def test_a_timer_due_now_is_never_delayed() -> None:
    """timeout 0 (a delayed call is due) polls without waiting; a nearer timer cuts the wait."""
    time = FakeTime()
    polls = paced(time)
    polls(None)  # waited 0: busy
    polls(0)
    assert time.slept == []
    polls(0.0005)
    assert time.slept == [pytest.approx(0.0005)]
    assert time.polls[-1] == pytest.approx(0.0)


def test_the_wait_is_taken_off_the_reactors_timeout() -> None:
    time = FakeTime()
    polls = paced(time)
    polls(None)
    polls(1.0)
    assert time.slept == [pytest.approx(0.002)]
    assert time.polls[-1] == pytest.approx(0.998)


def test_a_wait_that_oversleeps_turns_pacing_off_for_a_while() -> None:
    """On a contended CPU the wait came back late: the next polls within CONTENDED_SECONDS do not wait."""
    time = FakeTime()
    polls = paced(time)
    polls(None)
    time.oversleep = 0.010
    polls(None)  # slept 2 ms + 10 ms late
    assert polls.contended == 1
    time.oversleep = 0.0
    for _ in range(5):
        polls(None)
    assert len(time.slept) == 1
    time.now += CONTENDED_SECONDS + 0.1
    polls(None)  # the last poll ended long ago: nothing to wait for
    polls(None)  # busy again, and no longer contended: paced
    assert len(time.slept) == 2


def test_a_slightly_late_wait_keeps_pacing() -> None:
    time = FakeTime()
    polls = paced(time)
    polls(None)
    time.oversleep = 0.001  # under one interval late: the scheduler's usual slack
    polls(None)
    polls(None)
    assert polls.contended == 0
    assert len(time.slept) == 2


class Loop:
    """A reactor-like object: its loop calls ``doIteration``."""

    def __init__(self) -> None:
        self.timeouts: list[Optional[float]] = []

    def doIteration(self, timeout: Optional[float]) -> None:
        self.timeouts.append(timeout)


def test_pace_polls_wraps_once_and_zero_leaves_the_reactor_alone() -> None:
    loop = Loop()
    assert pace_polls(loop, 0) is None
    assert not isinstance(loop.doIteration, PacedPolls)
    wrapper = pace_polls(loop, 2)
    assert isinstance(wrapper, PacedPolls)
    assert wrapper.interval == pytest.approx(0.002)
    assert pace_polls(loop, 2) is wrapper  # not wrapped twice
    loop.doIteration(0.5)
    assert loop.timeouts == [0.5]


def test_pace_polls_leaves_a_reactor_without_a_poll_loop_alone() -> None:
    assert pace_polls(object(), 2) is None


def test_the_event_loop_section() -> None:
    assert parse_event_loop(Section({}, "event_loop")) == EventLoopConfig()
    assert parse_event_loop(Section({"poll_interval_ms": 0}, "event_loop")).poll_interval_ms == 0
    for bad, words in (
        ({"poll_interval_ms": -1}, "at least 0"),
        ({"poll_interval_ms": MAX_POLL_INTERVAL_MS + 1}, "at most 20"),
        ({"poll_interval_ms": "fast"}, "must be a number"),
        ({"interval": 1}, "interval"),
    ):
        with pytest.raises(ConfigError, match=words):
            parse_event_loop(Section(bad, "event_loop"))


def test_the_edge_and_node_read_their_event_loop() -> None:
    node = parse_node_config({"node_id": "n1", "event_loop": {"poll_interval_ms": 5}})
    assert node.event_loop.poll_interval_ms == 5
    edge = parse_edge_config({"control_plane": {"edge_id": "e1"}, "event_loop": {"poll_interval_ms": 0}})
    assert edge.event_loop.poll_interval_ms == 0
    with pytest.raises(ConfigError, match=r"event_loop\.poll_interval_ms"):
        parse_node_config({"node_id": "n1", "event_loop": {"poll_interval_ms": 50}})


def test_the_test_process_reactor_is_not_paced() -> None:
    """Only twistd paces: a service made in this process leaves its reactor's poll as it is."""
    assert not isinstance(getattr(global_reactor, "doIteration", None), PacedPolls)


class _Reader:
    """A descriptor on one end of a real socket pair: reads what comes, or raises when told to."""

    def __init__(self, sock: socket.socket, fail: bool = False) -> None:
        self.sock = sock
        self.fail = fail
        self.read: list[bytes] = []
        self.lost: list[object] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def doRead(self) -> None:
        if self.fail:
            raise ValueError("a protocol's bug")
        self.read.append(self.sock.recv(100))

    def connectionLost(self, reason: object) -> None:
        self.lost.append(reason)

    def logPrefix(self) -> str:
        return "reader"


def test_an_epoll_reactor_polls_leanly_and_still_reads_and_drops_a_failing_descriptor() -> None:
    """A real epoll reactor (not installed): ready descriptors are read; one whose read raises is removed and told."""
    loop = EPollReactor()
    good_a, good_b = socket.socketpair()
    bad_a, bad_b = socket.socketpair()
    logged: list[dict[str, Any]] = []
    log.addObserver(logged.append)
    try:
        wrapper = pace_polls(loop, 0)
        assert isinstance(wrapper, PacedPolls)  # lean, even when never waiting
        good, bad = _Reader(good_a), _Reader(bad_a, fail=True)
        loop.addReader(good)
        loop.addReader(bad)
        good_b.send(b"token")
        bad_b.send(b"x")
        loop.doIteration(1.0)
        assert good.read == [b"token"]
        assert len(bad.lost) == 1 and bad not in loop.getReaders()
        assert good in loop.getReaders()
        assert [e["failure"].type for e in logged if e.get("isError")] == [ValueError]
    finally:
        log.removeObserver(logged.append)
        loop.removeAll()
        loop._poller.close()
        for end in (good_a, good_b, bad_a, bad_b):
            end.close()
