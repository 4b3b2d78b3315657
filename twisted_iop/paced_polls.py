"""Fewer wake-ups under load: the reactor polls at most once per interval while events keep coming.

A paced engine sends each token in a write of its own, so a process that
relays many streams wakes once per token: the poll blocks, a token
arrives, the kernel wakes the process for that one socket, the reactor
reads it and blocks again. On a machine with idle cores each wake-up is
the largest cost of a token (most of the Node's CPU at 64 streams was in
``epoll_wait``), and nginx pays it too, in C.

:class:`PacedPolls` wraps the reactor's poll: when the last poll came back
sooner than ``interval`` (events arrive faster than that), the next one
first waits for the rest of the interval, so one wake-up carries the
tokens of every stream that arrived meanwhile. When the process is idle
(the last poll waited at least the interval) it polls at once, so a lone
event, the first token of a stream included, costs no added delay. A
poll that must not wait (a timer due now: timeout 0) never waits, and
the wait is cut to the reactor's own timeout, so no timer runs later than
the interval would make it.

On an epoll reactor the poll itself is :func:`lean_epoll`: each ready
descriptor is handed to the reactor's own ``_doReadOrWrite`` (which reads
or writes, catches and logs what the protocol raises, and disconnects),
without the per-event ``log.callWithLogger`` wrapper (2.1 us a call,
``timeit``: one per token on the Node) whose only effect is the legacy
log's ``[Protocol,fd,address]`` prefix on lines Twisted logs from inside
the call; our own log lines never used it.

What a token may wait for it is at most ``interval``; what it saves is
measured by ``bench/stream_gateway.py`` (docs/performance.md, "Streamed
tokens against nginx").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Optional

from twisted.application.service import IService, ServiceMaker
from twisted.internet.epollreactor import EPollReactor

#: How long polls go unpaced after a wait overslept (the CPU is contended).
CONTENDED_SECONDS = 1.0


class PacedPolls:
    """A reactor's ``doIteration`` that polls at most once per ``interval`` seconds while busy.

    On a contended CPU a wait is a turn given away: the process comes back
    only when the scheduler returns to it, later than asked, and a busy
    machine batches the wake-ups anyway. A wait that overslept by more than
    an interval turns the pacing off for :data:`CONTENDED_SECONDS`.
    """

    __slots__ = (
        "_clock",
        "_last_end",
        "_poll",
        "_sleep",
        "_unpaced_until",
        "_waited",
        "contended",
        "interval",
        "waits",
    )

    def __init__(
        self,
        poll: Callable[[Optional[float]], None],
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._poll = poll
        self._clock = clock
        self._sleep = sleep
        self.interval = interval
        self._last_end = 0.0
        #: How long the last poll waited for its events.
        self._waited = interval
        self._unpaced_until = 0.0
        #: Waits made before a poll, and how many of them overslept.
        self.waits = 0
        self.contended = 0

    def __call__(self, timeout: Optional[float]) -> None:
        interval = self.interval
        if self._waited < interval and timeout != 0:
            now = self._clock()
            rest = interval - (now - self._last_end)
            if timeout is not None:
                rest = min(rest, timeout)
            if rest > 0 and now >= self._unpaced_until:
                self._sleep(rest)
                self.waits += 1
                slept = self._clock() - now
                if slept > rest + interval:
                    self.contended += 1
                    self._unpaced_until = now + slept + CONTENDED_SECONDS
                if timeout is not None:
                    timeout = max(0.0, timeout - slept)
        start = self._clock()
        self._poll(timeout)
        self._last_end = end = self._clock()
        self._waited = end - start


def lean_epoll(reactor: EPollReactor) -> Callable[[Optional[float]], None]:
    """``reactor``'s ``doPoll`` without the per-event logging context (see the module's docstring)."""
    poller = reactor._poller
    selectables = reactor._selectables
    handle = reactor._doReadOrWrite

    def poll(timeout: Optional[float]) -> None:
        # epoll retries an interrupted wait itself (PEP 475).
        events = poller.poll(-1 if timeout is None else timeout, len(selectables))
        for fd, event in events:
            selectable = selectables.get(fd)
            if selectable is not None:
                handle(selectable, fd, event)

    return poll


def pace_polls(reactor: object, interval_ms: float) -> Optional[PacedPolls]:
    """Pace ``reactor``'s polls at ``interval_ms`` (0: never wait); the wrapper installed, if any.

    Only a reactor whose loop calls ``doIteration(timeout)`` (every Twisted
    poller reactor: epoll, poll, select) is paced; any other is left alone.
    An epoll reactor polls with :func:`lean_epoll`, at any interval.
    """
    poll = getattr(reactor, "doIteration", None)
    if poll is None or isinstance(poll, PacedPolls):
        return poll if isinstance(poll, PacedPolls) else None
    if isinstance(reactor, EPollReactor):
        poll = lean_epoll(reactor)
    elif interval_ms <= 0:
        return None
    paced = PacedPolls(poll, max(0.0, interval_ms) / 1000.0)
    setattr(reactor, "doIteration", paced)  # noqa: B010 (the loop finds it there; any poller reactor has it)
    return paced


class PacedServiceMaker(ServiceMaker):
    """The ``twistd`` plugin of a daemon whose config has an ``event_loop`` section (the Edge, the Node).

    The service is made as :class:`ServiceMaker` makes it; then the global
    reactor, which ``twistd`` runs, is paced at the config's
    ``event_loop.poll_interval_ms``. Only ``twistd`` paces: a service made
    in a test's process leaves that process's reactor alone.
    """

    def makeService(self, options: Any) -> IService:
        service: IService = super().makeService(options)
        from twisted.internet import reactor

        pace_polls(reactor, options.config.event_loop.poll_interval_ms)
        return service
