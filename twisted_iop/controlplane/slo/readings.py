"""What each provider did between two snapshots: the difference of its cumulative readings (pure).

Each provider's ``ProviderLatency`` carries cumulative sketches and counts
since ``counting_since_ms`` (the Edge's clock). :class:`ProviderReadings`
keeps the last reading of every stream, a stream being ``(edge, node,
provider)``, and turns the next reading into a :class:`Delta`:

* same ``counting_since_ms``: the new reading minus the last
  (:meth:`LatencySketch.minus <twisted_iop.latency.sketch.LatencySketch.minus>`);
* a new ``counting_since_ms`` (the Edge or its counters restarted), or a
  reading the last one is not contained in: the new reading whole, counted
  from zero; never a negative count;
* a stream seen for the first time (this process just started, or the
  provider is new to it): a baseline only, nothing counted (its counts may
  hold days from before).

Sketches a peer sent are checked (``LatencySketch.from_pairs``); a provider
whose latency does not check is left out of that reading and counted in
:attr:`ProviderReadings.refused`. At most ``max_streams`` streams are kept
(new ones beyond it are counted in :attr:`ProviderReadings.streams_refused`);
the streams of edges no longer known are forgotten by :meth:`forget_except`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import attrs

from twisted_iop.controlplane.slo.spec import DURATION, LATENCY_METRICS, TPOT, TTFT
from twisted_iop.latency.sketch import LatencySketch
from twisted_iop.wire import control_pb2 as pb

#: The cumulative sketch field of each latency metric.
TOTAL_FIELDS = {TTFT: "ttft_total", TPOT: "tpot_total", DURATION: "duration_total"}
DEFAULT_MAX_STREAMS = 50_000

StreamKey = tuple[str, str, str]


@attrs.define
class Reading:
    """A stream's last cumulative reading (only the metrics in use)."""

    counting_since_ms: int
    requests: int
    errors: int
    sketches: dict[str, LatencySketch]


@attrs.frozen
class Delta:
    """What one provider did since its last reading."""

    edge_id: str
    node_id: str
    provider_id: str
    models: tuple[str, ...]
    at: float
    requests: int
    errors: int
    #: Per latency metric in use: the observations since the last reading.
    sketches: dict[str, LatencySketch]


def sketch_of(message: pb.LatencySketch) -> LatencySketch:
    """A checked sketch from its wire form; ValueError names what is wrong."""
    return LatencySketch.from_pairs(list(message.index), list(message.count), message.sum_seconds)


def reading_of(latency: pb.ProviderLatency, metrics: Iterable[str]) -> Reading:
    """The cumulative reading a ``ProviderLatency`` carries; ValueError when it does not check."""
    if latency.errors_total > latency.requests_total:
        raise ValueError(f"errors_total {latency.errors_total} over requests_total {latency.requests_total}")
    sketches = {metric: sketch_of(getattr(latency, TOTAL_FIELDS[metric])) for metric in metrics}
    return Reading(latency.counting_since_ms, latency.requests_total, latency.errors_total, sketches)


class ProviderReadings:
    """The last reading of every provider stream (see the module docstring)."""

    def __init__(self, max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        self.max_streams = max_streams
        self._last: dict[StreamKey, Reading] = {}
        #: Providers whose latency did not check, and new streams beyond max_streams.
        self.refused = 0
        self.streams_refused = 0

    def __len__(self) -> int:
        return len(self._last)

    def take(
        self, edge_id: str, response: pb.EdgeStatusResponse, at: float, metrics: Iterable[str] = LATENCY_METRICS
    ) -> list[Delta]:
        """The deltas of every provider of ``response`` (an edge's snapshot received at ``at``)."""
        wanted = tuple(m for m in LATENCY_METRICS if m in set(metrics))
        deltas: list[Delta] = []
        for node in response.nodes:
            for provider in node.providers:
                if not provider.HasField("latency"):
                    continue
                key = (edge_id, node.node_id, provider.provider_id)
                try:
                    reading = reading_of(provider.latency, wanted)
                except ValueError:
                    self.refused += 1
                    continue
                delta = self._delta(key, reading, tuple(provider.models), at)
                if delta is not None:
                    deltas.append(delta)
        return deltas

    def _delta(self, key: StreamKey, reading: Reading, models: tuple[str, ...], at: float) -> Optional[Delta]:
        last = self._last.get(key)
        if last is None:
            if len(self._last) >= self.max_streams:
                self.streams_refused += 1
                return None
            self._last[key] = reading
            return None
        self._last[key] = reading
        restarted = last.counting_since_ms != reading.counting_since_ms or reading.requests < last.requests
        sketches: dict[str, LatencySketch] = {}
        for metric, sketch in reading.sketches.items():
            before = last.sketches.get(metric)
            since = None if restarted or before is None else sketch.minus(before)
            if since is None:
                # Counted from zero: the counters began again (or the metric is new to this stream).
                since = sketch if restarted else LatencySketch()
            sketches[metric] = since
        if restarted:
            requests, errors = reading.requests, reading.errors
        else:
            requests = reading.requests - last.requests
            errors = max(reading.errors - last.errors, 0)
        return Delta(key[0], key[1], key[2], models, at, requests, min(errors, requests), sketches)

    def forget_except(self, edge_ids: set[str]) -> int:
        """Forget the streams of edges not in ``edge_ids``; how many were forgotten."""
        gone = [key for key in self._last if key[0] not in edge_ids]
        for key in gone:
            del self._last[key]
        return len(gone)


# -- an edge's figure, for a rollout's latency criterion -------------------------------------

#: The recent-window sketch field of each latency metric.
RECENT_FIELDS = {TTFT: "ttft_recent", TPOT: "tpot_recent", DURATION: "duration_recent"}

ProviderKey = tuple[str, str]


def recent_sketch(response: pb.EdgeStatusResponse, metric: str) -> LatencySketch:
    """The edge's recent window of ``metric``, every provider merged (those that do not check left out)."""
    total = LatencySketch()
    for node in response.nodes:
        for provider in node.providers:
            if provider.HasField("latency"):
                try:
                    total.merge(sketch_of(getattr(provider.latency, RECENT_FIELDS[metric])))
                except ValueError:
                    continue
    return total


def cumulative_readings(response: pb.EdgeStatusResponse, metric: str) -> dict[ProviderKey, Reading]:
    """Each provider's cumulative reading of ``metric`` (those that do not check left out)."""
    readings: dict[ProviderKey, Reading] = {}
    for node in response.nodes:
        for provider in node.providers:
            if provider.HasField("latency"):
                try:
                    readings[(node.node_id, provider.provider_id)] = reading_of(provider.latency, (metric,))
                except ValueError:
                    continue
    return readings


def observed_since(baseline: dict[ProviderKey, Reading], now: dict[ProviderKey, Reading], metric: str) -> LatencySketch:
    """What the edge's providers observed of ``metric`` between two sets of
    readings, merged: a provider new since, or restarted (new
    ``counting_since_ms``), counts whole."""
    total = LatencySketch()
    for key, reading in now.items():
        sketch = reading.sketches[metric]
        before = baseline.get(key)
        since = None
        if before is not None and before.counting_since_ms == reading.counting_since_ms:
            since = sketch.minus(before.sketches[metric])
            if since is None:
                continue  # not contained in the last reading: left out, never negative
        total.merge(sketch if since is None else since)
    return total
