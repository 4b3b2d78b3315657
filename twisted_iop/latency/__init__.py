"""Latency: what the fleet measures of its requests' speed, and the math on it.

This package owns the shapes every daemon shares for latency figures, and
does no I/O:

* :mod:`.sketch`: a mergeable log-bucket sketch of durations with a stated
  relative error (:class:`~.sketch.LatencySketch`), and a sliding window of
  them (:class:`~.sketch.SlidingSketch`) for "the last minute";
* :mod:`.wire`: a sketch to and from its ``LatencySketch`` message.

The Edge records each request into them; the snapshot carries them to the
Control Plane, whose views, history and SLOs merge them exactly.
"""
