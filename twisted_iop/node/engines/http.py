"""The Node's HTTP connections to its engines.

* :class:`QuietConnectionPool`: engines drop idle connections
  (llama-cpp-python after 5 s) and the Node opens new ones for probes and
  requests all day; Twisted's default pool logs "Starting factory" and
  "Stopping factory" for each, with the engine's address in it. The probes
  and the inference runner share this pool class.
* :class:`ProviderHTTPClient`: the inference runner's client (the part of
  treq it uses): persistent connections, ``TCP_NODELAY``, IP literals
  without a resolver thread, the body written with the headers.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Optional, Protocol, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.interfaces import IConsumer, IStreamClientEndpoint
from twisted.web.client import URI, Agent, HTTPConnectionPool, _HTTP11ClientFactory
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IBodyProducer
from zope.interface import implementer

from twisted_iop.eventloop.reactor_types import Reactor

#: Idle provider connections kept open per provider host (for reuse).
MAX_IDLE_PROVIDER_CONNECTIONS = 64


class _QuietClientFactory(_HTTP11ClientFactory):
    """The pool's per-connection factory, without the "Starting/Stopping factory" lines."""

    noisy = False


class QuietConnectionPool(HTTPConnectionPool):
    """A persistent pool whose connections open and close without a log line each."""

    _factory = _QuietClientFactory


class InferenceHTTPClient(Protocol):
    """The part of treq the runner uses."""

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        """Issue a request."""


@implementer(IBodyProducer)
class _BytesBody:
    """A request body written whole, at once, with the request's headers.

    (treq's bytes body goes through a cooperator: it leaves a turn after the
    headers, as a second small segment that Nagle's algorithm can hold.)
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    def startProducing(self, consumer: IConsumer) -> Deferred[None]:
        consumer.write(self._data)
        return succeed(None)

    def pauseProducing(self) -> None:
        pass

    def resumeProducing(self) -> None:
        pass

    def stopProducing(self) -> None:
        pass


@implementer(IAgentEndpointFactory)
class _ProviderEndpoints:
    """Endpoints to providers: IP literals connect directly (no resolver thread); TCP_NODELAY on each."""

    def __init__(self, reactor: Reactor) -> None:
        self._reactor = reactor

    def endpointForURI(self, uri: URI) -> IStreamClientEndpoint:
        host = uri.host.decode("ascii")
        try:
            version = ipaddress.ip_address(host).version
        except ValueError:
            return _NoDelayEndpoint(HostnameEndpoint(self._reactor, host, uri.port))
        endpoint_type = TCP4ClientEndpoint if version == 4 else TCP6ClientEndpoint
        return _NoDelayEndpoint(endpoint_type(self._reactor, host, uri.port))


@implementer(IStreamClientEndpoint)
class _NoDelayEndpoint:
    """Connects through ``inner`` and turns Nagle's algorithm off (requests and events are small)."""

    def __init__(self, inner: IStreamClientEndpoint) -> None:
        self._inner = inner

    def connect(self, protocolFactory: Any) -> Deferred[Any]:
        return self._inner.connect(protocolFactory).addCallback(_no_delay)


def _no_delay(protocol: Any) -> Any:
    transport = getattr(protocol, "transport", None)
    if transport is not None and hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)
    return protocol


class ProviderHTTPClient:
    """The runner's HTTP client for providers (the part of treq's interface it uses).

    A persistent connection pool (no connection setup per request), no
    cookies kept between requests, no redirects followed, no resolver
    thread for IP literals, ``TCP_NODELAY``, and the body sent with the
    headers. The response is returned unbuffered, for ``deliverBody``.
    """

    def __init__(self, reactor: Reactor, max_idle_per_host: int = MAX_IDLE_PROVIDER_CONNECTIONS) -> None:
        self.pool = QuietConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = max_idle_per_host
        self._agent = Agent.usingEndpointFactory(reactor, _ProviderEndpoints(reactor), pool=self.pool)

    def request(
        self, method: str, url: str, data: bytes = b"", headers: Optional[dict[bytes, list[bytes]]] = None, **_: object
    ) -> Deferred[Any]:
        """Send one request; fires with the (unbuffered) response."""
        return cast(
            "Deferred[Any]",
            self._agent.request(method.encode("ascii"), url.encode("utf-8"), Headers(headers), _BytesBody(data)),
        )
