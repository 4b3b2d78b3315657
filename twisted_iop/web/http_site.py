"""A ``twisted.web`` Site that holds against hostile HTTP clients.

Every HTTP listener of the daemons is a :class:`GuardedSite`. It adds to
Twisted's Site what a public-facing server needs and Twisted leaves to the
application, checked before a request reaches a route:

* **deadlines**: a request's headers must arrive within
  ``header_timeout_seconds`` of its first byte and the whole request within
  ``request_timeout_seconds`` (Twisted's idle timeout alone restarts on every
  byte, so a trickling client held a socket forever);
* **connection caps**: at most ``max_connections`` per listener and
  ``max_connections_per_address`` per peer address, refused by closing the
  socket at once (on ``ssl:`` listeners too). The channel counts its
  connection; a socket a resource takes over (a WebSocket upgrade, see
  :meth:`GuardedChannel.prepare_takeover`) stays counted until it closes;
* **bodies**: a ``Content-Length`` above ``max_body_bytes`` is refused with
  413 before a byte of the body is read, a chunked body is cut off at the
  limit, and the site's ``authorize`` check runs on the headers before the
  body is read (no temporary file is ever written for an unauthenticated
  client);
* **browsers**: the ``Host`` header must name this server (IP literals,
  ``localhost`` or a configured name: DNS rebinding), a cross-origin write is
  refused, a write with a body must say ``Content-Type: application/json``, and every
  answer carries ``X-Content-Type-Options``, ``X-Frame-Options``, a
  Content-Security-Policy and a ``Server`` header without versions;
* methods other than the ones served get a JSON 405;
* **stopping**: once :meth:`GuardedSite.stop_accepting` ran, a new request
  on a kept-alive connection gets a JSON 503 ``shutting_down`` (except the
  health paths, so ``/readyz`` can say it is stopping), and
  :meth:`GuardedSite.close_all` closes the connections after their answers.

The checks of one request on its headers (:class:`GuardedRequest`,
:class:`Refusal`, :class:`SiteLimits`, the browser rules) are
:mod:`twisted_iop.web.request_guard`'s; this module holds the connection
(:class:`GuardedChannel`: deadlines, takeover, the site's headers on every
answer) and the site (:class:`GuardedSite`: caps, stopping, logging).
Refusals are the same JSON error shape as the views'
(``{"error": {"code", "message", "status"}}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Optional
from urllib.parse import unquote_to_bytes

from twisted.internet.interfaces import IAddress, IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper
from twisted.web.http import HTTPChannel
from twisted.web.server import Site

from twisted_iop.eventloop.turn_writes import write_now
from twisted_iop.web.access_log import access_line, refusal_line
from twisted_iop.web.request_guard import WRITE_METHODS as WRITE_METHODS  # where the routes import it from
from twisted_iop.web.request_guard import (
    GuardedRequest,
    HeaderCheck,
    Refusal,
    SiteLimits,
    host_allowed,
)

#: What the ``Server`` header says (never a version).
SERVER_NAME = b"twisted-iop"

#: Headers on every answer.
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"X-Content-Type-Options", b"nosniff"),
    (b"X-Frame-Options", b"DENY"),
    (b"Referrer-Policy", b"no-referrer"),
    (
        b"Content-Security-Policy",
        b"default-src 'self'; script-src 'self'; connect-src 'self' ws: wss:; "
        b"img-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; "
        b"base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    ),
)

#: Host header values whose verdict a site remembers (then it starts over).
HOST_VERDICTS_KEPT = 256

#: The names of the headers the site adds to every answer (lower case).
_SITE_HEADER_NAMES = frozenset(name.lower() for name, _ in SECURITY_HEADERS) | {b"server"}

#: Reason phrases of the refusals this module answers itself.
_PHRASES = {
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    414: b"URI Too Long",
    415: b"Unsupported Media Type",
    421: b"Misdirected Request",
    503: b"Service Unavailable",
}


def error_json(status: int, code: str, message: str) -> bytes:
    """The JSON error shape shared with the views."""
    return json.dumps({"error": {"code": code, "message": message, "status": status}}).encode("utf-8")


#: The site's headers as they are written on every answer.
_SITE_HEADER_LINES = (
    b"Server: " + SERVER_NAME + b"\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in SECURITY_HEADERS)
)


class GuardedChannel(HTTPChannel):
    """An HTTP connection with request deadlines, counted by its site."""

    _log = Logger()
    site: GuardedSite

    def __init__(self) -> None:
        super().__init__()
        self.peer_host = ""
        self.request_method = b""
        self.request_path = b""
        #: The current request's target and HTTP version (for the access log of a refusal).
        self.request_uri = b""
        self.request_version = b""
        #: The connection's one deadline timer. It is never moved later or
        #: cancelled when a request ends (both cost a reactor operation per
        #: request): when it fires it looks at the deadline of now and
        #: either answers 408 or waits again for what is left.
        self._deadline: Optional[IDelayedCall] = None
        #: When the current deadline passes (None: no request under way).
        self._deadline_at: Optional[float] = None
        #: What the deadline waits for now: "headers" or "request".
        self._awaiting = "headers"
        self._request_deadline_at = 0.0
        self._refused = False
        #: Whether a resource was handed the socket (prepare_takeover ran).
        self._taken_over = False
        #: Whether the transport is TLS, asked once (Twisted asks twice a request).
        self._secure: Optional[bool] = None
        #: The connection's two addresses, asked once (every request asks both;
        #: the local one is a getsockname call on a TCP socket).
        self._peer: Optional[IAddress] = None
        self._host: Optional[IAddress] = None

    def connectionMade(self) -> None:
        super().connectionMade()
        transport: Any = self.transport
        self.site.connection_made(self, transport)
        if self.site.tcp_nodelay and hasattr(transport, "setTcpNoDelay"):
            # Small streamed writes must leave at once (no Nagle delay).
            transport.setTcpNoDelay(True)
        self._start_deadlines()

    def prepare_takeover(self) -> None:
        """A resource is about to take the socket over (a WebSocket upgrade).

        The protocol that takes over gets the socket's events from then on,
        and this channel no longer sees it close. So a wrapper goes in at
        the socket, between the reactor's transport and the protocol it
        delivers to (this channel on TCP, the TLS protocol on ``ssl:``):
        it tells the site when the socket closes. On TCP the resource
        wires its protocol to that wrapper (Autobahn does so for a
        transport whose protocol is a ``ProtocolWrapper``); on TLS to the
        TLS protocol above it, which stays the WebSocket's transport.

        The channel also stops being the producer of its transport: the
        protocol that takes over may register its own flow control, and a
        TLS transport would not close while a producer is registered.
        """
        below: Any = self
        transport: Any = self.transport
        if transport is None or self._taken_over:
            return
        self._taken_over = True
        transport.unregisterProducer()  # registered by HTTPChannel.connectionMade
        while isinstance(transport, ProtocolWrapper):  # TLS: down to the socket
            below, transport = transport, transport.transport
        watch = _SocketWatch(self, below)
        watch.transport = transport
        transport.protocol = watch

    def lineReceived(self, line: bytes) -> None:
        if self._refused:
            return
        if not self.request_method and line:
            # The request line: on a kept-alive connection, a new request.
            if self._deadline_at is None:
                self._start_deadlines()
            parts = line.split(b" ", 2)
            self.request_method = parts[0].upper()
            self.request_uri = parts[1] if len(parts) > 1 else b""
            self.request_version = parts[2] if len(parts) > 2 else b""
            self.request_path = self.request_uri.split(b"?", 1)[0]
            if not _utf8_path(self.request_path):
                self.refuse(Refusal(400, "invalid_path", "the request path is not UTF-8 once percent-decoded"))
                return
        # Called directly (a header line costs no super() lookup).
        HTTPChannel.lineReceived(self, line)

    def rawDataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        super().rawDataReceived(data)

    def lineLengthExceeded(self, line: bytes) -> None:
        """A request line or header line over the limit: a JSON 414 or 431, not a silent close."""
        if not self.request_method:
            self.request_method = line.split(b" ", 1)[0][:16].upper()
            self.refuse(Refusal(414, "uri_too_long", f"the request line exceeds {self.MAX_LENGTH} bytes"))
        else:
            self.refuse(Refusal(431, "headers_too_large", f"a header line exceeds {self.MAX_LENGTH} bytes"))

    def _respondToBadRequestAndDisconnect(self) -> None:
        """Twisted's bare 400 (too many headers, a malformed request line), as JSON."""
        self.refuse(Refusal(400, "bad_request", "the request is malformed or its headers too large"))

    def allHeadersReceived(self) -> None:
        if self._deadline_at is not None and self._awaiting == "headers":
            # The timer fires at the header deadline and waits again for the rest.
            self._awaiting = "request"
            self._deadline_at = self._request_deadline_at
        super().allHeadersReceived()

    def isSecure(self) -> bool:
        """Whether the connection is TLS: adapting the transport to
        ``ISSLTransport`` once, not on every request (a connection does not
        change its transport while it speaks HTTP)."""
        secure = self._secure
        if secure is None:
            secure = self._secure = bool(super().isSecure())
        return secure

    def getPeer(self) -> IAddress:
        """The remote address (the connection's, kept once asked)."""
        peer = self._peer
        if peer is None:
            peer = self._peer = super().getPeer()
        return peer

    def getHost(self) -> IAddress:
        """The local address (the connection's, kept once asked)."""
        host = self._host
        if host is None:
            host = self._host = super().getHost()
        return host

    def request_complete(self) -> None:
        """The whole request arrived: its deadlines no longer apply (the
        timer, when it fires, finds no request and ends)."""
        self._deadline_at = None
        self.request_method = b""
        self.request_path = b""
        self.request_uri = b""

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Any) -> None:
        """Write an answer's headers: the request's own, then the site's.

        ``Server`` is always ours (never Twisted's, with its version); the
        security headers are added unless the answer set its own. They are
        appended here as bytes, not set on every request's header map.
        """
        sequence = [version, b" ", code, b" ", reason, b"\r\n"]
        own: set[bytes] = set()
        for name, values in headers.getAllRawHeaders():
            lower = name.lower()
            if lower in _SITE_HEADER_NAMES:
                if lower == b"server":
                    continue
                own.add(lower)
            for value in values:
                sequence.extend((name, b": ", value, b"\r\n"))
        if own:
            sequence.append(b"Server: " + SERVER_NAME + b"\r\n")
            for name, value in SECURITY_HEADERS:
                if name.lower() not in own:
                    sequence.extend((name, b": ", value, b"\r\n"))
        else:
            sequence.append(_SITE_HEADER_LINES)
        sequence.append(b"\r\n")
        assert self.transport is not None
        self.writeSequence(sequence)

    def write(self, data: bytes) -> None:
        """Response bytes: sent at once on a ``write_now`` site (:mod:`twisted_iop.eventloop.turn_writes`)."""
        if self.site.write_now:
            write_now(self.transport, data)
        else:
            super().write(data)

    def writeSequence(self, iovec: Any) -> None:
        """Response bytes in pieces: one write, sent at once on a ``write_now`` site."""
        if self.site.write_now:
            write_now(self.transport, b"".join(iovec))
        else:
            super().writeSequence(iovec)

    def refuse(self, refusal: Refusal, request: Optional[GuardedRequest] = None) -> None:
        """Write ``refusal`` as the whole answer and close the connection,
        with an access-log line like any answer's."""
        if self._refused or self.transport is None:
            return
        self._refused = True
        self._cancel()
        body = self.site.error_json(refusal.status, refusal.code, refusal.message)
        lines = [
            b"HTTP/1.1 %d %s" % (refusal.status, _PHRASES.get(refusal.status, b"Error")),
            b"Server: " + SERVER_NAME,
            b"Content-Type: application/json",
            b"Cache-Control: no-store",
            b"Content-Length: %d" % len(body),
            b"Connection: close",
        ]
        lines += [name + b": " + value for name, value in SECURITY_HEADERS + refusal.headers]
        if refusal.status == 401:
            lines.append(b'WWW-Authenticate: Bearer realm="' + self.site.realm + b'"')
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        self.transport.loseConnection()
        self.site.log_refusal(self, refusal.status, len(body), request)

    def _start_deadlines(self) -> None:
        limits = self.site.limits
        clock = self.site.reactor
        now = clock.seconds()
        self._request_deadline_at = now + limits.request_timeout_seconds
        if limits.header_timeout_seconds < limits.request_timeout_seconds:
            self._awaiting = "headers"
            deadline_at = now + limits.header_timeout_seconds
        else:
            self._awaiting = "request"
            deadline_at = self._request_deadline_at
        self._deadline_at = deadline_at
        timer = self._deadline
        if timer is None:
            self._deadline = clock.callLater(deadline_at - now, self._deadline_passed)
        elif timer.getTime() > deadline_at:
            # Left waiting for an earlier request's longer deadline: sooner now.
            timer.reset(deadline_at - now)

    def _deadline_passed(self) -> None:
        """The timer fired: 408 if the current deadline passed, else wait for what is left."""
        self._deadline = None
        deadline_at = self._deadline_at
        if deadline_at is None:
            return  # no request under way: the next one starts a timer
        clock = self.site.reactor
        left = deadline_at - clock.seconds()
        if left > 0:
            self._deadline = clock.callLater(left, self._deadline_passed)
            return
        self._expired()

    def _expired(self) -> None:
        self._deadline_at = None
        what = self._awaiting
        seconds = (
            self.site.limits.header_timeout_seconds if what == "headers" else self.site.limits.request_timeout_seconds
        )
        self.site.count_timeout()
        self.refuse(Refusal(408, "request_timeout", f"the {what} did not arrive within {seconds:g}s"))
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            # A client that does not read must not keep the socket either.
            self.site.reactor.callLater(5.0, abort)

    def _cancel(self) -> None:
        self._deadline_at = None
        timer = self._deadline
        self._deadline = None
        if timer is not None and timer.active():
            timer.cancel()

    def connectionLost(self, reason: Any = None) -> None:
        self._cancel()
        self.site.connection_lost(self)
        super().connectionLost(reason)


