"""Drive the accepting side of every wire without sockets (tests and bench).

Each driver builds the real factory of one wire over its real state (the
Control Plane's :class:`EdgeWireFactory` with an ``EdgeRegistry`` and an
``EdgeGateway``; the Edge's :class:`NodeServerFactory` with a
``NodeRegistry``; the ``/client`` :class:`ClientWireFactory`), connects
protocols to ``StringTransport``s, and feeds them bytes. The checks here
say what docs/wire.md promises a hostile peer: nothing is logged as a
failure, a violating connection is answered or closed, and a good peer is
still served afterwards. The fuzz tests and ``bench/wire_fuzz.py`` share
them.

Only tests and benchmarks import this module. The frames it feeds and
reads are built and decoded by :mod:`twisted_iop.testing.wires.frames`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Optional

from google.protobuf.message import DecodeError, Message
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogLevel, globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import provider

from twisted_iop.testing.configs import edge_mapping, node_hello
from twisted_iop.testing.wires.frames import decode_frames, ws_frame, ws_messages
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import (
    PREFIX_BYTES,
    RESPONSE_BODIES,
    FramedPeerProtocol,
    PeerSettings,
    frame,
    make_envelope,
)

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot

#: Bodies a peer sends unsolicited: never answered, whatever their request id.
UNSOLICITED_BODIES = frozenset(
    {"edge_event", "node_ready", "node_health_report", "node_load_report", "node_instances_report"}
)

#: The edge id and node id a good peer uses in the drivers.
GOOD_EDGE_ID = "edge-good"
GOOD_NODE_ID = "node-1"


def edge_hello(edge_id: str = GOOD_EDGE_ID) -> pb.EdgeHelloRequest:
    """A hello the Control Plane accepts."""
    return pb.EdgeHelloRequest(
        edge_id=edge_id,
        protocol_major=PROTOCOL_MAJOR,
        commands=[pb.CommandSpec(name="node.drain", target_kind="node")],
    )


# -- the log --------------------------------------------------------------------


class LogCapture:
    """Every event logged while active; :meth:`errors` are the ones a test fails on."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

        @provider(ILogObserver)
        def observe(event: dict[str, Any]) -> None:
            self.events.append(event)

        self._observer = observe

    @contextmanager
    def active(self) -> Iterator[LogCapture]:
        """Capture while the ``with`` block runs."""
        globalLogPublisher.addObserver(self._observer)
        try:
            yield self
        finally:
            globalLogPublisher.removeObserver(self._observer)

    def errors(self) -> list[dict[str, Any]]:
        """Logged failures and critical events (an unhandled error is both)."""
        return [
            e for e in self.events if "log_failure" in e or e.get("log_level") in (LogLevel.critical, LogLevel.error)
        ]

    def warnings(self) -> list[dict[str, Any]]:
        """Warnings logged so far."""
        return [e for e in self.events if e.get("log_level") == LogLevel.warn]

    def describe(self, events: list[dict[str, Any]]) -> str:
        """The events as text, for an assertion message."""
        from twisted.logger import formatEvent

        lines = []
        for event in events:
            line = formatEvent(event)
            failure = event.get("log_failure")
            if isinstance(failure, Failure):
                line += "\n" + failure.getTraceback()
            lines.append(line)
        return "\n".join(lines)


# -- framed TCP wires ------------------------------------------------------------


class FramedConnection:
    """One accepted protocol on a ``StringTransport``."""

    def __init__(self, protocol: FramedPeerProtocol) -> None:
        self.protocol = protocol
        self.transport = StringTransport()
        self.fed = bytearray()
        protocol.makeConnection(self.transport)

    def feed(self, data: bytes) -> None:
        """Deliver ``data`` as one read."""
        self.fed += data
        self.protocol.dataReceived(data)

    def send(self, body: str, message: Message, request_id: int = 0) -> None:
        """Deliver one well-formed frame."""
        self.feed(frame(make_envelope(body, message, request_id)))

    def sent(self) -> list[pb.Envelope]:
        """Everything the protocol wrote, decoded."""
        return decode_frames(self.transport.value())

    @property
    def closed(self) -> bool:
        """Whether the protocol closed (or started closing) the connection."""
        return self.transport.disconnecting or self.protocol.closing

    def drop(self) -> None:
        """The peer goes away."""
        self.protocol.connectionLost(Failure(ConnectionError("test peer gone")))


