"""The status provider: the Edge's ``EdgeStatusResponse`` snapshot.

Rules (see docs/edge-and-node.md):

* every configured Node appears, in configuration order;
* a Node that is not dispatch-ready has ``connected=false`` and each of its
  configured providers keeps its identity (id, kind, models) with
  ``status=UNAVAILABLE``, ``health=OFFLINE`` and every counter 0;
* a ready Node's providers show their configured capacity, in-flight leases
  and queue pressure from the pool, health from the Node's reports, and
  ``AVAILABLE`` or ``DRAINED``.
"""

from __future__ import annotations

from twisted.internet.interfaces import IReactorTime

from twisted_iop.edge.config import NodeConfig, ProviderConfig
from twisted_iop.edge.registry import NodeRegistry
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import with_totals


class StatusProvider:
    """Builds snapshots from the registry, stamped with the Edge's clock."""

    def __init__(self, registry: NodeRegistry, clock: IReactorTime) -> None:
        self._registry = registry
        self._clock = clock

    def snapshot(self) -> pb.EdgeStatusResponse:
        """A fresh ``EdgeStatusResponse`` listing every configured Node, with its totals."""
        response = pb.EdgeStatusResponse(
            edge_id=self._registry.edge_id,
            generated_at_ms=_ms(self._clock.seconds()),
        )
        for node in self._registry.nodes():
            response.nodes.append(self.node_snapshot(node))
        # Counted here, once, so the Control Plane need not visit every
        # provider of every answer (it recounts a sample).
        return with_totals(response)

    def node_snapshot(self, node: NodeConfig) -> pb.EdgeNodeSnapshot:
        """The snapshot of one configured Node."""
        registry = self._registry
        ready = registry.is_ready(node.node_id)
        drained = registry.is_drained(node.node_id)
        snapshot = pb.EdgeNodeSnapshot(
            node_id=node.node_id,
            connected=ready,
            drained=drained,
            connected_since_ms=_ms(registry.ownership.owner_since(node.node_id)) if ready else 0,
            last_seen_ms=_ms(registry.ownership.last_seen(node.node_id)),
            labels=dict(node.labels),
        )
        for provider in node.providers:
            if ready:
                snapshot.providers.append(self._ready_provider(node.node_id, provider, drained))
            else:
                snapshot.providers.append(unavailable_provider(provider))
        return snapshot

    def _ready_provider(self, node_id: str, provider: ProviderConfig, drained: bool) -> pb.ProviderSnapshot:
        counters = self._registry.pool.counters(node_id, provider.provider_id)
        health = self._registry.health(node_id, provider.provider_id)
        health_value = health.health if health is not None else pb.PROVIDER_HEALTH_UNKNOWN
        reason = ""
        if health_value != pb.PROVIDER_HEALTH_HEALTHY:
            reason = (health.reason if health is not None else "") or "no health report yet"
        return pb.ProviderSnapshot(
            provider_id=provider.provider_id,
            kind=provider.kind,
            models=list(provider.models),
            status=pb.PROVIDER_STATUS_DRAINED if drained else pb.PROVIDER_STATUS_AVAILABLE,
            health=health_value,
            health_reason=reason,
            capacity=counters.capacity,
            in_flight=counters.in_flight,
            queued=counters.queued,
            long_context_capacity=counters.long_context_capacity,
            long_context_in_flight=counters.long_context_in_flight,
            long_context_queued=counters.long_context_queued,
        )


def unavailable_provider(provider: ProviderConfig) -> pb.ProviderSnapshot:
    """A provider of a Node that is not dispatch-ready: identity only, all zeros."""
    return pb.ProviderSnapshot(
        provider_id=provider.provider_id,
        kind=provider.kind,
        models=list(provider.models),
        status=pb.PROVIDER_STATUS_UNAVAILABLE,
        health=pb.PROVIDER_HEALTH_OFFLINE,
        health_reason="node is not connected",
    )


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
