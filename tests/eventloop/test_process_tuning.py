"""The lean epoll poll (ready descriptors read as before, a raising one logged and dropped) and the tuned collector.

These poll a real epoll reactor (a new one, not the installed one) over
real socket pairs. The daemons' end-to-end tests run ``twistd``, whose
plugins install the lean poll, so every one of them crosses it too.
"""

from __future__ import annotations

import gc
import socket
from typing import Any

from twisted.internet.epollreactor import EPollReactor
from twisted.internet.task import Clock
from twisted.python import log

from twisted_iop.daemon import DaemonService
from twisted_iop.eventloop.process_tuning import GC_THRESHOLD, use_lean_poll


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


def test_ready_descriptors_are_read_and_a_raising_one_is_logged_and_dropped() -> None:
    loop = EPollReactor()
    good_a, good_b = socket.socketpair()
    bad_a, bad_b = socket.socketpair()
    logged: list[dict[str, Any]] = []
    log.addObserver(logged.append)
    try:
        poll = use_lean_poll(loop)
        assert poll is not None and loop.doIteration is poll
        good, bad = _Reader(good_a), _Reader(bad_a, fail=True)
        loop.addReader(good)
        loop.addReader(bad)
        good_b.send(b"token")
        bad_b.send(b"x")
        loop.doIteration(1.0)
        assert good.read == [b"token"]
        assert len(bad.lost) == 1
        assert bad not in loop.getReaders() and good in loop.getReaders()
        assert [e["failure"].type for e in logged if e.get("isError")] == [ValueError]
        good_b.send(b"more")
        loop.doIteration(1.0)
        assert good.read == [b"token", b"more"]
    finally:
        log.removeObserver(logged.append)
        loop.removeAll()
        loop._poller.close()
        for end in (good_a, good_b, bad_a, bad_b):
            end.close()


def test_a_quiet_descriptor_is_not_read() -> None:
    """Nothing ready: the poll returns after its timeout without reading anything."""
    loop = EPollReactor()
    quiet_a, quiet_b = socket.socketpair()
    try:
        poll = use_lean_poll(loop)
        assert poll is not None
        quiet = _Reader(quiet_a)
        loop.addReader(quiet)
        poll(0)
        poll(0.001)
        assert quiet.read == [] and quiet.lost == []
    finally:
        loop.removeAll()
        loop._poller.close()
        quiet_a.close()
        quiet_b.close()


def test_a_daemon_tunes_the_collector_as_it_starts() -> None:
    """compose sets tune_gc on every daemon's service; starting it freezes what exists and sets the thresholds."""
    threshold = gc.get_threshold()
    service = DaemonService(Clock(), 1.0)
    service.tune_gc = True
    try:
        gc.unfreeze()
        service.startService()
        assert gc.get_threshold() == GC_THRESHOLD
        assert gc.get_freeze_count() > 0
    finally:
        service.stopService()
        gc.set_threshold(*threshold)


def test_only_an_epoll_reactor_is_changed() -> None:
    clock = Clock()
    assert use_lean_poll(clock) is None
    assert not hasattr(clock, "doIteration")
