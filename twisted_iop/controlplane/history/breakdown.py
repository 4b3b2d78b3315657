"""What one status snapshot adds up to beyond its counts: per model, the engines, the latency.

A kept snapshot carries its counts (``snapshot.counts``, read for free);
the per-model figures, what the engines say (tokens per second, running
and waiting requests, the KV cache) and the latency figures (the
providers' recent sketches merged: :mod:`.latency`) need the snapshot
parsed and its providers visited. :func:`breakdown_of` does that once;
:class:`BreakdownCache` keeps the result per edge with the bytes it was
made from, so an edge whose snapshot did not change since is not parsed
again. The sampler (:mod:`.edge_sampler`) parses at most ``parse_budget``
changed snapshots per sample: a busy fleet changes every snapshot every
round, and parsing 10,000 of them costs more than the round (about 35 us
each on the 2-core development machine, parse and visit); an edge over
the budget keeps its previous breakdown until its turn comes (the edges
are taken in a rotating order, so each comes within ``edges / budget``
samples).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Optional

import attrs

from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.history.fields import FLEET_FIELDS, LATENCY_FIELDS, MISSING, MODEL_FIELDS, names
from twisted_iop.controlplane.history.latency import NO_LATENCY, LatencyPart, part_of
from twisted_iop.controlplane.http.latency_views import SnapshotLatency, snapshot_latency
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import GENERAL_AT, HEALTH_AT, TOTALS_FIELDS

#: Fixed-point scales (fields.py declares them; these are the same numbers).
TOKENS_SCALE = 1
KV_SCALE = 1000

_FIELD_NAMES = names(FLEET_FIELDS)
#: The fields of an edge's row read from its counts, and where they are in the counts.
_FROM_COUNTS = ("nodes_connected", "nodes_configured", "providers", *TOTALS_FIELDS[HEALTH_AT["healthy"] :])
assert _FIELD_NAMES[1 : 1 + len(_FROM_COUNTS)] == _FROM_COUNTS, "fields.py and status_totals.py disagree"
#: Each of those as (its column in an edge's row, its place in the counts).
COUNT_COLUMNS: tuple[tuple[int, int], ...] = tuple(
    (1 + i, TOTALS_FIELDS.index(name)) for i, name in enumerate(_FROM_COUNTS)
)
#: The fields after those: what only a parse tells.
EXTRA_FIELDS = _FIELD_NAMES[1 + len(_FROM_COUNTS) :]
assert (
    "tokens_per_second",
    "engines_reporting",
    "engine_running",
    "engine_waiting",
    "kv_cache_usage",
    *names(LATENCY_FIELDS),
) == EXTRA_FIELDS
assert names(MODEL_FIELDS)[1:7] == TOTALS_FIELDS[GENERAL_AT : GENERAL_AT + 6]
assert names(MODEL_FIELDS)[-len(LATENCY_FIELDS) :] == names(LATENCY_FIELDS)

#: The latency of a snapshot without any figures.
NO_FIGURES = SnapshotLatency((), (), None)

#: The extras of an edge nobody parsed yet.
NO_EXTRAS: tuple[int, ...] = (MISSING,) * len(EXTRA_FIELDS)


@attrs.frozen
class Breakdown:
    """What a snapshot adds up to beyond its counts."""

    #: Values of :data:`EXTRA_FIELDS`, in order.
    extras: tuple[int, ...]
    #: The KV-cache shares reported (in thousandths) added up, and how many
    #: providers reported one (a fleet's mean is the sum of sums over the sum of counts).
    kv_sum: int
    kv_reporting: int
    #: Per model, its row of :data:`~.fields.MODEL_FIELDS` values (sorted by name).
    models: tuple[tuple[str, tuple[int, ...]], ...]
    #: The edge's latency (its values end :attr:`extras`), and each model's (in :attr:`models`' order;
    #: their values end the models' rows).
    latency: LatencyPart = NO_LATENCY
    model_latency: tuple[LatencyPart, ...] = ()


EMPTY = Breakdown(NO_EXTRAS, 0, 0, ())


_PROVIDER_COUNTS = attrgetter(
    "capacity", "in_flight", "queued", "long_context_capacity", "long_context_in_flight", "long_context_queued"
)
_ENGINE = attrgetter("known", "running", "waiting", "kv_cache_usage")
_get_tokens = attrgetter("tokens_per_second")
_get_engine = attrgetter("engine")
_get_models = attrgetter("models")


def breakdown_of(response: pb.EdgeStatusResponse, latency_figures: bool = True) -> Breakdown:
    """Visit the providers of a parsed snapshot once (each field read in C by ``attrgetter``);
    without ``latency_figures`` (the snapshot is known to carry none) their latency is not looked for."""
    providers = [p for node in response.nodes for p in node.providers]
    # NaN and negatives count as 0.
    valid = [t if t == t and t > 0 else 0.0 for t in map(_get_tokens, providers)]
    reporting = running = waiting = kv_reporting = kv_sum = 0
    for known, provider_running, provider_waiting, kv in map(_ENGINE, map(_get_engine, providers)):
        if known:
            reporting += 1
            running += provider_running
            waiting += provider_waiting
            if 0.0 <= kv <= 1.0:
                kv_sum += round(kv * KV_SCALE)
                kv_reporting += 1
    serving: dict[str, list[int]] = {}
    for index, provider_models in enumerate(map(_get_models, providers)):
        for model in provider_models:
            indexes = serving.setdefault(model, [])
            if not indexes or indexes[-1] != index:  # a model named twice by one provider counts once
                indexes.append(index)
    latency = snapshot_latency(response, durations=False) if latency_figures else NO_FIGURES
    models: list[tuple[str, tuple[int, ...]]] = []
    model_latency: list[LatencyPart] = []
    if serving:
        counts = list(map(_PROVIDER_COUNTS, providers))
        by_model = dict(latency.models)
        for model in sorted(serving):
            indexes = serving[model]
            part = part_of(by_model.get(model))
            model_latency.append(part)
            if len(indexes) == 1:
                only = indexes[0]
                tokens = round(min(valid[only], 1e12) * TOKENS_SCALE)
                models.append((model, (1, *counts[only], tokens, *part.values)))
            else:
                summed = map(sum, zip(*[counts[i] for i in indexes], strict=True))
                tokens = round(min(sum(valid[i] for i in indexes), 1e12) * TOKENS_SCALE)
                models.append((model, (len(indexes), *summed, tokens, *part.values)))
    edge = part_of(latency.edge)
    extras = (
        round(min(sum(valid), 1e12) * TOKENS_SCALE),
        reporting,
        running if reporting else MISSING,
        waiting if reporting else MISSING,
        kv_sum // kv_reporting if kv_reporting else MISSING,
        *edge.values,
    )
    return Breakdown(extras, kv_sum, kv_reporting, tuple(models), edge, tuple(model_latency))


class BreakdownCache:
    """Each edge's breakdown with the snapshot bytes it was made from."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[bytes, Breakdown]] = {}
        #: Snapshots parsed (for /metrics and the bench).
        self.parsed = 0
        #: Changed snapshots not parsed in their sample for the budget (their previous breakdown served).
        self.deferred = 0

    def __len__(self) -> int:
        return len(self._kept)

    def kept(self, edge_id: str) -> tuple[bytes, Breakdown]:
        """The bytes an edge's breakdown was made from and the breakdown (``b""`` and :data:`EMPTY`: none yet)."""
        return self._kept.get(edge_id, _NONE)

    def parse(self, edge_id: str, snapshot: StatusSnapshot) -> Breakdown:
        """Parse ``edge_id``'s snapshot, keep and return its breakdown (a snapshot whose
        latency key says it carries no latency figures is not searched for them)."""
        made = breakdown_of(snapshot.parse(), snapshot.latency_key != b"")
        self._kept[edge_id] = (snapshot.data, made)
        self.parsed += 1
        return made

    def forget_except(self, edge_ids: set[str]) -> None:
        """Forget the edges not in ``edge_ids`` (gone from the registry)."""
        for edge_id in [e for e in self._kept if e not in edge_ids]:
            del self._kept[edge_id]

    def get(self, edge_id: str) -> Optional[Breakdown]:
        """The kept breakdown of an edge, if any."""
        kept = self._kept.get(edge_id)
        return None if kept is None else kept[1]


_NONE: tuple[bytes, Breakdown] = (b"", EMPTY)
