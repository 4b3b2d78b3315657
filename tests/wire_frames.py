"""Decoding helpers shared by protocol tests (not tests themselves)."""

from __future__ import annotations

import struct

from twisted_iop.wire import control_pb2 as pb


def decode(data: bytes) -> list[pb.Envelope]:
    """Split a byte stream of frames into envelopes."""
    out = []
    while len(data) >= 4:
        (length,) = struct.unpack(">I", data[:4])
        envelope = pb.Envelope()
        envelope.ParseFromString(data[4 : 4 + length])
        out.append(envelope)
        data = data[4 + length :]
    return out
