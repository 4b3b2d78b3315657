"""The WebSocket wire client against the REAL Control Plane on loopback.

Hello, subscription, and the reconnects that the client's dialling service
(Twisted's ClientService) drives: hello and subscribe happen in its
prepareConnection, which resumes after the last sequence seen.
"""

from __future__ import annotations

import socket
from typing import cast

import pytest
import pytest_twisted
from twisted.internet import reactor

import twisted_iop
from twisted_iop.client import ClientWireClient, ControlPlaneUnreachable, HelloRejected, WireRequestError
from twisted_iop.client.wire import DEFAULT_WIRE_URL, WIRE_URL_ENV, _unknown_members, event_from_wire
from twisted_iop.client.wire_connection import decode_client_envelope, error_code_name, make_client_envelope
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane
from twisted_iop.testing.wires.peers import connect_edge
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.dialer import DialingService


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

    def messages(self) -> list[str]:
        """The messages of the events kept so far."""
        return [e.message for e in self.events]

    def state_names(self) -> list[str]:
        """The states reported so far."""
        return [state for state, _ in self.states]


def test_url_from_argument_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL comes from the argument, else the environment, else the default; bad schemes fail."""
    monkeypatch.delenv(WIRE_URL_ENV, raising=False)
    assert ClientWireClient(reactor=reactor).url == DEFAULT_WIRE_URL
    monkeypatch.setenv(WIRE_URL_ENV, "ws://cp.example:9/client")
    assert ClientWireClient(reactor=reactor).url == "ws://cp.example:9/client"
    assert ClientWireClient("wss://x:1/client", reactor=reactor).url == "wss://x:1/client"
    with pytest.raises(ValueError, match="not a ws:"):
        ClientWireClient("http://x:1/client", reactor=reactor)


def test_log_target_never_shows_credentials() -> None:
    """Log lines name the server by scheme, host, port and path; a user:password part is left out."""
    client = ClientWireClient("wss://ops:secret@cp.example/client", reactor=reactor)
    assert client.target == "wss://cp.example:443/client"


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
    wire = pb.FleetEvent(
        sequence=3,
        fleet_sequence=9,
        edge_id="edge-a",
        kind="node.ready",
        node_id="node-1",
        occurred_at_ms=1_700_000_000_000,
        attributes={"n": "3"},
    )
    event = event_from_wire(wire)
    assert (event.sequence, event.fleet_sequence, event.kind, event.node_id) == (3, 9, "node.ready", "node-1")
    assert event.provider_id is None and event.attributes == {"n": "3"}
    assert event.occurred_at is not None and event.occurred_at.year == 2023


@pytest_twisted.ensureDeferred
async def test_hello_accepted_with_token_and_refused_without() -> None:
    """hello() answers the server's response: accepted with the token, refused (and subscribe fails) without."""
    cp = await start_control_plane(config_text="http:\n  api_token: t0k\n")
    good = ClientWireClient(cp.wire_url, reactor=reactor, api_token="t0k", client_name="tests")
    bad = ClientWireClient(cp.wire_url, reactor=reactor, api_token="wrong")
    try:
        response = await good.hello()
        assert response.accepted and response.server_version == twisted_iop.__version__
        assert "events.resume" in response.features
        refused = await bad.hello()
        assert not refused.accepted and "token" in refused.reason
        with pytest.raises(HelloRejected):
            await bad.subscribe("")
    finally:
        await good.close()
        await bad.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_unreachable_server() -> None:
    """Nothing listening: hello() and subscribe() raise ControlPlaneUnreachable, 'connection refused'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ClientWireClient(f"ws://127.0.0.1:{port}/client", reactor=reactor)
    with pytest.raises(ControlPlaneUnreachable) as caught:
        await client.hello()
    assert caught.value.reason == "connection refused"
    with pytest.raises(ControlPlaneUnreachable) as subscribing:
        await client.subscribe()
    assert subscribing.value.reason == "connection refused"
    await client.close()


@pytest_twisted.ensureDeferred
async def test_subscribe_to_unknown_edge_fails_with_the_server_code() -> None:
    """The server's Error answer to subscribe raises WireRequestError with its code; no retry follows."""
    cp = await start_control_plane()
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    try:
        with pytest.raises(WireRequestError) as caught:
            await client.subscribe("edge-zzz")
        assert caught.value.code == "invalid_argument"
        await eventually(lambda: not cp.service.client_factory.connections, timeout=5, message="closed")
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_resume_past_the_servers_numbering_starts_over_from_its_first_event() -> None:
    """A Control Plane restarted without a durable store numbers from 1 again: the
    resumed subscription is told ``sequence_reset`` and gets the new events."""
    cp = await start_control_plane()
    wire_port = cp.service.port("client_wire")
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, on_state=seen.on_state, backoff_initial=0.05
        )
        for message in ("one", "two", "three"):
            edge.event("node.ready", message=message)
        await eventually(lambda: seen.messages() == ["one", "two", "three"], timeout=5, message="three events")
        before = subscription.last_sequence
        await cp.stop()
        cp = await start_control_plane(wire_port=wire_port)
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        edge.event("node.ready", message="after the restart")
        await eventually(lambda: subscription.reconnects == 1, timeout=10, message="a reconnect")
        await eventually(
            lambda: seen.messages()[-1:] == ["after the restart"], timeout=5, message="the new process's event"
        )
        assert [lost.reason for lost in seen.lost] == ["sequence_reset"]
        assert before is not None and subscription.last_sequence is not None
        assert subscription.last_sequence < before
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_subscription_resumes_through_prepare_connection() -> None:
    """A dropped subscription is dialled again by its ClientService and resumed after the last event seen."""
    cp = await start_control_plane()
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        subscription = await client.subscribe(
            "edge-a", on_event=seen.on_event, on_lost=seen.on_lost, on_state=seen.on_state, backoff_initial=0.05
        )
        edge.event("node.ready", message="one")
        await eventually(lambda: seen.messages() == ["one"], timeout=5, message="event one")
        first_connection = subscription._protocol
        cp.service.client_factory.close_all()  # the server drops every client socket
        await eventually(lambda: "disconnected" in seen.state_names(), timeout=5, message="the drop")
        edge.event("node.ready", message="two")  # while the client is away
        await eventually(lambda: subscription.reconnects == 1, timeout=5, message="a reconnect")
        edge.event("node.ready", message="three")
        await eventually(lambda: seen.messages() == ["one", "two", "three"], timeout=5, message="two and three")
        # The service holds the resumed connection: prepareConnection made it.
        assert isinstance(subscription._service, DialingService)
        held = await subscription._service.whenConnected()
        assert held is subscription._protocol and held is not first_connection
        assert subscription.response is not None and subscription.response.last_sequence >= 1
        await eventually(lambda: "resumed" in seen.state_names(), timeout=5, message="resumed state")
        assert seen.lost == []
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_fleet_subscription_survives_a_control_plane_restart() -> None:
    """The Control Plane stops and starts again on the same port: the client retries, then resumes."""
    cp: ControlPlaneHarness = await start_control_plane()
    port = cp.service.port("client_wire")
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        edge, _ = await connect_edge(cp.edge_wire_port, "edge-a")
        subscription = await client.subscribe(on_event=seen.on_event, on_state=seen.on_state, backoff_initial=0.05)
        edge.event("node.ready", message="before")
        await eventually(lambda: seen.messages() == ["before"], timeout=5, message="first event")
        await cp.stop()
        await eventually(lambda: "retrying" in seen.state_names(), timeout=5, message="refused reconnects")
        assert [s for s in seen.state_names() if s != "retrying"] == ["disconnected"]
        cp = await start_control_plane(wire_port=port)
        await eventually(lambda: subscription.reconnects == 1, timeout=10, message="reconnected to the new one")
        await eventually(lambda: seen.state_names()[-1] == "resumed", timeout=5, message="resumed state")
        assert not subscription.done.called
    finally:
        await client.close()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_stop_ends_the_subscription_cleanly() -> None:
    """stop() unsubscribes, closes and fires done; the server sees the socket go and nothing dials again."""
    cp = await start_control_plane()
    client = ClientWireClient(cp.wire_url, reactor=reactor)
    seen = Recorder()
    try:
        subscription = await client.subscribe(on_state=seen.on_state, backoff_initial=0.01)
        await eventually(lambda: cp.service.client_factory.connections, timeout=5, message="server connection")
        await subscription.stop()
        assert subscription.done.called and subscription.reconnects == 0
        assert subscription._service is not None and not subscription._service.running
        await eventually(lambda: not cp.service.client_factory.connections, timeout=5, message="server saw the close")
        assert seen.states == []
    finally:
        await client.close()
        await cp.stop()


def test_wire_event_members_this_client_does_not_know_are_kept() -> None:
    """A known event carries nothing unknown; fields a newer Control Plane's
    message has beyond the ones this client reads are kept in ``unknown``
    (shown with a real message that has such a field: the edge's own event)."""
    assert event_from_wire(pb.FleetEvent(sequence=1, edge_id="edge-a", kind="node.ready")).unknown == {}
    newer = cast(pb.FleetEvent, pb.EdgeEvent(kind="node.ready", edge_sequence=5, node_id="node-1"))
    assert _unknown_members(newer) == {"edge_sequence": 5}
