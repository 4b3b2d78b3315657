"""Capacity history as an earlier release stored it, for the tests of reading it back.

:func:`write_old_chunks` writes, into any history store, the chunks a
release before the latency fields wrote: the fleet's sampled rows and a
rolled-up point, a model's rows and an edge's segment of the ``edges``
group, each at its old width (:data:`OLD_FLEET_WIDTH`,
:data:`OLD_MODEL_WIDTH`). The stored forms did not change otherwise, so
these are made with today's chunk writers.
"""

from __future__ import annotations

from typing import Any

from twisted_iop.controlplane.history import chunks, tiers
from twisted_iop.controlplane.history.columns import ColumnChunkWriter
from twisted_iop.controlplane.history.edge_sampler import EDGES
from twisted_iop.controlplane.history.fields import FLEET_FIELDS, LATENCY_FIELDS, MODEL_FIELDS
from twisted_iop.controlplane.history.frames import segment_of, store_key
from twisted_iop.controlplane.history.settings import Tier
from twisted_iop.controlplane.store.interface import HistoryChunk

#: The fleet's (and an edge's) fields, and a model's, before the latency fields.
OLD_FLEET_WIDTH = len(FLEET_FIELDS) - len(LATENCY_FIELDS)
OLD_MODEL_WIDTH = len(MODEL_FIELDS) - len(LATENCY_FIELDS)
#: What every old point holds: the fleet's counts, a model's, an edge's whole columns.
FLEET_VALUE = 5
MODEL_VALUE = 3
EDGE_VALUE = 7


def write_old_chunks(store: Any, t_ms: int, tiers_of: tuple[Tier, Tier], edge_id: str, model: str) -> None:
    """Write old-width chunks at ``t_ms``: the fleet's three sampled rows (1 s apart) in the first
    of ``tiers_of`` and their rolled-up point in the second, ``model``'s one row (2 providers),
    and ``edge_id``'s two frames in the first tier's store key of the edges' segments."""
    first, second = tiers_of
    row = (1, *[FLEET_VALUE] * (OLD_FLEET_WIDTH - 1))
    fleet = chunks.OpenChunk(chunks.SAMPLED, 1 + OLD_FLEET_WIDTH)
    for i in range(3):
        fleet.append(t_ms + 1000 * i, row)
    store.history_write(HistoryChunk("fleet", first.key, t_ms / 1000, t_ms / 1000 + 2, fleet.closed_bytes()))
    rolled = chunks.OpenChunk(chunks.ROLLED, 1 + tiers.rolled_width(OLD_FLEET_WIDTH))
    rolled.append(t_ms, tiers.roll_sampled([row] * 3))
    store.history_write(HistoryChunk("fleet", second.key, t_ms / 1000, t_ms / 1000, rolled.closed_bytes()))
    one = chunks.OpenChunk(chunks.SAMPLED, 1 + OLD_MODEL_WIDTH)
    one.append(t_ms, (2, *[MODEL_VALUE] * (OLD_MODEL_WIDTH - 1)))
    store.history_write(HistoryChunk(f"model:{model}", first.key, t_ms / 1000, t_ms / 1000, one.open_bytes()))
    patch_columns = tuple(c for c in EDGES.patch_columns if c < OLD_FLEET_WIDTH)
    segment = ColumnChunkWriter(chunks.SAMPLED, OLD_FLEET_WIDTH, patch_columns)
    segment.add_keys([edge_id])
    segment.add_frame(t_ms, [(c, [EDGE_VALUE]) for c in range(OLD_FLEET_WIDTH) if c not in patch_columns], [])
    segment.add_frame(t_ms + 1000, [], [(0, [0] * len(patch_columns))])
    series = EDGES.series(segment_of(edge_id))
    store.history_write(HistoryChunk(series, store_key(first), t_ms / 1000, t_ms / 1000 + 1, segment.closed_bytes()))
