#!/usr/bin/env python
"""``twistd`` with the Edge's latency recording turned off: the reference of
``bench/latency_cost.py`` (the same Edge, its recorder's two calls made no-ops).

Run as ``python bench/edge_without_latency.py -n iop-edge --config edge.yaml``.
"""

from __future__ import annotations

import sys
from typing import Any

from twisted.scripts.twistd import run

from twisted_iop.edge.inference.latency import LatencyRecorder


def _nothing(self: LatencyRecorder, *args: Any) -> None:
    """Record nothing."""


LatencyRecorder.queue_waited = _nothing  # type: ignore[method-assign]
LatencyRecorder.request_ended = _nothing  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv = ["twistd", *sys.argv[1:]]
    run()
