"""CPU of one large frame sent whole versus trickled in small pieces.

A peer that sends a big frame a few hundred bytes at a time must not cost
the receiver more than the same frame sent whole. This prints the CPU time
of both for the framed peer protocol of the TCP wires, next to Twisted's
``Int32StringReceiver`` (which re-concatenates the partial frame on every
read) measured in the same run as the reference. No sockets: the bytes go
straight to ``dataReceived`` on a ``StringTransport``. Runs in seconds.

    .venv/bin/python bench/frame_trickle.py [--frame-bytes N] [--piece-bytes N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, Union

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.protocols.basic import Int32StringReceiver

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, frame, make_envelope
from twisted_iop.wire.settings import PeerSettings


class CountingPeer(FramedPeerProtocol):
    """The TCP wires' framed peer, counting what reaches the subclass hook."""

    def __init__(self, max_frame_bytes: int) -> None:
        super().__init__(Clock(), PeerSettings(max_frame_bytes=max_frame_bytes))
        self.count = 0

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        self.count += 1


class CountingInt32(Int32StringReceiver):
    """The reference: Twisted's receiver, which copies the partial frame per read."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.MAX_LENGTH = max_frame_bytes
        self.count = 0

    def stringReceived(self, string: bytes) -> None:
        self.count += 1


def cpu_of(build: Callable[[], Union[CountingPeer, CountingInt32]], data: bytes, piece: int) -> float:
    """CPU seconds to feed ``data`` in ``piece``-byte reads (0: whole) to a fresh protocol."""
    protocol = build()
    protocol.makeConnection(StringTransport())
    pieces = [data] if piece <= 0 else [data[i : i + piece] for i in range(0, len(data), piece)]
    start = time.process_time()
    for chunk in pieces:
        protocol.dataReceived(chunk)
    elapsed = time.process_time() - start
    assert protocol.count == 1, "the frame did not arrive exactly once"
    return elapsed


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frame-bytes", type=int, default=4 * 1024 * 1024, help="frame size (default 4 MiB)")
    parser.add_argument("--piece-bytes", type=int, default=200, help="bytes per read when trickled (default 200)")
    parser.add_argument(
        "--reference-bytes",
        type=int,
        default=1024 * 1024,
        help="frame size for the Int32StringReceiver reference (default 1 MiB: it is quadratic)",
    )
    args = parser.parse_args()

    def frame_of(size: int) -> bytes:
        return frame(make_envelope("edge_event", pb.EdgeEvent(message="x" * size)))

    rows = []
    for name, build_class, size in (
        ("FramedPeerProtocol", CountingPeer, args.frame_bytes),
        ("FramedPeerProtocol", CountingPeer, args.reference_bytes),
        ("Int32StringReceiver (reference)", CountingInt32, args.reference_bytes),
    ):
        data = frame_of(size)
        limit = len(data) + 1024

        def build(build_class: Any = build_class, limit: int = limit) -> Union[CountingPeer, CountingInt32]:
            protocol: Union[CountingPeer, CountingInt32] = build_class(limit)
            return protocol

        whole = cpu_of(build, data, 0)
        trickled = cpu_of(build, data, args.piece_bytes)
        rows.append((name, len(data), whole, trickled))

    print(f"one frame, whole versus in {args.piece_bytes}-byte reads (CPU seconds)")
    print(f"{'receiver':34} {'frame bytes':>12} {'whole':>9} {'trickled':>9} {'ratio':>8}")
    for name, size, whole, trickled in rows:
        ratio = trickled / whole if whole > 0 else float("inf")
        print(f"{name:34} {size:>12} {whole:>9.4f} {trickled:>9.4f} {ratio:>7.1f}x")
    print("(the trickled cost is dominated by per-read overhead: about 20,000 reads for 4 MiB)")


if __name__ == "__main__":
    main()
