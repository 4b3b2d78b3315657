"""The ``redis`` store: cluster mode, where the replicas share Redis.

Events, operations, idempotency keys and rollouts are already kept in
Redis by the replica's journal and rollout store (docs/scale-out.md),
numbered there, and loaded by every replica when it joins: this store has
nothing of them to write or read back (:meth:`RedisStore.open` returns an
empty :class:`~.interface.KeptState`). What it keeps is the capacity
history and the SLOs, shared by the replicas:

* ``<prefix>:history:<step>:<series>``: a hash of the series' chunks at
  one tier, field ``start`` -> ``end|base64(data)``;
* ``<prefix>:history_index``: a sorted set of every chunk
  (``step␟series␟start``) scored by its end, for expiry and the byte bound;
* ``<prefix>:history_bytes``: the bytes of the chunks kept (the byte bound
  drops the chunks that ended first);
* ``<prefix>:slos``: a hash of the SLOs, field name -> base64 of its stored
  form (spec, buckets and alerts);
* ``<prefix>:deployments``: a hash of the deployments, field name -> base64
  of its stored form (spec, generation, placement);
* ``<prefix>:history_lease``: which replica samples the history now. One
  replica samples and writes; the others read. The lease is taken with
  ``SET NX PX`` and refreshed at a third of its time to live; when its
  holder dies another replica takes it within one time to live.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster.scripts import Script
from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store.interface import HistoryChunk, StoreError, StoreHealth
from twisted_iop.controlplane.store.memory import NothingToRestore

if TYPE_CHECKING:
    from twisted_iop.controlplane.cluster.store import RedisLink

#: The separator of an index member's parts (ASCII unit separator).
SEPARATOR = "\x1f"
#: How long the sampling lease lives unless refreshed.
LEASE_TTL_SECONDS = 15.0
#: Chunks dropped per script run when over the byte bound or expiring.
TRIM_CHUNKS = 500

_HISTORY_COMMON = """
local P = ARGV[1]
local function drop(members)
  local freed = 0
  for _, m in ipairs(members) do
    local a = string.find(m, '\\31', 1, true)
    local b = string.find(m, '\\31', a + 1, true)
    local hash = P .. ':history:' .. string.sub(m, 1, a - 1) .. ':' .. string.sub(m, a + 1, b - 1)
    local field = string.sub(m, b + 1)
    local old = redis.call('HGET', hash, field)
    if old then
      freed = freed + string.len(old)
      redis.call('HDEL', hash, field)
    end
    redis.call('ZREM', P .. ':history_index', m)
  end
  if freed > 0 then redis.call('DECRBY', P .. ':history_bytes', freed) end
  return #members
end
"""

#: Keep one chunk, then drop the oldest beyond the byte bound.
#: ARGV: prefix, step, series, start, end, value, max bytes.
WRITE = Script(
    "history_write",
    _HISTORY_COMMON
    + """
local hash = P .. ':history:' .. ARGV[2] .. ':' .. ARGV[3]
local old = redis.call('HGET', hash, ARGV[4])
redis.call('HSET', hash, ARGV[4], ARGV[6])
redis.call('ZADD', P .. ':history_index', ARGV[5], ARGV[2] .. '\\31' .. ARGV[3] .. '\\31' .. ARGV[4])
local bytes = redis.call('INCRBY', P .. ':history_bytes', string.len(ARGV[6]) - (old and string.len(old) or 0))
if bytes > tonumber(ARGV[7]) then
  drop(redis.call('ZRANGE', P .. ':history_index', 0, """
    + str(TRIM_CHUNKS - 1)
    + """))
end
return bytes
""",
)

#: Drop the chunks of one tier that ended before a time. ARGV: prefix, step, before.
EXPIRE = Script(
    "history_expire",
    _HISTORY_COMMON
    + """
local ended = redis.call('ZRANGEBYSCORE', P .. ':history_index', '-inf', '(' .. ARGV[3], 'LIMIT', 0, """
    + str(TRIM_CHUNKS)
    + """)
local mine = {}
for _, m in ipairs(ended) do
  if string.sub(m, 1, string.len(ARGV[2]) + 1) == ARGV[2] .. '\\31' then table.insert(mine, m) end
