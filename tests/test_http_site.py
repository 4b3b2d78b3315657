"""The guarded HTTP site against hostile clients, over real sockets on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, cast

import pytest
import pytest_twisted
from autobahn.twisted.resource import WebSocketResource
from autobahn.twisted.websocket import (
    WebSocketClientFactory,
    WebSocketClientProtocol,
    WebSocketServerFactory,
    WebSocketServerProtocol,
)
from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import (
    SSL4ClientEndpoint,
    TCP4ClientEndpoint,
    TCP4ServerEndpoint,
    connectProtocol,
    serverFromString,
)
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web.resource import Resource

from twisted_iop.testing.harness import eventually, self_signed, start_control_plane
from twisted_iop.testing.http import RawClient, connect, request_head
from twisted_iop.web.http_site import HOST_VERDICTS_KEPT, GuardedSite
from twisted_iop.web.request_guard import GuardedRequest, Refusal, SiteLimits, host_allowed


class Echo(Resource):
    """Answers with the size of the body it read."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[int] = []

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        return b'{"ok": true}'

    def render_POST(self, request: Any) -> bytes:
        size = len(request.content.read())
        self.bodies.append(size)
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"read": size}).encode()


async def serve(limits: SiteLimits = SiteLimits(), authorize: Any = None) -> tuple[Any, int, Echo, GuardedSite]:
    """A guarded site on 127.0.0.1:0."""
    echo = Echo()
    site = GuardedSite(echo, limits, authorize=authorize, reactor=reactor)
    port = await TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(site)
    return port, port.getHost().port, echo, site