def check_answered_or_closed(connection: FramedConnection, limit: int, hello_limit: int) -> None:
    """What docs/wire.md promises about one connection that was fed anything.

    * closed: the last frame written says why (an ``error``, or a hello
      answer with ``accepted=false``);
    * open: every complete frame fed was a valid envelope within the size
      limits, the first one a hello, and every request in it (a non-zero
      ``request_id`` on a body that is neither an answer nor unsolicited)
      was answered with its ``request_id``.
    """
    written = connection.sent()
    if connection.closed:
        assert written, "closed without saying why"
        last = written[-1]
        body = last.WhichOneof("body")
        if body in ("edge_hello_response", "node_hello_response"):
            assert not getattr(last, body).accepted, "closed after accepting hello"
        else:
            assert body == "error", f"closed, last frame was {body}"
        return
    answered = {e.request_id for e in written}
    data = bytes(connection.fed)
    offset = 0
    first = True
    while len(data) - offset >= PREFIX_BYTES:
        (length,) = struct.unpack(">I", data[offset : offset + PREFIX_BYTES])
        assert length <= (hello_limit if first else limit), f"open after a frame of {length} bytes"
        end = offset + PREFIX_BYTES + length
        if end > len(data):
            break
        envelope = pb.Envelope()
        try:
            envelope.ParseFromString(data[offset + PREFIX_BYTES : end])
        except DecodeError:
            raise AssertionError("open after a frame that does not parse") from None
        body = envelope.WhichOneof("body")
        if first:
            assert body in ("edge_hello_request", "node_hello_request"), f"open after a first frame {body}"
            first = False
        rid = envelope.request_id
        if rid and body not in RESPONSE_BODIES and body not in UNSOLICITED_BODIES:
            assert rid in answered, f"request {rid} ({body}) neither answered nor closed"
        offset = end


class EdgeWireDriver:
    """The Control Plane's edge wire over a real registry and gateway."""

    hello_body = "edge_hello_request"

    def __init__(self, settings: PeerSettings = PeerSettings()) -> None:
        from twisted_iop.controlplane.fleet.registry import EdgeRegistry
        from twisted_iop.controlplane.requests.gateway import EdgeGateway
        from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory

        self.clock = Clock()
        self.settings = settings
        self.registry = EdgeRegistry(self.clock)
        self.gateway = EdgeGateway(self.registry, self.clock)
        self.factory = EdgeWireFactory(self.registry, self.clock, settings)
        #: Outcomes of the requests the Control Plane sent (so none is left unhandled).
        self.outcomes: list[Any] = []
        self._edges = 0

    def connect(self) -> FramedConnection:
        """A new accepted connection."""
        return FramedConnection(self.factory.buildProtocol(None))

    def hello_message(self) -> Any:
        """A hello with a fresh edge id."""
        self._edges += 1
        return edge_hello(f"edge-{self._edges}")

    def open_requests(self, connection: FramedConnection) -> None:
        """Make the Control Plane wait on the edge (ids 1 and 2): a status request and a command."""
        edge_id = getattr(connection.protocol, "edge_id", None)
        if not edge_id or connection.closed:
            return
        status = self.gateway.status(edge_id)
        status.addCallbacks(self._render, self.outcomes.append)
        try:
            done = self.gateway.dispatch(edge_id, "node.drain", "node-1", {}, 30.0).ended
        except Exception as e:
            self.outcomes.append(e)
            return
        done.addBoth(self.outcomes.append)

    def _render(self, snapshot: StatusSnapshot) -> None:
        # What the HTTP views would show of whatever the edge answered.
        from twisted_iop.controlplane.http import json_views

        self.outcomes.append([json_views.node_json(n) for n in snapshot.parse().nodes])
        self.outcomes.append(snapshot.counts)

    def check_good_peer(self) -> None:
        """A well-behaved edge is still enrolled and answered on this factory."""
        good = self.connect()
        good.send("edge_hello_request", edge_hello(GOOD_EDGE_ID), 1)
        good.send("ping", pb.Ping(sent_at_ms=1), 2)
        written = good.sent()
        assert written[0].edge_hello_response.accepted, written
        assert written[1].WhichOneof("body") == "pong"
        assert self.registry.get(GOOD_EDGE_ID).connected
        status = self.gateway.status(GOOD_EDGE_ID)
        request = good.sent()[-1]
        assert request.WhichOneof("body") == "edge_status_request"
        good.send("edge_status_response", pb.EdgeStatusResponse(edge_id=GOOD_EDGE_ID), request.request_id)
        results: list[Any] = []
        status.addBoth(results.append)
        assert results and results[0].parse().edge_id == GOOD_EDGE_ID, results
        good.drop()

    def finish(self) -> None:
        """Let every deadline pass so no request is left waiting."""
        self.clock.advance(3600)


