"""Listeners shared by the daemons: bind or fail start-up clearly, report the port.

Both the Control Plane (three listeners) and the Edge (its Node listener)
use :class:`ListenerService`, added by
:meth:`twisted_iop.daemon.DaemonService.add_listener`, which turns a bind
failure under ``twistd`` into one clear line and exit code 1 instead of a
traceback. Each listener logs one line once bound: its label, endpoint and
port, never a Python object.
"""

from __future__ import annotations

from typing import Any, Optional, cast

from twisted.application.internet import StreamServerEndpointService
from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import serverFromString
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IStreamServerEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.tls import TLSListenConfig, TLSServerEndpoint, server_tls_options

#: Listen backlog used when a TCP endpoint does not name one. Twisted's
#: default (50) drops SYNs when thousands of peers reconnect at once after a
#: restart, and each dropped SYN costs the peer a one-second retry; with
#: 1024, 20,000 edges dialing at once still overflowed the queue thousands
#: of times. The kernel caps it at ``net.core.somaxconn`` (4096 by default).
DEFAULT_BACKLOG = 4096


class BindError(RuntimeError):
    """A listener could not bind its address."""


def with_backlog(description: str) -> str:
    """Add ``backlog=DEFAULT_BACKLOG`` to a TCP/SSL endpoint that has none."""
    kind = description.split(":", 1)[0]
    if kind in ("tcp", "tcp6", "ssl") and "backlog=" not in description:
        return f"{description}:backlog={DEFAULT_BACKLOG}"
    return description


def server_endpoint(reactor: Reactor, description: str, tls: Optional[TLSListenConfig] = None) -> IStreamServerEndpoint:
    """The endpoint for ``description``; with ``tls``, wrapped in mutual TLS."""
    endpoint = serverFromString(reactor, with_backlog(description))
    if tls is None:
        return cast("IStreamServerEndpoint", endpoint)
    return TLSServerEndpoint(endpoint, server_tls_options(tls), reactor)


class ListenerService(StreamServerEndpointService):
    """A listener that fails start-up if it cannot bind and reports its port.

    It logs ``<label> listening on <description> (port N)`` once bound; tests
    and benchmarks read the port of a ``:0`` listener from that line.
    """

    _log = Logger()

    def __init__(
        self,
        label: str,
        description: str,
        factory: IProtocolFactory,
        reactor: Reactor,
        tls: Optional[TLSListenConfig] = None,
    ) -> None:
        super().__init__(server_endpoint(reactor, description, tls), factory)
        # Twisted's "Starting factory <... object at 0x...>" lines say nothing
        # a person can use; the line logged once bound says it all.
        if isinstance(factory, Factory):
            factory.noisy = False
        self.setName(label)
        self.label = label
        self.description = description
        self.tls = tls
        #: The bound TCP port (0 until bound, or for non-TCP endpoints).
        self.port_number = 0
        self.is_bound = False
        self._waiters: list[Deferred[int]] = []
        self._raiseSynchronously = True
        self._stop_called = False

    def privilegedStartService(self) -> None:
        try:
            super().privilegedStartService()
        except Exception as e:
            raise BindError(f"cannot listen for {self.label} on {self.description}: {e}") from None
        if self._waitingForPort is not None:
            self._waitingForPort.addCallback(self._bound)

    def _bound(self, port: IListeningPort) -> IListeningPort:
        self.port_number = int(getattr(port.getHost(), "port", 0))
        self.is_bound = True
        self._log.info(
            "{label} listening on {description} (port {port})",
            label=self.label,
            description=self.description,
            port=self.port_number,
        )
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.callback(self.port_number)
        return port

    def bound(self) -> Deferred[int]:
        """Fires with the TCP port once the listener is bound."""
        if self.is_bound:
            return succeed(self.port_number)
        waiter: Deferred[int] = Deferred()
        self._waiters.append(waiter)
        return waiter

    def stopService(self) -> Any:
        """Stop listening (once: a graceful stop closes listeners before the other services)."""
        if self._stop_called:
            return None
        self._stop_called = True
        self.is_bound = False
        return super().stopService()

    def startService(self) -> None:
        self._stop_called = False
        super().startService()
