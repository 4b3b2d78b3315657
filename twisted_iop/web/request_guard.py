"""The rules one HTTP request is held to before it reaches a route.

:class:`GuardedRequest` is the request of every :class:`~twisted_iop.web.http_site.GuardedSite`:
it checks a request on its headers, before a byte of its body is read,
and answers a :class:`Refusal` instead of the route when one fails, in
this order: the site is stopping (503, health paths excepted), a method
not served (405 with ``Allow``), a ``Host`` that does not name this server
(421, :func:`host_allowed`: DNS rebinding), the site's ``authorize``
check, a ``Content-Length`` over the limit (413), a cross-origin write or
WebSocket (403), a write whose body is not ``application/json`` (415). A
chunked body is cut at the limit (413). :class:`SiteLimits` holds a
listener's limits and browser rules. The connection, its deadlines and
caps are :mod:`twisted_iop.web.http_site`'s.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from typing import Any, Optional, Protocol
from urllib.parse import urlsplit

import attrs
from twisted.logger import Logger
from twisted.web.server import Request

from twisted_iop.eventloop.turn_writes import write_now

#: Methods that change state: they need a JSON body and a same-origin caller.
WRITE_METHODS = frozenset({b"POST", b"PUT", b"PATCH", b"DELETE"})


@attrs.frozen
class SiteLimits:
    """Limits and browser rules of one HTTP listener."""

    max_body_bytes: int = 65536
    header_timeout_seconds: float = 10.0
    request_timeout_seconds: float = 30.0
    idle_timeout_seconds: float = 60.0
    max_connections: int = 1024
    max_connections_per_address: int = 128
    #: Host names (besides IP literals and ``localhost``) this server answers to.
    allowed_hosts: tuple[str, ...] = ()
    #: Methods served; anything else is a 405.
    methods: frozenset[bytes] = frozenset({b"GET", b"HEAD", b"POST"})
    #: Paths still served while the site is stopping (health and readiness).
    paths_while_stopping: frozenset[bytes] = frozenset({b"/healthz", b"/readyz"})


@attrs.frozen
class Refusal:
    """Why a request is answered without reaching a route."""

    status: int
    code: str
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


#: Checks a request's headers before its body is read; None lets it pass.
HeaderCheck = Callable[["GuardedRequest"], Optional[Refusal]]


class GuardingSite(Protocol):
    """What a request's checks need of its site (a ``GuardedSite`` is one)."""

    #: Whether answers are sent from the write itself (:func:`~twisted_iop.eventloop.turn_writes.write_now`).
    write_now: bool

    @property
    def limits(self) -> SiteLimits:
        """The listener's limits and browser rules."""

    @property
    def stopping(self) -> bool:
        """Whether new requests are answered 503 ``shutting_down``."""

    @property
    def allowed_methods(self) -> Optional[Callable[[bytes], Optional[bytes]]]:
        """The ``Allow`` header of a path, None where unknown."""

    @property
    def authorize(self) -> Optional[HeaderCheck]:
        """The site's check of a request's headers, if any."""

    def host_allowed(self, host_header: bytes) -> bool:
        """Whether a ``Host`` header names this server."""


class GuardingChannel(Protocol):
    """What a request needs of its connection (a ``GuardedChannel`` is one)."""

    @property
    def site(self) -> GuardingSite:
        """The site the connection belongs to."""

    @property
    def request_method(self) -> bytes:
        """The current request's method, from its request line."""

    @property
    def request_path(self) -> bytes:
        """The current request's path, from its request line."""

    def request_complete(self) -> None:
        """The whole request arrived."""

    @property
    def transport(self) -> Any:
        """The connection's transport (the socket's, on a plain TCP listener)."""

    def refuse(self, refusal: Refusal, request: Optional[GuardedRequest] = None) -> None:
        """Answer ``refusal`` as the whole answer and close."""


def host_allowed(host_header: Optional[bytes], allowed: Iterable[str]) -> bool:
    """Whether a ``Host`` header names this server.

    IP literals are always allowed: DNS rebinding needs a name the attacker
    controls, never an address. Names must be ``localhost`` or configured.
    """
    if not host_header:
        return False
    try:
        host = urlsplit("//" + host_header.decode("ascii")).hostname
    except (UnicodeDecodeError, ValueError):
        return False
    if not host:
        return False
    host = host.lower().rstrip(".")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return True
    if host == "localhost" or host.endswith(".localhost"):
        return True
    return host in {name.lower().rstrip(".") for name in allowed}