@pytest_twisted.ensureDeferred
async def test_huge_content_length_is_refused_before_the_body() -> None:
    """A 1 GiB Content-Length gets 413 at once; the body is never read or stored."""
    port, number, echo, _ = await serve()
    try:
        client = await connect(number)
        client.tcp.write(
            request_head("POST", number, "Content-Type: application/json\r\nContent-Length: 1073741824\r\n")
        )
        await client.closed
        assert client.status == 413
        assert client.body["error"]["code"] == "body_too_large"
        assert echo.bodies == []
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_chunked_body_is_cut_at_the_limit() -> None:
    """A chunked body that grows past the limit is answered 413 and the connection closed."""
    port, number, echo, _ = await serve(SiteLimits(max_body_bytes=1000))
    try:
        client = await connect(number)
        client.tcp.write(
            request_head("POST", number, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")
        )
        for _ in range(5):
            client.tcp.write(b"1f4\r\n" + b"x" * 500 + b"\r\n")
        await client.closed
        assert client.status == 413
        assert echo.bodies == []
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_authorization_is_checked_before_the_body() -> None:
    """The site's header check answers 401 before a body within the limit is read."""

    def authorize(request: GuardedRequest) -> Optional[Refusal]:
        if request.getHeader(b"authorization") != b"Bearer good":
            return Refusal(401, "unauthorized", "an API token is required")
        return None

    port, number, echo, _ = await serve(authorize=authorize)
    try:
        client = await connect(number)
        client.tcp.write(request_head("POST", number, "Content-Type: application/json\r\nContent-Length: 60000\r\n"))
        await client.closed
        assert client.status == 401
        assert b"WWW-Authenticate: Bearer" in client.received
        good = await connect(number)
        good.tcp.write(
            request_head(
                "POST",
                number,
                "Content-Type: application/json\r\nAuthorization: Bearer good\r\nContent-Length: 2\r\nConnection: close\r\n",
            )
            + b"{}"
        )
        await good.closed
        assert good.status == 200
        assert echo.bodies == [2]
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_trickled_headers_meet_the_header_deadline() -> None:
    """A client that sends its headers a byte at a time is cut off at the header deadline (408)."""
    port, number, _, site = await serve(SiteLimits(header_timeout_seconds=0.3, request_timeout_seconds=5))
    try:
        client = await connect(number)
        head = request_head("GET", number)
        sent = 0

        def trickle() -> None:
            nonlocal sent
            if client.is_closed or sent >= len(head) - 2:
                return
            client.tcp.write(head[sent : sent + 1])
            sent += 1
            reactor.callLater(0.05, trickle)

        trickle()
        await client.closed
        assert client.status == 408
        assert client.body["error"]["code"] == "request_timeout"
        assert site.timed_out_requests == 1
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_slow_body_meets_the_request_deadline() -> None:
    """Headers in time but a body that never ends: 408 at the request deadline."""
    port, number, echo, _ = await serve(SiteLimits(request_timeout_seconds=0.3))
    try:
        client = await connect(number)
        client.tcp.write(request_head("POST", number, "Content-Type: application/json\r\nContent-Length: 100\r\n"))
        client.tcp.write(b"{")
        await client.closed
        assert client.status == 408
        assert echo.bodies == []
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_connections_per_address_are_capped() -> None:
    """Past the per-address cap a new connection is closed at once; closing one frees a place."""
    port, number, _, site = await serve(SiteLimits(max_connections_per_address=2))
    try:
        first, second = await connect(number), await connect(number)
        await eventually(lambda: site.connections == 2, message="two connections counted")
        third = await connect(number)
        await third.closed
        assert third.received == b""
        assert site.refused_connections == 1
        first.tcp.loseConnection()
        await first.closed
        await eventually(lambda: site.connections == 1, message="closed connection forgotten")
        fourth = await connect(number)
        fourth.tcp.write(request_head("GET", number, "Connection: close\r\n"))
        await fourth.closed
        assert fourth.status == 200
        second.tcp.loseConnection()
        await second.closed
        await eventually(lambda: site.connections == 0 and site.by_address == {}, message="all forgotten")
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_host_header_must_name_this_server() -> None:
    """DNS rebinding: a foreign name in Host is refused; IP literals, localhost and configured names pass."""
    port, number, _, _ = await serve(SiteLimits(allowed_hosts=("iop.example.org",)))
    try:
        for host, status in (
            ("attacker.example", 421),
            (f"127.0.0.1:{number}", 200),
            (f"localhost:{number}", 200),
            ("iop.example.org", 200),
            ("[::1]:80", 200),
        ):
            client = await connect(number)
            client.tcp.write(request_head("GET", number, "Connection: close\r\n", host=host))
            await client.closed
            assert client.status == status, host
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_browser_writes_need_json_and_the_same_origin() -> None:
    """A cross-site form POST (text/plain, foreign Origin) never reaches the route."""
    port, number, echo, _ = await serve()
    try:
        cases = [
            ("Content-Type: text/plain\r\n", 415, "unsupported_media_type"),
            ("Content-Type: application/json\r\nOrigin: http://evil.example\r\n", 403, "cross_origin"),
            ("Content-Type: application/json\r\nOrigin: null\r\n", 403, "cross_origin"),
        ]
        for headers, status, code in cases:
            client = await connect(number)
            client.tcp.write(request_head("POST", number, headers + "Content-Length: 2\r\n") + b"{}")
            await client.closed
            assert (client.status, client.body["error"]["code"]) == (status, code)
        same = await connect(number)
        same.tcp.write(
            request_head(
                "POST",
                number,
                f"Content-Type: application/json; charset=utf-8\r\nOrigin: http://127.0.0.1:{number}\r\n"
                "Content-Length: 2\r\nConnection: close\r\n",
            )
            + b"{}"
        )
        await same.closed
        assert same.status == 200
        assert echo.bodies == [2]
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_unknown_methods_get_json_405() -> None:
    """OPTIONS and TRACE are answered 405 in JSON with an Allow header, not a 500."""
    port, number, _, _ = await serve()
    try:
        for method in ("OPTIONS", "TRACE", "PROPFIND"):
            client = await connect(number)
            client.tcp.write(request_head(method, number))
            await client.closed
            assert client.status == 405
            assert client.body["error"]["code"] == "method_not_allowed"
            assert b"Allow: GET, HEAD, POST" in client.received
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_answers_carry_security_headers_and_no_version() -> None:
    """Every answer has the security headers and a Server header without a version."""
    port, number, _, _ = await serve()
    try:
        client = await connect(number)
        client.tcp.write(request_head("GET", number, "Connection: close\r\n"))
        await client.closed
        head = client.received.split(b"\r\n\r\n", 1)[0]
        assert client.status == 200
        for header in (b"X-Content-Type-Options: nosniff", b"X-Frame-Options: DENY", b"Content-Security-Policy: "):
            assert header in head
        assert b"Server: twisted-iop\r\n" in head + b"\r\n"
        assert b"TwistedWeb" not in head
    finally:
        await port.stopListening()


def test_host_allowed_rules() -> None:
    """Host rules: IP literals and localhost always; names only when configured; junk never."""
    assert host_allowed(b"10.1.2.3:8080", ())
    assert host_allowed(b"[fe80::1]", ())
    assert host_allowed(b"LOCALHOST", ())
    assert not host_allowed(b"localhost.attacker.example", ())
    assert not host_allowed(b"example.org", ())
    assert host_allowed(b"Example.ORG.", ("example.org",))
    assert not host_allowed(b"", ())
    assert not host_allowed(None, ())
    assert not host_allowed(b"\xff\xfe", ())


class OwnPolicy(Resource):
    """Answers with its own Content-Security-Policy and a Server header of its own."""

    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"Content-Security-Policy", b"default-src 'none'")
        request.setHeader(b"Server", b"something/1.0")
        return b"{}"


