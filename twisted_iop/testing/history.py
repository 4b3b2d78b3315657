"""Capacity history for tests: a sampled fleet on a fake clock, and chunks of an earlier release.

:class:`HistoryFleet` is a registry, gateway and history service over a
store, on a :class:`~twisted.internet.task.Clock`, with edges whose answers
the tests set; :func:`column` reads one field out of a view.

:func:`write_old_chunks` writes, into any history store, the chunks a
release before the latency fields wrote: the fleet's sampled rows and a
rolled-up point, a model's rows and an edge's segment of the ``edges``
group, each at its old width (:data:`OLD_FLEET_WIDTH`,
:data:`OLD_MODEL_WIDTH`). The stored forms did not change otherwise, so
these are made with today's chunk writers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history import chunks, tiers
from twisted_iop.controlplane.history.columns import ColumnChunkWriter
from twisted_iop.controlplane.history.edge_sampler import EDGES
from twisted_iop.controlplane.history.fields import FLEET_FIELDS, LATENCY_FIELDS, MODEL_FIELDS, fields_of
from twisted_iop.controlplane.history.frames import segment_of, store_key
from twisted_iop.controlplane.history.queries import choose_tier, parse_range
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.history.settings import HistorySettings, Tier
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.interface import HistoryChunk
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.wires.peers import AnsweringEdgePeer
from twisted_iop.wire import control_pb2 as pb

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


class HistoryFleet:
    """A registry, gateway and history service over ``store`` (a memory store by default) on a
    fake clock started at ``start``, with edges whose answers the tests set (:meth:`answer`)."""

    def __init__(self, settings: HistorySettings, start: float, store: Any = None) -> None:
        self.clock = Clock()
        self.clock.advance(start)
        self.registry = EdgeRegistry(self.clock)
        self.gateway = EdgeGateway(self.registry, self.clock, fleet_max_age_seconds=0.0)
        self.store = store if store is not None else MemoryStore()
        self.history = HistoryService(settings, self.registry, self.gateway, self.store, self.clock)
        self.peers: dict[str, AnsweringEdgePeer] = {}
        self.history.startService()

    def enroll(self, edge_id: str, hello: EdgeHello, status: Callable[[], pb.EdgeStatusResponse]) -> AnsweringEdgePeer:
        """Connect edge ``edge_id``, answering ``status()`` to every status request."""
        peer = self.peers[edge_id] = AnsweringEdgePeer(edge_id)
        self.answer(edge_id, status)
        self.registry.connect(edge_id, peer, hello)
        return peer

    def answer(self, edge_id: str, status: Callable[[], pb.EdgeStatusResponse]) -> None:
        """The edge answers ``status()`` from now on."""
        self.peers[edge_id].status = status

    def seconds(self, n: int) -> None:
        """Let ``n`` one-second intervals pass (each one samples)."""
        for _ in range(n):
            self.clock.advance(1)

    def read(self, series: str, step: Optional[str] = None, span: str = "-1h") -> Deferred[Any]:
        """A series' view, every field, as the routes read it."""
        queries = self.history.queries
        now = self.clock.seconds()
        start, end = parse_range(span, None, now)
        tier_list = queries.tiers_for(series)
        index = (
            choose_tier(tier_list, start, end, now)
            if step is None
            else [t.step_seconds for t in tier_list].index(float(step))
        )
        return queries.view(series, fields_of(series), index, start, end)

    def view(self, series: str, step: Optional[str] = None, span: str = "-1h") -> Any:
        """A series' view, every field, from a store that answers at once."""
        result: list[Any] = []
        self.read(series, step, span).addCallback(result.append)
        assert result, "the store answers at once"
        return result[0]


def column(view: Any, name: str) -> list[Any]:
    """One field's values (sampled) or (mean, max, last) triples (rolled) in a view."""
    at = [f.name for f in view.fields].index(name)
    return [values[at] for _, _, values in view.points]