def _utf8_path(path: bytes) -> bool:
    """Whether ``path`` is UTF-8 once percent-decoded (what the routes can match)."""
    try:
        unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class _SocketWatch(ProtocolWrapper):
    """What the socket's transport delivers to once a resource is about to
    take the socket over from a channel (see
    :meth:`GuardedChannel.prepare_takeover`): it passes everything on and
    tells the site when the socket closes, so the connection stays counted
    until then."""

    def __init__(self, channel: GuardedChannel, protocol: Any) -> None:
        # Never made connected (the socket already is), and it forgets the
        # connection itself: it needs no wrapping factory.
        super().__init__(None, protocol)  # type: ignore[arg-type]  # never connected, so no wrapping factory
        self._channel = channel

    def connectionLost(self, reason: Any = None) -> None:
        try:
            self.wrappedProtocol.connectionLost(reason)
        finally:
            self._channel.site.connection_lost(self._channel)


class _Refused(Protocol):
    """A connection over the caps: closed as soon as it is made, nothing read or written."""

    def connectionMade(self) -> None:
        transport: Any = self.transport
        transport.abortConnection()


class GuardedSite(Site):
    """A Site with per-listener and per-address connection caps and guarded requests."""

    _log = Logger()
    requestFactory = GuardedRequest  # type: ignore[assignment]  # its __init__ is narrower than Request's (no *args)
    displayTracebacks = False
    noisy = False

    def __init__(
        self,
        resource: Any,
        limits: SiteLimits = SiteLimits(),
        authorize: Optional[HeaderCheck] = None,
        reactor: Optional[IReactorTime] = None,
        *,
        error_json: Callable[[int, str, str], bytes] = error_json,
        realm: bytes = b"iop",
        access_log: bool = True,
        tcp_nodelay: bool = False,
        allowed_methods: Optional[Callable[[bytes], Optional[bytes]]] = None,
        write_now: bool = False,
    ) -> None:
        super().__init__(resource, timeout=limits.idle_timeout_seconds, reactor=reactor, logFormatter=access_line)
        self.limits = limits
        self.authorize = authorize
        #: The error body of a refusal (the views' JSON shape unless told otherwise).
        self.error_json = error_json
        self.realm = realm
        self.access_log = access_log
        #: The ``Allow`` header of a path (its routes'), None where unknown.
        self.allowed_methods = allowed_methods
        self.tcp_nodelay = tcp_nodelay
        #: Whether answers are sent from the write itself, not on the next
        #: writable poll (:func:`twisted_iop.eventloop.turn_writes.write_now`): streamed events.
        self.write_now = write_now
        #: Open connections: on this listener, and per peer address.
        self.connections = 0
        self.by_address: dict[str, int] = {}
        #: Connections refused at the caps, and requests cut at a deadline.
        self.refused_connections = 0
        self.timed_out_requests = 0
        self._last_refusal_log = -1e9
        #: Set by :meth:`stop_accepting`: new requests get 503 ``shutting_down``.
        self.stopping = False
        #: Each open connection's channel and the transport of its socket.
        self._open: dict[GuardedChannel, Any] = {}
        #: Host header -> whether it names this server (the rule depends on
        #: the header and this site's fixed limits only), at most
        #: HOST_VERDICTS_KEPT entries.
        self._host_verdicts: dict[bytes, bool] = {}

    def host_allowed(self, host_header: bytes) -> bool:
        """:func:`host_allowed` for this site's names, remembered per header value."""
        verdict = self._host_verdicts.get(host_header)
        if verdict is None:
            verdict = host_allowed(host_header, self.limits.allowed_hosts)
            if len(self._host_verdicts) >= HOST_VERDICTS_KEPT:
                self._host_verdicts.clear()
            self._host_verdicts[host_header] = verdict
        return verdict

    def buildProtocol(self, addr: Optional[IAddress]) -> Any:
        host = str(getattr(addr, "host", ""))
        limits = self.limits
        if self.connections >= limits.max_connections or self.by_address.get(host, 0) >= (
            limits.max_connections_per_address
        ):
            self.refused_connections += 1
            now = self.reactor.seconds()
            if now - self._last_refusal_log >= 10.0:
                self._last_refusal_log = now
                self._log.warn(
                    "HTTP connection limit reached; {count} connections refused so far",
                    count=self.refused_connections,
                )
            # A protocol that closes at once, not None: on an ``ssl:``
            # listener the TLS wrapper would wrap None and fail.
            return _Refused()
        channel = GuardedChannel()
        channel.site = self
        channel.factory = self
        channel.requestFactory = self.requestFactory  # type: ignore[assignment]  # its __init__ is narrower than Request's (no *args)
        channel.peer_host = host
        channel.callLater = self.reactor.callLater  # type: ignore[method-assign, assignment]  # HTTPChannel's callLater is the reactor's, set per channel
        channel.timeOut = self.timeOut  # type: ignore[assignment]  # Twisted's stubs type timeOut as int; it takes seconds as float
        return channel

    def log(self, request: Any) -> None:
        """One access-log line per request, unless the listener's volume makes it noise."""
        if self.access_log:
            super().log(request)

    def log_refusal(self, channel: GuardedChannel, status: int, length: int, request: Optional[GuardedRequest]) -> None:
        """The access-log line of an answer the site gave itself (405, 408, 413, 415, 421 ...)."""
        if not self.access_log or self._logFile is None:
            return
        headers = None if request is None else request.requestHeaders
        line = refusal_line(self._logDateTime or "-", channel, status, length, headers)
        self._logFile.write(line + "\n")

    def connection_made(self, channel: GuardedChannel, transport: Any) -> None:
        """Count a connection made (``transport`` is its socket's)."""
        self._open[channel] = transport
        self.connections += 1
        host = channel.peer_host
        self.by_address[host] = self.by_address.get(host, 0) + 1

    def connection_lost(self, channel: GuardedChannel) -> None:
        """Forget a closed connection in the counts (once, however often told)."""
        if self._open.pop(channel, None) is None:
            return
        self.connections -= 1
        host = channel.peer_host
        left = self.by_address.get(host, 0) - 1
        if left > 0:
            self.by_address[host] = left
        else:
            self.by_address.pop(host, None)

    def stop_accepting(self) -> None:
        """Answer new requests with 503 ``shutting_down`` (health paths excepted)."""
        self.stopping = True

    def close_all(self) -> None:
        """Close every connection once what was written to it is sent."""
        for transport in list(self._open.values()):
            transport.loseConnection()

    def count_timeout(self) -> None:
        """Count a request cut at its deadline."""
        self.timed_out_requests += 1
