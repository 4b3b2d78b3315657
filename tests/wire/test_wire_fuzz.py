"""Fuzzing the accepting sides of every wire with hostile bytes (Hypothesis).

Arbitrary bytes and structure-aware mutations of real envelopes (unknown
enum values, unknown oneof field numbers, huge repeated fields, invalid
UTF-8 in strings, answers to requests never sent, oversize length
prefixes), split at random points, go through the real decoder and
dispatch of the Control Plane's edge wire (with a real registry and
gateway waiting on the edge), the Edge's node wire (with a real node
registry probing the node) and the ``/client`` WebSocket. Each example
asserts: nothing logged as a failure, the connection answered or closed as
docs/wire.md says, and a good peer on the same factory served afterwards.
``bench/wire_fuzz.py`` runs the same drivers for long runs.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.testing.wires.frames import field_bytes, field_varint, length_prefixed, ws_frame
from twisted_iop.testing.wires.wire import (
    ClientWireDriver,
    EdgeWireDriver,
    LogCapture,
    NodeWireDriver,
    check_answered_or_closed,
)
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame, make_envelope
from twisted_iop.wire.settings import PeerSettings

#: Examples per fuzz test (the suite's profile scales them, see conftest.py).
EXAMPLES = 100

#: Small limits so that "too large" and "huge" stay cheap to generate.
SETTINGS = PeerSettings(max_frame_bytes=256 * 1024, max_hello_frame_bytes=8 * 1024, max_violations=10)

ENVELOPE_BODIES = [f.name for f in pb.Envelope.DESCRIPTOR.oneofs_by_name["body"].fields]
ENVELOPE_NUMBERS = {f.number for f in pb.Envelope.DESCRIPTOR.fields}
CLIENT_BODIES = [f.name for f in pb.ClientEnvelope.DESCRIPTOR.oneofs_by_name["body"].fields]
CLIENT_NUMBERS = {f.number for f in pb.ClientEnvelope.DESCRIPTOR.fields}

request_ids = st.one_of(st.sampled_from([0, 1, 2, 3, 5]), st.integers(0, 2**64 - 1))
enum_values = st.one_of(st.integers(0, 15), st.integers(-(2**31), 2**31 - 1))
texts = st.text(max_size=20)


def unknown_field_numbers(known: set[int]) -> st.SearchStrategy[int]:
    """Field numbers the message does not define (a newer minor's bodies)."""
    return st.integers(2, 2**29 - 1).filter(lambda n: n not in known and not 19000 <= n <= 19999)


@st.composite
def known_body(draw: st.DrawFn) -> tuple[str, Any]:
    """A real envelope body, with the values a hostile peer would choose."""
    body = draw(st.sampled_from(ENVELOPE_BODIES))
    message = getattr(pb.Envelope(), body).__class__()
    if body == "error":
        message.code = draw(enum_values)
        message.message = draw(texts)
    elif body == "edge_hello_request":
        message.edge_id = draw(st.sampled_from(["edge-x", "", "bad id", "edge-good"]))
        message.protocol_major = draw(st.sampled_from([PROTOCOL_MAJOR, PROTOCOL_MAJOR + 1, 0]))
        n = draw(st.sampled_from([0, 1, 300]))
        message.commands.extend(pb.CommandSpec(name=f"c{i}") for i in range(n))
        for i in range(draw(st.sampled_from([0, 2, 100]))):
            message.labels[f"k{i}"] = "v"
    elif body == "node_hello_request":
        message.node_id = draw(st.sampled_from(["node-1", "node-9", ""]))
        message.protocol_major = draw(st.sampled_from([PROTOCOL_MAJOR, 7]))
        for i in range(draw(st.sampled_from([0, 1, 500]))):
            message.providers.add(provider_id=f"p{i}", kind="mock")
    elif body in ("node_ready", "node_health_report"):
        for _ in range(draw(st.sampled_from([0, 1, 2, 2000]))):
            message.providers.add(provider_id=draw(st.sampled_from(["mock-a", "zz"])), health=draw(enum_values))
    elif body == "node_probe_response":
        message.health.add(provider_id="mock-a", health=draw(enum_values))
    elif body == "edge_status_response":
        for i in range(draw(st.sampled_from([0, 1, 500]))):
            node = message.nodes.add(node_id=f"n{i}")
            node.providers.add(provider_id="p", status=draw(enum_values), health=draw(enum_values))
    elif body == "edge_command_response":
        message.outcome = draw(enum_values)
        message.reason = draw(texts)
    elif body == "edge_event":
        message.kind = draw(st.sampled_from(["node.ready", "command.accepted", "x" * 300]))
        message.command_id = draw(texts)
    return body, message


@st.composite
def hostile_payload(draw: st.DrawFn) -> bytes:
    """One envelope's bytes: real, mutated or garbage."""
    kind = draw(st.sampled_from(["known", "known", "known", "unknown_oneof", "bad_utf8", "empty", "random"]))
    rid = draw(request_ids)
    if kind == "known":
        body, message = draw(known_body())
        return make_envelope(body, message, rid).SerializeToString()
    if kind == "unknown_oneof":
        number = draw(unknown_field_numbers(ENVELOPE_NUMBERS))
        return field_varint(1, rid) + field_bytes(number, draw(st.binary(max_size=30)))
    if kind == "bad_utf8":
        # A string field (edge_id, node_id, kind, message: always field 1
        # or 2) holding bytes that are not UTF-8.
        number = draw(st.sampled_from([10, 20, 26, 40]))
        inner = field_bytes(draw(st.sampled_from([1, 2])), b"\xff\xfe\xc3(")
        return field_varint(1, rid) + field_bytes(number, inner)
    if kind == "empty":
        return b""
    return draw(st.binary(max_size=64))


@st.composite
def hostile_frames(draw: st.DrawFn) -> bytes:
    """A stream of frames, an oversize length prefix now and then."""
    frames = [length_prefixed(payload) for payload in draw(st.lists(hostile_payload(), max_size=12))]
    if draw(st.booleans()) and draw(st.booleans()):
        frames.append((SETTINGS.max_frame_bytes + draw(st.integers(1, 2**20))).to_bytes(4, "big") + b"junk")
    return b"".join(frames)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at the given offsets (taken modulo its length)."""
    if not data:
        return []
    points = sorted({c % len(data) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def run_framed(driver: Any, say_hello: bool, ready: bool, stream: bytes, cuts: list[int]) -> None:
    """Feed one hostile connection; check the log, the answers and a good peer."""
    with LogCapture().active() as log:
        connection = driver.connect()
        if say_hello:
            connection.send(driver.hello_body, driver.hello_message(), 1)
            if ready:
                report = pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_HEALTHY)
                connection.send("node_ready", pb.NodeReady(providers=[report]))
            driver.open_requests(connection)
        for piece in split(stream, cuts):
            connection.feed(piece)
        check_answered_or_closed(connection, SETTINGS.max_frame_bytes, SETTINGS.max_hello_frame_bytes)
        driver.finish()
        connection.drop()
        driver.check_good_peer()
    assert log.errors() == [], log.describe(log.errors())


FRAMED = dict(
    say_hello=st.booleans(),
    ready=st.booleans(),
    stream=hostile_frames(),
    cuts=st.lists(st.integers(0, 2**20), max_size=16),
)
RAW = dict(stream=st.binary(max_size=600), cuts=st.lists(st.integers(0, 2**20), max_size=16))


@settings(max_examples=EXAMPLES)
@given(**FRAMED)
def test_edge_wire_survives_hostile_streams(say_hello: bool, ready: bool, stream: bytes, cuts: list[int]) -> None:
    """Edge wire, any frames after (or instead of) a hello: no failure logged, answered or closed, good edge served."""
    run_framed(EdgeWireDriver(SETTINGS), say_hello, ready, stream, cuts)


@settings(max_examples=EXAMPLES)
@given(**FRAMED)
def test_node_wire_survives_hostile_streams(say_hello: bool, ready: bool, stream: bytes, cuts: list[int]) -> None:
    """Node wire, any frames after (or instead of) a hello: no failure logged, answered or closed, good node served."""
    run_framed(NodeWireDriver(SETTINGS), say_hello, ready, stream, cuts)


@settings(max_examples=EXAMPLES // 2)
@given(**RAW)
def test_edge_wire_survives_arbitrary_bytes(stream: bytes, cuts: list[int]) -> None:
    """Plain random bytes as a whole edge connection: the same guarantees."""
    run_framed(EdgeWireDriver(SETTINGS), False, False, stream, cuts)


@settings(max_examples=EXAMPLES // 2)
@given(**RAW)
def test_node_wire_survives_arbitrary_bytes(stream: bytes, cuts: list[int]) -> None:
    """Plain random bytes as a whole node connection: the same guarantees."""
    run_framed(NodeWireDriver(SETTINGS), False, False, stream, cuts)


@st.composite
def client_message(draw: st.DrawFn) -> tuple[bytes, bool, bool]:
    """One client WebSocket frame: (frame bytes, is a well-formed binary envelope, is raw garbage)."""
    kind = draw(st.sampled_from(["known", "known", "hello", "unknown_oneof", "bad_utf8", "text", "random"]))
    rid = draw(request_ids)
    if kind in ("known", "hello"):
        body = "client_hello_request" if kind == "hello" else draw(st.sampled_from(CLIENT_BODIES))
        envelope = pb.ClientEnvelope(request_id=rid)
        message = getattr(envelope, body)
        message.SetInParent()
        if body == "client_hello_request":
            message.protocol_major = draw(st.sampled_from([PROTOCOL_MAJOR, PROTOCOL_MAJOR, 9]))
            message.client_name = draw(texts)
        elif body == "subscribe_request":
            message.edge_id = draw(st.sampled_from(["", "edge-a", "bad id", "x" * 200]))
            message.resume = draw(st.booleans())
            message.since_sequence = draw(st.integers(0, 2**64 - 1))
        elif body == "error":
            message.code = draw(enum_values)
        return ws_frame(envelope.SerializeToString()), True, False
    if kind == "unknown_oneof":
        number = draw(unknown_field_numbers(CLIENT_NUMBERS))
        return ws_frame(field_varint(1, rid) + field_bytes(number, b"?")), True, False
    if kind == "bad_utf8":
        return ws_frame(field_bytes(draw(st.sampled_from([11, 13])), field_bytes(1, b"\xff\xfe"))), True, False
    if kind == "text":
        return ws_frame(b"hello", opcode=1), True, False
    return draw(st.binary(max_size=40)), False, True


@settings(max_examples=EXAMPLES)
@given(messages=st.lists(client_message(), max_size=14), cuts=st.lists(st.integers(0, 2**20), max_size=12))
def test_client_wire_survives_hostile_messages(messages: list[tuple[bytes, bool, bool]], cuts: list[int]) -> None:
    """Hostile /client messages: no failure logged, each answered or the socket closed, good client served."""
    driver = ClientWireDriver(max_violations=10, hello_timeout_seconds=10.0)
    garbage = any(raw for _, _, raw in messages)
    with LogCapture().active() as log:
        connection = driver.connect()
        stream = b"".join(data for data, _, _ in messages)
        for piece in split(stream, cuts):
            connection.feed(piece)
        answers, close_code = connection.received()
        if not connection.closed and not garbage:
            # One answer per message (no edges exist, so no events); a resumed subscription
            # whose sequence is ahead of the server's is also told events_lost, right after
            # its answer.
            bodies = [answer.WhichOneof("body") for answer in answers]
            for i, body in enumerate(bodies):
                if body == "events_lost":
                    assert i > 0 and bodies[i - 1] == "subscribe_response", bodies
            replies = [body for body in bodies if body != "events_lost"]
            assert len(replies) == len(messages), (answers, messages)
        elif not garbage:
            assert close_code in (4001, 4002, 4004), close_code
        said_hello = connection.protocol.said_hello
        driver.clock.advance(11)
        if not said_hello and not garbage:
            assert connection.closed
            assert connection.received()[1] in (4001, 4002, 4003, 4004)
        connection.drop()
        driver.check_good_peer()
    assert log.errors() == [], log.describe(log.errors())


def test_client_socket_without_hello_is_closed_at_the_deadline() -> None:
    """A socket that never says hello gets error{HELLO_TIMEOUT} and close code 4003 at the deadline."""
    driver = ClientWireDriver(hello_timeout_seconds=10.0)
    connection = driver.connect()
    driver.clock.advance(9.9)
    assert not connection.closed
    driver.clock.advance(0.2)
    messages, close_code = connection.received()
    assert messages[-1].error.code == pb.ERROR_CODE_HELLO_TIMEOUT
    assert close_code == 4003 and connection.closed
    connection.drop()


def test_client_hello_stops_the_deadline() -> None:
    """After an accepted hello the deadline no longer applies."""
    driver = ClientWireDriver(hello_timeout_seconds=10.0)
    connection = driver.connect()
    connection.send("client_hello_request", pb.ClientHelloRequest(protocol_major=PROTOCOL_MAJOR), 1)
    driver.clock.advance(60)
    assert not connection.closed
    assert driver.clock.getDelayedCalls() == []
    connection.drop()


def test_client_unknown_oneof_and_enum_are_answered() -> None:
    """An unknown body gets UNEXPECTED_MESSAGE (HELLO_REQUIRED before hello); an error with code 99 too."""
    driver = ClientWireDriver()
    connection = driver.connect()
    unknown = field_varint(1, 4) + field_bytes(99, b"")
    connection.feed(ws_frame(unknown))
    connection.send("client_hello_request", pb.ClientHelloRequest(protocol_major=PROTOCOL_MAJOR), 5)
    connection.feed(ws_frame(unknown))
    connection.send("error", pb.Error(code=99), 6)  # type: ignore[arg-type]  # an unknown enum value, on purpose
    messages, close_code = connection.received()
    assert [(m.request_id, m.WhichOneof("body")) for m in messages] == [
        (4, "error"),
        (5, "client_hello_response"),
        (4, "error"),
        (6, "error"),
    ]
    codes = [m.error.code for m in messages if m.WhichOneof("body") == "error"]
    assert codes == [pb.ERROR_CODE_HELLO_REQUIRED, pb.ERROR_CODE_UNEXPECTED_MESSAGE, pb.ERROR_CODE_UNEXPECTED_MESSAGE]
    assert close_code is None
    connection.drop()


def test_client_socket_is_closed_after_too_many_refused_messages() -> None:
    """max_violations refused messages close the socket with 4004."""
    driver = ClientWireDriver(max_violations=3)
    connection = driver.connect()
    for _ in range(5):
        connection.feed(ws_frame(b"\xff\xff"))
    messages, close_code = connection.received()
    assert len(messages) == 3 and close_code == 4004
    connection.drop()
    driver.check_good_peer()


def test_frames_of_a_good_peer_in_random_pieces() -> None:
    """Sanity for the split helper: a hello split anywhere is still one hello."""
    data = frame(make_envelope("ping", pb.Ping(), 1))
    assert b"".join(split(data, [3, 1, 7, 100])) == data