def _answer_head(site: GuardedSite, host: bytes = b"127.0.0.1") -> bytes:
    """The head of the answer to one GET through ``site`` (no socket)."""
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
    return bytes(transport.value().split(b"\r\n\r\n", 1)[0])


def test_an_answers_own_security_header_is_kept_and_the_server_header_is_ours() -> None:
    """A header the answer set itself is written once, as set; the others are added; Server is ours."""
    head = _answer_head(GuardedSite(OwnPolicy(), reactor=Clock()))
    lines = head.split(b"\r\n")
    assert lines.count(b"Content-Security-Policy: default-src 'none'") == 1
    assert sum(line.lower().startswith(b"content-security-policy:") for line in lines) == 1
    assert b"X-Frame-Options: DENY" in lines and b"X-Content-Type-Options: nosniff" in lines
    assert [line for line in lines if line.lower().startswith(b"server:")] == [b"Server: twisted-iop"]


def test_host_verdicts_are_remembered_within_a_bound() -> None:
    """A site answers each Host header by the same rules, however many distinct ones it sees,
    and remembers at most HOST_VERDICTS_KEPT of them."""
    site = GuardedSite(OwnPolicy(), SiteLimits(allowed_hosts=("iop.example",)), reactor=Clock())
    for i in range(HOST_VERDICTS_KEPT * 2 + 7):
        name = f"h{i}.example".encode()
        assert site.host_allowed(name) is False
        assert site.host_allowed(b"iop.example:%d" % i) is True
        assert site.host_allowed(b"10.0.0.1:%d" % i) is True
        assert len(site._host_verdicts) <= HOST_VERDICTS_KEPT
    assert b" 421 " in _answer_head(site, b"evil.example").split(b"\r\n")[0]
    assert b" 200 " in _answer_head(site, b"iop.example").split(b"\r\n")[0]


def _deadline_timers(clock: Clock) -> list[Any]:
    """The pending deadline timers of every channel on ``clock``."""
    return [
        call
        for call in clock.getDelayedCalls()
        if getattr(getattr(call, "func", None), "__name__", "") == "_deadline_passed"
    ]


def test_one_timer_carries_the_header_then_the_request_deadline() -> None:
    """Headers in time move the request's single timer on to the request deadline,
    counted from the request's start; a finished request's timer ends without a 408."""
    clock = Clock()
    site = GuardedSite(Echo(), SiteLimits(header_timeout_seconds=10, request_timeout_seconds=30), reactor=clock)
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    clock.advance(9)
    channel.dataReceived(b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n{")
    clock.advance(20.5)
    assert transport.value() == b"" and site.timed_out_requests == 0
    assert len(_deadline_timers(clock)) == 1
    clock.advance(0.5)
    assert b" 408 " in transport.value().split(b"\r\n")[0] and b"the request did not arrive" in transport.value()
    assert site.timed_out_requests == 1

    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40001))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert b" 200 " in transport.value().split(b"\r\n")[0]
    assert len(_deadline_timers(clock)) <= 1  # the connection's one timer, never one per request
    clock.advance(60)
    assert site.timed_out_requests == 1 and transport.value().count(b"HTTP/1.1") == 1
    assert _deadline_timers(clock) == []  # an idle connection keeps no timer


def test_a_kept_alive_connections_next_request_has_its_own_header_deadline() -> None:
    """After a request whose timer waited for its longer request deadline, the next
    request's headers must still arrive within the header deadline of that request."""
    clock = Clock()
    site = GuardedSite(Echo(), SiteLimits(header_timeout_seconds=10, request_timeout_seconds=30), reactor=clock)
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n")
    channel.dataReceived(b"Content-Length: 2\r\n\r\n{")
    clock.advance(12)  # the timer passed the header deadline and now waits for second 30
    channel.dataReceived(b"}")
    assert b" 200 " in transport.value().split(b"\r\n")[0]
    clock.advance(1)
    channel.dataReceived(b"GET / HTTP/1.1\r\n")  # headers never finish
    clock.advance(9.5)
    assert site.timed_out_requests == 0
    clock.advance(0.5)
    assert site.timed_out_requests == 1
    assert b"the headers did not arrive within 10s" in transport.value()


