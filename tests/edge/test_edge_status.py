"""Registry + status provider: snapshot rules and node events, by plain calls."""

from __future__ import annotations

from twisted.internet.task import Clock

from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import edge_config, healthy, node_hello
from twisted_iop.testing.wires.peers import FakeNodePeer
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import RejectionCode
from twisted_iop.wire.status_totals import GENERAL_AT, carried_counts, counts_problem, response_counts


def make() -> tuple[Clock, NodeRegistry, StatusProvider, list[pb.EdgeEvent]]:
    """A registry over the two-node test config, recording its events."""
    clock = Clock()
    clock.advance(1000)
    registry = NodeRegistry(edge_config(), clock)
    events: list[pb.EdgeEvent] = []
    registry.relay.add_listener(events.append)
    return clock, registry, StatusProvider(registry, clock), events


def node(snapshot: pb.EdgeStatusResponse, node_id: str) -> pb.EdgeNodeSnapshot:
    """The snapshot of ``node_id``."""
    return next(n for n in snapshot.nodes if n.node_id == node_id)


def assert_unavailable(entry: pb.EdgeNodeSnapshot) -> None:
    """A not-ready node: connected=false, providers unavailable/offline, all counters 0."""
    assert not entry.connected
    assert entry.connected_since_ms == 0
    assert entry.providers
    for p in entry.providers:
        assert p.provider_id and p.kind and list(p.models)
        assert p.status == pb.PROVIDER_STATUS_UNAVAILABLE
        assert p.health == pb.PROVIDER_HEALTH_OFFLINE
        assert (
            p.capacity,
            p.in_flight,
            p.queued,
            p.long_context_capacity,
            p.long_context_in_flight,
            p.long_context_queued,
        ) == (0, 0, 0, 0, 0, 0)


def test_every_configured_node_listed_before_any_connects() -> None:
    """With no node connected, every configured node appears unavailable."""
    _, _, status, _ = make()
    snapshot = status.snapshot()
    assert snapshot.edge_id == "edge-a"
    assert [n.node_id for n in snapshot.nodes] == ["node-1", "node-2"]
    for entry in snapshot.nodes:
        assert_unavailable(entry)
    assert node(snapshot, "node-2").providers[0].models == ["llama-3-8b", "qwen-2-7b"]


def test_pending_connection_changes_nothing_ready_restores_capacity() -> None:
    """Pending shows nothing new; ready shows real capacity and health."""
    clock, registry, status, events = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    assert_unavailable(node(status.snapshot(), "node-1"))
    assert [e.kind for e in events] == ["node.pending"]
    clock.advance(2)
    registry.node_ready(token, healthy("mock-a"))
    entry = node(status.snapshot(), "node-1")
    assert entry.connected and entry.connected_since_ms == 1002000
    provider = entry.providers[0]
    assert provider.status == pb.PROVIDER_STATUS_AVAILABLE
    assert provider.health == pb.PROVIDER_HEALTH_HEALTHY
    assert (provider.capacity, provider.long_context_capacity) == (4, 1)
    assert [e.kind for e in events] == ["node.pending", "node.ready"]


def test_counters_come_from_pool() -> None:
    """in_flight and queued come from leases and queue pressure."""
    _, registry, status, _ = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    leases = [registry.pool.try_acquire("llama-3-8b") for _ in range(4)]
    assert all(leases)
    registry.pool.admit("llama-3-8b")
    registry.pool.try_acquire("llama-3-8b", long_context=True)
    p = node(status.snapshot(), "node-1").providers[0]
    assert (p.in_flight, p.queued, p.long_context_in_flight) == (4, 1, 1)


def test_disconnect_zeroes_everything_and_reconnect_restores() -> None:
    """Owner close: connected=false, all zeros; a new ready owner brings capacity back."""
    _, registry, status, events = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    registry.pool.try_acquire("llama-3-8b")
    registry.node_closed(token)
    assert_unavailable(node(status.snapshot(), "node-1"))
    assert events[-1].kind == "node.disconnected"
    again = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(again, healthy("mock-a"))
    p = node(status.snapshot(), "node-1").providers[0]
    assert (p.capacity, p.in_flight) == (4, 0)


def test_second_connection_never_shows_node_disconnected() -> None:
    """A second connection (pending, then ready) keeps the node connected throughout."""
    _, registry, status, events = make()
    old_peer = FakeNodePeer()
    first = registry.node_accepted(node_hello("node-1"), old_peer)
    registry.node_ready(first, healthy("mock-a"))
    second = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    assert node(status.snapshot(), "node-1").connected
    registry.node_ready(second, healthy("mock-a"))
    assert old_peer.closed == 1
    assert node(status.snapshot(), "node-1").connected
    registry.node_closed(first)  # the superseded connection's close is stale
    assert node(status.snapshot(), "node-1").connected
    kinds = [e.kind for e in events]
    assert kinds == ["node.pending", "node.ready", "node.superseded", "node.ready"]


def test_pending_close_and_pending_health_change_nothing() -> None:
    """A pending connection's health reports and close produce nothing."""
    _, registry, status, events = make()
    first = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(first, healthy("mock-a"))
    second = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    before = status.snapshot()
    report = [pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_UNHEALTHY)]
    assert registry.node_health(second, report) == []
    registry.node_closed(second)
    after = status.snapshot()
    after.generated_at_ms = before.generated_at_ms
    assert after == before
    assert [e.kind for e in events] == ["node.pending", "node.ready"]


