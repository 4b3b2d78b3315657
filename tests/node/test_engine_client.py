"""The Node's lean HTTP/1.1 client for engines (``twisted_iop.node.engines.client``)
against a raw scripted server on 127.0.0.1: body framings, reads split anywhere,
keep-alive reuse, bounds, a kept-alive connection the engine closed, cancel."""

from __future__ import annotations

from typing import Any, Optional, cast

import pytest
import pytest_twisted
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.endpoints import TCP4ServerEndpoint
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from twisted_iop.node.engines.client import MAX_HEAD_BYTES, EngineHTTPClient
from twisted_iop.testing.harness import eventually

REACTOR = global_reactor


class Scripted(Protocol):
    """Answers each request (once its head and body are in) with the next script: a list of byte pieces
    written one per reactor turn, then ``close`` or not."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server
        self.received = b""

    def connectionMade(self) -> None:
        self.server.connections += 1

    def dataReceived(self, data: bytes) -> None:
        self.received += data
        while b"\r\n\r\n" in self.received:
            head, _, rest = self.received.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            self.server.requests.append(head + b"\r\n\r\n" + rest[:length])
            self.received = rest[length:]
            pieces, close = self.server.scripts.pop(0)
            self._write(list(pieces), close)

    def _write(self, pieces: list[bytes], close: bool) -> None:
        if pieces:
            assert self.transport is not None
            self.transport.write(pieces.pop(0))
            REACTOR.callLater(0, self._write, pieces, close)
        elif close:
            assert self.transport is not None
            self.transport.loseConnection()


class ScriptedServer(Factory):
    """The scripts, the requests received and the connections made."""

    def __init__(self) -> None:
        self.scripts: list[tuple[list[bytes], bool]] = []
        self.requests: list[bytes] = []
        self.connections = 0

    def buildProtocol(self, addr: Any) -> Scripted:
        return Scripted(self)


class Reader(Protocol):
    """Collects a body and how it ended."""

    def __init__(self) -> None:
        self.data = b""
        self.reason: Optional[Failure] = None
        self.ended: Deferred[None] = Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        self.reason = reason
        self.ended.callback(None)


@pytest.fixture
def server() -> Any:
    """A scripted server listening on 127.0.0.1 (stopped after the test)."""
    factory = ScriptedServer()
    port = pytest_twisted.blockon(TCP4ServerEndpoint(REACTOR, 0, interface="127.0.0.1").listen(factory))
    factory.url = f"http://127.0.0.1:{port.getHost().port}/v1/chat/completions"  # type: ignore[attr-defined]  # the test's own attribute on the factory
    yield factory
    pytest_twisted.blockon(port.stopListening())


async def fetch(client: EngineHTTPClient, url: str, body: bytes = b"{}") -> tuple[int, Any, bytes, Failure]:
    """POST ``body``; the status, headers, body and how the body ended."""
    return await fetch_answer(client.request("POST", url, data=body, headers={b"Content-Type": [b"application/json"]}))


async def fetch_answer(answer: Deferred[Any]) -> tuple[int, Any, bytes, Failure]:
    """The status, headers, body and how the body ended of the answer ``answer`` fires with."""
    response = await answer
    reader = Reader()
    response.deliverBody(reader)
    await reader.ended
    assert reader.reason is not None
    return response.code, response.headers, reader.data, reader.reason


def split(data: bytes, size: int) -> list[bytes]:
    """``data`` in pieces of ``size`` bytes."""
    return [data[i : i + size] for i in range(0, len(data), size)]


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"b\r\ndata: one\n\n\r\n"
    b"B;ext=1\r\ndata: two\n\n\r\n"
    b"0\r\nX-Trailer: t\r\n\r\n"
)


@pytest.mark.parametrize("piece", [1, 7, 4096])
@pytest_twisted.ensureDeferred
async def test_a_chunked_stream_in_pieces_of_any_size(server: Any, piece: int) -> None:
    """A chunked answer read in pieces of any size gives the same body and ends well;
    the request went as one POST with its length and headers."""
    server.scripts.append((split(CHUNKED, piece), False))
    client = EngineHTTPClient(REACTOR)
    code, headers, body, ended = await fetch(client, server.url, b'{"a":1}')
    assert code == 200
    assert headers.getRawHeaders(b"Content-Type") == [b"text/event-stream"]
    assert body == b"data: one\n\ndata: two\n\n"
    assert ended.check(ResponseDone)
    request = server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nContent-Length: 7\r\n" in request and request.endswith(b'\r\n\r\n{"a":1}')
    client.close()


@pytest_twisted.ensureDeferred
async def test_a_stream_of_one_chunk_per_read(server: Any) -> None:
    """As an engine streams: each event its own chunk in its own read (the common case read
    without the general loop), with an extension, a size in capitals and a padded size among them."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    events = [b"data: %d\n\n" % i for i in range(5)]
    pieces = [
        head,
        b"%x\r\n%s\r\n" % (len(events[0]), events[0]),
        b"%x;x=y\r\n%s\r\n" % (len(events[1]), events[1]),
        b"%X\r\n%s\r\n" % (len(events[2]), events[2]),
        b"0%x\r\n%s\r\n" % (len(events[3]), events[3]),
        b"%x\r\n%s\r\n0\r\n\r\n" % (len(events[4]), events[4]),
    ]
    server.scripts.append((pieces, False))
    client = EngineHTTPClient(REACTOR)
    code, _, body, ended = await fetch(client, server.url)
    assert code == 200
    assert body == b"".join(events)
    assert ended.check(ResponseDone)
    client.close()