def _origin_host(origin: bytes) -> Optional[str]:
    try:
        parts = urlsplit(origin.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    return parts.netloc.lower()


class _Discard:
    """A request body sink that keeps nothing (a refused request's body)."""

    def write(self, data: bytes) -> None:
        pass

    def seek(self, offset: int, whence: int = 0) -> int:
        return 0

    def tell(self) -> int:
        return 0

    def read(self, size: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass


class GuardedRequest(Request):
    """A request checked on its headers before its body is read."""

    _log = Logger()
    # Always a GuardedChannel: an HTTPChannel that is a GuardingChannel
    # (typed by what is used here, so this module need not import the site's).
    channel: GuardingChannel  # type: ignore[assignment]  # Twisted's stubs declare the channel as HTTPChannel

    def __init__(self, channel: Any, queued: Any = None) -> None:
        # Every body served here is JSON: never parse form submissions
        # (Twisted's Content-Type parsing for them is costly and unused).
        super().__init__(channel, queued, parsePOSTFormSubmission=False)
        self.body_bytes = 0
        self.refused: Optional[Refusal] = None

    def write(self, data: bytes) -> None:
        """Response bytes. A chunk of a started chunked answer on a ``write_now``
        site (a streamed token, usually) is framed here and sent in one step;
        anything else is written as twisted.web writes it. Both count the
        bytes in ``sentLength`` (the access log's size)."""
        if (
            self.chunked
            and self.startedWriting
            and data
            and not self.finished
            and not self._disconnected
            and not self._encoder
            and not self._inFakeHead
            and self.channel.site.write_now
        ):
            self.sentLength += len(data)
            write_now(self.channel.transport, b"%x\r\n%b\r\n" % (len(data), data))
            return
        super().write(data)

    # -- header-time checks -------------------------------------------------

    def gotLength(self, length: Optional[int]) -> None:
        site = self.channel.site
        # The method is known from the request line; checks need it now.
        self.method = self.channel.request_method
        refusal = self._check_headers(site, length)
        if refusal is not None:
            self.refuse(refusal)
            return
        super().gotLength(length)

    def _check_headers(self, site: GuardingSite, length: Optional[int]) -> Optional[Refusal]:
        limits = site.limits
        method = self.channel.request_method
        headers = self.requestHeaders
        if site.stopping and self.channel.request_path not in limits.paths_while_stopping:
            return Refusal(503, "shutting_down", "the server is shutting down; retry after its restart")
        if method not in limits.methods:
            allowed = site.allowed_methods(self.channel.request_path) if site.allowed_methods else None
            allowed = allowed or b", ".join(sorted(limits.methods))
            return Refusal(
                405,
                "method_not_allowed",
                f"method {method.decode('ascii', 'replace')[:20]} is not served here",
                ((b"Allow", allowed),),
            )
        host = headers.getRawHeaders(b"host", [b""])[0]
        if not site.host_allowed(host):
            return Refusal(421, "unknown_host", "the Host header does not name this server")
        if site.authorize is not None:
            refusal = site.authorize(self)
            if refusal is not None:
                return refusal
        if length is not None and length > limits.max_body_bytes:
            return Refusal(
                413, "body_too_large", f"request body of {length} bytes exceeds {limits.max_body_bytes} bytes"
            )
        # Each header is read once: a WebSocket upgrade is a GET (RFC 6455,
        # 4.1), so only a GET is asked for one; Origin serves both rules.
        if method == b"GET":
            upgrade = headers.getRawHeaders(b"upgrade")
            if upgrade is None or upgrade[0].lower() != b"websocket":
                return None
            write = False
        elif method in WRITE_METHODS:
            write = True
        else:
            return None
        origins = headers.getRawHeaders(b"origin")
        origin = None if origins is None else origins[0]
        if not write:
            # Cross-site WebSocket hijacking: a page elsewhere may not open
            # the live wire with the operator's browser.
            if origin is not None and _origin_host(origin) != host.decode("ascii", "replace").lower():
                return Refusal(403, "cross_origin", "cross-origin WebSockets are not allowed")
            return None
        if origin is not None and (
            origin == b"null" or _origin_host(origin) != host.decode("ascii", "replace").lower()
        ):
            return Refusal(403, "cross_origin", "cross-origin writes are not allowed")
        if length == 0:
            # No body (Content-Length: 0, or none and not chunked): nothing
            # to say the type of (a body-less POST /rollouts/{id}/cancel).
            return None
        content_type = headers.getRawHeaders(b"content-type", [b""])[0]
        media = content_type.split(b";", 1)[0].strip().lower()
        if media != b"application/json":
            return Refusal(415, "unsupported_media_type", "the request body must be sent as application/json")
        return None

    def handleContentChunk(self, data: bytes) -> None:
        if self.refused is not None:
            return
        self.body_bytes += len(data)
        limit = self.channel.site.limits.max_body_bytes
        if self.body_bytes > limit:
            self.refuse(Refusal(413, "body_too_large", f"request body exceeds {limit} bytes"))
            return
        super().handleContentChunk(data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        self.channel.request_complete()
        if self.refused is not None:
            return
        super().requestReceived(command, path, version)

    def refuse(self, refusal: Refusal) -> None:
        """Answer ``refusal`` now, before the body is read, and close."""
        if self.refused is not None:
            return
        self.refused = refusal
        self.content = _Discard()
        self.channel.refuse(refusal, self)