def test_health_change_of_owner_is_an_event_and_shows() -> None:
    """The owner's health change emits provider.health_changed and shows with its reason."""
    _, registry, status, events = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    report = [pb.ProviderHealthReport(provider_id="mock-a", health=pb.PROVIDER_HEALTH_DEGRADED, reason="slow")]
    assert registry.node_health(token, report) == ["mock-a"]
    assert registry.node_health(token, report) == []
    p = node(status.snapshot(), "node-1").providers[0]
    assert p.health == pb.PROVIDER_HEALTH_DEGRADED and p.health_reason == "slow"
    changed = [e for e in events if e.kind == "provider.health_changed"]
    assert len(changed) == 1
    assert changed[0].provider_id == "mock-a" and changed[0].attributes["health"] == "degraded"


def test_unreported_provider_is_unknown_and_takes_no_work() -> None:
    """A configured provider the node does not report shows unknown and gets no leases."""
    _, registry, status, _ = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, [])
    p = node(status.snapshot(), "node-1").providers[0]
    assert p.health == pb.PROVIDER_HEALTH_UNKNOWN and p.health_reason
    assert registry.pool.try_acquire("llama-3-8b") is None


def test_drained_node_reports_drained() -> None:
    """A drained ready node's providers show DRAINED; undrain restores AVAILABLE."""
    _, registry, status, events = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    assert registry.set_drained("node-1", True, "maintenance")
    entry = node(status.snapshot(), "node-1")
    assert entry.drained and entry.providers[0].status == pb.PROVIDER_STATUS_DRAINED
    assert events[-1].kind == "node.drained" and events[-1].attributes["reason"] == "maintenance"
    assert not registry.set_drained("node-1", True)
    registry.set_drained("node-1", False)
    assert node(status.snapshot(), "node-1").providers[0].status == pb.PROVIDER_STATUS_AVAILABLE


def test_hello_checks() -> None:
    """Unknown node, wrong credential, bad version and bad ids are rejected with shared codes."""
    _, registry, _, events = make()
    assert registry.check_hello(node_hello("node-1")) is None
    assert registry.check_hello(node_hello("node-2", credential="s3cret")) is None
    rejections = [
        registry.check_hello(h)
        for h in (
            node_hello("node-9"),
            node_hello("node-2", credential="wrong"),
            node_hello("node-2"),
            node_hello("node-1", major=99),
            node_hello("bad id"),
        )
    ]
    assert [r.code if r is not None else None for r in rejections] == [
        RejectionCode.UNKNOWN_NODE,
        RejectionCode.BAD_CREDENTIAL,
        RejectionCode.BAD_CREDENTIAL,
        RejectionCode.UNSUPPORTED_VERSION,
        RejectionCode.INVALID_ID,
    ]
    assert all(r is not None and r.permanent and r.reason for r in rejections)
    assert events == [] and registry.connection_count() == 0


def test_undrain_is_seen_by_the_pool_without_telling_it_the_state() -> None:
    """Drain lives only in the registry: the pool's placement and pressure follow it."""
    _, registry, status, _ = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    registry.set_drained("node-1", True)
    assert not registry.node_takes_work("node-1") and not registry.pool.eligible("node-1", "mock-a")
    waiting = registry.pool.admit("llama-3-8b")
    assert node(status.snapshot(), "node-1").providers[0].queued == 0
    registry.set_drained("node-1", False)
    assert waiting.called
    p = node(status.snapshot(), "node-1").providers[0]
    assert (p.status, p.in_flight, p.queued) == (pb.PROVIDER_STATUS_AVAILABLE, 1, 0)


def test_every_snapshot_carries_its_own_totals() -> None:
    """The totals sent with a snapshot are the counts of its nodes and
    providers, as the Control Plane would count them, in every state."""
    _, registry, status, _ = make()
    first = status.snapshot()
    counts = carried_counts(first)
    assert counts is not None and counts == response_counts(first) and counts[1] == len(first.nodes)
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    registry.pool.try_acquire("llama-3-8b")
    registry.pool.admit("llama-3-8b")
    busy = status.snapshot()
    counts = carried_counts(busy)
    assert counts == response_counts(busy) != carried_counts(first)
    in_flight = node(busy, "node-1").providers[0].in_flight
    assert counts is not None and counts[0] == 1 and counts[GENERAL_AT + 1] == in_flight > 0
    assert counts_problem(counts, len(busy.nodes)) is None


def test_a_provider_snapshot_carries_the_estimated_part_of_its_tokens() -> None:
    """Tokens counted from an engine's usage and tokens the Node estimated
    both add to the provider's totals; the estimated ones are also its own
    part of the snapshot, so the Control Plane can say how much is a guess."""
    clock, registry, status, _ = make()
    token = registry.node_accepted(node_hello("node-1"), FakeNodePeer())
    registry.node_ready(token, healthy("mock-a"))
    registry.tokens.add("node-1", "mock-a", "llama-3-8b", 10, 20, clock.seconds())
    registry.tokens.add("node-1", "mock-a", "llama-3-8b", 3, 5, clock.seconds(), estimated=True)
    provider = node(status.snapshot(), "node-1").providers[0]
    assert (provider.prompt_tokens, provider.completion_tokens) == (13, 25)
    assert (provider.estimated_prompt_tokens, provider.estimated_completion_tokens) == (3, 5)
