"""A lean HTTP/1.1 client for engine requests: keep-alive connections, one write per request.

The inference runner sends one POST per request to an engine and reads its
answer as it comes (a stream of server-sent events, or a whole JSON body).
Twisted's ``Agent`` does that through six layers per read (the client
protocol, its parser, a line receiver, the chunked decoder, the response's
state dispatcher, then our reader) and builds a URI, a ``Headers``, an
endpoint and several Deferreds per request. Here one protocol per
connection parses the status line, the headers (bounded) and the body
(``Content-Length``, chunked, or to the close) and hands body bytes to the
reader's ``dataReceived`` in the same call as the socket's read.

:class:`EngineHTTPClient` keeps idle connections per engine (host, port)
and gives :class:`~twisted_iop.node.inference.InferenceRunner` what it used
from ``Agent``: ``request(method, url, data=, headers=)`` firing with a
response (``code``, ``headers.getRawHeaders``, ``deliverBody``); failures
are Twisted's own (``ResponseNeverReceived`` when a kept-alive connection
closed before any answer, ``ConnectionRefusedError`` ...), so the runner's
retry and its reasons stay as they are. ``https://`` engines go through
:class:`~twisted_iop.node.engines.http.ProviderHTTPClient` (TLS).

What it saves, measured with ``bench/stream_gateway.py`` (paced streams
through Edge + Node, the Node's CPU per 1,000 tokens): see
docs/performance.md, "Streamed tokens against nginx".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Optional, cast
from urllib.parse import urlsplit

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.eventloop.turn_writes import write_now
from twisted_iop.node.engines.http import ProviderHTTPClient

#: Idle connections kept per engine for reuse (a Node streams hundreds at once).
MAX_IDLE_PER_ENGINE = 1024
#: Largest status line and header block of an answer.
MAX_HEAD_BYTES = 64 * 1024
#: Longest chunk-size line of a chunked body.
MAX_CHUNK_LINE_BYTES = 1024
#: Parsed request URLs kept (one per provider and endpoint, in practice).
MAX_CACHED_URLS = 1024

_HEAD_END = b"\r\n\r\n"


class ResponseHeaders:
    """An answer's headers, by lower-case name (the part of ``Headers`` the runner reads)."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[bytes, list[bytes]]) -> None:
        self._values = values

    def getRawHeaders(self, name: bytes, default: Optional[list[bytes]] = None) -> Optional[list[bytes]]:
        """The values of header ``name`` (any case), or ``default``."""
        return self._values.get(name.lower(), default)


class EngineResponse:
    """An engine's answer: status, headers, and its body through :meth:`deliverBody`.

    Body bytes that come before :meth:`deliverBody` (and how the body
    ended) are kept here, for the reader when it comes; the connection may
    meanwhile serve the next request.
    """

    __slots__ = ("_connection", "_early", "_ended", "_protocol", "code", "headers")

    def __init__(self, connection: _EngineConnection, code: int, headers: ResponseHeaders) -> None:
        self._connection: Optional[_EngineConnection] = connection
        self._protocol: Any = None
        self._early: list[bytes] = []
        self._ended: Optional[Failure] = None
        self.code = code
        self.headers = headers

    def deliverBody(self, protocol: Any) -> None:
        """Give the body to ``protocol`` (``dataReceived``, then ``connectionLost``)."""
        self._protocol = protocol
        protocol.makeConnection(_BodyTransport(self))
        early, self._early = self._early, []
        for data in early:
            if self._protocol is not protocol:
                return
            protocol.dataReceived(data)
        if self._ended is not None and self._protocol is protocol:
            ended, self._ended = self._ended, None
            self._protocol = None
            protocol.connectionLost(ended)

    def give(self, data: bytes) -> None:
        """Body bytes from the connection."""
        protocol = self._protocol
        if protocol is not None:
            protocol.dataReceived(data)
        elif self._ended is None and self._connection is not None:
            self._early.append(data)

    def end(self, reason: Failure) -> None:
        """The body ended (``ResponseDone``, ``PotentialDataLoss`` or a failure)."""
        self._connection = None
        protocol, self._protocol = self._protocol, None
        if protocol is not None:
            protocol.connectionLost(reason)
        else:
            self._ended = reason

    def serving(self) -> Optional[_EngineConnection]:
        """The connection still reading this body, if any."""
        return self._connection

    def stop(self) -> None:
        """The reader stopped: nothing more reaches it, and an unfinished body's connection is dropped."""
        connection, self._connection = self._connection, None
        self._protocol = None
        self._early = []
        if connection is not None:
            connection.abort()


