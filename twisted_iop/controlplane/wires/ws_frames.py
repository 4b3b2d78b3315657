"""WebSocket frames of live events, written here instead of by Autobahn.

A subscriber's events of one reactor turn go out as one transport write of
frames built here (final, binary, unmasked, uncompressed: RFC 6455 section
5.2), byte for byte what Autobahn's ``sendMessage`` would write for each.
Autobahn's public API frames and writes one message per call; its
``prepareMessage`` builds the same frame in more steps.

Measured with ``timeit`` (CPython 3.11, the four side by side in one
process, best of 12 runs; one subscriber on a ``StringTransport``,
``EdgeRegistry.record`` then the next turn's write, about 2.4 us of each
figure being the registry's own work, and most of a lone event's the turn's timer):

=============================================  ===========  ==============
per event                                      1 per turn   256 per turn
=============================================  ===========  ==============
frames from here, one write per turn           10.1 us      4.7 us
``sendMessage`` per event                      10.9 us      8.1 us
``prepareMessage`` + ``sendPreparedMessage``   10.5 us      8.3 us
``prepareMessage`` frames joined, one write    13.1 us      5.9 us
=============================================  ===========  ==============

So the frames stay here. They are written only to a socket whose options
are the ones ``/client`` sets (:func:`frames_writable`): per-message
compression refused by :func:`refuse_compression`, so a client can never
negotiate it, and server frames unmasked. Any other socket gets its events
through ``sendMessage``.
"""

from __future__ import annotations

from typing import Protocol

from twisted_iop.wire.preserialized import client_event_prefix

#: The first byte of every frame written here: FIN, no RSV bit (nothing
#: compressed), opcode 2 (binary).
_FINAL_BINARY = 0x80 | 0x02
#: The header of an unmasked, final, binary WebSocket frame of each length
#: up to 125 (the length in the second byte, the mask bit clear).
_SMALL_FRAME_HEADERS = tuple(bytes((_FINAL_BINARY, n)) for n in range(126))
#: The headers of longer frames, before their 16-bit and 64-bit lengths.
_HEADER_16 = bytes((_FINAL_BINARY, 126))
_HEADER_64 = bytes((_FINAL_BINARY, 127))
#: The largest serialized event whose envelope fits a small frame (the
#: frame's length in its second byte).
_SMALL_EVENT_BYTES = max(n for n in range(126) if len(client_event_prefix(n)) + n <= 125)
#: Everything before a small event's bytes in its frame, by the event's length.
_SMALL_EVENT_PREFIXES = tuple(
    _SMALL_FRAME_HEADERS[len(client_event_prefix(n)) + n] + client_event_prefix(n)
    for n in range(_SMALL_EVENT_BYTES + 1)
)


def binary_frame(payload: bytes) -> bytes:
    """``payload`` as one server-to-client WebSocket frame: final, binary,
    unmasked, uncompressed."""
    n = len(payload)
    if n < 126:
        return _SMALL_FRAME_HEADERS[n] + payload
    if n <= 0xFFFF:
        return _HEADER_16 + n.to_bytes(2, "big") + payload
    return _HEADER_64 + n.to_bytes(8, "big") + payload


def event_envelope_frame(event: bytes) -> bytes:
    """The frame of the ``ClientEnvelope`` whose body is the serialized
    ``FleetEvent`` ``event``: ``binary_frame(client_event_envelope(event))``,
    in one concatenation for a small event."""
    n = len(event)
    if n <= _SMALL_EVENT_BYTES:
        return _SMALL_EVENT_PREFIXES[n] + event
    return binary_frame(client_event_prefix(n) + event)


def refuse_compression(offers: list[object]) -> None:
    """Accept none of a client's per-message compression offers (the
    ``perMessageCompressionAccept`` option of ``/client``): events are small
    protobuf messages, and frames written here are never compressed."""
    return None


class SocketOptions(Protocol):
    """The Autobahn options of a socket that decide how its frames look."""

    perMessageCompressionAccept: object
    maskServerFrames: bool


def frames_writable(socket: SocketOptions) -> bool:
    """Whether frames built here may be written to ``socket``'s transport:
    it refuses compression with :func:`refuse_compression` (so none was
    negotiated) and does not mask its frames."""
    return socket.perMessageCompressionAccept is refuse_compression and not socket.maskServerFrames
