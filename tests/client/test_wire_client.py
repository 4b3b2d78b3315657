"""The WebSocket wire client against a fake ``/client`` server on loopback.

The fake server (iop_client_fakes.FakeWireServer) speaks the contract of
proto/iop/control.proto; the same behaviours are checked against the real
Control Plane in test_client_integration.py.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
import pytest_twisted
from iop_client_fakes import FakeWireServer, fleet_event
from support import eventually
from twisted.internet import reactor

from twisted_iop.client import ClientWireClient, ControlPlaneUnreachable, HelloRejected, WireRequestError
from twisted_iop.client.wire import (
    DEFAULT_WIRE_URL,
    WIRE_URL_ENV,
    decode_client_envelope,
    error_code_name,
    event_from_wire,
    make_client_envelope,
)
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb


class Recorder:
    """Collects what a subscription delivers."""

    def __init__(self) -> None:
        self.events: list[pb.FleetEvent] = []
        self.lost: list[pb.EventsLost] = []
        self.states: list[tuple[str, str]] = []

    def on_event(self, event: pb.FleetEvent) -> None:
        """Keep an event."""
        self.events.append(event)

    def on_lost(self, lost: pb.EventsLost) -> None:
        """Keep a lost-events notice."""
        self.lost.append(lost)

    def on_state(self, state: str, detail: str) -> None:
        """Keep a connection state change."""
        self.states.append((state, detail))

    def sequences(self) -> list[int]:
        """The edge sequences of the events kept so far."""
        return [e.sequence for e in self.events]


async def started_server(token: Any = None) -> tuple[FakeWireServer, str]:
    """A listening fake server and its URL."""
    server = FakeWireServer(token=token)
    url = await server.listen(reactor)
    return server, url


def test_url_from_argument_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL comes from the argument, else the environment, else the default; bad schemes fail."""
    monkeypatch.delenv(WIRE_URL_ENV, raising=False)
    assert ClientWireClient(reactor=reactor).url == DEFAULT_WIRE_URL
    monkeypatch.setenv(WIRE_URL_ENV, "ws://cp.example:9/client")
    assert ClientWireClient(reactor=reactor).url == "ws://cp.example:9/client"
    assert ClientWireClient("wss://x:1/client", reactor=reactor).url == "wss://x:1/client"
    with pytest.raises(ValueError):
        ClientWireClient("http://x:1/client", reactor=reactor)


def test_envelope_encoding_round_trip() -> None:
    """Envelopes carry the request id and the named body; error codes read well."""
    envelope = make_client_envelope(
        "subscribe_request", pb.SubscribeRequest(edge_id="edge-a", resume=True, since_sequence=41), 7
    )
    decoded, body = decode_client_envelope(envelope.SerializeToString())
    assert body == "subscribe_request" and decoded.request_id == 7
    assert decoded.subscribe_request.since_sequence == 41 and decoded.subscribe_request.resume
    assert error_code_name(pb.ERROR_CODE_HELLO_REQUIRED) == "hello_required"
    assert error_code_name(999) == "error_999"


def test_wire_event_becomes_the_http_event_model() -> None:
    """A FleetEvent converts to the same typed Event the HTTP views return."""
    event = event_from_wire(fleet_event("edge-a", 3, 9))
    assert (event.sequence, event.fleet_sequence, event.kind, event.node_id) == (3, 9, "node.ready", "node-1")
    assert event.provider_id is None and event.attributes == {"n": "3"}
    assert event.occurred_at is not None and event.occurred_at.year == 2023


