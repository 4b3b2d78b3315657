"""The sampled fields of capacity history, declared once.

Every figure the history keeps is an integer: counts as they are,
``tokens_per_second`` in whole tokens per second (hundredths cost a fifth
of a busy day's bytes, for a precision no chart shows), and in fixed point
(:attr:`Field.scale`): ``kv_cache_usage`` in thousandths (0..1000 for
0..100 %), ``ttft_p95`` and ``tpot_p95`` in tenths of a millisecond (the
sketches' smallest value; within their 2 % error for anything from 5 ms:
microseconds cost a busy day 20 % more bytes for digits the sketches do
not have) and ``requests_per_second`` in hundredths (one request a minute
is 0.02). A value nobody
reported (no engine said its load, no provider reports its KV cache) is
:data:`MISSING` (-1), which every real value is above, so it is never
mistaken for 0; the JSON views show it as ``null``.

The latency fields (:data:`LATENCY_FIELDS`, the last of both shapes) come
from the providers' ``ProviderLatency`` in the snapshot: the sketches of
the Edge's last minute (a sliding 60 s window, what the status views
show; a sample every 15 or 30 s reads overlapping windows):

* ``ttft_p95`` / ``tpot_p95``: the 95th percentile of the merged sketches
  (:mod:`~twisted_iop.latency.sketch`: exact merges, 2 % error) of the
  providers in scope: an edge's, a model's on an edge, and, for the fleet
  and each model fleet-wide, every edge's sketches merged (never a mean of
  p95s). :data:`MISSING` when no request of that kind ended in the window
  (a p95 of nothing is not 0);
* ``requests_per_second``: the requests that ended in the window over its
  length, added up over the providers (and edges); :data:`MISSING` only
  when no provider in scope reports latency figures at all (an Edge that
  served nothing since it started, or an older one): an Edge that measured
  and saw no request end says 0.

A rolled-up tier (:mod:`.tiers`) keeps sums, maxima and lasts, not
sketches, so it cannot merge percentiles: a rolled-up p95 point's
**max** is the highest p95 sampled in its step (the figure to read, and
what the console and ``iopctl history`` draw), its mean the mean of the
sampled p95s (not a p95 of the step). Adding edges up (a selector's view,
:mod:`.queries`) takes the slowest edge's p95 (:attr:`Combine.MAX`): an
upper bound of the p95 of their requests together, since no more than 5 %
of any edge's requests are above its own p95.

Two shapes of series:

* ``fleet`` and ``edge:<id>``: :data:`FLEET_FIELDS`, every figure;
* ``model:<name>`` (the fleet's providers serving that model) and
  ``edge:<id>/model:<name>``: :data:`MODEL_FIELDS`, fewer. A provider
  serving several models counts its capacity, work and tokens under each
  of them (what is available to a model, not a share of it), so the
  models of an edge may add up to more than the edge.

The per-edge series are kept by group (:func:`group_key`: ``edges`` and
``edge-models``, column-wise in :mod:`.frames`), the fleet's each on its
own. The chunk encodings (:mod:`.chunks`, :mod:`.columns`), the roll-ups
(:mod:`.tiers`), the sampler (:mod:`.breakdown`, :mod:`.edge_sampler`,
:mod:`.recorder`) and the views (:mod:`.queries`, the OpenAPI document)
all take the names and order from here.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Optional

import attrs

#: The value of a field nobody reported (every real value is 0 or more).
MISSING = -1


class Combine(enum.Enum):
    """How the values of several edges make one (the fleet, a selector's edges)."""

    #: Added up (counts, capacity, tokens per second).
    SUM = "sum"
    #: The mean of the providers that reported it (a share: the KV cache).
    MEAN = "mean"
    #: The highest (a percentile: the members' sketches are not kept, and
    #: the highest p95 bounds the p95 of their requests together).
    MAX = "max"


@attrs.frozen
class Field:
    """One sampled figure."""

    name: str
    #: What one unit of the JSON value is, in words (for the docs and the API).
    unit: str
    #: Stored integer = JSON value x scale (1 for counts).
    scale: int = 1
    combine: Combine = Combine.SUM


#: A tenth of a millisecond: the stored unit of the latency percentiles.
TENTHS_OF_MS = 10_000
#: Hundredths: the stored unit of requests per second.
HUNDREDTHS = 100

#: The latency figures, last in both shapes (an older chunk, stored without
#: them, reads as missing them: :func:`~.tiers.fitted`).
LATENCY_FIELDS: tuple[Field, ...] = (
    Field(
        "ttft_p95",
        "seconds: the 95th percentile of time to first token over the Edges' last minute",
        scale=TENTHS_OF_MS,
        combine=Combine.MAX,
    ),
    Field(
        "tpot_p95",
        "seconds: the 95th percentile of time per output token over the Edges' last minute",
        scale=TENTHS_OF_MS,
        combine=Combine.MAX,
    ),
    Field("requests_per_second", "requests that ended per second over the Edges' last minute", scale=HUNDREDTHS),
)

#: Every figure of the fleet and of one edge, in stored order.
FLEET_FIELDS: tuple[Field, ...] = (
    Field("edges_connected", "edges"),
    Field("nodes_connected", "nodes"),
    Field("nodes_configured", "nodes"),
    Field("providers", "providers"),
    Field("providers_healthy", "providers"),
    Field("providers_degraded", "providers"),
    Field("providers_unhealthy", "providers"),
    Field("providers_offline", "providers"),
    Field("providers_unknown", "providers"),
    Field("capacity", "requests"),
    Field("in_flight", "requests"),
    Field("queued", "requests"),
    Field("long_context_capacity", "requests"),
    Field("long_context_in_flight", "requests"),
    Field("long_context_queued", "requests"),
    Field("tokens_per_second", "completion tokens per second"),
    Field("engines_reporting", "providers whose engine reported its load"),
    Field("engine_running", "requests the engines run"),
    Field("engine_waiting", "requests waiting inside the engines"),
    Field("kv_cache_usage", "share of the KV cache in use (0..1)", scale=1000, combine=Combine.MEAN),
    *LATENCY_FIELDS,
)

#: The figures of one model (fleet-wide, or on one edge), in stored order.
MODEL_FIELDS: tuple[Field, ...] = (
    Field("providers", "providers"),
    Field("capacity", "requests"),
    Field("in_flight", "requests"),
    Field("queued", "requests"),
    Field("long_context_capacity", "requests"),
    Field("long_context_in_flight", "requests"),
    Field("long_context_queued", "requests"),
    Field("tokens_per_second", "completion tokens per second"),
    *LATENCY_FIELDS,
)

FLEET = "fleet"
EDGE_PREFIX = "edge:"
MODEL_PREFIX = "model:"
#: The groups the per-edge series are kept in, column-wise (:mod:`.frames`):
#: each edge's series, keyed by its id, and each model on an edge, keyed
#: ``<edge id>/<model>`` (an edge id has no ``/``).
EDGES_GROUP = "edges"
EDGE_MODELS_GROUP = "edge-models"


def edge_series(edge_id: str) -> str:
    """The series name of one edge."""
    return EDGE_PREFIX + edge_id


def model_series(model: str, edge_id: str = "") -> str:
    """The series name of one model, fleet-wide or on ``edge_id``."""
    if edge_id:
        return f"{EDGE_PREFIX}{edge_id}/{MODEL_PREFIX}{model}"
    return MODEL_PREFIX + model


def group_key(series: str) -> Optional[tuple[str, str, str]]:
    """Where a per-edge series is kept: its group, its edge's id and its key
    in the group (None: the fleet's or a model's, kept as a series of its own)."""
    if not series.startswith(EDGE_PREFIX):
        return None
    edge_id, slash, model = series[len(EDGE_PREFIX) :].partition("/")
    if not slash:
        return EDGES_GROUP, edge_id, edge_id
    if not model.startswith(MODEL_PREFIX):
        return None
    return EDGE_MODELS_GROUP, edge_id, f"{edge_id}/{model[len(MODEL_PREFIX) :]}"


def fields_of(series: str) -> tuple[Field, ...]:
    """The fields a series holds (by its name's shape)."""
    if series.startswith(MODEL_PREFIX) or f"/{MODEL_PREFIX}" in series:
        return MODEL_FIELDS
    return FLEET_FIELDS


def names(fields: Sequence[Field]) -> tuple[str, ...]:
    """The fields' names, in order."""
    return tuple(field.name for field in fields)


def index_of(fields: Sequence[Field]) -> dict[str, int]:
    """Each field's place in a row of ``fields``."""
    return {field.name: i for i, field in enumerate(fields)}


def shown(value: float, field: Field) -> float | int | None:
    """A stored value (or a mean of them) as the JSON views show it (every
    digit of its scale: tenths of a millisecond to four decimals of a second)."""
    if value < 0:
        return None
    if field.scale == 1:
        return value if isinstance(value, int) else round(value, 3)
    return round(value / field.scale, max(3, len(str(field.scale)) - 1))
