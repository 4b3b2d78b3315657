"""A sketch's ``LatencySketch`` message, both ways (the one place that reads a peer's)."""

from __future__ import annotations

from twisted_iop.latency.sketch import LatencySketch
from twisted_iop.wire import control_pb2 as pb


def fill_sketch(target: pb.LatencySketch, sketch: LatencySketch) -> None:
    """Write ``sketch`` into ``target``; an empty sketch leaves it empty (not sent)."""
    if sketch.count:
        indices, counts = sketch.pairs()
        target.index.extend(indices)
        target.count.extend(counts)
        target.sum_seconds = sketch.total


def sketch_from_wire(message: pb.LatencySketch) -> LatencySketch:
    """The sketch a peer's message carries; ValueError names what is wrong with it."""
    return LatencySketch.from_pairs(message.index, message.count, message.sum_seconds)
