"""A daemon's process, tuned: a lean poll under ``twistd``, and a garbage collector tuned for a long life.

The lean poll
-------------

Twisted's epoll reactor hands each ready descriptor to its
``_doReadOrWrite`` inside ``log.callWithLogger``: 2.1 us a call
(``timeit``), once for every read, which on the Node is once for every
streamed token an engine sends. The wrapper's only effect is the legacy
log's ``[Protocol,fd,address]`` prefix on lines Twisted logs from inside
the call; our own log lines never use it, and ``_doReadOrWrite`` itself
still catches, logs and disconnects what a protocol raises.

:func:`lean_epoll` is that poll without the wrapper.

The garbage collector
---------------------
A daemon imports Twisted, Klein, protobuf and our own modules: a few
hundred thousand objects that live as long as the process, which every
full collection walks again. :func:`tune_garbage_collector` collects once,
freezes what is left (the collector no longer walks it) and raises the
thresholds (:data:`GC_THRESHOLD`). On the Edge at 64 streams, before, the
collector was a fifth of the process's CPU (``perf``: ``gc_collect_main``,
``visit_decref`` and ``visit_reachable``): each streamed token makes a few
short-lived objects, and the young collections they trigger promote the
streams' own objects into the older generations, whose collections walked
the whole start-up heap. Every daemon's service tunes it as it starts
(``DaemonService.tune_gc``, set by ``compose``), after what it read back at
start (the Control Plane's store), so that is frozen too.

:class:`DaemonServiceMaker` is the ``twistd`` plugin of each daemon: it
makes the service as Twisted's :class:`ServiceMaker` does, then gives the
global reactor the lean poll when it is an epoll reactor (any other is
left as it is). Only ``twistd`` does this: a service made in a test's
process leaves that process's reactor alone.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, Optional

from twisted.application.service import IService, ServiceMaker
from twisted.internet.epollreactor import EPollReactor

Poll = Callable[[Optional[float]], None]

#: Thresholds of the garbage collector in a daemon. A fleet fan-out on the
#: Control Plane creates tens of thousands of short-lived objects per round;
#: with the defaults (700, 10, 10) they trigger several full collections per
#: round. The young generation's threshold is also the longest pause: kept
#: events wait in it for their first collection (one object each), so at
#: 50,000 a young collection walked 50,000 events (13-80 ms in one reactor
#: turn, a miss of the 5 ms live-event latency); at 10,000 it takes 2-5 ms,
#: and a fleet round at 10,000 edges runs about 4 of them (within the noise
#: of its CPU per edge, bench/gateway_inprocess.py).
GC_THRESHOLD = (10_000, 20, 100)


def tune_garbage_collector() -> None:
    """Freeze the objects that exist now and raise the collector's thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)


def lean_epoll(reactor: EPollReactor) -> Poll:
    """``reactor``'s ``doPoll`` without the per-event logging context."""
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


def use_lean_poll(reactor: object) -> Optional[Poll]:
    """Give ``reactor`` the lean poll if it is an epoll reactor; the poll installed, if any."""
    if not isinstance(reactor, EPollReactor):
        return None
    poll = lean_epoll(reactor)
    # The reactor's loop calls doIteration(timeout) on the instance.
    setattr(reactor, "doIteration", poll)  # noqa: B010
    return poll


class DaemonServiceMaker(ServiceMaker):
    """A daemon's ``twistd`` plugin: its service, and the global reactor on the lean poll."""

    def makeService(self, options: Any) -> IService:
        service: IService = super().makeService(options)
        from twisted.internet import reactor

        use_lean_poll(reactor)
        return service
