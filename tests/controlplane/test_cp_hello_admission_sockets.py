"""Hello admission over real sockets: a burst is queued and enrolls, a closed edge leaves the queue,
a loop lagging past the grace still enrolls them."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import LoopingCall, deferLater

from twisted_iop.daemon import raise_open_file_limit
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.wires.peers import ScriptedEdge
from twisted_iop.wire import control_pb2 as pb

#: A listen queue deep enough for a burst (Twisted's default backlog is 50).
BURST_LISTEN = "tcp:0:interface=127.0.0.1:backlog=1024"


class Enroller:
    """Dials edges as a real Edge does: after ``retry_later``, again once the hint (jittered) has passed."""

    def __init__(self, cp: ControlPlaneHarness) -> None:
        self.endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port)
        self.edges: list[ScriptedEdge] = []
        self.retries = 0
        self.hints_ms: list[int] = []

    async def enroll(self, edge_id: str, attempts: int = 50) -> pb.EdgeHelloResponse:
        """Dial and say hello until accepted (or ``attempts`` answers); the last answer."""
        answer = pb.EdgeHelloResponse()
        for _ in range(attempts):
            edge = ScriptedEdge(edge_id)
            await connectProtocol(self.endpoint, edge)
            self.edges.append(edge)
            answer = await edge.hello()
            if answer.accepted or answer.reason_code != "retry_later":
                return answer
            self.retries += 1
            self.hints_ms.append(answer.retry_after_ms)
            await deferLater(reactor, answer.retry_after_ms / 1000.0 * (0.5 + random.random()), lambda: None)
        return answer

    def close(self) -> None:
        """Drop every connection this made."""
        for edge in self.edges:
            if edge.transport is not None:
                edge.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_a_burst_of_500_edges_is_queued_and_enrolls_without_retry_later() -> None:
    """500 edges dialing at once all enroll at the shipped settings on their first hello."""
    raise_open_file_limit()
    cp = await start_control_plane(edge_wire_listen=BURST_LISTEN)
    enroller = Enroller(cp)
    try:
        admission = cp.service.edge_factory.hello_admission
        admission.probe.reset_max()
        answers = await Deferred.fromCoroutine(_all(enroller, [f"burst-{i:03d}" for i in range(500)]))
        assert all(answer.accepted for answer in answers)
        await eventually(
            lambda: all(_connected(cp, f"burst-{i:03d}") for i in range(500)), timeout=10, message="500 edges connected"
        )
        assert admission.processed_total == 500
        # Queued, not refused: nobody was sent away to dial again.
        assert enroller.retries == 0 and admission.refused_total == 0
    finally:
        enroller.close()
        await cp.stop()


def _connected(cp: ControlPlaneHarness, edge_id: str) -> bool:
    record = cp.registry.find(edge_id)
    return record is not None and bool(record.connected)


async def _all(enroller: Enroller, edge_ids: list[str]) -> list[pb.EdgeHelloResponse]:
    dialed: list[Any] = [Deferred.fromCoroutine(enroller.enroll(edge_id)) for edge_id in edge_ids]
    return list(await gatherResults(dialed))


@pytest_twisted.ensureDeferred
async def test_a_queued_hello_whose_edge_closes_is_dropped_and_the_next_one_served() -> None:
    """Paced at 1 hello per second, the third edge waits in the queue; it hangs up, so it is never
    enrolled, and the fourth, queued behind it, is answered next."""
    cp = await start_control_plane(config_text="edge_wire:\n  hello_admission:\n    max_per_second: 1\n")
    enroller = Enroller(cp)
    try:
        for edge_id in ("paced-0", "paced-1"):
            assert (await enroller.enroll(edge_id, attempts=1)).accepted
        leaving, staying = ScriptedEdge("paced-2"), ScriptedEdge("paced-3")
        for edge in (leaving, staying):
            await connectProtocol(enroller.endpoint, edge)
            enroller.edges.append(edge)
        leaving.hello()
        admission = cp.service.edge_factory.hello_admission
        await eventually(lambda: admission.pending == 1, timeout=5, message="the third hello queued")
        answer = staying.hello()
        await eventually(lambda: admission.pending == 2, timeout=5, message="the fourth hello queued")
        assert leaving.transport is not None
        leaving.transport.loseConnection()
        await eventually(lambda: admission.withdrawn_total == 1, timeout=5, message="the closed edge withdrawn")
        assert (await answer).accepted
        assert cp.registry.find("paced-2") is None
        assert admission.refused_total == 0
    finally:
        enroller.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_reactor_lagging_past_the_grace_still_enrolls_edges_without_retry_later() -> None:
    """Every reactor turn blocks for 200 ms, longer than the 500 ms grace: hellos are queued and
    enrolled, none is told retry_later (the loop lags because of something else, refusing would
    not help)."""
    cp = await start_control_plane()
    enroller = Enroller(cp)
    lagging = LoopingCall(time.sleep, 0.2)
    try:
        lagging.start(0.0)
        await deferLater(reactor, 1.0, lambda: None)
        admission = cp.service.edge_factory.hello_admission
        answers = [await enroller.enroll(f"slow-{i}", attempts=1) for i in range(3)]
        lagging.stop()
        assert all(answer.accepted for answer in answers)
        assert admission.refused_total == 0
        assert admission.lag_queued_total >= 1
        assert cp.registry.find("slow-2") is not None
    finally:
        if lagging.running:
            lagging.stop()
        enroller.close()
        await cp.stop()