@pytest.mark.parametrize(
    "piece",
    [b"5\r\nabcdeXY", b"5\r\nabcdef\r\n", b"-5\r\nabcde\r\n", b"zz\r\nab\r\n"],
    ids=["no CRLF after the bytes", "longer than its size", "negative size", "not hex"],
)
@pytest_twisted.ensureDeferred
async def test_a_malformed_chunk_in_a_read_of_its_own_cuts_the_body(server: Any, piece: bytes) -> None:
    """Never a complete answer, however the one-chunk read is malformed (the engine closes after it)."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    server.scripts.append(([head, b"3\r\nok!\r\n", piece], True))
    client = EngineHTTPClient(REACTOR)
    _, _, body, ended = await fetch(client, server.url)
    assert body.startswith(b"ok!")
    assert not ended.check(ResponseDone, PotentialDataLoss)
    client.close()


class PausingReader(Reader):
    """Pauses its transport at the first bytes, as a stream held by a full Edge connection does."""

    def dataReceived(self, data: bytes) -> None:
        if not self.data:
            cast(IPushProducer, self.transport).pauseProducing()
        super().dataReceived(data)


@pytest_twisted.ensureDeferred
async def test_a_connection_paused_in_the_read_that_ended_its_body_reads_its_next_answer(server: Any) -> None:
    """The reader paused the connection while the same read went on to end the body: the connection,
    back in the pool, must read the next answer on it (it stalled, its bytes unread, until cancelled)."""
    whole = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nb\r\ndata: one\n\n\r\n0\r\n\r\n"
    server.scripts.append(([whole], False))
    server.scripts.append(([whole], False))
    client = EngineHTTPClient(REACTOR)
    response = await client.request("POST", server.url, data=b"{}")
    reader = PausingReader()
    response.deliverBody(reader)
    await reader.ended
    assert reader.data == b"data: one\n\n" and reader.reason is not None and reader.reason.check(ResponseDone)
    second = client.request("POST", server.url, data=b"{}")
    second.addTimeout(5, REACTOR)
    code, _, body, ended = await fetch_answer(second)
    assert (code, body) == (200, b"data: one\n\n") and ended.check(ResponseDone)
    assert server.connections == 1  # the same connection, reused
    client.close()


@pytest_twisted.ensureDeferred
async def test_keep_alive_reuses_the_connection(server: Any) -> None:
    """Two answers in turn (Content-Length, then chunked) travel on one kept connection."""
    server.scripts.append(([b"HTTP/1.1 400 Bad\r\nContent-Length: 5\r\nRetry-After: 3\r\n\r\nerror"], False))
    server.scripts.append(([CHUNKED], False))
    client = EngineHTTPClient(REACTOR)
    code, headers, body, ended = await fetch(client, server.url)
    assert (code, body, headers.getRawHeaders(b"retry-after")) == (400, b"error", [b"3"])
    assert ended.check(ResponseDone)
    assert client.idle_connections() == 1
    code, _, body, ended = await fetch(client, server.url)
    assert (code, body) == (200, b"data: one\n\ndata: two\n\n")
    assert server.connections == 1
    client.close()
    assert client.idle_connections() == 0


@pytest_twisted.ensureDeferred
async def test_a_body_to_the_close_ends_with_potential_data_loss(server: Any) -> None:
    """No length and no chunking: the body runs to the close, which ends it (as Twisted's client says)."""
    server.scripts.append(([b"HTTP/1.1 200 OK\r\n\r\n", b"whole ", b"body"], True))
    client = EngineHTTPClient(REACTOR)
    code, _, body, ended = await fetch(client, server.url)
    assert (code, body) == (200, b"whole body")
    assert ended.check(PotentialDataLoss)
    assert client.idle_connections() == 0


@pytest_twisted.ensureDeferred
async def test_a_cut_chunked_body_is_a_failure(server: Any) -> None:
    """The engine closing mid-body is not a success: the reader is told the answer failed."""
    server.scripts.append(([CHUNKED[:-20]], True))
    client = EngineHTTPClient(REACTOR)
    _, _, body, ended = await fetch(client, server.url)
    assert body.startswith(b"data: one")
    assert ended.check(ResponseFailed) and not ended.check(ResponseDone, PotentialDataLoss)


@pytest.mark.parametrize(
    "answer",
    [
        b"NOT HTTP\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD_BYTES,
    ],
)
@pytest_twisted.ensureDeferred
async def test_a_bad_head_fails_the_request(server: Any, answer: bytes) -> None:
    """A bad status line, a bad length or headers past the bound fail the request (ResponseFailed)."""
    server.scripts.append(([answer], False))
    client = EngineHTTPClient(REACTOR)
    with pytest.raises(ResponseFailed):
        await fetch(client, server.url)


@pytest_twisted.ensureDeferred
async def test_a_closed_connection_before_any_answer_is_never_received(server: Any) -> None:
    """A kept-alive connection the engine closes before answering is ``ResponseNeverReceived``
    (the runner sends such a request once more)."""
    server.scripts.append(([], True))
    client = EngineHTTPClient(REACTOR)
    with pytest.raises(ResponseNeverReceived):
        await fetch(client, server.url)


@pytest_twisted.ensureDeferred
async def test_cancel_before_the_answer_drops_the_connection(server: Any) -> None:
    """Cancelling a request that has no answer yet fails it with CancelledError and closes its connection."""
    server.scripts.append(([], False))
    client = EngineHTTPClient(REACTOR)
    d = client.request("POST", server.url, data=b"{}")
    await eventually(lambda: server.requests, timeout=5, message="the request at the engine")
    d.cancel()
    with pytest.raises(CancelledError):
        await d
    assert client.idle_connections() == 0


@pytest_twisted.ensureDeferred
async def test_a_refused_connection_is_twisteds_error() -> None:
    """Nothing listening: ConnectionRefusedError, as Twisted's Agent gives it."""
    from twisted_iop.testing.redis import free_port

    client = EngineHTTPClient(REACTOR)
    with pytest.raises(ConnectionRefusedError):
        await client.request("POST", f"http://127.0.0.1:{free_port()}/v1/completions", data=b"{}")


@pytest_twisted.ensureDeferred
async def test_a_stopped_reader_gets_nothing_more(server: Any) -> None:
    """A reader that stops (``transport.stopProducing``) drops the connection; nothing more reaches it."""
    server.scripts.append(([CHUNKED[:100], CHUNKED[100:]], False))
    client = EngineHTTPClient(REACTOR)
    response = await client.request("POST", server.url, data=b"{}")

    class Stopper(Reader):
        def dataReceived(self, data: bytes) -> None:
            super().dataReceived(data)
            assert self.transport is not None
            cast(Any, self.transport).stopProducing()

    reader = Stopper()
    response.deliverBody(reader)
    await eventually(lambda: reader.data, timeout=5, message="the first bytes")
    seen = reader.data
    await eventually(lambda: server.connections == 1 and not client.idle_connections(), timeout=5, message="closed")
    assert reader.data == seen
    assert not reader.ended.called


@pytest_twisted.ensureDeferred
async def test_no_content_has_no_body_and_keeps_the_connection(server: Any) -> None:
    """A 204 ends at its head (no length needed) and its connection is reused."""
    server.scripts.append(([b"HTTP/1.1 204 No Content\r\n\r\n"], False))
    client = EngineHTTPClient(REACTOR)
    code, _, body, ended = await fetch(client, server.url)
    assert (code, body) == (204, b"")
    assert ended.check(ResponseDone)
    assert client.idle_connections() == 1
    client.close()


@pytest_twisted.ensureDeferred
async def test_bytes_no_request_asked_for_close_the_connection(server: Any) -> None:
    """An answer longer than its Content-Length: the extra bytes close the connection
    instead of being read as the next request's answer."""
    server.scripts.append(([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", b"junk"], False))
    server.scripts.append(([b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"], False))
    client = EngineHTTPClient(REACTOR)
    _, _, body, _ = await fetch(client, server.url)
    assert body == b"ok"
    await eventually(lambda: client.idle_connections() == 0, timeout=5, message="the connection dropped")
    _, _, body, _ = await fetch(client, server.url)
    assert body == b"next"
    assert server.connections == 2
    client.close()
