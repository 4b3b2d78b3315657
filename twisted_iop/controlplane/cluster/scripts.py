"""The Lua scripts: one per kind of change, each fenced.

Every change to an edge's shared record runs as one script, so it is
atomic and ordered with every other replica's changes. A change caused by
a connection carries that connection's **fence** (``replica/boot/token``)
and is applied only while the fence is the edge's current one and the edge
is connected: a stale connection's close or late reply, on any replica,
changes nothing. The claim at hello takes a new **epoch** (``HINCRBY``),
so the newest hello wins across replicas.

Every recorded event is appended to the edge's stream (ID ``seq-0``) and to
the fleet stream (ID ``fleet_seq-0``) in the same script, with the change
it stands for; replicas follow the fleet stream to keep their mirrors, so
stream order is the one order of changes everybody sees.

Every script takes ``prefix, origin, edge stream length, fleet stream
length`` as its first four arguments. Keys are built from the prefix
inside the scripts: this is for one Redis server (or a primary with
replicas), not Redis Cluster.
"""

from __future__ import annotations

import hashlib

import attrs

_COMMON = """
local P, ORIGIN, EDGE_MAX, FLEET_MAX = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local function append(edge, event, change)
  local seq = redis.call('HINCRBY', P .. ':edge:' .. edge, 'seq', 1)
  local fseq = redis.call('INCR', P .. ':fleet_seq')
  redis.call('XADD', P .. ':events:' .. edge, 'MAXLEN', '~', EDGE_MAX, seq .. '-0', 'e', event, 'f', fseq)
  redis.call('XADD', P .. ':fleet', 'MAXLEN', '~', FLEET_MAX, fseq .. '-0', 'e', event, 'c', change, 'o', ORIGIN,
             's', seq)
  return fseq
end
local function is_current(edge, fence)
  local v = redis.call('HMGET', P .. ':edge:' .. edge, 'fence', 'connected')
  return v[1] == fence and v[2] == '1'
end
local function take(edge, fence, owner, hello, now, event, previous_owner)
  local ek = P .. ':edge:' .. edge
  local epoch = redis.call('HINCRBY', ek, 'epoch', 1)
  local enrollments = redis.call('HINCRBY', ek, 'enrollments', 1)
  redis.call('HSET', ek, 'fence', fence, 'owner', owner, 'connected', '1', 'connected_at', now,
             'last_seen', now, 'hello', hello)
  redis.call('HDEL', ek, 'disconnected_at')
  redis.call('SADD', P .. ':edges', edge)
  if previous_owner and previous_owner ~= owner then
    redis.call('SREM', P .. ':owned:' .. previous_owner, edge)
  end
  redis.call('SADD', P .. ':owned:' .. owner, edge)
  append(edge, event, cjson.encode({kind = 'connect', fence = fence, owner = owner, epoch = epoch,
                                    at = tonumber(now), enrollments = enrollments, hello = hello}))
  return epoch
end
"""


@attrs.frozen
class Script:
    """One Lua script and its SHA1 (what EVALSHA names)."""

    name: str
    source: str

    @property
    def sha(self) -> str:
        """The SHA1 of the source."""
        return hashlib.sha1(self.source.encode()).hexdigest()


def _script(name: str, body: str) -> Script:
    return Script(name, _COMMON + body)


#: A hello was accepted: a new epoch, this connection is current.
#: ARGV: edge, fence, owner, hello, now, connected event, superseded event.
#: Returns the epoch.
CLAIM = _script(
    "claim",
    """
local edge, fence, owner = ARGV[5], ARGV[6], ARGV[7]
local prev = redis.call('HMGET', P .. ':edge:' .. edge, 'fence', 'connected', 'owner')
if prev[2] == '1' then
  append(edge, ARGV[11], cjson.encode({kind = 'superseded', fence = prev[1]}))
end
return take(edge, fence, owner, ARGV[8], ARGV[9], ARGV[10], prev[3])
""",
)

#: After Redis came back: is this connection still the current one?
#: ARGV: edge, fence, owner, hello, now, connected event.
#: Returns 1 (still current), 2 (connected again after it was reaped),
#: 3 (Redis had lost the record; claimed again) or 0 (superseded).
REASSERT = _script(
    "reassert",
    """
local edge, fence, owner = ARGV[5], ARGV[6], ARGV[7]
local v = redis.call('HMGET', P .. ':edge:' .. edge, 'fence', 'connected', 'owner')
if v[1] == fence then
  if v[2] == '1' then
    redis.call('SADD', P .. ':owned:' .. owner, edge)
    return 1
  end
  take(edge, fence, owner, ARGV[8], ARGV[9], ARGV[10], v[3])
  return 2
end
if not v[1] then
  take(edge, fence, owner, ARGV[8], ARGV[9], ARGV[10], false)
  return 3
end
return 0
""",
)

