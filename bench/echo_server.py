#!/usr/bin/env python
"""The reference for fleet rounds: a bare Twisted length-prefixed echo server.

It does the least work a poll can cost: edges dial in and say hello (answered
with one constant frame), and ``GET /round`` writes one constant status
request frame to every edge and answers once every edge has sent one frame
back, counting frames by their length prefix without parsing them.
``GET /count`` says how many edges have said hello. It prints
``echo edge_port=N http_port=M`` once listening (loopback only).
"""

from __future__ import annotations

import sys

from twisted.internet import reactor
from twisted.internet.protocol import Factory, Protocol
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from twisted_iop.daemon import raise_open_file_limit
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame, make_envelope

#: The fake edges number their hello 1, so one constant answer fits them all.
HELLO_ACCEPTED = frame(make_envelope("edge_hello_response", pb.EdgeHelloResponse(accepted=True), 1))
POLL = frame(make_envelope("edge_status_request", pb.EdgeStatusRequest(), 2))


class Edge(Protocol):
    """Counts frames; the first is the hello."""

    def connectionMade(self) -> None:
        self.buffer = b""
        self.said_hello = False

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4 and len(self.buffer) >= 4 + (n := int.from_bytes(self.buffer[:4], "big")):
            self.buffer = self.buffer[4 + n :]
            if self.said_hello:
                fleet.answered()
            else:
                self.said_hello = True
                fleet.edges.append(self)
                self.transport.write(HELLO_ACCEPTED)


class Fleet(Resource):
    """``/round`` and ``/count``."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.edges: list[Edge] = []
        self.waiting = 0
        self.request = None

    def render_GET(self, request):  # type: ignore[no-untyped-def]
        if request.path == b"/count":
            return str(len(self.edges)).encode()
        self.waiting, self.request = len(self.edges), request
        for edge in self.edges:
            edge.transport.write(POLL)
        return NOT_DONE_YET

    def answered(self) -> None:
        self.waiting -= 1
        if self.waiting == 0 and self.request is not None:
            self.request.write(str(len(self.edges)).encode())
            self.request.finish()
            self.request = None


raise_open_file_limit()
fleet = Fleet()
edge_port = reactor.listenTCP(0, Factory.forProtocol(Edge), backlog=4096, interface="127.0.0.1")
http_port = reactor.listenTCP(0, Site(fleet), interface="127.0.0.1")
print(f"echo edge_port={edge_port.getHost().port} http_port={http_port.getHost().port}", flush=True)
reactor.run()
sys.exit(0)
