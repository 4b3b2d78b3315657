"""The edge wire's hello deadline over real sockets: it judges the edge, not
how far behind the Control Plane's reactor is."""

from __future__ import annotations

import select
import socket
import time
from typing import Optional

import pytest
import pytest_twisted

from twisted_iop.controlplane.wires.edge_wire import EdgeWireProtocol
from twisted_iop.testing.harness import eventually, start_control_plane
from twisted_iop.testing.wires.frames import decode_frames
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame, make_envelope

HELLO_TIMEOUT_SECONDS = 0.2


def _frames(client: socket.socket, into: list[pb.Envelope]) -> list[pb.Envelope]:
    """``into`` with the frames received since, decoded."""
    into.extend(decode_frames(_received(client)))
    return into


def _received(client: socket.socket) -> bytes:
    """What the Control Plane sent so far, read without blocking ("" once closed and drained)."""
    data = b""
    while select.select([client], [], [], 0)[0]:
        chunk = client.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest_twisted.ensureDeferred
async def test_a_hello_that_waited_unread_past_the_deadline_is_accepted_and_silence_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An edge connects and sends its hello at once; the Control Plane
    accepts the connection (its hello deadline starts) and then stays busy
    in the same reactor pass past the deadline, as reading thousands of
    hellos at once does. When the reactor runs its timers again, the
    deadline has passed with the hello unread in the socket: the edge is
    enrolled all the same. A connection that says nothing still gets
    HELLO_TIMEOUT."""
    stalled: list[bool] = []
    start_hello_timer = EdgeWireProtocol.start_hello_timer

    def start_then_stall(self: EdgeWireProtocol) -> None:
        start_hello_timer(self)
        if not stalled:
            stalled.append(True)
            # Not a wait for anything: this holds the reactor's I/O pass
            # (the accept) until the deadline has passed.
            time.sleep(HELLO_TIMEOUT_SECONDS * 2)

    monkeypatch.setattr(EdgeWireProtocol, "start_hello_timer", start_then_stall)
    cp = await start_control_plane(config_text=f"edge_wire: {{hello_timeout_seconds: {HELLO_TIMEOUT_SECONDS}}}")
    speaking = socket.create_connection(("127.0.0.1", cp.edge_wire_port))
    silent: Optional[socket.socket] = None
    try:
        hello = pb.EdgeHelloRequest(edge_id="edge-a", protocol_major=PROTOCOL_MAJOR)
        speaking.sendall(frame(make_envelope("edge_hello_request", hello, 1)))
        await eventually(lambda: cp.registry.find("edge-a") is not None, message="edge-a enrolled")
        assert stalled and cp.registry.get("edge-a").connected
        answers: list[pb.Envelope] = []
        await eventually(lambda: _frames(speaking, answers), message="the answer")
        assert answers[0].edge_hello_response.accepted and answers[0].request_id == 1
        silent = socket.create_connection(("127.0.0.1", cp.edge_wire_port))
        refused: list[pb.Envelope] = []
        await eventually(lambda: _frames(silent, refused), message="the refusal")
        assert refused[0].error.code == pb.ERROR_CODE_HELLO_TIMEOUT
        assert cp.registry.get("edge-a").connected
    finally:
        speaking.close()
        if silent is not None:
            silent.close()
        await cp.stop()
