"""Settings of cluster mode (``cluster`` in control-plane.yaml)."""

from __future__ import annotations

import os
import socket
from typing import Optional
from urllib.parse import unquote, urlsplit

import attrs

MEMORY = "memory"
REDIS = "redis"
BACKENDS = (MEMORY, REDIS)


def default_replica_id() -> str:
    """Host name and process id: unique per running process."""
    host = socket.gethostname().split(".")[0] or "replica"
    return f"{host}-{os.getpid()}"


@attrs.frozen
class RedisAddress:
    """Where Redis is, from a ``redis://[user:password@]host:port/db`` URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: Optional[str] = attrs.field(default=None, repr=False)
    password: Optional[str] = attrs.field(default=None, repr=False)

    def __str__(self) -> str:
        """The address without credentials (for logs)."""
        return f"redis://{self.host}:{self.port}/{self.db}"


def parse_redis_url(url: str) -> RedisAddress:
    """The address in ``url``; ValueError says what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        # Never echo the URL: it may hold a password.
        raise ValueError(
            f"must be a redis://[user:password@]host:port/db URL (scheme {parts.scheme[:20]!r} is not redis)"
        )
    if not parts.hostname:
        raise ValueError("names no host")
    try:
        port = parts.port or 6379
    except ValueError:
        raise ValueError("has a port that is not a number from 1 to 65535") from None
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise ValueError(f"database must be a number, not {path[:20]!r}")
    return RedisAddress(
        host=parts.hostname,
        port=port,
        db=int(path or 0),
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password is not None else None,
    )


@attrs.frozen
class ClusterConfig:
    """How this replica shares the fleet (the default: it does not)."""

    backend: str = MEMORY
    redis: RedisAddress = RedisAddress()
    replica_id: str = attrs.field(factory=default_replica_id)
    #: Every Redis key starts with this and a colon.
    key_prefix: str = "iop"
    #: A replica that has not refreshed its lease for this long is dead:
    #: its edges show disconnected until they enroll again.
    lease_ttl_seconds: float = 6.0
    heartbeat_seconds: float = 2.0
    #: How long a Redis command may take before the link counts as down.
    redis_timeout_seconds: float = 5.0
    #: Idempotency keys are remembered this long (a retried POST within it
    #: returns the same operation on any replica).
    idempotency_ttl_seconds: float = 24 * 3600.0
    #: Entries kept in the fleet event stream (``MAXLEN ~``).
    fleet_stream_length: int = 100_000

    @property
    def enabled(self) -> bool:
        """Whether this replica shares the fleet through Redis."""
        return self.backend == REDIS
