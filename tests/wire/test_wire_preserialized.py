"""Envelopes written from bytes serialized once parse as the envelopes building them gives."""

from __future__ import annotations

import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import make_envelope
from twisted_iop.wire.preserialized import (
    CLIENT_EVENT_TAG,
    REQUEST_ID_TAG,
    InferenceChunkEnvelopes,
    PreserializedAnswer,
    PreserializedRequest,
    client_event_envelope,
    field_tag,
    varint,
)

request_ids = st.integers(min_value=0, max_value=2**64 - 1)
texts = st.text(max_size=40)
labels = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)

#: Request bodies, each with any content.
requests = st.one_of(
    st.just(("edge_status_request", pb.EdgeStatusRequest())),
    st.builds(
        lambda name, target, arguments, timeout: (
            "edge_command_request",
            pb.EdgeCommandRequest(name=name, target=target, arguments=arguments, timeout_ms=timeout),
        ),
        texts,
        texts,
        labels,
        st.integers(0, 2**32 - 1),
    ),
    st.builds(lambda sent: ("ping", pb.Ping(sent_at_ms=sent)), st.integers(-(2**63), 2**63 - 1)),
)
#: Answer bodies, each with any content.
answers = st.one_of(
    st.builds(
        lambda accepted, version, interval: (
            "edge_hello_response",
            pb.EdgeHelloResponse(accepted=accepted, server_version=version, keepalive_interval_ms=interval),
        ),
        st.booleans(),
        texts,
        st.integers(0, 2**32 - 1),
    ),
    st.builds(lambda code, message: ("error", pb.Error(code=code, message=message)), st.integers(0, 20), texts),
)


def parsed(data: bytes) -> pb.Envelope:
    """``data`` parsed as an envelope."""
    envelope = pb.Envelope()
    envelope.ParseFromString(data)
    return envelope


@given(request_id=request_ids, request=requests)
def test_a_spliced_request_is_the_envelope_building_one_gives(request_id: int, request: tuple[str, Message]) -> None:
    """Any request body with any request id spliced in parses to the envelope make_envelope builds."""
    body, message = request
    envelope = parsed(PreserializedRequest(body, message).envelope_bytes(request_id))
    assert envelope == make_envelope(body, message, request_id)
    assert envelope.request_id == request_id and envelope.WhichOneof("body") == body


@given(request_id=request_ids, answer=answers)
def test_a_spliced_answer_is_the_envelope_building_one_gives(request_id: int, answer: tuple[str, Message]) -> None:
    """Any answer body with the id of the request it answers parses to the envelope make_envelope builds."""
    body, message = answer
    envelope = parsed(PreserializedAnswer(body, message).envelope_bytes(request_id))
    assert envelope == make_envelope(body, message, request_id)


@given(
    event=st.builds(
        pb.FleetEvent,
        sequence=st.integers(0, 2**64 - 1),
        edge_id=texts,
        kind=texts,
        message=st.text(max_size=300),
        attributes=labels,
    )
)
def test_a_wrapped_event_is_the_client_envelope_building_one_gives(event: pb.FleetEvent) -> None:
    """A serialized FleetEvent wrapped as a ClientEnvelope parses to the envelope with that event."""
    envelope = pb.ClientEnvelope()
    envelope.ParseFromString(client_event_envelope(event.SerializeToString()))
    assert envelope == pb.ClientEnvelope(event=event) and envelope.request_id == 0


@given(request_ids)
def test_varint_matches_protobuf(value: int) -> None:
    """varint encodes like protobuf's own encoder (a uint64 field without its tag)."""
    assert pb.Envelope(request_id=value).SerializeToString() == (REQUEST_ID_TAG + varint(value) if value else b"")


def test_the_spliced_tags_are_the_ones_protobuf_writes() -> None:
    """The tags written in front of pre-serialized bytes are what protobuf's
    encoder writes for those fields (a tag left behind by a change of the
    proto fails here)."""
    assert pb.Envelope(request_id=1).SerializeToString() == REQUEST_ID_TAG + b"\x01"
    assert pb.ClientEnvelope(event=pb.FleetEvent()).SerializeToString() == CLIENT_EVENT_TAG + b"\x00"


def _alone(message: type[Message], name: str) -> bytes:
    """``message`` with only field ``name`` set (to a value that is not its
    default), serialized."""
    instance = message()
    field = message.DESCRIPTOR.fields_by_name[name]
    if field.message_type is not None:
        getattr(instance, name).SetInParent()
    elif field.cpp_type == field.CPPTYPE_STRING:
        setattr(instance, name, b"x" if field.type == field.TYPE_BYTES else "x")
    elif field.cpp_type == field.CPPTYPE_BOOL:
        setattr(instance, name, True)
    else:
        setattr(instance, name, 1)
    return instance.SerializeToString()


@pytest.mark.parametrize(
    ("message", "name"),
    [
        (message, field.name)
        for message in (pb.Envelope, pb.ClientEnvelope, pb.FleetEvent, pb.EdgeHelloResponse, pb.Error, pb.Ping)
        for field in message.DESCRIPTOR.fields
        if not field.is_repeated
    ],
)
def test_field_tag_follows_the_descriptor(message: type[Message], name: str) -> None:
    """Every single field's tag, computed from its descriptor, leads what protobuf writes for it."""
    assert _alone(message, name).startswith(field_tag(message, name))


def test_field_tag_refuses_repeated_fields() -> None:
    """A repeated field has no single tag here (packed scalars use another wire type)."""
    with pytest.raises(ValueError, match="repeated"):
        field_tag(pb.EdgeHelloRequest, "commands")


@given(inference_id=st.integers(min_value=0, max_value=2**64 - 1), data=st.binary(max_size=70_000))
def test_a_written_chunk_envelope_is_the_one_protobuf_writes(inference_id: int, data: bytes) -> None:
    """Byte for byte (sizes across every varint length of the body), and it parses back to the same chunk."""
    written = InferenceChunkEnvelopes(inference_id).envelope_bytes(data)
    built = pb.Envelope(inference_chunk=pb.InferenceChunk(inference_id=inference_id, data=data))
    assert written == built.SerializeToString()
    parsed = pb.Envelope.FromString(written)
    assert parsed.WhichOneof("body") == "inference_chunk"
    assert (parsed.inference_chunk.inference_id, parsed.inference_chunk.data) == (inference_id, data)


@pytest.mark.parametrize("size", [0, 1, 0x7F - 3, 0x7F - 2, 0x7F, 0x80, 0x3FFF, 0x4000])
def test_a_chunk_envelope_at_each_varint_boundary(size: int) -> None:
    data = b"x" * size
    for inference_id in (0, 1, 300, 2**63):
        built = pb.Envelope(inference_chunk=pb.InferenceChunk(inference_id=inference_id, data=data))
        assert InferenceChunkEnvelopes(inference_id).envelope_bytes(data) == built.SerializeToString()