@pytest_twisted.ensureDeferred
async def test_hello_sends_protocol_version_and_token() -> None:
    """hello() answers the server's response; the request carries version, name and token."""
    server, url = await started_server(token="t0k")
    client = ClientWireClient(url, reactor=reactor, api_token="t0k", client_name="tests")
    try:
        response = await client.hello()
        assert response.accepted and response.server_version == "fake-1"
        assert list(response.features) == ["events.subscribe", "events.resume"]
        hello = server.received[0].client_hello_request
        assert (hello.protocol_major, hello.protocol_minor) == (PROTOCOL_MAJOR, PROTOCOL_MINOR)
        assert hello.api_token == "t0k" and hello.client_name == "tests"
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_rejected_hello_is_answered_and_subscribe_fails() -> None:
    """A wrong token: hello() answers accepted=False; subscribe() raises HelloRejected."""
    server, url = await started_server(token="right")
    client = ClientWireClient(url, reactor=reactor, api_token="wrong")
    try:
        response = await client.hello()
        assert not response.accepted and "token" in response.reason
        with pytest.raises(HelloRejected):
            await client.subscribe("edge-a")
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_unreachable_server() -> None:
    """Nothing listening: ControlPlaneUnreachable with 'connection refused'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ClientWireClient(f"ws://127.0.0.1:{port}/client", reactor=reactor)
    with pytest.raises(ControlPlaneUnreachable) as caught:
        await client.hello()
    assert caught.value.reason == "connection refused"


@pytest_twisted.ensureDeferred
async def test_subscribe_to_unknown_edge_fails_with_the_server_code() -> None:
    """The server's Error answer to subscribe raises WireRequestError with its code."""
    server, url = await started_server()
    client = ClientWireClient(url, reactor=reactor)
    try:
        with pytest.raises(WireRequestError) as caught:
            await client.subscribe("edge-zzz")
        assert caught.value.code == "invalid_argument"
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_subscription_resumes_after_reconnect_without_duplicates() -> None:
    """After a dropped connection the client resumes after the last sequence it saw."""
    server, url = await started_server()
    client = ClientWireClient(url, reactor=reactor)
    seen = Recorder()
    try:
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, on_state=seen.on_state, backoff_initial=0.05
        )
        server.publish(fleet_event("edge-a", 1, 1))
        server.publish(fleet_event("edge-a", 2, 2))
        await eventually(lambda: seen.sequences() == [1, 2], timeout=5, message="events 1 and 2")
        server.drop_all()
        server.publish(fleet_event("edge-a", 3, 3))  # nobody is connected now
        await eventually(lambda: subscription.reconnects == 1, timeout=5, message="a reconnect")
        server.publish(fleet_event("edge-a", 4, 4))
        await eventually(lambda: seen.sequences() == [1, 2, 3, 4], timeout=5, message="events 3 and 4")
        resumed = [e.subscribe_request for e in server.received if e.WhichOneof("body") == "subscribe_request"]
        assert [(r.resume, r.since_sequence) for r in resumed] == [(False, 0), (True, 2)]
        assert seen.lost == [] and seen.states[0][0] == "disconnected" and seen.states[-1][0] == "resumed"
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_resume_gap_is_reported_before_the_rest() -> None:
    """Events that left the server's buffer while away arrive as events_lost(resume_gap)."""
    server, url = await started_server()
    client = ClientWireClient(url, reactor=reactor)
    seen = Recorder()
    try:
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, backoff_initial=0.05
        )
        server.publish(fleet_event("edge-a", 1, 1))
        await eventually(lambda: seen.sequences() == [1], timeout=5, message="event 1")
        server.drop_all()
        for n in range(2, 7):
            server.publish(fleet_event("edge-a", n, n))
        server.trim(keep=2)  # 2, 3, 4 are gone; 5 and 6 are kept
        await eventually(lambda: seen.sequences() == [1, 5, 6], timeout=5, message="events 5 and 6")
        assert [(l.count, l.first_sequence, l.last_sequence, l.reason) for l in seen.lost] == [(3, 2, 4, "resume_gap")]
        assert subscription.last_sequence == 6
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_since_replays_and_slow_consumer_is_reported() -> None:
    """since=N replays buffered events after N; a slow_consumer notice reaches on_lost."""
    server, url = await started_server()
    for n in range(1, 4):
        server.publish(fleet_event("edge-a", n, n))
    client = ClientWireClient(url, reactor=reactor)
    seen = Recorder()
    try:
        await client.subscribe("edge-a", since=1, on_event=seen.on_event, on_lost=seen.on_lost)
        await eventually(lambda: seen.sequences() == [2, 3], timeout=5, message="replayed events")
        server.send_lost(count=10, first=4, last=13)
        server.publish(fleet_event("edge-a", 14, 14))
        await eventually(lambda: seen.sequences() == [2, 3, 14], timeout=5, message="event 14")
        assert [(l.count, l.reason) for l in seen.lost] == [(10, "slow_consumer")]
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_fleet_subscription_counts_fleet_sequences() -> None:
    """Without an edge id the subscription covers all edges and tracks fleet sequences."""
    server, url = await started_server()
    server.known_edges.add("edge-b")
    client = ClientWireClient(url, reactor=reactor)
    seen = Recorder()
    try:
        subscription = await client.subscribe(on_event=seen.on_event)
        server.publish(fleet_event("edge-a", 1, 1))
        server.publish(fleet_event("edge-b", 1, 2))
        await eventually(lambda: len(seen.events) == 2, timeout=5, message="two events")
        assert [e.edge_id for e in seen.events] == ["edge-a", "edge-b"]
        assert subscription.last_sequence == 2
    finally:
        await client.close()
        await server.stop()


@pytest_twisted.ensureDeferred
async def test_stop_ends_the_subscription_cleanly() -> None:
    """stop() unsubscribes, closes and fires done; no reconnect follows."""
    server, url = await started_server()
    client = ClientWireClient(url, reactor=reactor)
    try:
        subscription = await client.subscribe("edge-a", backoff_initial=0.01)
        await subscription.stop()
        assert subscription.done.called and subscription.reconnects == 0
        await eventually(lambda: not server.connections, timeout=5, message="server saw the close")
        bodies = [e.WhichOneof("body") for e in server.received]
        assert bodies == ["client_hello_request", "subscribe_request", "unsubscribe_request"]
    finally:
        await client.close()
        await server.stop()
