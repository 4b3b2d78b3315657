"""The one static type of "the reactor" our services are built on.

A service that needs more of the reactor than its clock (it listens,
connects, waits for start-up or shutdown) takes a :class:`Reactor`. Code
that only needs time takes Twisted's own ``IReactorTime``, which a bare
``Clock`` provides.

:class:`Reactor` is a ``Protocol`` listing the members of ``IReactorCore``,
``IReactorTime`` and ``IReactorTCP``, so both the global reactor (typed by
Twisted as all of those) and ``MemoryReactorClock`` in tests are accepted
by their shape. It is also declared to implement those three interfaces
(the mypy-zope plugin reads ``@implementer``), so a ``Reactor`` can be
passed on to Twisted's APIs that ask for any one of them (endpoints,
``Agent``, ``Site``, ``LoopingCall.clock``) without a cast. Nothing ever
instantiates it: it exists for the type checker only.

Two reactor abilities are not in it because the global reactor's static
type (``twisted.internet._IReactorCommon``) or ``MemoryReactorClock``
lacks them: ``IReactorProcess`` (engine launches) and
``IReactorFromThreads`` (the SQLite store, trace export). The few places
that use them narrow with a cast that says why. So do the services that
take a clock and, when no client is injected, build one on it
(``ProviderProber``, ``InferenceRunner``, ``ClusterReplica``): only the
running reactor comes without a client.
"""

from collections.abc import Callable, Sequence
from typing import Any, Optional, Protocol

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import (
    IConnector,
    IDelayedCall,
    IListeningPort,
    IReactorCore,
    IReactorTCP,
    IReactorTime,
)
from twisted.internet.protocol import ClientFactory, P, ServerFactory
from zope.interface import implementer

__all__ = ["Reactor"]


@implementer(IReactorCore, IReactorTime, IReactorTCP)
class Reactor(Protocol):
    """A reactor that runs, keeps time and speaks TCP (see the module docstring)."""

    running: bool

    # -- IReactorTime -----------------------------------------------------------------------

    def seconds(self) -> float: ...

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: object, **kwargs: object
    ) -> IDelayedCall: ...

    def getDelayedCalls(self) -> Sequence[IDelayedCall]: ...

    # -- IReactorCore -----------------------------------------------------------------------

    def resolve(self, name: str, timeout: Sequence[int] = ...) -> Deferred[str]: ...

    def run(self) -> None: ...

    def stop(self) -> None: ...

    def crash(self) -> None: ...

    def iterate(self, delay: float) -> None: ...

    def fireSystemEvent(self, eventType: str) -> None: ...

    def addSystemEventTrigger(
        self, phase: str, eventType: str, callable: Callable[..., Any], *args: object, **kwargs: object
    ) -> Any: ...

    def removeSystemEventTrigger(self, triggerID: Any) -> None: ...

    def callWhenRunning(self, callable: Callable[..., Any], *args: object, **kwargs: object) -> Optional[Any]: ...

    # -- IReactorTCP ------------------------------------------------------------------------

    def listenTCP(
        self, port: int, factory: ServerFactory[Any], backlog: int = ..., interface: str = ...
    ) -> IListeningPort: ...

    def connectTCP(
        self,
        host: str,
        port: int,
        factory: ClientFactory[P],
        timeout: float = ...,
        bindAddress: Optional[tuple[str, int]] = ...,
    ) -> IConnector: ...