end
return drop(mine)
""",
)


class RedisStore(NothingToRestore):
    """The store of a replica in cluster mode (``store.backend: redis``):
    events, operations, edges and rollouts are the journal's (in Redis,
    loaded by every replica when it joins); this store keeps the history."""

    backend = "redis"
    _log = Logger()

    def __init__(self, prefix: str, replica_id: str, clock: IReactorTime, history_max_bytes: int) -> None:
        self._link_: Optional[RedisLink] = None
        self._prefix = prefix
        #: This process's name in the lease (``replica/boot``).
        self._owner = f"{replica_id}/{uuid.uuid4().hex[:12]}"
        self._clock = clock
        self.history_max_bytes = history_max_bytes
        self._lease_key = f"{prefix}:history_lease"
        self._leader = False
        self._lease_loop: Optional[LoopingCall] = None
        self._error = ""
        self.dropped = 0

    def attach(self, link: RedisLink) -> None:
        """Use the replica's connections to Redis (made after the store)."""
        self._link_ = link

    @property
    def _link(self) -> RedisLink:
        link = self._link_
        if link is None:
            raise StoreError("the redis store is not attached to the replica's link yet")
        return link

    # -- history -----------------------------------------------------------------------

    def history_write(self, chunk: HistoryChunk) -> None:
        """Keep ``chunk`` in Redis (a write that fails is counted and logged)."""
        value = f"{chunk.end!r}|{stored_forms.b64(chunk.data)}"
        d = self._link.run(
            WRITE,
            self._prefix,
            chunk.step,
            chunk.series,
            repr(chunk.start),
            repr(chunk.end),
            value,
            self.history_max_bytes,
        )
        d.addCallbacks(self._written, self._write_failed)

    def history_expire(self, step: int, before: float) -> None:
        """Drop the chunks of ``step`` that ended before ``before``."""
        self._link.run(EXPIRE, self._prefix, step, repr(before)).addCallbacks(self._written, self._write_failed)

    def history_read(self, series: Sequence[str], step: int, start: float, end: float) -> Deferred[list[HistoryChunk]]:
        """The chunks of ``series`` overlapping ``[start, end]``, from Redis."""
        names = sorted(set(series))
        reads = [self._link.call("HGETALL", f"{self._prefix}:history:{step}:{name}") for name in names]

        async def gather() -> list[HistoryChunk]:
            chunks: list[HistoryChunk] = []
            for name, read in zip(names, reads, strict=True):
                try:
                    reply = await read
                except Exception as e:
                    raise StoreError(f"history read failed: {e}") from None
                chunks.extend(_chunks(name, step, reply, start, end))
            return chunks

        return Deferred.fromCoroutine(gather())

    # -- SLOs -------------------------------------------------------------------------------

    def slo_write(self, name: str, data: bytes) -> None:
        """Keep an SLO in Redis (a write that fails is counted and logged)."""
        self._hash_write("slos", name, data)

    def slo_delete(self, name: str) -> None:
        """Forget an SLO."""
        self._hash_delete("slos", name)

    def slo_read(self) -> Deferred[dict[str, bytes]]:
        """Every SLO kept in Redis (entries that do not decode are skipped)."""
        return self._hash_read("slos", "SLO")

    # -- deployments ------------------------------------------------------------------------

    def deployment_write(self, name: str, data: bytes) -> None:
        """Keep a deployment in Redis (a write that fails is counted and logged)."""
        self._hash_write("deployments", name, data)

    def deployment_delete(self, name: str) -> None:
        """Forget a deployment."""
        self._hash_delete("deployments", name)

    def deployment_read(self) -> Deferred[dict[str, bytes]]:
        """Every deployment kept in Redis (entries that do not decode are skipped)."""
        return self._hash_read("deployments", "deployment")

    def _hash_write(self, key: str, name: str, data: bytes) -> None:
        d = self._link.call("HSET", f"{self._prefix}:{key}", name, stored_forms.b64(data))
        d.addCallbacks(self._written, self._write_failed)

    def _hash_delete(self, key: str, name: str) -> None:
        self._link.call("HDEL", f"{self._prefix}:{key}", name).addCallbacks(self._written, self._write_failed)

    def _hash_read(self, key: str, what: str) -> Deferred[dict[str, bytes]]:
        async def read() -> dict[str, bytes]:
            try:
                reply = await self._link.call("HGETALL", f"{self._prefix}:{key}")
            except Exception as e:
                raise StoreError(f"{what} read failed: {e}") from None
            items = list(reply.items()) if isinstance(reply, dict) else list(zip(reply[::2], reply[1::2], strict=False))
            kept: dict[str, bytes] = {}
            for name, value in items:
                try:
                    kept[str(name)] = stored_forms.unb64(str(value), what)
                except stored_forms.BadRecord:
                    continue
            return kept

        return Deferred.fromCoroutine(read())

    def history_leader(self) -> bool:
        """Whether this replica samples the history now (it holds the lease)."""
        return self._leader

    def _written(self, _: object) -> None:
        if self._error:
            self._log.info("history: writing to Redis again")
        self._error = ""

    def _write_failed(self, failure: Failure) -> None:
        self.dropped += 1
        message = failure.getErrorMessage().splitlines()[0] if failure.getErrorMessage() else "failed"
        if message != self._error:
            self._log.warn("history: a write to Redis failed: {error}", error=message)
        self._error = message

    # -- the sampling lease ------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        loop = self._lease_loop = LoopingCall(self._refresh_lease)
        loop.clock = self._clock
        loop.start(LEASE_TTL_SECONDS / 3, now=True)

    def stopService(self) -> Deferred[None]:
        super().stopService()
        if self._lease_loop is not None and self._lease_loop.running:
            self._lease_loop.stop()
        if self._leader:
            self._leader = False
            # Let it go at once (only if still ours) so another replica samples without a gap.
            d = self._link.call("EVAL", _RELEASE, "1", self._lease_key, self._owner)
            d.addErrback(lambda _: None)
            return d.addCallback(lambda _: None)
        return succeed(None)

    def _refresh_lease(self) -> None:
        ttl = str(int(LEASE_TTL_SECONDS * 1000))
        if self._leader:
            d = self._link.call("EVAL", _EXTEND, "1", self._lease_key, self._owner, ttl)
        else:
            d = self._link.call("SET", self._lease_key, self._owner, "NX", "PX", ttl)
        d.addCallbacks(self._lease_answer, self._lease_failed)

    def _lease_answer(self, reply: Any) -> None:
        held = reply in ("OK", 1, "1")
        if held != self._leader:
            self._log.info(
                "history: this replica {now} the history's sampler", now="is now" if held else "is no longer"
            )
        self._leader = held

    def _lease_failed(self, failure: Failure) -> None:
        # Unsure whether it still holds: stop sampling (another replica may take over).
        self._leader = False

    def health(self) -> StoreHealth:
        """Whether the last history write reached Redis."""
        return StoreHealth(backend=self.backend, writable=not self._error, error=self._error, dropped=self.dropped)

    def close(self) -> Deferred[None]:
        """Nothing queued here (writes go to Redis as they come)."""
        return succeed(None)


#: Extend the lease if it is still ours. KEYS: lease; ARGV: owner, ttl ms.
_EXTEND = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end"
)
#: Delete the lease if it is still ours. KEYS: lease; ARGV: owner.
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


def _chunks(series: str, step: int, reply: Any, start: float, end: float) -> list[HistoryChunk]:
    """The chunks of one series' hash that overlap ``[start, end]``; entries
    that do not parse are skipped (Redis is checked like a wire)."""
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, list):
        items = list(zip(reply[::2], reply[1::2], strict=False))
    else:
        return []
    chunks = []
    for field, value in items:
        try:
            chunk_start = float(field)
            chunk_end_text, data = str(value).split("|", 1)
            chunk_end = float(chunk_end_text)
            if chunk_end < start or chunk_start > end:
                continue
            chunks.append(HistoryChunk(series, step, chunk_start, chunk_end, stored_forms.unb64(data, "history chunk")))
        except (ValueError, stored_forms.BadRecord):
            continue
    chunks.sort(key=lambda c: c.start)
    return chunks
