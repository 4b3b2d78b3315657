"""What one status snapshot adds up to beyond its counts: per model, and the engines.

A kept snapshot carries its counts (``snapshot.counts``, read for free);
the per-model figures and what the engines say (tokens per second, running
and waiting requests, the KV cache) need the snapshot parsed and its
providers visited. :func:`breakdown_of` does that once;
:class:`BreakdownCache` keeps the result per edge with the bytes it was
made from, so an edge whose snapshot did not change since is not parsed
again, and parses at most ``budget`` changed snapshots per sample: a busy
fleet changes every snapshot every round, and parsing 10,000 of them
costs more than the round (about 30 us each on the 2-core development
machine); an edge over the budget keeps its previous breakdown until its
turn comes (the edges are taken in a rotating order, so each comes within
``edges / budget`` samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Optional

import attrs

from twisted_iop.controlplane.history.fields import FLEET_FIELDS, MISSING, MODEL_FIELDS, names
from twisted_iop.controlplane.snapshots import StatusSnapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import GENERAL_AT, HEALTH_AT, TOTALS_FIELDS

#: Fixed-point scales (fields.py declares them; these are the same numbers).
TOKENS_SCALE = 100
KV_SCALE = 1000

_FIELD_NAMES = names(FLEET_FIELDS)
#: The fields of an edge's row read from its counts, and where they are in the counts.
_FROM_COUNTS = ("nodes_connected", "nodes_configured", "providers", *TOTALS_FIELDS[HEALTH_AT["healthy"] :])
assert _FIELD_NAMES[1 : 1 + len(_FROM_COUNTS)] == _FROM_COUNTS, "fields.py and status_totals.py disagree"
_pick_counts = itemgetter(*(TOTALS_FIELDS.index(name) for name in _FROM_COUNTS))
#: The fields after those: what only a parse tells.
EXTRA_FIELDS = _FIELD_NAMES[1 + len(_FROM_COUNTS) :]
assert EXTRA_FIELDS == ("tokens_per_second", "engines_reporting", "engine_running", "engine_waiting", "kv_cache_usage")
assert names(MODEL_FIELDS)[1:7] == TOTALS_FIELDS[GENERAL_AT : GENERAL_AT + 6]

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


EMPTY = Breakdown(NO_EXTRAS, 0, 0, ())


def edge_row(counts: Sequence[int], extras: tuple[int, ...]) -> tuple[int, ...]:
    """An edge's row of :data:`~.fields.FLEET_FIELDS` from its snapshot's counts and its extras."""
    return (1, *_pick_counts(counts), *extras)


def breakdown_of(response: pb.EdgeStatusResponse) -> Breakdown:
    """Visit the providers of a parsed snapshot once."""
    tokens = 0.0
    reporting = running = waiting = kv_reporting = 0
    kv_sum = 0
    models: dict[str, list[int]] = {}
    for node in response.nodes:
        for p in node.providers:
            provider_tokens = p.tokens_per_second
            if provider_tokens == provider_tokens and provider_tokens > 0:  # NaN and negatives count as 0
                tokens += provider_tokens
            else:
                provider_tokens = 0.0
            engine = p.engine
            if engine.known:
                reporting += 1
                running += engine.running
                waiting += engine.waiting
                kv = engine.kv_cache_usage
                if 0.0 <= kv <= 1.0:
                    kv_sum += round(kv * KV_SCALE)
                    kv_reporting += 1
            row = (
                1,
                p.capacity,
                p.in_flight,
                p.queued,
                p.long_context_capacity,
                p.long_context_in_flight,
                p.long_context_queued,
                round(min(provider_tokens, 1e12) * TOKENS_SCALE),
            )
            for model in set(p.models):
                kept = models.get(model)
                if kept is None:
                    models[model] = list(row)
                else:
                    models[model] = [a + b for a, b in zip(kept, row, strict=True)]
    extras = (
        round(min(tokens, 1e12) * TOKENS_SCALE),
        reporting,
        running if reporting else MISSING,
        waiting if reporting else MISSING,
        kv_sum // kv_reporting if kv_reporting else MISSING,
    )
    return Breakdown(extras, kv_sum, kv_reporting, tuple((m, tuple(models[m])) for m in sorted(models)))


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

    def of(self, edge_id: str, snapshot: StatusSnapshot, may_parse: bool) -> tuple[Breakdown, bool]:
        """The breakdown of ``edge_id``'s snapshot and whether it was parsed
        now; with ``may_parse`` false, a changed snapshot is not parsed and
        the previous breakdown (or :data:`EMPTY`) serves."""
        kept = self._kept.get(edge_id)
        data = snapshot.data
        if kept is not None and (kept[0] is data or kept[0] == data):
            return kept[1], False
        if not may_parse:
            self.deferred += 1
            return (EMPTY if kept is None else kept[1]), False
        made = breakdown_of(snapshot.parse())
        self._kept[edge_id] = (data, made)
        self.parsed += 1
        return made, True

    def forget_except(self, edge_ids: set[str]) -> None:
        """Forget the edges not in ``edge_ids`` (gone from the registry)."""
        for edge_id in [e for e in self._kept if e not in edge_ids]:
            del self._kept[edge_id]

    def get(self, edge_id: str) -> Optional[Breakdown]:
        """The kept breakdown of an edge, if any."""
        kept = self._kept.get(edge_id)
        return None if kept is None else kept[1]
