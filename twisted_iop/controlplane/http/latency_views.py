"""An edge's latency figures as the Control Plane's views show them (no I/O).

Each provider of a snapshot may carry a ``ProviderLatency`` (the Edge's
``edge/inference/latency.py``): sketches of time to first token (TTFT), time per
output token (TPOT) and request duration over its last window, and the
requests and errors that ended in it. This module reads them, checked
(:func:`~twisted_iop.latency.wire.sketch_from_wire`: a bad one from a
peer is left out, with one warning per snapshot, never a crash), merges
them **exactly** into a model's figures (the providers that list the
model; a provider of several models counts in each) and an edge's, and
writes the views' ``latency`` object (:func:`latency_json`): p50/p95 within
the sketch's :data:`~twisted_iop.latency.sketch.RELATIVE_ERROR`, and
``null`` figures when no request ended in the window.

Parsing sketches is paid once per snapshot per view that shows them: the
status view keeps its rendering per snapshot, and the fleet rows keep each
edge's ``latency`` per snapshot (``json_bytes.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Optional

import attrs
from twisted.logger import Logger

from twisted_iop.latency.sketch import LatencySketch
from twisted_iop.latency.wire import sketch_from_wire
from twisted_iop.wire import control_pb2 as pb

#: The longest window a peer's figures may say they cover (a day).
MAX_WINDOW_SECONDS = 86_400.0

_log = Logger(namespace="twisted_iop.controlplane.http.latency_views")


@attrs.frozen
class LatencyFigures:
    """A provider's (or merged: a model's, an edge's) figures over its recent window."""

    ttft: LatencySketch
    tpot: LatencySketch
    duration: LatencySketch
    requests: int
    errors: int
    window_seconds: float


def provider_figures(latency: pb.ProviderLatency, durations: bool = True) -> LatencyFigures:
    """The recent figures of one ``ProviderLatency``; ValueError names what is wrong with it.
    Without ``durations``, the duration sketch is not read (left empty: the history keeps none)."""
    window = latency.window_seconds
    if not (math.isfinite(window) and 0 < window <= MAX_WINDOW_SECONDS):
        raise ValueError(f"window_seconds {window!r} outside (0, {MAX_WINDOW_SECONDS:g}]")
    if latency.errors_recent > latency.requests_recent:
        raise ValueError(f"{latency.errors_recent} errors of {latency.requests_recent} requests")
    return LatencyFigures(
        sketch_from_wire(latency.ttft_recent),
        sketch_from_wire(latency.tpot_recent),
        sketch_from_wire(latency.duration_recent) if durations else LatencySketch(),
        latency.requests_recent,
        latency.errors_recent,
        window,
    )


def merged_figures(figures: Iterable[LatencyFigures]) -> Optional[LatencyFigures]:
    """All of ``figures`` in one (exact: counts added); None when there are none; one alone is itself."""
    listed = list(figures)
    if len(listed) == 1:
        return listed[0]
    ttft, tpot, duration = LatencySketch(), LatencySketch(), LatencySketch()
    requests = errors = 0
    window = 0.0
    seen = False
    for each in listed:
        seen = True
        ttft.merge(each.ttft)
        tpot.merge(each.tpot)
        duration.merge(each.duration)
        requests += each.requests
        errors += each.errors
        window = max(window, each.window_seconds)
    return LatencyFigures(ttft, tpot, duration, requests, errors, window) if seen else None


@attrs.frozen
class SnapshotLatency:
    """The latency figures of one snapshot: per provider (in snapshot order), per model, and the edge's."""

    #: One per provider of each node in order; None when it carried none (or a bad one).
    providers: tuple[Optional[LatencyFigures], ...]
    #: Per model (sorted by name), the merged figures of the providers that list it.
    models: tuple[tuple[str, Optional[LatencyFigures]], ...]
    edge: Optional[LatencyFigures]


