"""How fast the Edge's inference requests went: one room for every latency figure (no I/O).

:class:`LatencyRecorder` is told of each request once, when it ends (and
of each queue wait when a lease is granted), and keeps from that:

* the Prometheus histograms of ``/metrics``, named after the OpenTelemetry
  GenAI conventions with their advised bucket boundaries, by model, node,
  provider and outcome (:data:`OUTCOMES`, a fixed set; models and providers
  are configured, so the label sets are bounded, and :data:`MAX_SERIES`
  bounds them whatever a reload does): time to the first token
  (:data:`TTFT_BUCKETS`, streamed answers only), time per output token
  after the first (:data:`TPOT_BUCKETS`: ``(end - first token) /
  (completion tokens - 1)``, when the engine's usage says more than one
  token), the whole request (:data:`DURATION_BUCKETS`, admission to its
  end) and the queue wait (admission, or a retry, to its lease);
* per provider, :class:`~twisted_iop.latency.sketch.SlidingSketch` es of
  the last :data:`WINDOW_SECONDS` and cumulative
  :class:`~twisted_iop.latency.sketch.LatencySketch` es of the same three
  figures, and the requests and errors counted in both, for the
  snapshot's ``ProviderLatency`` (:meth:`LatencyRecorder.provider_latency`).

What each sketch counts: TTFT, every streamed request whose first token
reached the Edge, whatever its end; TPOT and duration, completed requests.
``errors`` are the requests that failed for the engine's or the Edge's
sake (outcome ``error``), never the client's (``client_error``: the rules
of :mod:`~twisted_iop.edge.inference.errors`; ``cancelled``: the client
went away).

The cost is one dict look-up (a series object created once per label set)
and a handful of bisects and log-bucket additions per request; measured by
``bench/latency_cost.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

from twisted_iop.latency.sketch import LatencySketch, SlidingSketch
from twisted_iop.latency.wire import fill_sketch
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.wire import control_pb2 as pb

#: ``gen_ai.server.time_to_first_token``'s advised boundaries (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
#: ``gen_ai.server.time_per_output_token``'s advised boundaries (seconds).
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
#: ``gen_ai.server.request.duration``'s advised boundaries (seconds).
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
#: The queue wait's boundaries: the GenAI TTFT ones (a queue wait is part of a TTFT).
QUEUE_WAIT_BUCKETS = TTFT_BUCKETS

#: The ``outcome`` label's values.
OK = "ok"
ERROR = "error"
CLIENT_ERROR = "client_error"
CANCELLED = "cancelled"
OUTCOMES = (OK, ERROR, CLIENT_ERROR, CANCELLED)
#: The "recent" window of the snapshot, and its slices.
WINDOW_SECONDS = 60.0
WINDOW_SLICES = 6
#: Most label sets kept for /metrics (each is three histograms); beyond it a request counts only in
#: :attr:`LatencyRecorder.dropped_series`.
MAX_SERIES = 4096


class RequestSeries:
    """The histograms of one (model, node, provider, outcome)."""

    __slots__ = ("duration", "tpot", "ttft")

    def __init__(self) -> None:
        self.ttft = LatencyHistogram(TTFT_BUCKETS)
        self.tpot = LatencyHistogram(TPOT_BUCKETS)
        self.duration = LatencyHistogram(DURATION_BUCKETS)


class _SlidingCount:
    """Events of the last ``window`` seconds, in the same slices as a SlidingSketch."""

    __slots__ = ("_slice_seconds", "_slices", "_width")

    def __init__(self, window: float, slices: int) -> None:
        self._slice_seconds = window / slices
        self._width = slices
        #: [slice number, count], oldest first.
        self._slices: list[list[int]] = []

    def add(self, now: float) -> None:
        number = int(now // self._slice_seconds)
        slices = self._slices
        if slices and slices[-1][0] == number:
            slices[-1][1] += 1
            return
        slices.append([number, 1])
        if len(slices) > self._width:
            del slices[0]

    def reading(self, now: float) -> int:
        oldest = int(now // self._slice_seconds) - self._width + 1
        return sum(count for number, count in self._slices if number >= oldest)


class ProviderFigures:
    """One provider's sketches and counts, recent and since :attr:`since`."""

    __slots__ = (
        "duration_recent",
        "duration_total",
        "errors_recent",
        "errors_total",
        "requests_recent",
        "requests_total",
        "since",
        "tpot_recent",
        "tpot_total",
        "ttft_recent",
        "ttft_total",
    )

    def __init__(self, since: float) -> None:
        self.since = since
        self.ttft_recent = SlidingSketch(WINDOW_SECONDS, WINDOW_SLICES)
        self.tpot_recent = SlidingSketch(WINDOW_SECONDS, WINDOW_SLICES)
        self.duration_recent = SlidingSketch(WINDOW_SECONDS, WINDOW_SLICES)
        self.ttft_total = LatencySketch()
        self.tpot_total = LatencySketch()
        self.duration_total = LatencySketch()
        self.requests_recent = _SlidingCount(WINDOW_SECONDS, WINDOW_SLICES)
        self.errors_recent = _SlidingCount(WINDOW_SECONDS, WINDOW_SLICES)
        self.requests_total = 0
        self.errors_total = 0


