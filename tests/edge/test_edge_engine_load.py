"""The engines' own load at the Edge: readings checked and kept per owner connection,
saturation taking a provider out of rotation until a reading says it recovered,
``capacity: auto``, fair turns between equals, and the snapshot and metrics that
show it (plain calls on a registry with a fake clock)."""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from twisted_iop.configuration import ConfigError
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.nodes.wire import NodeServerFactory
from twisted_iop.edge.providers.load import MAX_ENGINE_REQUESTS, EngineLoads, SaturationRule
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame

MODEL = "m"


def edge(capacities: dict[str, Any], inference: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """edge.yaml with one Node per provider (``p1`` on ``n1`` ...), all serving :data:`MODEL`."""
    nodes = [
        {
            "node_id": f"n{provider_id[1:]}",
            "providers": [{"provider_id": provider_id, "kind": "mock", "models": [MODEL], "capacity": capacity}],
        }
        for provider_id, capacity in capacities.items()
    ]
    return {"control_plane": {"edge_id": "edge-a"}, "nodes": nodes, "inference": inference or {}}


def ready_registry(
    capacities: dict[str, Any], inference: Optional[dict[str, Any]] = None
) -> tuple[NodeRegistry, Clock, dict[str, int]]:
    """Every Node connected, ready and healthy; the registry, its clock and the owner tokens."""
    clock = Clock()
    clock.advance(1000)
    registry = NodeRegistry(parse_edge_config(edge(capacities, inference)), clock)
    tokens = {}
    for provider_id in capacities:
        node_id = f"n{provider_id[1:]}"
        spec = pb.NodeProviderSpec(provider_id=provider_id, kind="mock", models=[MODEL])
        token = registry.node_accepted(pb.NodeHelloRequest(node_id=node_id, providers=[spec]), FakeNodePeer())
        health = pb.ProviderHealthReport(provider_id=provider_id, health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
        registry.node_ready(token, [health])
        tokens[provider_id] = token
    return registry, clock, tokens


def load(provider_id: str, **fields: Any) -> list[pb.ProviderLoadReport]:
    """A one-provider load report (known unless told otherwise)."""
    fields.setdefault("known", True)
    fields.setdefault("kv_cache_usage", -1.0)
    return [pb.ProviderLoadReport(provider_id=provider_id, load=pb.EngineLoad(**fields))]


def test_readings_are_checked_and_bounded() -> None:
    """Unknown providers are ignored; counts, parallel and age are clamped; bad KV figures are unknown."""
    loads = EngineLoads(SaturationRule())
    reports = [
        pb.ProviderLoadReport(provider_id="nobody", load=pb.EngineLoad(known=True, running=1)),
        pb.ProviderLoadReport(
            provider_id="p1",
            load=pb.EngineLoad(
                known=True, running=2**32 - 1, waiting=2**32 - 1, kv_cache_usage=math.nan, age_ms=2**32 - 1
            ),
        ),
    ]
    assert loads.update("n1", ["p1"], reports, now=10_000.0) == ["p1"]
    reading = loads.last("n1", "p1")
    assert reading is not None
    assert reading.running == MAX_ENGINE_REQUESTS and reading.waiting == MAX_ENGINE_REQUESTS
    assert reading.kv_cache_usage is None
    assert reading.read_at == 10_000.0 - 3600.0  # the age is bounded to an hour
    assert loads.last("n1", "nobody") is None
    for bad in (1.5, -0.1, math.inf):
        loads.update("n1", ["p1"], load("p1", kv_cache_usage=bad), now=10_000.0)
        kept = loads.last("n1", "p1")
        assert kept is not None and kept.kv_cache_usage is None
    loads.update("n1", ["p1"], load("p1", parallel=2**32 - 1), now=10_000.0)
    assert loads.parallel("n1", "p1") == 100_000


def test_saturated_engine_takes_no_lease_until_a_reading_says_it_recovered() -> None:
    """Waiting above max_waiting (or KV above max_kv_cache) stops new leases; recovery admits the queue."""
    registry, _clock, tokens = ready_registry({"p1": 4})
    pool = registry.pool
    registry.node_load(tokens["p1"], load("p1", running=4, waiting=6))
    assert registry.providers.saturated("n1", "p1")
    assert pool.try_acquire(MODEL) is None
    waiting = pool.admit(MODEL)
    assert not waiting.called
    registry.node_load(tokens["p1"], load("p1", running=4, waiting=5, kv_cache_usage=0.81))
    assert pool.try_acquire(MODEL) is None and not waiting.called  # the KV cache is over 0.8
    registry.node_load(tokens["p1"], load("p1", running=4, waiting=2, kv_cache_usage=0.5))
    assert waiting.called and not registry.providers.saturated("n1", "p1")


def test_a_stale_saturated_reading_stops_counting() -> None:
    """A reading older than stale_after_seconds is unknown: the provider takes work again, the queue moves."""
    registry, clock, tokens = ready_registry({"p1": 4}, {"saturation": {"stale_after_seconds": 10}})
    registry.node_load(tokens["p1"], load("p1", running=4, waiting=9, age_ms=2000))
    waiting = registry.pool.admit(MODEL)
    assert not waiting.called
    clock.advance(7.9)
    assert not waiting.called
    clock.advance(0.2)  # 2 s old when received + 8.1 s since
    assert waiting.called
    assert registry.engine_load("n1", "p1") is None and registry.providers.engine_loads.last("n1", "p1") is not None


def test_only_the_owner_connection_counts_and_readings_go_with_the_node() -> None:
    """A pending connection's reports change nothing; a disconnect drops the readings."""
    registry, _clock, tokens = ready_registry({"p1": 2})
    spec = pb.NodeProviderSpec(provider_id="p1", kind="mock", models=[MODEL])
    pending = registry.node_accepted(pb.NodeHelloRequest(node_id="n1", providers=[spec]), FakeNodePeer())
    assert registry.node_load(pending, load("p1", waiting=50)) == []
    assert not registry.providers.saturated("n1", "p1")
    registry.node_load(tokens["p1"], load("p1", waiting=50, parallel=3))
    assert registry.providers.saturated("n1", "p1")
    registry.node_closed(tokens["p1"])
    assert registry.providers.engine_loads.last("n1", "p1") is None and not registry.providers.saturated("n1", "p1")


def test_node_wire_dispatches_load_reports() -> None:
    """``node_load_report`` from an accepted connection reaches the registry."""
    clock = Clock()
    registry = NodeRegistry(parse_edge_config(edge({"p1": 2})), clock)
    factory = NodeServerFactory(registry, clock, registry.config.node_server.peer_settings())
    protocol = factory.buildProtocol(None)
    protocol.makeConnection(StringTransport())
    spec = pb.NodeProviderSpec(provider_id="p1", kind="mock", models=[MODEL])
    hello = pb.Envelope(
        request_id=1, node_hello_request=pb.NodeHelloRequest(node_id="n1", protocol_major=1, providers=[spec])
    )
    health = pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
    ready = pb.Envelope(node_ready=pb.NodeReady(providers=[health]))
    report = pb.Envelope(node_load_report=pb.NodeLoadReport(providers=load("p1", running=1, waiting=7)))
    for envelope in (hello, ready, report):
        protocol.dataReceived(frame(envelope))
    assert registry.is_ready("n1")
    assert registry.providers.saturated("n1", "p1")
    protocol.connectionLost(None)  # type: ignore[arg-type]  # the protocol ignores the reason


def test_two_idle_providers_share_the_work() -> None:
    """Equals take turns, not configuration order."""
    registry, _clock, _tokens = ready_registry({"p1": 4, "p2": 4})
    pool = registry.pool
    placed = []
    for _ in range(6):
        lease = pool.try_acquire(MODEL)
        assert lease is not None
        placed.append(lease.provider_id)
        pool.release(lease)
    assert placed.count("p1") == 3 and placed.count("p2") == 3


def test_least_loaded_uses_the_engine_figures() -> None:
    """An engine busy with work from elsewhere loses to an idle one, whatever our own leases say."""
    registry, _clock, tokens = ready_registry({"p1": 4, "p2": 4})
    registry.node_load(tokens["p1"], load("p1", running=3, waiting=1))
    registry.node_load(tokens["p2"], load("p2", running=0, waiting=0))
    for _ in range(3):
        lease = registry.pool.try_acquire(MODEL)
        assert lease is not None and lease.provider_id == "p2"


def test_capacity_auto_follows_the_engine_parallelism() -> None:
    """``capacity: auto`` is 1 until the engine reports its slots, then that many."""
    registry, clock, tokens = ready_registry({"p1": "auto"})
    pool = registry.pool
    assert pool.counters("n1", "p1").capacity == 1
    first = pool.try_acquire(MODEL)
    assert first is not None and pool.try_acquire(MODEL) is None
    waiting = pool.admit(MODEL)
    registry.node_load(tokens["p1"], load("p1", running=1, parallel=3))
    assert waiting.called and pool.counters("n1", "p1").capacity == 3
    assert pool.try_acquire(MODEL) is not None and pool.try_acquire(MODEL) is None
    snapshot = StatusProvider(registry, clock).snapshot().nodes[0].providers[0]
    assert snapshot.capacity == 3 and snapshot.engine.parallel == 3


def test_capacity_must_be_a_number_or_auto() -> None:
    """Any other word names the field."""
    with pytest.raises(ConfigError, match=r"nodes\[0\]\.providers\[0\]\.capacity: must be a whole number or 'auto'"):
        parse_edge_config(edge({"p1": "lots"}))


def test_saturation_settings_are_checked() -> None:
    """Defaults are the endpoint picker's (5 waiting, 0.8 KV cache); bad values name their field."""
    rule = parse_edge_config(edge({"p1": 1})).inference.saturation
    assert (rule.max_waiting, rule.max_kv_cache, rule.stale_after_seconds) == (5, 0.8, 30.0)
    with pytest.raises(ConfigError, match=r"inference\.saturation\.max_kv_cache"):
        parse_edge_config(edge({"p1": 1}, {"saturation": {"max_kv_cache": 1.5}}))
    with pytest.raises(ConfigError, match=r"inference\.failover\.cooldown_seconds"):
        parse_edge_config(edge({"p1": 1}, {"failover": {"cooldown_seconds": math.inf}}))
    with pytest.raises(ConfigError, match=r"inference\.failover\.max_retrys"):
        parse_edge_config(edge({"p1": 1}, {"failover": {"max_retrys": 1}}))


def test_snapshot_shows_the_reading_with_its_age_now() -> None:
    """The snapshot carries the engine's figures, its age at snapshot time, and saturated."""
    registry, clock, tokens = ready_registry({"p1": 2})
    registry.node_load(tokens["p1"], load("p1", running=2, waiting=8, kv_cache_usage=0.25, age_ms=500))
    clock.advance(2)
    provider = StatusProvider(registry, clock).snapshot().nodes[0].providers[0]
    assert provider.engine.known and provider.engine.running == 2 and provider.engine.waiting == 8
    assert provider.engine.kv_cache_usage == 0.25 and provider.engine.age_ms == 2500
    assert provider.saturated and not provider.cooling_down