class NodeWireDriver:
    """The Edge's node wire over a real NodeRegistry."""

    hello_body = "node_hello_request"

    def __init__(self, settings: PeerSettings = PeerSettings()) -> None:
        from twisted_iop.edge.config import parse_edge_config
        from twisted_iop.edge.nodes.registry import NodeRegistry
        from twisted_iop.edge.nodes.wire import NodeServerFactory

        self.clock = Clock()
        self.settings = settings
        self.registry = NodeRegistry(parse_edge_config(edge_mapping(), {}), self.clock)
        self.factory = NodeServerFactory(self.registry, self.clock, settings)
        self.outcomes: list[Any] = []

    def connect(self) -> FramedConnection:
        """A new accepted connection."""
        return FramedConnection(self.factory.buildProtocol(None))

    def hello_message(self) -> Any:
        """The configured Node's hello."""
        return node_hello()

    def open_requests(self, connection: FramedConnection) -> None:
        """Make the Edge wait on the node (a probe), once the node is ready."""
        if connection.closed or not self.registry.is_ready(GOOD_NODE_ID):
            return
        self.registry.probe_node(GOOD_NODE_ID, 30.0).addBoth(self.outcomes.append)

    def check_good_peer(self) -> None:
        """A well-behaved node is still accepted, made ready and probed on this factory."""
        good = self.connect()
        good.send("node_hello_request", node_hello(), 1)
        assert good.sent()[0].node_hello_response.accepted, good.sent()
        report = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
        good.send("node_ready", pb.NodeReady(providers=[report]))
        assert self.registry.is_ready(GOOD_NODE_ID)
        results: list[Any] = []
        self.registry.probe_node(GOOD_NODE_ID, 5.0).addBoth(results.append)
        probe = good.sent()[-1]
        assert probe.WhichOneof("body") == "node_probe_request"
        good.send("node_probe_response", pb.NodeProbeResponse(health=[report]), probe.request_id)
        assert results == [[]], results
        good.drop()

    def finish(self) -> None:
        """Let every deadline pass so no request is left waiting."""
        self.clock.advance(3600)


# -- the client WebSocket -----------------------------------------------------------

_HANDSHAKE = (
    b"GET /client HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


class ClientConnection:
    """One ``/client`` socket after the opening handshake.

    ``headers`` are further request headers of the handshake (each ending
    in CRLF); :attr:`handshake_response` is the server's answer to it.
    """

    def __init__(self, protocol: Any, headers: bytes = b"") -> None:
        self.protocol = protocol
        self.transport = StringTransport()
        protocol.makeConnection(self.transport)
        protocol.dataReceived(_HANDSHAKE + headers + b"\r\n")
        head, _, rest = self.transport.value().partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        #: The status line and headers of the server's handshake answer.
        self.handshake_response = head
        self.transport.clear()
        self.transport.write(rest)
        self.sent_envelopes: list[pb.ClientEnvelope] = []

    def feed(self, data: bytes) -> None:
        """Deliver raw bytes (WebSocket frames) as one read."""
        self.protocol.dataReceived(data)

    def send(self, body: str, message: Message, request_id: int = 0) -> None:
        """Send one well-formed ``ClientEnvelope``."""
        envelope = pb.ClientEnvelope(request_id=request_id)
        getattr(envelope, body).CopyFrom(message)
        self.feed(ws_frame(envelope.SerializeToString()))

    def received(self) -> tuple[list[pb.ClientEnvelope], Optional[int]]:
        """What the server sent: messages and close code."""
        return ws_messages(self.transport.value())

    @property
    def closed(self) -> bool:
        """Whether the server started closing the socket."""
        from autobahn.websocket.protocol import WebSocketProtocol

        return self.protocol.state != WebSocketProtocol.STATE_OPEN or self.transport.disconnecting

    def drop(self) -> None:
        """The client goes away (cancels Autobahn's timers)."""
        from twisted.internet.error import ConnectionDone

        self.protocol.connectionLost(Failure(ConnectionDone()))


class ClientWireDriver:
    """The ``/client`` WebSocket over a real EdgeRegistry."""

    def __init__(self, **settings: Any) -> None:
        from twisted_iop.controlplane.fleet.registry import EdgeRegistry
        from twisted_iop.controlplane.wires.client_wire import ClientWireFactory, ClientWireSettings

        self.clock = Clock()
        self.registry = EdgeRegistry(self.clock)
        # No Autobahn auto-ping: its timers run on the global reactor.
        settings.setdefault("auto_ping_interval_seconds", 0.0)
        self.factory = ClientWireFactory(self.registry, ClientWireSettings(**settings), self.clock)

    def connect(self) -> ClientConnection:
        """A new socket, opened."""
        return ClientConnection(self.factory.buildProtocol(None))

    def check_good_peer(self) -> None:
        """A well-behaved client still says hello and subscribes on this factory."""
        good = self.connect()
        good.send("client_hello_request", pb.ClientHelloRequest(client_name="good", protocol_major=PROTOCOL_MAJOR), 1)
        good.send("subscribe_request", pb.SubscribeRequest(), 2)
        messages, close_code = good.received()
        assert close_code is None
        assert [m.WhichOneof("body") for m in messages] == ["client_hello_response", "subscribe_response"], messages
        assert messages[0].client_hello_response.accepted
        good.drop()