#: A connection closed. ARGV: edge, fence, now, disconnected event.
#: Returns 1, or 0 when the fence was stale (nothing changed).
RELEASE = _script(
    "release",
    """
local edge, fence, now = ARGV[5], ARGV[6], ARGV[7]
local ek = P .. ':edge:' .. edge
local v = redis.call('HMGET', ek, 'fence', 'connected', 'owner')
if v[1] ~= fence or v[2] ~= '1' then return 0 end
redis.call('HSET', ek, 'connected', '0', 'disconnected_at', now, 'last_seen', now)
if v[3] then redis.call('SREM', P .. ':owned:' .. v[3], edge) end
append(edge, ARGV[8], cjson.encode({kind = 'disconnect', fence = fence, at = tonumber(now)}))
return 1
""",
)

#: A status snapshot arrived. ARGV: edge, fence, snapshot (base64), now.
STATUS = _script(
    "status",
    """
local edge, fence = ARGV[5], ARGV[6]
if not is_current(edge, fence) then return 0 end
redis.call('HSET', P .. ':edge:' .. edge, 'snapshot', ARGV[7], 'snapshot_at', ARGV[8], 'last_seen', ARGV[8])
return 1
""",
)

#: An event. ARGV: edge, fence ('' for the Control Plane's own events),
#: event, change. Returns its fleet sequence, or 0 when the fence was stale.
EVENT = _script(
    "event",
    """
local edge, fence = ARGV[5], ARGV[6]
if fence ~= '' and not is_current(edge, fence) then return 0 end
return append(edge, ARGV[7], ARGV[8])
""",
)

#: An operation was created or changed (only the replica that dispatched
#: it changes it). ARGV: edge, operation id, operation JSON, created at,
#: event, operations kept per edge. Returns the event's fleet sequence.
OPERATION = _script(
    "operation",
    """
local edge, id, op = ARGV[5], ARGV[6], ARGV[7]
local index = P .. ':ops:' .. edge
redis.call('SET', P .. ':op:' .. id, op)
redis.call('ZADD', index, ARGV[8], id)
local keep = tonumber(ARGV[10])
local n = redis.call('ZCARD', index)
if n > 2 * keep then
  local old = redis.call('ZRANGE', index, 0, n - keep - 1)
  for _, gone in ipairs(old) do redis.call('DEL', P .. ':op:' .. gone) end
  redis.call('ZREMRANGEBYRANK', index, 0, n - keep - 1)
end
return append(edge, ARGV[9], '{"kind":"operation","op":' .. op .. '}')
""",
)

#: An idempotency key for a new command. ARGV: edge, key, operation id,
#: TTL (ms). Returns '' when the key was free (now taken), or the operation
#: id that already holds it.
RESERVE_KEY = _script(
    "reserve_key",
    """
local k = P .. ':idem:' .. ARGV[5] .. ':' .. ARGV[6]
if redis.call('SET', k, ARGV[7], 'NX', 'PX', ARGV[8]) then return '' end
return redis.call('GET', k)
""",
)

#: A replica is gone (its lease expired) or restarted: its edges are
#: disconnected. ARGV: replica, fence prefix to keep ('' none), now, message.
#: Returns how many edges it disconnected.
REAP = _script(
    "reap",
    """
local replica, keep, now, message = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local owned = P .. ':owned:' .. replica
local n = 0
for _, edge in ipairs(redis.call('SMEMBERS', owned)) do
  local ek = P .. ':edge:' .. edge
  local v = redis.call('HMGET', ek, 'fence', 'connected', 'owner')
  local kept = keep ~= '' and v[1] and string.sub(v[1], 1, #keep) == keep
  if v[3] == replica and not kept then
    if v[2] == '1' then
      redis.call('HSET', ek, 'connected', '0', 'disconnected_at', now)
      local event = cjson.encode({edge_id = edge, kind = 'edge.disconnected', occurred_at = tonumber(now),
                                  recorded_at = tonumber(now), node_id = '', provider_id = '', command_id = '',
                                  message = message, attributes = {reason = 'owner_lost'}})
      append(edge, event, cjson.encode({kind = 'disconnect', fence = v[1], at = tonumber(now)}))
      n = n + 1
    end
    redis.call('SREM', owned, edge)
  elseif v[3] ~= replica then
    redis.call('SREM', owned, edge)
  end
end
return n
""",
)

ALL = (CLAIM, REASSERT, RELEASE, STATUS, EVENT, OPERATION, RESERVE_KEY, REAP)