class Addresses(Resource):
    """Answers with what the request says of its connection: local and remote address, TLS."""

    isLeaf = True

    def render_GET(self, request: Any) -> bytes:
        request.setHeader(b"content-type", b"application/json")
        host, peer = request.getHost(), request.getClientAddress()
        body = json.dumps({"host": host.port, "peer": peer.port, "secure": request.isSecure()}).encode()
        request.setHeader(b"content-length", b"%d" % len(body))
        return body


class CountingTransport(StringTransport):
    """A transport that counts how often it is asked for its addresses."""

    def __init__(self) -> None:
        super().__init__(IPv4Address("TCP", "127.0.0.1", 8080), IPv4Address("TCP", "127.0.0.1", 40000))
        self.asked = 0

    def getHost(self) -> IPv4Address:
        self.asked += 1
        return cast(IPv4Address, super().getHost())

    def getPeer(self) -> IPv4Address:
        self.asked += 1
        return cast(IPv4Address, super().getPeer())


def test_a_connection_is_asked_for_its_addresses_once() -> None:
    """Every request on a kept-alive connection sees its addresses and TLS state; the
    transport is asked for them once per connection, not per request."""
    site = GuardedSite(Addresses(), reactor=Clock())
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = CountingTransport()
    channel.makeConnection(transport)
    for _ in range(3):
        channel.dataReceived(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    decoder = json.JSONDecoder()
    bodies = [decoder.raw_decode(part.decode())[0] for part in transport.value().split(b"\r\n\r\n")[1:]]
    assert bodies == [{"host": 8080, "peer": 40000, "secure": False}] * 3
    assert transport.asked <= 2


# -- connection counts on TLS and after a WebSocket upgrade ---------------------------


class EchoServer(WebSocketServerProtocol):
    """Sends every message back."""

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.sendMessage(payload, isBinary)


class EchoClient(WebSocketClientProtocol):
    """Keeps what it receives; fires ``opened`` and ``closed``."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: Deferred[None] = Deferred()
        self.closed: Deferred[None] = Deferred()
        self.messages: list[bytes] = []

    def onOpen(self) -> None:
        self.opened.callback(None)

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        self.messages.append(payload)

    def onClose(self, wasClean: bool, code: Optional[int], reason: Optional[str]) -> None:
        if not self.closed.called:
            self.closed.callback(None)


class TakeOver(Resource):
    """Hands every request to a WebSocket resource, as the Control Plane's ``/client`` does."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        factory = WebSocketServerFactory()
        factory.protocol = EchoServer
        self._websocket = WebSocketResource(factory)

    def render(self, request: Any) -> Any:
        request.channel.prepare_takeover()
        return self._websocket.render(request)


class Listener:
    """A guarded site on 127.0.0.1:0 over plain TCP or TLS, and how to dial it."""

    def __init__(self, tls: bool, directory: Path) -> None:
        self.tls = tls
        self._key, self._certificate = self_signed(directory)

    async def serve(self, site: GuardedSite) -> int:
        """Listen with ``site``; return the port."""
        description = "tcp:0:interface=127.0.0.1"
        if self.tls:
            description = f"ssl:0:interface=127.0.0.1:privateKey={self._key}:certKey={self._certificate}"
        self.port = await serverFromString(reactor, description).listen(site)
        number: int = self.port.getHost().port
        return number

    def endpoint(self, number: int) -> Any:
        """A client endpoint to the listener (trusting its certificate on TLS)."""
        if not self.tls:
            return TCP4ClientEndpoint(reactor, "127.0.0.1", number)
        trust = Certificate.loadPEM(self._certificate.read_bytes())
        return SSL4ClientEndpoint(reactor, "127.0.0.1", number, optionsForClientTLS("localhost", trust))

    async def raw(self, number: int) -> RawClient:
        """A raw HTTP client connection."""
        return cast("RawClient", await connectProtocol(self.endpoint(number), RawClient()))

    async def websocket(self, number: int) -> EchoClient:
        """An open WebSocket to the listener."""
        scheme = "wss" if self.tls else "ws"
        factory = WebSocketClientFactory(f"{scheme}://localhost:{number}/ws")
        factory.protocol = EchoClient
        client: EchoClient = await self.endpoint(number).connect(factory)
        await client.opened
        return client


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_connections_are_counted_until_they_close(tls: bool, tmp_path: Path) -> None:
    """On TCP and TLS alike: the per-address cap refuses a third connection,
    a closed one is forgotten at once, and close_all closes the rest."""
    listener = Listener(tls, tmp_path)
    site = GuardedSite(Echo(), SiteLimits(max_connections_per_address=2), reactor=reactor)
    number = await listener.serve(site)
    try:
        first, second = await listener.raw(number), await listener.raw(number)
        await eventually(lambda: site.connections == 2, message="two connections counted")
        third = await listener.raw(number)
        await third.closed
        assert site.refused_connections == 1
        first.tcp.write(request_head("GET", number, "Connection: close\r\n"))
        await first.closed
        assert first.status == 200
        await eventually(lambda: site.connections == 1, message="the closed connection forgotten")
        site.close_all()
        await second.closed
        await eventually(lambda: site.connections == 0 and site.by_address == {}, message="all forgotten")
    finally:
        await listener.port.stopListening()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
async def test_a_websocket_that_took_the_socket_over_stays_counted(tls: bool, tmp_path: Path) -> None:
    """After a WebSocket upgrade took the socket from the HTTP channel, the
    connection still counts against the caps until the socket closes, and
    close_all still closes it."""
    listener = Listener(tls, tmp_path)
    site = GuardedSite(TakeOver(), SiteLimits(max_connections_per_address=1), reactor=reactor)
    number = await listener.serve(site)
    try:
        client = await listener.websocket(number)
        client.sendMessage(b"ping", isBinary=True)
        await eventually(lambda: client.messages == [b"ping"], message="echo over the taken-over socket")
        assert site.connections == 1
        refused = await listener.raw(number)
        await refused.closed
        assert site.refused_connections == 1
        client.sendClose()
        await client.closed
        await eventually(lambda: site.connections == 0 and site.by_address == {}, message="closed socket forgotten")
        again = await listener.websocket(number)
        assert site.connections == 1
        site.close_all()
        await again.closed
        await eventually(lambda: site.connections == 0 and site.by_address == {}, message="all forgotten")
    finally:
        await listener.port.stopListening()


@pytest_twisted.ensureDeferred
async def test_client_websocket_on_the_http_port_is_counted_until_it_closes() -> None:
    """The Control Plane's /client on its HTTP port: counted by the HTTP site
    while open, forgotten when it closes, closed by the site's close_all."""
    cp = await start_control_plane()
    try:
        site = cp.service.http_site
        number = cp.service.port("http")
        factory = WebSocketClientFactory(f"ws://127.0.0.1:{number}/client")
        factory.protocol = EchoClient
        client = cast(EchoClient, await TCP4ClientEndpoint(reactor, "127.0.0.1", number).connect(factory))
        await client.opened
        assert site.connections == 1
        client.sendClose()
        await client.closed
        await eventually(lambda: site.connections == 0 and site.by_address == {}, message="closed socket forgotten")
        again = cast(EchoClient, await TCP4ClientEndpoint(reactor, "127.0.0.1", number).connect(factory))
        await again.opened
        site.close_all()
        await again.closed
        await eventually(lambda: site.connections == 0, message="closed by close_all")
    finally:
        await cp.stop()


def test_cross_origin_websocket_upgrades_are_refused() -> None:
    """A WebSocket upgrade (a GET) from a page of another origin is refused 403;
    the same origin, or no Origin (not a browser), reaches the resource."""
    site = GuardedSite(Echo(), reactor=Clock())
    cases = (
        (b"Origin: http://evil.example\r\n", b" 403 "),
        (b"Origin: null\r\n", b" 403 "),
        (b"Origin: http://127.0.0.1:8080\r\n", b" 200 "),
        (b"", b" 200 "),
    )
    for origin, status in cases:
        channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
        transport = StringTransport()
        channel.makeConnection(transport)
        channel.dataReceived(
            b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + origin
            + b"\r\n"
        )
        head = transport.value().split(b"\r\n", 1)[0]
        assert status in head, (origin, head)
        if status == b" 403 ":
            assert b"cross-origin WebSockets are not allowed" in transport.value()
