"""Control Plane replicas sharing one Redis, in the test reactor."""

from __future__ import annotations

from twisted.internet import reactor as global_reactor

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, start_control_plane


def cluster_config(redis_url: str, replica_id: str, extra: str = "") -> str:
    """control-plane.yaml text for one replica (quick heartbeat and lease for tests)."""
    return (
        "cluster:\n"
        "  backend: redis\n"
        f"  redis_url: {redis_url}\n"
        f"  replica_id: {replica_id}\n"
        "  heartbeat_seconds: 0.25\n"
        "  lease_ttl_seconds: 1.0\n"
        "  redis_timeout_seconds: 2.0\n"
        "status:\n"
        "  fleet_max_age_seconds: 0\n" + extra
    )


async def start_replica(
    redis_url: str, replica_id: str, extra: str = "", reactor: Reactor = global_reactor
) -> ControlPlaneHarness:
    """Start one replica and wait until it has joined its cluster."""
    harness = await start_control_plane(reactor, config_text=cluster_config(redis_url, replica_id, extra))
    cluster = harness.service.cluster
    assert cluster is not None
    await eventually(lambda: cluster.available, timeout=10, message=f"{replica_id} joined", reactor=reactor)
    return harness
