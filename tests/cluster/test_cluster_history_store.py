"""The redis store: history chunks shared through a real redis-server, and
one sampling replica at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from twisted_iop.controlplane.cluster.settings import parse_redis_url
from twisted_iop.controlplane.cluster.store import RedisLink
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.fields import fields_of
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.interface import HistoryChunk
from twisted_iop.controlplane.store.redis import RedisStore
from twisted_iop.testing import store_contract
from twisted_iop.testing.harness import eventually
from twisted_iop.testing.history import EDGE_VALUE, FLEET_VALUE, write_old_chunks
from twisted_iop.testing.redis import RedisServer


async def _store(server: RedisServer, replica: str, max_bytes: int = 2**30) -> tuple[RedisStore, RedisLink]:
    link = RedisLink(parse_redis_url(server.url), reactor, 5.0)
    link.start()
    await eventually(lambda: link.up, message="redis connected")
    store = RedisStore("iop", replica, reactor, max_bytes)
    store.attach(link)
    return store, link


@pytest_twisted.async_yield_fixture
async def stores(redis_server: RedisServer) -> AsyncIterator[list[Any]]:
    """Two replicas' stores on one redis-server."""
    made = [await _store(redis_server, "cp-1"), await _store(redis_server, "cp-2")]
    yield [store for store, _ in made]
    for store, link in made:
        if store.running:
            await store.stopService()
        await link.stop()


@pytest.mark.parametrize("check", store_contract.CHECKS, ids=lambda check: check.__name__)
@pytest_twisted.ensureDeferred
async def test_the_history_contract_across_two_replicas(stores: list[RedisStore], check: Any) -> None:
    """What one replica writes, another reads: the store contract, through Redis."""
    one, other = stores

    async def settle() -> None:
        # Each replica writes on its own connection, in order: a ping on the
        # writer's connection answers after every write sent before it.
        await one._link.call("PING")

    await check(one, other, settle)


@pytest_twisted.ensureDeferred
async def test_history_in_redis_is_bounded_in_bytes(redis_server: RedisServer) -> None:
    """Past the byte bound the chunks that ended first are dropped."""
    store, link = await _store(redis_server, "cp-1", max_bytes=20_000)
    try:
        for n in range(40):
            store.history_write(HistoryChunk(f"edge:{n}", 15, float(n), float(n) + 10, b"z" * 1000))

        async def kept() -> list[str]:
            return [f"edge:{n}" for n in range(40) if await store.history_read([f"edge:{n}"], 15, 0, 100)]

        await eventually(lambda: _last_kept(kept()), message="the newest kept")
        names = await kept()
        assert "edge:0" not in names and len(names) <= 20
    finally:
        await link.stop()


async def _last_kept(names: Any) -> bool:
    return "edge:39" in await names


@pytest_twisted.ensureDeferred
async def test_one_replica_samples_and_another_takes_over_when_it_stops(stores: list[RedisStore]) -> None:
    """The sampling lease is held by one replica; when it stops, the other takes it."""
    one, other = stores
    one.startService()
    await eventually(lambda: one.history_leader(), message="the first replica leads")
    other.startService()
    await eventually(lambda: other._lease_loop is not None and other._lease_loop.running, message="second polling")
    assert one.history_leader() and not other.history_leader()
    await one.stopService()
    assert not one.history_leader()
    await eventually(lambda: other.history_leader(), timeout=10, message="the second replica takes over")


@pytest_twisted.ensureDeferred
async def test_chunks_written_before_the_latency_fields_read_back_from_redis(redis_server: RedisServer) -> None:
    """Chunks of the older, narrower form (the fleet's, a rolled-up point, a model's, an edge's
    segment) that one replica wrote to Redis read back through another replica's views: their
    values as written, the latency fields null."""
    writer, writer_link = await _store(redis_server, "cp-1")
    reader, reader_link = await _store(redis_server, "cp-2")
    try:
        settings = config_from_text(
            "history:\n  interval_seconds: 1\n  tiers:\n  - {keep_hours: 1}\n  - {step_seconds: 4, keep_hours: 2}\n"
        ).history
        t_ms = 1_700_000_000_000
        write_old_chunks(writer, t_ms, (settings.tiers[0], settings.tiers[1]), "edge-a", "llama-3-8b")
        await writer._link.call("PING")
        clock = Clock()
        clock.advance(t_ms / 1000 + 10)
        registry = EdgeRegistry(clock)
        queries = HistoryService(settings, registry, EdgeGateway(registry, clock), reader, clock).queries
        start, end = t_ms / 1000 - 1, t_ms / 1000 + 5

        async def values(series: str, tier: int, name: str) -> list[Any]:
            view = await queries.view(series, fields_of(series), tier, start, end)
            at = [f.name for f in view.fields].index(name)
            return [point[at] for _, _, point in view.points]

        assert await values("fleet", 0, "capacity") == [FLEET_VALUE] * 3
        assert await values("fleet", 0, "ttft_p95") == [None] * 3
        assert await values("fleet", 1, "capacity") == [(FLEET_VALUE, FLEET_VALUE, FLEET_VALUE)]
        assert await values("fleet", 1, "requests_per_second") == [(None, None, None)]
        assert await values("model:llama-3-8b", 0, "providers") == [2]
        assert await values("model:llama-3-8b", 0, "tpot_p95") == [None]
        assert await values("edge:edge-a", 0, "capacity") == [EDGE_VALUE] * 2
        assert await values("edge:edge-a", 0, "ttft_p95") == [None] * 2
        assert queries.unreadable == 0
    finally:
        await writer_link.stop()
        await reader_link.stop()
