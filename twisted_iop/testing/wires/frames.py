"""Frames by hand: protobuf fields the generated API cannot express, the one
decoder of a length-prefixed frame stream, and WebSocket frames for ``/client``."""

from __future__ import annotations

import os
import struct
from typing import Any, Optional

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PREFIX_BYTES, make_envelope

# -- protobuf encoding by hand ---------------------------------------------------


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (negative values as 10-byte two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    """One varint field (wire type 0)."""
    return varint(number << 3) + varint(value)


def field_bytes(number: int, payload: bytes) -> bytes:
    """One length-delimited field (wire type 2)."""
    return varint((number << 3) | 2) + varint(len(payload)) + payload


def length_prefixed(payload: bytes) -> bytes:
    """``payload`` as one frame on a TCP wire."""
    return struct.pack(">I", len(payload)) + payload


def envelope_bytes(body: str, message: Any, request_id: int = 0) -> bytes:
    """A serialized envelope (no length prefix)."""
    return make_envelope(body, message, request_id).SerializeToString()


# -- the framed TCP wires ----------------------------------------------------------


def decode_frames(data: bytes) -> list[pb.Envelope]:
    """Every complete frame in a byte stream (what a transport was written), decoded.

    A trailing partial frame is left out.
    """
    out = []
    offset = 0
    while len(data) - offset >= PREFIX_BYTES:
        (length,) = struct.unpack(">I", data[offset : offset + PREFIX_BYTES])
        end = offset + PREFIX_BYTES + length
        if end > len(data):
            break
        envelope = pb.Envelope()
        envelope.ParseFromString(data[offset + PREFIX_BYTES : end])
        out.append(envelope)
        offset = end
    return out


# -- the client WebSocket ------------------------------------------------------------

OPCODE_TEXT = 1
OPCODE_BINARY = 2
OPCODE_CLOSE = 8


def ws_frame(payload: bytes, opcode: int = OPCODE_BINARY, mask: Optional[bytes] = None) -> bytes:
    """One masked client-to-server WebSocket frame."""
    key = os.urandom(4) if mask is None else mask
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return head + key + masked


def ws_messages(data: bytes) -> tuple[list[pb.ClientEnvelope], Optional[int]]:
    """The binary messages and the close code (if any) in server-to-client frames."""
    messages: list[pb.ClientEnvelope] = []
    close_code: Optional[int] = None
    offset = 0
    while len(data) - offset >= 2:
        opcode = data[offset] & 0x0F
        n = data[offset + 1] & 0x7F
        offset += 2
        if n == 126:
            (n,) = struct.unpack(">H", data[offset : offset + 2])
            offset += 2
        elif n == 127:
            (n,) = struct.unpack(">Q", data[offset : offset + 8])
            offset += 8
        payload = data[offset : offset + n]
        offset += n
        if opcode == OPCODE_BINARY:
            envelope = pb.ClientEnvelope()
            envelope.ParseFromString(payload)
            messages.append(envelope)
        elif opcode == OPCODE_CLOSE and len(payload) >= 2:
            (close_code,) = struct.unpack(">H", payload[:2])
    return messages, close_code