def time_per_output_token(first_token_at: float, ended_at: float, completion_tokens: int) -> Optional[float]:
    """``(end - first token) / (completion tokens - 1)``; None for one token or fewer."""
    if completion_tokens <= 1:
        return None
    return max(ended_at - first_token_at, 0.0) / (completion_tokens - 1)


class LatencyRecorder:
    """Every latency figure of the Edge's requests (reactor thread only)."""

    def __init__(self, started_at: float) -> None:
        #: When the cumulative counts began (the snapshot's ``counting_since_ms``).
        self.started_at = started_at
        self._series: dict[tuple[str, str, str, str], RequestSeries] = {}
        self._queue_waits: dict[tuple[str, str, str], LatencyHistogram] = {}
        self._providers: dict[tuple[str, str], ProviderFigures] = {}
        #: Requests not in /metrics because :data:`MAX_SERIES` label sets exist already.
        self.dropped_series = 0

    # -- what the gateway tells it ------------------------------------------------------

    def queue_waited(self, model: str, node_id: str, provider_id: str, seconds: float) -> None:
        """A request waited ``seconds`` from admission (or a retry) to its lease on this provider."""
        key = (model, node_id, provider_id)
        histogram = self._queue_waits.get(key)
        if histogram is None:
            if len(self._queue_waits) >= MAX_SERIES:
                self.dropped_series += 1
                return
            histogram = self._queue_waits[key] = LatencyHistogram(QUEUE_WAIT_BUCKETS)
        histogram.observe(seconds)

    def request_ended(
        self,
        model: str,
        node_id: str,
        provider_id: str,
        outcome: str,
        started_at: float,
        first_token_at: Optional[float],
        ended_at: float,
        completion_tokens: Optional[int],
    ) -> None:
        """One request ended: admitted at ``started_at``, its first streamed token at
        ``first_token_at`` (None: not streamed, or none came), ``completion_tokens`` by the
        engine's usage (None: no usage). ``node_id``/``provider_id`` are "" when it never
        held a lease (counted in /metrics only)."""
        duration = max(ended_at - started_at, 0.0)
        ttft = max(first_token_at - started_at, 0.0) if first_token_at is not None else None
        tpot = None
        if outcome == OK and first_token_at is not None and completion_tokens is not None:
            tpot = time_per_output_token(first_token_at, ended_at, completion_tokens)
        key = (model, node_id, provider_id, outcome)
        series = self._series.get(key)
        if series is None:
            if len(self._series) >= MAX_SERIES:
                self.dropped_series += 1
                series = None
            else:
                series = self._series[key] = RequestSeries()
        if series is not None:
            series.duration.observe(duration)
            if ttft is not None:
                series.ttft.observe(ttft)
            if tpot is not None:
                series.tpot.observe(tpot)
        if not provider_id:
            return
        figures = self._providers.get((node_id, provider_id))
        if figures is None:
            figures = self._providers[(node_id, provider_id)] = ProviderFigures(self.started_at)
        figures.requests_total += 1
        figures.requests_recent.add(ended_at)
        if outcome == ERROR:
            figures.errors_total += 1
            figures.errors_recent.add(ended_at)
        if ttft is not None:
            figures.ttft_total.observe(ttft)
            figures.ttft_recent.observe(ttft, ended_at)
        if outcome == OK:
            figures.duration_total.observe(duration)
            figures.duration_recent.observe(duration, ended_at)
            if tpot is not None:
                figures.tpot_total.observe(tpot)
                figures.tpot_recent.observe(tpot, ended_at)

    # -- what /metrics and the snapshot read -----------------------------------------------

    def series(self) -> Iterator[tuple[list[str], RequestSeries]]:
        """Every (``[model, node, provider, outcome]``, histograms), sorted."""
        for key in sorted(self._series):
            yield list(key), self._series[key]

    def queue_waits(self) -> Iterator[tuple[list[str], LatencyHistogram]]:
        """Every (``[model, node, provider]``, queue-wait histogram), sorted."""
        for key in sorted(self._queue_waits):
            yield list(key), self._queue_waits[key]

    def provider_latency(self, node_id: str, provider_id: str, now: float) -> Optional[pb.ProviderLatency]:
        """The snapshot's ``ProviderLatency`` of a provider; None before its first request.

        Bounded: six sketches of at most ``MAX_BUCKETS`` buckets each; empty ones are left out.
        """
        figures = self._providers.get((node_id, provider_id))
        if figures is None:
            return None
        latency = pb.ProviderLatency(
            window_seconds=WINDOW_SECONDS,
            requests_total=figures.requests_total,
            errors_total=figures.errors_total,
            counting_since_ms=int(figures.since * 1000),
            requests_recent=figures.requests_recent.reading(now),
            errors_recent=figures.errors_recent.reading(now),
        )
        fill_sketch(latency.ttft_recent, figures.ttft_recent.reading(now))
        fill_sketch(latency.tpot_recent, figures.tpot_recent.reading(now))
        fill_sketch(latency.duration_recent, figures.duration_recent.reading(now))
        fill_sketch(latency.ttft_total, figures.ttft_total)
        fill_sketch(latency.tpot_total, figures.tpot_total)
        fill_sketch(latency.duration_total, figures.duration_total)
        return latency
