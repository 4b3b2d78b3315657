"""A raw HTTP/1.1 client over TCP, for tests that need to misbehave on purpose."""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure


class RawClient(Protocol):
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
    return await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), RawClient())


def request_head(method: str, port: int, extra: str = "", host: Optional[str] = None, path: str = "/x") -> bytes:
    """A request line and headers (``extra`` is more header lines, each ending in CRLF)."""
    host = host or f"127.0.0.1:{port}"
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()
