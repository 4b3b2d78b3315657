"""The reactor's poll without a logging context per ready descriptor.

Twisted's epoll reactor hands each ready descriptor to its
``_doReadOrWrite`` inside ``log.callWithLogger``: 2.1 us a call
(``timeit``), once for every read, which on the Node is once for every
streamed token an engine sends. The wrapper's only effect is the legacy
log's ``[Protocol,fd,address]`` prefix on lines Twisted logs from inside
the call; our own log lines never use it, and ``_doReadOrWrite`` itself
still catches, logs and disconnects what a protocol raises.

:func:`lean_epoll` is that poll without the wrapper, and
:class:`LeanPollServiceMaker` is the ``twistd`` plugin of each daemon: it
makes the service as Twisted's :class:`ServiceMaker` does, then gives the
global reactor the lean poll when it is an epoll reactor (any other is
left as it is). Only ``twistd`` does this: a service made in a test's
process leaves that process's reactor alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from twisted.application.service import IService, ServiceMaker
from twisted.internet.epollreactor import EPollReactor

Poll = Callable[[Optional[float]], None]


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


class LeanPollServiceMaker(ServiceMaker):
    """A daemon's ``twistd`` plugin: its service, and the global reactor on the lean poll."""

    def makeService(self, options: Any) -> IService:
        service: IService = super().makeService(options)
        from twisted.internet import reactor

        use_lean_poll(reactor)
        return service
