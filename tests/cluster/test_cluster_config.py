"""The ``cluster`` section of control-plane.yaml: defaults, a full Redis
setup, the environment overrides and the errors (docs/scale-out.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.cluster.settings import MEMORY, REDIS, RedisAddress
from twisted_iop.controlplane.config import config_from_text, load_config

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "configs" / "control-plane-cluster.yaml"

FULL = """
cluster:
  backend: redis
  redis_url: redis://iop:s3cret@redis.example.net:6380/3
  replica_id: cp-1
  key_prefix: fleet-eu
  lease_ttl_seconds: 10
  heartbeat_seconds: 2.5
  redis_timeout_seconds: 3
  idempotency_ttl_seconds: 3600
  fleet_stream_length: 50000
"""


def test_defaults_are_memory() -> None:
    """Without a cluster section the Control Plane is one process with no Redis,
    and the other settings have the documented defaults."""
    cluster = config_from_text("{}").cluster
    assert cluster.backend == MEMORY
    assert not cluster.enabled
    assert cluster.redis == RedisAddress("127.0.0.1", 6379, 0, None, None)
    assert cluster.key_prefix == "iop"
    assert (cluster.lease_ttl_seconds, cluster.heartbeat_seconds) == (6.0, 2.0)
    assert cluster.redis_timeout_seconds == 5.0
    assert cluster.idempotency_ttl_seconds == 24 * 3600.0
    assert cluster.fleet_stream_length == 100_000
    # The default replica id is the host name and the process id.
    assert cluster.replica_id.endswith(f"-{os.getpid()}")


def test_full_redis_section() -> None:
    """Every setting of a Redis cluster is read, the URL split into its parts."""
    cluster = config_from_text(FULL).cluster
    assert cluster.backend == REDIS and cluster.enabled
    assert cluster.redis == RedisAddress("redis.example.net", 6380, 3, "iop", "s3cret")
    assert cluster.replica_id == "cp-1"
    assert cluster.key_prefix == "fleet-eu"
    assert (cluster.lease_ttl_seconds, cluster.heartbeat_seconds) == (10.0, 2.5)
    assert cluster.redis_timeout_seconds == 3.0
    assert cluster.idempotency_ttl_seconds == 3600.0
    assert cluster.fleet_stream_length == 50_000


def test_redis_address_in_logs_has_no_password() -> None:
    """The address as logged (and shown by --check) names host, port and
    database, never the credentials in the URL."""
    address = config_from_text(FULL).cluster.redis
    assert str(address) == "redis://redis.example.net:6380/3"
    assert "s3cret" not in str(address)


def test_environment_overrides_url_and_replica_id() -> None:
    """IOP_REDIS_URL and IOP_REPLICA_ID win over the file; empty ones do not."""
    environ = {"IOP_REDIS_URL": "redis://10.1.2.3/1", "IOP_REPLICA_ID": "cp-3"}
    cluster = config_from_text(FULL, environ).cluster
    assert cluster.redis == RedisAddress("10.1.2.3", 6379, 1, None, None)
    assert cluster.replica_id == "cp-3"
    kept = config_from_text(FULL, {"IOP_REDIS_URL": "", "IOP_REPLICA_ID": ""}).cluster
    assert kept.redis.host == "redis.example.net" and kept.replica_id == "cp-1"


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        ("cluster: {backend: etcd}", {}, "cluster.backend: must be one of memory, redis, not 'etcd'"),
        (
            "cluster: {redis_url: 'http://r:6379/0'}",
            {},
            "cluster.redis_url: must be a redis://[user:password@]host:port/db URL",
        ),
        ("cluster: {redis_url: 'redis://r:99999/0'}", {}, "cluster.redis_url: has a port that is not a number"),
        ("cluster: {redis_url: 'redis://r:6379/zero'}", {}, "cluster.redis_url: database must be a number"),
        ("cluster: {redis_url: 'redis://'}", {}, "cluster.redis_url: names no host"),
        (
            "cluster: {}",
            {"IOP_REDIS_URL": "r:6379"},
            "environment variable IOP_REDIS_URL (overrides cluster.redis_url): must be a redis://",
        ),
        ("cluster: {replica_id: 'cp 1'}", {}, "cluster.replica_id: replica_id 'cp 1' is malformed"),
        (
            "cluster: {}",
            {"IOP_REPLICA_ID": "-cp"},
            "environment variable IOP_REPLICA_ID (overrides cluster.replica_id): replica_id '-cp' is malformed",
        ),
        (
            "cluster: {lease_ttl_seconds: 3, heartbeat_seconds: 2}",
            {},
            "cluster.lease_ttl_seconds: must be at least twice heartbeat_seconds (2)",
        ),
        (
            "cluster: {heartbeat_seconds: 4}",
            {},
            "cluster.lease_ttl_seconds: must be at least twice heartbeat_seconds (4)",
        ),
        ("cluster: {key_prefix: 'a b'}", {}, "cluster.key_prefix: must be 1 to 64 characters"),
        ("cluster: {fleet_stream_length: 10}", {}, "cluster.fleet_stream_length: must be at least 1000"),
        ("cluster: {redis: {host: r}}", {}, "cluster.redis: unknown setting"),
    ],
)
def test_bad_settings_name_the_field(text: str, environ: dict[str, str], expected: str) -> None:
    """A bad cluster setting is one line that names the field (or the
    environment variable) and says what is wrong."""
    with pytest.raises(ConfigError) as raised:
        config_from_text(text, environ)
    message = str(raised.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_lease_of_exactly_two_heartbeats_is_accepted() -> None:
    """The lease TTL may be exactly twice the heartbeat (the bound is inclusive)."""
    cluster = config_from_text("cluster: {lease_ttl_seconds: 4, heartbeat_seconds: 2}").cluster
    assert (cluster.lease_ttl_seconds, cluster.heartbeat_seconds) == (4.0, 2.0)


def test_sample_cluster_config_parses() -> None:
    """configs/control-plane-cluster.yaml loads as a Redis replica that a load
    balancer can reach, its replica id and Redis URL from the environment."""
    config = load_config(str(SAMPLE), {"IOP_REPLICA_ID": "cp-2", "IOP_REDIS_URL": "redis://10.0.0.20:6379/0"})
    assert config.notices == ()
    assert config.cluster.enabled
    assert config.cluster.replica_id == "cp-2"
    assert config.cluster.redis == RedisAddress("10.0.0.20", 6379, 0, None, None)
    assert config.http_listen == "tcp:8080:interface=0.0.0.0"
    assert config.edge_wire_listen == "tcp:7443:interface=0.0.0.0"
    assert config.http.tokens.required and config.credentials.required
    from_file = load_config(str(SAMPLE), {}).cluster
    assert from_file.redis == RedisAddress("10.0.0.10", 6379, 0, None, None)
    assert from_file.lease_ttl_seconds >= 2 * from_file.heartbeat_seconds


def test_a_bad_redis_url_never_shows_its_password() -> None:
    """A URL with a password that is not accepted is refused without echoing it,
    and the parsed address does not show the password in its repr or text."""
    with pytest.raises(ConfigError) as raised:
        config_from_text("cluster: {redis_url: 'rediss://user:s3cret@r:6379/0'}")
    assert "s3cret" not in str(raised.value)
    config = config_from_text("cluster: {backend: redis, redis_url: 'redis://user:s3cret@r:6379/0'}")
    assert config.cluster.redis.password == "s3cret"
    assert "s3cret" not in repr(config) and "s3cret" not in str(config.cluster.redis)


def test_the_single_process_sample_turns_cluster_mode_on_with_one_setting() -> None:
    """configs/control-plane.yaml with ``cluster.backend: redis`` and nothing else
    changed is a valid cluster config: its store follows the cluster (redis), and
    unchanged it keeps the embedded sqlite store."""
    text = (ROOT / "configs" / "control-plane.yaml").read_text()
    assert config_from_text(text).store.backend == "sqlite"
    assert "\ncluster:\n  backend: memory\n" in text
    clustered = text.replace("\ncluster:\n  backend: memory\n", "\ncluster:\n  backend: redis\n")
    config = config_from_text(clustered)
    assert config.cluster.backend == REDIS
    assert config.store.backend == "redis"
