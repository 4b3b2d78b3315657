"""The status provider: the Edge's ``EdgeStatusResponse`` snapshot.

Rules (see docs/edge-and-node.md):

* every configured Node appears, in configuration order;
* a Node that is not dispatch-ready has ``connected=false`` and each of its
  configured providers keeps its identity (id, kind, models) with
  ``status=UNAVAILABLE``, ``health=OFFLINE`` and every counter 0;
* a ready Node's providers show their capacity (configured, or the
  engine's with ``capacity: auto``), in-flight leases and queue pressure
  from the pool, health from the Node's reports, and ``AVAILABLE`` or
  ``DRAINED``; the engine's last reading (``engine``, its ``age_ms`` the age
  now), ``saturated``, tokens (totals, the part of them estimated, and
  completion tokens per second over the last minute) and ``cooling_down``: a provider that cools down and
  reports ``healthy`` shows ``degraded`` with the cool-down's reason;
  ``latency``, its requests' TTFT, time per token and duration sketches
  (``edge/inference/latency.py``), absent before its first request;
  ``launch``, its engine's state when its Node launches it;
  ``deployment``, the deployment a provider is an instance of;
* each node carries the engine profiles and GPU slots it declares, and the
  snapshot the desired set's version this edge took, every instance's
  state and whether the edge holds changes (:mod:`~twisted_iop.edge.deployments`).

:func:`provider_counters` is the one source of the lease counters, for
this view and for ``/metrics`` alike.
"""

from __future__ import annotations

from typing import Optional

from twisted.internet.interfaces import IReactorTime

from twisted_iop.edge.config import NodeConfig, ProviderConfig
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.providers.pool import LeaseCounters
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import with_totals


class StatusProvider:
    """Builds snapshots from the registry, stamped with the Edge's clock."""

    def __init__(
        self, registry: NodeRegistry, clock: IReactorTime, deployments: Optional[EdgeDeployments] = None
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._deployments = deployments

    def snapshot(self) -> pb.EdgeStatusResponse:
        """A fresh ``EdgeStatusResponse`` listing every configured Node, with its totals."""
        response = pb.EdgeStatusResponse(
            edge_id=self._registry.edge_id,
            generated_at_ms=_ms(self._clock.seconds()),
        )
        for node in self._registry.nodes():
            response.nodes.append(self.node_snapshot(node))
        if self._deployments is not None:
            self._deployments.fill_status(response)
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
        if self._deployments is not None:
            self._deployments.fill_node_snapshot(snapshot)
        return snapshot

    def _ready_provider(self, node_id: str, provider: ProviderConfig, drained: bool) -> pb.ProviderSnapshot:
        registry = self._registry
        provider_id = provider.provider_id
        counters = provider_counters(registry, node_id, provider_id)
        health = registry.providers.health(node_id, provider_id)
        health_value = health.health if health is not None else pb.PROVIDER_HEALTH_UNKNOWN
        reason = ""
        if health_value != pb.PROVIDER_HEALTH_HEALTHY:
            reason = (health.reason if health is not None else "") or "no health report yet"
        cooling = registry.providers.cooling_down(node_id, provider_id)
        if cooling is not None and health_value in (pb.PROVIDER_HEALTH_HEALTHY, pb.PROVIDER_HEALTH_DEGRADED):
            health_value = pb.PROVIDER_HEALTH_DEGRADED
            reason = f"cooling down: {cooling}" + (f"; {reason}" if reason else "")
        now = self._clock.seconds()
        reading = registry.providers.engine_loads.last(node_id, provider_id)
        engine = reading.to_wire(now) if reading is not None else pb.EngineLoad(known=False, kv_cache_usage=-1.0)
        prompt_tokens, completion_tokens = registry.tokens.provider_totals(node_id, provider_id)
        estimated_prompt, estimated_completion = registry.tokens.provider_estimated_totals(node_id, provider_id)
        snapshot = pb.ProviderSnapshot(
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
            engine=engine,
            tokens_per_second=registry.tokens.tokens_per_second(node_id, provider_id, now),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            estimated_prompt_tokens=estimated_prompt,
            estimated_completion_tokens=estimated_completion,
            saturated=registry.providers.saturated(node_id, provider_id),
            cooling_down=cooling is not None,
        )
        latency = registry.latency.provider_latency(node_id, provider_id, now)
        if latency is not None:
            snapshot.latency.CopyFrom(latency)
        launch = health.launch if health is not None else None
        if launch is not None:
            snapshot.launch.CopyFrom(launch.to_wire())
        return snapshot


def provider_counters(registry: NodeRegistry, node_id: str, provider_id: str) -> LeaseCounters:
    """The lease counters of a provider as the Edge shows them: all 0 unless its Node is ready."""
    if not registry.is_ready(node_id):
        return LeaseCounters(0, 0, 0, 0, 0, 0)
    return registry.pool.counters(node_id, provider_id)


def unavailable_provider(provider: ProviderConfig) -> pb.ProviderSnapshot:
    """A provider of a Node that is not dispatch-ready: identity only, all zeros."""
    return pb.ProviderSnapshot(
        provider_id=provider.provider_id,
        kind=provider.kind,
        models=list(provider.models),
        status=pb.PROVIDER_STATUS_UNAVAILABLE,
        health=pb.PROVIDER_HEALTH_OFFLINE,
        health_reason="node is not connected",
        engine=pb.EngineLoad(known=False, kv_cache_usage=-1.0),
    )


def _ms(seconds: float) -> int:
    return int(seconds * 1000)
