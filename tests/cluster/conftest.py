"""Fixtures of the cluster tests: a private redis-server per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from twisted_iop.testing.redis import RedisServer, redis_available


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, on a free loopback port."""
    if not redis_available():
        pytest.fail("redis-server is not installed: run `make redis` (make test does)")
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
