"""Scripted edges with hello labels of the test's choosing, connected by the thousand."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater

from twisted_iop.testing.wires.peers import ScriptedEdge
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb

#: Control Plane settings for tests that connect many edges: hellos are not paced.
MANY_EDGES_CONFIG = "edge_wire:\n  hello_admission:\n    max_per_second: 0\n"
#: Hellos answered retry_later are tried again (as an Edge does) at most this many times.
HELLO_ATTEMPTS = 20
#: Edges connected at once while a fleet is built.
CONNECT_CHUNK = 250


class LabelledEdge(ScriptedEdge):
    """A scripted edge whose hello carries ``labels``."""

    def __init__(self, edge_id: str, labels: dict[str, str]) -> None:
        super().__init__(edge_id)
        self.labels = labels

    def hello(self) -> Deferred[pb.EdgeHelloResponse]:
        """Say hello with this edge's labels."""
        request = pb.EdgeHelloRequest(
            edge_id=self.edge_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version="test-edge",
            labels=self.labels,
            commands=self.catalog,
        )
        d = self.request("edge_hello_request", request, 60)
        return d.addCallback(lambda env: env.edge_hello_response)


async def connect_labelled(port: int, edge_id: str, labels: dict[str, str]) -> LabelledEdge:
    """Connect one labelled edge to ``127.0.0.1:port``; answer it once its hello is accepted."""
    for _ in range(HELLO_ATTEMPTS):
        edge = LabelledEdge(edge_id, labels)
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), edge)
        answer = await edge.hello()
        if answer.accepted:
            return edge
        assert answer.reason_code == "retry_later", (edge_id, answer)
        if edge.transport is not None:
            edge.transport.loseConnection()
        await deferLater(reactor, min(answer.retry_after_ms, 2000) / 1000.0)
    raise AssertionError(f"{edge_id}: hello still answered retry_later after {HELLO_ATTEMPTS} attempts")


async def connect_fleet(port: int, labels_of: dict[str, dict[str, str]]) -> dict[str, LabelledEdge]:
    """Connect every edge of ``labels_of`` (edge id -> labels), a chunk at a time."""
    edges: dict[str, LabelledEdge] = {}
    ids = list(labels_of)
    for start in range(0, len(ids), CONNECT_CHUNK):
        chunk = ids[start : start + CONNECT_CHUNK]
        connected = await gatherResults(
            [Deferred.fromCoroutine(connect_labelled(port, i, labels_of[i])) for i in chunk], consumeErrors=True
        )
        edges.update(zip(chunk, connected, strict=True))
    return edges