def snapshot_latency(response: pb.EdgeStatusResponse, durations: bool = True) -> SnapshotLatency:
    """Read every provider's figures once and merge them by model and for the edge
    (without ``durations``, leaving the duration sketches empty: :func:`provider_figures`).

    The providers are merged by the set of models they list first (an
    edge's providers mostly share a few such sets), and each model's
    figures and the edge's from those merges: a sketch is merged into a
    model once per set, not once per provider and model (the history
    reads every changed snapshot of the fleet this way).
    """
    providers: list[Optional[LatencyFigures]] = []
    #: The providers with figures, by the models they list (in order, each once).
    by_models: dict[tuple[str, ...], list[LatencyFigures]] = {}
    serving: dict[str, None] = {}
    problems: list[str] = []
    for node in response.nodes:
        for provider in node.providers:
            figures = None
            if provider.HasField("latency"):
                try:
                    figures = provider_figures(provider.latency, durations)
                except ValueError as e:
                    problems.append(f"{node.node_id}/{provider.provider_id}: {e}")
            providers.append(figures)
            listed = tuple(dict.fromkeys(provider.models))
            serving.update(dict.fromkeys(listed))
            if figures is not None:
                by_models.setdefault(listed, []).append(figures)
    if problems:
        _log.warn(
            "edge {edge_id} sent latency figures left out for {count} provider(s): {problem}",
            edge_id=response.edge_id[:128],
            count=len(problems),
            problem=problems[0][:300],
        )
    groups = [(set(listed), merged_figures(group)) for listed, group in by_models.items()]
    models = tuple(
        (model, merged_figures(figures for listed, figures in groups if model in listed and figures is not None))
        for model in sorted(serving)
    )
    edge = merged_figures(figures for _, figures in groups if figures is not None)
    return SnapshotLatency(tuple(providers), models, edge)


def _seconds(value: Optional[float]) -> Optional[float]:
    # To the microsecond: the sketch is good to 2 %, more digits only lengthen the views.
    return None if value is None else round(value, 6)


def latency_json(figures: Optional[LatencyFigures]) -> dict[str, Any]:
    """The views' ``latency`` object (see docs/latency.md); null figures when no request ended."""
    if figures is None:
        return {
            "ttft_p50_seconds": None,
            "ttft_p95_seconds": None,
            "tpot_p50_seconds": None,
            "tpot_p95_seconds": None,
            "duration_p95_seconds": None,
            "requests_per_second": None,
            "requests": 0,
            "errors": 0,
            "window_seconds": None,
        }
    window = figures.window_seconds
    return {
        "ttft_p50_seconds": _seconds(figures.ttft.quantile(0.5)),
        "ttft_p95_seconds": _seconds(figures.ttft.quantile(0.95)),
        "tpot_p50_seconds": _seconds(figures.tpot.quantile(0.5)),
        "tpot_p95_seconds": _seconds(figures.tpot.quantile(0.95)),
        "duration_p95_seconds": _seconds(figures.duration.quantile(0.95)),
        "requests_per_second": round(figures.requests / window, 3),
        "requests": figures.requests,
        "errors": figures.errors,
        "window_seconds": window,
    }


def provider_latency_json(provider: pb.ProviderSnapshot) -> dict[str, Any]:
    """A provider's ``latency`` object (null figures without, or with bad, figures:
    :func:`snapshot_latency` of the same snapshot says so)."""
    if not provider.HasField("latency"):
        return latency_json(None)
    try:
        return latency_json(provider_figures(provider.latency))
    except ValueError:
        return latency_json(None)


def models_json(response: pb.EdgeStatusResponse) -> dict[str, Any]:
    """Per model of a snapshot, ``{"latency": ...}`` merged from the providers that list it."""
    return {model: {"latency": latency_json(figures)} for model, figures in snapshot_latency(response).models}


def edge_latency_json(response: pb.EdgeStatusResponse) -> dict[str, Any]:
    """An edge's ``latency`` object: every provider's figures merged."""
    return latency_json(snapshot_latency(response).edge)
