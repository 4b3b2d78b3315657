"""Providers' latency as an Edge reports it, made from lists of durations (tests and bench).

* :func:`sketch_message`: a ``LatencySketch`` wire message of some durations;
* :class:`LatencyFeed`: one provider's cumulative figures, as requests end
  (:meth:`LatencyFeed.requests`), and its ``ProviderLatency`` now
  (:meth:`LatencyFeed.message`); :meth:`LatencyFeed.restart` begins the
  counts again under a new ``counting_since_ms``, as a restarted Edge does;
* :func:`latency_snapshot`: an ``EdgeStatusResponse`` whose providers carry
  those figures, for a scripted edge to answer with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from twisted_iop.latency.sketch import LatencySketch
from twisted_iop.wire import control_pb2 as pb

#: When a feed's counting began, by default (the Edge's clock, ms).
COUNTING_SINCE_MS = 1_700_000_000_000


def sketch_of(durations: Iterable[float]) -> LatencySketch:
    """A sketch of ``durations``."""
    sketch = LatencySketch()
    for seconds in durations:
        sketch.observe(seconds)
    return sketch


def sketch_message(sketch: LatencySketch) -> pb.LatencySketch:
    """The wire form of ``sketch``."""
    indices, counts = sketch.pairs()
    return pb.LatencySketch(index=indices, count=counts, sum_seconds=sketch.total)


class LatencyFeed:
    """One provider's cumulative latency figures (see the module docstring)."""

    def __init__(self, counting_since_ms: int = COUNTING_SINCE_MS) -> None:
        self.counting_since_ms = counting_since_ms
        self.ttft = LatencySketch()
        self.tpot = LatencySketch()
        self.duration = LatencySketch()
        self.requests_total = 0
        self.errors_total = 0
        #: The recent window: what ended since :meth:`new_window`.
        self.recent = (LatencySketch(), LatencySketch(), LatencySketch())

    def new_window(self) -> None:
        """Begin a new recent window (what the snapshot's ``*_recent`` sketches hold)."""
        self.recent = (LatencySketch(), LatencySketch(), LatencySketch())

    def requests(
        self,
        ttft: Sequence[float] = (),
        tpot: Optional[Sequence[float]] = None,
        duration: Optional[Sequence[float]] = None,
        errors: int = 0,
    ) -> None:
        """Requests that ended: each one's TTFT, time per token (by default a
        tenth of its TTFT) and duration (by default twice its TTFT), and
        ``errors`` more that failed before a first token."""
        figures = (
            ttft,
            tpot if tpot is not None else [t / 10 for t in ttft],
            duration if duration is not None else [t * 2 for t in ttft],
        )
        for total, recent, values in zip((self.ttft, self.tpot, self.duration), self.recent, figures, strict=True):
            for seconds in values:
                total.observe(seconds)
                recent.observe(seconds)
        self.requests_total += max(len(ttft), len(duration or ())) + errors
        self.errors_total += errors

    def restart(self, counting_since_ms: int) -> None:
        """Begin the counts again (a restarted Edge)."""
        self.counting_since_ms = counting_since_ms
        self.ttft, self.tpot, self.duration = LatencySketch(), LatencySketch(), LatencySketch()
        self.requests_total = self.errors_total = 0
        self.new_window()

    def message(self) -> pb.ProviderLatency:
        """The provider's ``ProviderLatency`` now."""
        ttft, tpot, duration = self.recent
        return pb.ProviderLatency(
            ttft_recent=sketch_message(ttft),
            tpot_recent=sketch_message(tpot),
            duration_recent=sketch_message(duration),
            requests_recent=ttft.count,
            ttft_total=sketch_message(self.ttft),
            tpot_total=sketch_message(self.tpot),
            duration_total=sketch_message(self.duration),
            requests_total=self.requests_total,
            errors_total=self.errors_total,
            counting_since_ms=self.counting_since_ms,
            window_seconds=60.0,
        )


def latency_snapshot(
    edge_id: str, feeds: Mapping[str, LatencyFeed], models: Sequence[str] = ("llama-3-8b",)
) -> pb.EdgeStatusResponse:
    """A status answer with one connected node per feed (``node-<n>``), its
    provider named by the feed's key, serving ``models``, with the feed's figures."""
    response = pb.EdgeStatusResponse(edge_id=edge_id, generated_at_ms=COUNTING_SINCE_MS)
    for number, (provider_id, feed) in enumerate(sorted(feeds.items()), start=1):
        node = response.nodes.add(node_id=f"node-{number}", connected=True, connected_since_ms=COUNTING_SINCE_MS)
        provider = node.providers.add(
            provider_id=provider_id,
            kind="mock",
            models=list(models),
            status=pb.PROVIDER_STATUS_AVAILABLE,
            health=pb.PROVIDER_HEALTH_HEALTHY,
            capacity=4,
        )
        provider.latency.CopyFrom(feed.message())
    return response


class LatencyEngine:
    """An engine at a set time to first token behind one provider (``mock-1``)
    of a scripted edge: each status answer adds the ``per_answer`` requests
    it ran since the last one (its recent window is just those)."""

    def __init__(self, ttft: float, per_answer: int = 20) -> None:
        self.ttft = ttft
        self.per_answer = per_answer
        self.feed = LatencyFeed()

    def status(self, edge_id: str) -> pb.EdgeStatusResponse:
        """The next status answer of ``edge_id``."""
        self.feed.new_window()
        self.feed.requests(ttft=[self.ttft] * self.per_answer)
        return latency_snapshot(edge_id, {"mock-1": self.feed})