class _BodyTransport:
    """What a body's reader sees as its transport: pause, resume, stop (abort)."""

    __slots__ = ("_response",)

    def __init__(self, response: EngineResponse) -> None:
        self._response = response

    def pauseProducing(self) -> None:
        connection = self._response.serving()
        transport: Any = connection.transport if connection is not None else None
        if transport is not None:
            transport.pauseProducing()

    def resumeProducing(self) -> None:
        connection = self._response.serving()
        transport: Any = connection.transport if connection is not None else None
        if transport is not None:
            transport.resumeProducing()

    def stopProducing(self) -> None:
        self._response.stop()


# States of a connection.
_IDLE, _HEAD, _BODY, _CLOSED = range(4)
# How a body ends.
_LENGTH, _CHUNKED, _TO_CLOSE = range(3)


class _EngineConnection(Protocol):
    """One HTTP/1.1 connection to an engine: one request at a time, kept alive between them."""

    def __init__(self, pool: EngineHTTPClient, key: tuple[str, int]) -> None:
        self._pool = pool
        self._key = key
        self._state = _IDLE
        self._answer: Optional[Deferred[EngineResponse]] = None
        self._buffer = bytearray()
        self._response: Optional[EngineResponse] = None
        self._framing = _TO_CLOSE
        self._remaining = 0  # bytes left of the body (_LENGTH) or of the current chunk (_CHUNKED)
        self._in_trailer = False
        self._keep_alive = True

    # -- a request -----------------------------------------------------------

    def send(self, head: bytes, body: bytes) -> Deferred[EngineResponse]:
        """Write one request; fire with its answer's status and headers."""
        self._state = _HEAD
        self._buffer = bytearray()
        self._response = None
        self._in_trailer = False
        self._answer = Deferred(self._cancel)
        answer = self._answer
        write_now(self.transport, head + body)
        return answer

    def _cancel(self, _: Deferred[EngineResponse]) -> None:
        self._answer = None
        self.abort()

    def abort(self) -> None:
        """Drop the connection now (cancelled, or the reader stopped)."""
        self._response = None
        if self._state != _CLOSED:
            self._state = _CLOSED
            transport: Any = self.transport
            if transport is not None:
                transport.abortConnection()

    # -- the answer ------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self._state
        if state == _BODY:
            self._body_data(data)
        elif state == _HEAD:
            self._buffer += data
            end = self._buffer.find(_HEAD_END)
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self._fail_head(f"the engine's answer headers are longer than {MAX_HEAD_BYTES} bytes")
                return
            head = bytes(self._buffer[:end])
            rest = bytes(self._buffer[end + 4 :])
            self._buffer = bytearray()
            self._head(head)
            if rest and self._state in (_HEAD, _BODY):
                self.dataReceived(rest)  # the body's start, or the answer after an interim one
        elif state == _IDLE:
            self.abort()  # bytes no request asked for: the connection is not reused

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status = lines[0].split(b" ", 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
            self._fail_head("the engine's answer has no valid status line")
            return
        code = int(status[1])
        values: dict[bytes, list[bytes]] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                continue
            values.setdefault(name.strip().lower(), []).append(value.strip())
        connection = b",".join(values.get(b"connection", [])).lower()
        self._keep_alive = status[0] != b"HTTP/1.0" and b"close" not in connection
        if 100 <= code < 200:
            return  # an interim answer (100 Continue): the real one follows
        encoding = b",".join(values.get(b"transfer-encoding", [])).lower()
        length = values.get(b"content-length")
        if code in (204, 304):
            self._framing = _LENGTH
            self._remaining = 0
        elif b"chunked" in encoding:
            self._framing = _CHUNKED
            self._remaining = -1  # a size line comes first
        elif length is not None:
            try:
                self._remaining = int(length[0])
            except ValueError:
                self._remaining = -1
            if self._remaining < 0:
                self._fail_head("the engine's answer has a bad Content-Length")
                return
            self._framing = _LENGTH
        else:
            self._framing = _TO_CLOSE
            self._keep_alive = False
        self._state = _BODY
        answer, self._answer = self._answer, None
        response = self._response = EngineResponse(self, code, ResponseHeaders(values))
        if answer is not None:
            answer.callback(response)
        if self._state == _BODY and self._framing == _LENGTH and self._remaining == 0:
            self._finish()

    def _fail_head(self, message: str) -> None:
        answer, self._answer = self._answer, None
        self.abort()
        if answer is not None:
            answer.errback(Failure(ResponseFailed([Failure(ValueError(message))])))

    def _give(self, data: bytes) -> None:
        response = self._response
        if response is not None:
            response.give(data)

    def _body_data(self, data: bytes) -> None:
        framing = self._framing
        if framing == _TO_CLOSE:
            self._give(data)
        elif framing == _LENGTH:
            if len(data) >= self._remaining:
                piece, extra = data[: self._remaining], data[self._remaining :]
                self._remaining = 0
                if piece:
                    self._give(piece)
                self._finish()
                if extra:
                    self.dataReceived(extra)  # past the answer: not for any request
            else:
                self._remaining -= len(data)
                self._give(data)
        else:
            self._chunked(data)

    def _chunked(self, data: bytes) -> None:
        if self._remaining == -1 and not self._buffer and not self._in_trailer:
            # Usually a read is exactly one chunk (a streamed event): its size
            # line, its bytes and their CRLF, handed on without the loop below.
            line_end = data.find(b"\r\n")
            if 0 < line_end <= 16:
                try:
                    size = int(data[:line_end], 16)
                except ValueError:
                    size = 0  # an extension or a malformed line: the loop says which
                end = line_end + 2 + size
                if size > 0 and len(data) == end + 2 and data.endswith(b"\r\n"):
                    self._give(data[line_end + 2 : end])
                    return
        buffer = self._buffer
        if buffer:
            buffer += data
            source: Any = buffer
        else:
            source = data
        start = 0
        size = len(source)
        while start < size and self._state == _BODY:
            remaining = self._remaining
            if remaining > 0:
                end = min(size, start + remaining)
                self._remaining = remaining - (end - start)
                self._give(bytes(source[start:end]) if source is buffer else source[start:end])
                start = end
                if self._remaining == 0:
                    self._remaining = -2  # the CRLF after a chunk
                continue
            line_end = source.find(b"\r\n", start)
            if line_end < 0:
                if size - start > MAX_CHUNK_LINE_BYTES:
                    self._cut(f"the engine sent a chunk line longer than {MAX_CHUNK_LINE_BYTES} bytes")
                    return
                break
            line = bytes(source[start:line_end])
            start = line_end + 2
            if remaining == -2:
                if line:
                    self._cut("the engine's chunked body is malformed")
                    return
                self._remaining = -1
            elif self._in_trailer:
                if not line:
                    extra = bytes(source[start:])
                    self._finish()
                    if extra:
                        self.dataReceived(extra)  # past the answer: not for any request
                    return
            else:
                try:
                    chunk = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._cut("the engine's chunked body is malformed")
                    return
                if chunk < 0:
                    self._cut("the engine's chunked body is malformed")
                    return
                if chunk == 0:
                    self._in_trailer = True
                else:
                    self._remaining = chunk
        if self._state != _BODY:
            return
        if start >= size:
            self._buffer = bytearray()
        elif source is buffer:
            del buffer[:start]
        else:
            self._buffer = bytearray(source[start:])

    def _finish(self) -> None:
        """The body ended well: tell its reader; keep the connection for the next request."""
        response, self._response = self._response, None
        # Idle (or closed) before the reader hears of it: it may send the next request at once.
        if self._keep_alive and self._pool.keep(self):
            self._state = _IDLE
            self._buffer = bytearray()
            # A reader may have paused this connection in the very read that
            # ended its body: once idle it is nobody's to pause, and it must
            # read (the next request's answer, or the engine closing it).
            transport: Any = self.transport
            if transport is not None:
                transport.resumeProducing()
        else:
            self._state = _CLOSED
            if self.transport is not None:
                self.transport.loseConnection()
        if response is not None:
            response.end(Failure(ResponseDone()))

    def _cut(self, message: str) -> None:
        self._end_body(Failure(ResponseFailed([Failure(ValueError(message))])))
        self.abort()

    def _end_body(self, reason: Failure) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.end(reason)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        state, self._state = self._state, _CLOSED
        self._pool.forget(self)
        answer, self._answer = self._answer, None
        if answer is not None:
            if self._buffer:
                answer.errback(Failure(ResponseFailed([reason])))
            else:
                # Nothing of the answer came: the runner may send the request once more.
                answer.errback(Failure(ResponseNeverReceived([reason])))
            return
        if state == _BODY:
            if self._framing == _TO_CLOSE:
                self._end_body(Failure(PotentialDataLoss()) if reason.check(ConnectionDone) else reason)
            else:
                self._end_body(Failure(ResponseFailed([reason])))


class EngineHTTPClient:
    """Keep-alive HTTP/1.1 connections to engines, for the inference runner.

    ``http://`` engines only; an ``https://`` URL goes through ``tls_client``
    (Twisted's ``Agent`` with TLS).
    """

    def __init__(
        self,
        reactor: Reactor,
        max_idle_per_engine: int = MAX_IDLE_PER_ENGINE,
        tls_client: Optional[Any] = None,
        endpoint_for: Optional[Callable[[str, int], IStreamClientEndpoint]] = None,
    ) -> None:
        self._reactor = reactor
        self.max_idle_per_engine = max_idle_per_engine
        #: Idle connections per engine, oldest first (a dict: closing one is O(1)).
        self._idle: dict[tuple[str, int], dict[_EngineConnection, None]] = {}
        self._urls: dict[str, tuple[tuple[str, int], bytes]] = {}
        self._tls_client = tls_client
        self._endpoint_for = endpoint_for or self._endpoint

    @property
    def tls_client(self) -> Any:
        """The client for ``https://`` engines (made when first needed)."""
        if self._tls_client is None:
            self._tls_client = ProviderHTTPClient(self._reactor)
        return self._tls_client

    def request(
        self, method: str, url: str, data: bytes = b"", headers: Optional[dict[bytes, list[bytes]]] = None, **_: object
    ) -> Deferred[Any]:
        """Send one request; fires with the answer (status and headers; the body through ``deliverBody``)."""
        target = self._urls.get(url)
        if target is None:
            if not url.startswith("http://"):
                return cast("Deferred[Any]", self.tls_client.request(method, url, data=data, headers=headers))
            target = self._parse(url)
        key, start = target
        lines = [method.encode("ascii"), b" ", start]
        for name, values in (headers or {}).items():
            for value in values:
                lines += (name, b": ", value, b"\r\n")
        lines += (b"Content-Length: ", str(len(data)).encode("ascii"), b"\r\n\r\n")
        head = b"".join(lines)
        idle = self._idle.get(key)
        while idle:
            connection = idle.popitem()[0]  # the most recently used
            if connection.transport is not None and connection._state == _IDLE:
                return connection.send(head, data)
        return self._connect(key, head, data)

    def _parse(self, url: str) -> tuple[tuple[str, int], bytes]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or 80
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        netloc = host if ":" not in host else f"[{host}]"
        if parts.port:
            netloc += f":{parts.port}"
        start = path.encode("utf-8") + b" HTTP/1.1\r\nHost: " + netloc.encode("idna") + b"\r\n"
        target = ((host, port), start)
        if len(self._urls) < MAX_CACHED_URLS:
            self._urls[url] = target
        return target

    def _endpoint(self, host: str, port: int) -> IStreamClientEndpoint:
        try:
            version = ipaddress.ip_address(host).version
        except ValueError:
            return HostnameEndpoint(self._reactor, host, port)
        return (TCP4ClientEndpoint if version == 4 else TCP6ClientEndpoint)(self._reactor, host, port)

    def _connect(self, key: tuple[str, int], head: bytes, data: bytes) -> Deferred[Any]:
        connected = self._endpoint_for(*key).connect(_ConnectionFactory(self, key))
        answers: list[Deferred[EngineResponse]] = []

        def cancel(_: Deferred[Any]) -> None:
            # Before the connection: stop connecting; after: drop the connection.
            if answers:
                answers[0].cancel()
            else:
                connected.cancel()

        result: Deferred[Any] = Deferred(cancel)

        def made(connection: _EngineConnection) -> None:
            transport: Any = connection.transport
            if hasattr(transport, "setTcpNoDelay"):
                transport.setTcpNoDelay(True)
            if result.called:
                connection.abort()
                return
            answer = connection.send(head, data)
            answers.append(answer)
            answer.addCallbacks(result.callback, _pass_on(result))

        def failed(failure: Failure) -> None:
            if not result.called:
                result.errback(failure)

        connected.addCallbacks(made, failed)
        return result

    def keep(self, connection: _EngineConnection) -> bool:
        """A connection finished its answer: keep it for the next request (False: close it)."""
        idle = self._idle.setdefault(connection._key, {})
        if len(idle) >= self.max_idle_per_engine:
            return False
        idle[connection] = None
        return True

    def forget(self, connection: _EngineConnection) -> None:
        """A connection closed: not reused."""
        idle = self._idle.get(connection._key)
        if idle:
            idle.pop(connection, None)

    def idle_connections(self) -> int:
        """Connections kept for reuse, over every engine."""
        return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        """Close every idle connection (the Node is stopping)."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection._state = _CLOSED
                if connection.transport is not None:
                    connection.transport.loseConnection()
        if self._tls_client is not None:
            self._tls_client.pool.closeCachedConnections()


def _pass_on(result: Deferred[Any]) -> Callable[[Failure], None]:
    def errback(failure: Failure) -> None:
        if not result.called:
            result.errback(failure)

    return errback


class _ConnectionFactory(Factory):
    noisy = False

    def __init__(self, pool: EngineHTTPClient, key: tuple[str, int]) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: Any) -> _EngineConnection:
        return _EngineConnection(self._pool, self._key)
