"""Frames and bytes counted on a framed wire, in plain integers.

The framed peers (``wire/peer.py``) and the dialers (``wire/dialer.py``)
count every frame here: two additions a frame, no lock (reactor thread
only), nothing else imported. A daemon's Prometheus exposition
(``twisted_iop/metrics.py``) reads these counters when scraped; the wire
never imports the exposition, so the client library, which dials the same
wires, loads no Prometheus code.
"""

from __future__ import annotations

import attrs


@attrs.define
class WireCounters:
    """Frames and bytes one side of a wire has read and written (plain ints: cheap)."""

    frames_in: int = 0
    frames_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def received(self, size: int) -> None:
        """One frame of ``size`` bytes (length prefix included) was read."""
        self.frames_in += 1
        self.bytes_in += size

    def sent(self, size: int) -> None:
        """One frame of ``size`` bytes (length prefix included) was written."""
        self.frames_out += 1
        self.bytes_out += size
