"""HTTP for tests: JSON over treq, a raw HTTP/1.1 client that misbehaves on
purpose, and the inference gateway's requests and event streams."""

from __future__ import annotations

import json
from typing import Any, Optional, cast

import attrs
import treq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.wires.peers import TransportAccess

JSON_HEADERS: dict[bytes | str, list[bytes | str]] = {b"Content-Type": [b"application/json"]}


def _with_json_type(headers: Optional[dict[bytes, list[bytes]]]) -> dict[bytes | str, list[bytes | str]]:
    """``headers`` with a JSON content type, typed as treq takes them."""
    merged = dict(JSON_HEADERS)
    for name, values in (headers or {}).items():
        merged[name] = [*values]
    return merged


async def get_json(url: str, **kwargs: Any) -> tuple[int, Any]:
    """GET ``url``; return status and parsed JSON body."""
    response = await treq.get(url, **kwargs)
    return response.code, json.loads(await response.content())


async def post_json(url: str, payload: Any, **kwargs: Any) -> tuple[int, Any]:
    """POST ``payload`` (JSON, or bytes as they are) to ``url``; return status and parsed JSON body."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    headers = _with_json_type(kwargs.pop("headers", None))
    response = await treq.post(url, data=data, headers=headers, **kwargs)
    return response.code, json.loads(await response.content())


# -- raw HTTP/1.1 ------------------------------------------------------------------------


class RawClient(TransportAccess, Protocol):
    """Writes what it is told and keeps what it receives."""

    def __init__(self) -> None:
        self.received = b""
        self.closed: Deferred[None] = Deferred()
        self.is_closed = False

    def dataReceived(self, data: bytes) -> None:
        self.received += data

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.is_closed = True
        self.closed.callback(None)

    @property
    def status(self) -> int:
        return int(self.received.split(b" ", 2)[1]) if self.received.startswith(b"HTTP/1.1 ") else 0

    @property
    def body(self) -> Any:
        return json.loads(self.received.split(b"\r\n\r\n", 1)[1])


async def connect(port: int) -> RawClient:
    """A raw TCP client of the site."""
    return cast("RawClient", await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), RawClient()))


def request_head(method: str, port: int, extra: str = "", host: Optional[str] = None, path: str = "/x") -> bytes:
    """A request line and headers (``extra`` is more header lines, each ending in CRLF)."""
    host = host or f"127.0.0.1:{port}"
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


# -- the inference gateway -----------------------------------------------------------


def chat(stream: bool = False, max_tokens: int = 4, content: str = "hello", **extra: Any) -> bytes:
    """A chat completion request body."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    body.update(extra)
    return json.dumps(body).encode()


class SSEReader(Protocol):
    """Reads a server-sent event stream; can hang up after some events."""

    def __init__(self, hang_up_after: Optional[int] = None) -> None:
        self.events: list[bytes] = []
        self.hang_up_after = hang_up_after
        self.first: Deferred[None] = Deferred()
        self.done: Deferred[list[bytes]] = Deferred()
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        """Split events; fire ``first`` on the first; hang up when told."""
        self._buffer += data
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                self.events.append(event[6:])
                if not self.first.called:
                    self.first.callback(None)
                if self.hang_up_after is not None and len(self.events) >= self.hang_up_after:
                    assert self.transport is not None
                    cast(IPushProducer, self.transport).stopProducing()  # a TCP transport is a producer
                    return

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        """Fire ``done`` with the events read."""
        if not self.done.called:
            self.done.callback(self.events)


@attrs.define
class Answer:
    """One HTTP answer of the gateway."""

    code: int
    headers: Any
    body: bytes = b""
    events: list[bytes] = attrs.field(factory=list)

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


async def post(base: str, path: str, body: bytes, headers: Optional[dict[bytes, list[bytes]]] = None) -> Answer:
    """POST and read the whole answer (events split out for event streams)."""
    all_headers = _with_json_type(headers)
    response = await treq.post(base + path, data=body, headers=all_headers, timeout=30)
    content = await response.content()
    events = []
    if (response.headers.getRawHeaders(b"content-type") or [b""])[0].startswith(b"text/event-stream"):
        events = [e[6:] for e in content.split(b"\n\n") if e.startswith(b"data: ")]
    return Answer(response.code, response.headers, content, events)


async def open_stream(
    base: str, body: bytes, hang_up_after: Optional[int] = None, headers: Optional[dict[bytes, list[bytes]]] = None
) -> tuple[Any, SSEReader]:
    """POST a streaming request; return the response and a reader fed with its body."""
    all_headers = _with_json_type(headers)
    response = await treq.post(
        base + "/v1/chat/completions",
        data=body,
        headers=all_headers,
        unbuffered=True,
        timeout=30,
    )
    reader = SSEReader(hang_up_after)
    response.deliverBody(reader)
    return response, reader
