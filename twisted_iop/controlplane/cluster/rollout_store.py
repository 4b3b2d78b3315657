"""Rollouts in cluster mode: each rollout's whole state in Redis, and one
runner per rollout, fenced by a lease with an epoch.

* **The stored form** (:func:`~twisted_iop.controlplane.store.forms.rollout_dict`,
  ``rollout_from``, shared with the SQLite store), bounded by
  :data:`~twisted_iop.controlplane.store.forms.MAX_STATE_BYTES`.
* **The keys**: ``<prefix>:rollouts`` (sorted set of rollout ids by
  creation time), ``<prefix>:rollout:<id>`` (hash: ``state`` JSON,
  ``version``, ``settled``), ``<prefix>:rollout_lease:<id>`` (the runner's
  lease, ``<replica>/<boot>/<epoch>``, with a TTL),
  ``<prefix>:rollout_epoch:<id>`` (the counter of leases taken) and
  ``<prefix>:rollout_requests:<id>`` (a list of ``pause|resume|cancel``
  asked on replicas that do not run it).
* **The lease**: taken with ``SET NX PX`` after an ``INCR`` of the epoch
  (one script), refreshed at a third of its TTL. Every write of the state
  is a script that applies only while the lease is still this replica's
  with this epoch: a runner that lost its lease cannot overwrite the new
  runner's state. A runner whose lease was not confirmed within its TTL
  stops dispatching (and lets the rollout go) before anyone else can take
  it.
* :class:`ClusterRollouts` is the service's link: it writes the state of
  the rollouts run here (at most once per reactor turn each), mirrors the
  others' (a poll of versions; the state is read only when it changed),
  takes over rollouts whose runner's lease expired, and hands the moves
  asked elsewhere to the runner.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional, Protocol

import attrs
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster.scripts import Script
from twisted_iop.controlplane.cluster.store import RedisLink
from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.controlplane.store.forms import MAX_STATE_BYTES, rollout_dict, rollout_from

if TYPE_CHECKING:
    from twisted_iop.controlplane.cluster.replica import ClusterReplica


class RolloutService(Protocol):
    """What the store asks of the replica's rollout runner (``rollouts.RolloutService``)."""

    def find(self, rollout_id: str) -> Optional[rs.Rollout]:
        """The rollout kept here, if any."""

    def requested(self, rollout_id: str, move: str) -> None:
        """Another replica asked this runner for a move (pause, resume, cancel)."""

    def mirrored(self, rollout: rs.Rollout) -> None:
        """Another replica's rollout, as it now stands."""

    def adopt(self, rollout: rs.Rollout) -> None:
        """Run ``rollout`` here from now on (its lease was taken over)."""

    def let_go(self, rollout_id: str) -> None:
        """Stop running ``rollout_id`` here (its lease was lost)."""


#: The moves a replica that does not run a rollout hands to its runner.
MOVES = ("pause", "resume", "cancel")


# -- the scripts --------------------------------------------------------------------------

_PREFIX = """
local P = ARGV[1]
local id = ARGV[2]
local lease = P .. ':rollout_lease:' .. id
"""

#: Take the lease if nobody holds it. ARGV: prefix, id, owner, ttl ms. Returns the epoch (0: held).
ACQUIRE = Script(
    "rollout_acquire",
    _PREFIX
    + """
if redis.call('EXISTS', lease) == 1 then return 0 end
local epoch = redis.call('INCR', P .. ':rollout_epoch:' .. id)
redis.call('SET', lease, ARGV[3] .. '/' .. epoch, 'NX', 'PX', ARGV[4])
return epoch
""",
)

#: Refresh our lease. ARGV: prefix, id, owner/epoch, ttl ms. Returns 1 (still ours) or 0.
REFRESH = Script(
    "rollout_refresh",
    _PREFIX
    + """
if redis.call('GET', lease) ~= ARGV[3] then return 0 end
redis.call('PEXPIRE', lease, ARGV[4])
return 1
""",
)

#: Write the state while the lease is ours. ARGV: prefix, id, owner/epoch,
#: state JSON, created_at, settled (1/0), rollouts kept. Returns 1 or 0 (fenced out).
#: Beyond twice the kept number, the oldest settled rollouts are removed.
WRITE = Script(
    "rollout_write",
    _PREFIX
    + """
if redis.call('GET', lease) ~= ARGV[3] then return 0 end
local key = P .. ':rollout:' .. id
redis.call('HSET', key, 'state', ARGV[4], 'settled', ARGV[6])
redis.call('HINCRBY', key, 'version', 1)
local index = P .. ':rollouts'
redis.call('ZADD', index, ARGV[5], id)
local keep = tonumber(ARGV[7])
if redis.call('ZCARD', index) > 2 * keep then
  for _, old in ipairs(redis.call('ZRANGE', index, 0, keep - 1)) do
    if redis.call('HGET', P .. ':rollout:' .. old, 'settled') == '1' then
      redis.call('ZREM', index, old)
      redis.call('DEL', P .. ':rollout:' .. old, P .. ':rollout_epoch:' .. old, P .. ':rollout_requests:' .. old)
    end
  end
end
return 1
""",
)

#: The newest rollouts: a flat list of id, version, settled, lease holder ('' none).
#: ARGV: prefix, (unused), how many.
VERSIONS = Script(
    "rollout_versions",
    _PREFIX
    + """
local out = {}
for _, rid in ipairs(redis.call('ZREVRANGE', P .. ':rollouts', 0, tonumber(ARGV[3]) - 1)) do
  local v = redis.call('HMGET', P .. ':rollout:' .. rid, 'version', 'settled')
  out[#out + 1] = rid
  out[#out + 1] = v[1] or '0'
  out[#out + 1] = v[2] or '0'
  out[#out + 1] = redis.call('GET', P .. ':rollout_lease:' .. rid) or ''
end
return out
""",
)

#: Take the moves asked of a rollout (oldest first). ARGV: prefix, id.
TAKE_REQUESTS = Script(
    "rollout_take_requests",
    _PREFIX
    + """
local k = P .. ':rollout_requests:' .. id
local moves = redis.call('LRANGE', k, 0, -1)
redis.call('DEL', k)
return moves
""",
)


@attrs.define
class _Run:
    """A rollout this replica runs: its lease's epoch and how long it is sure to hold it."""

    epoch: int
    valid_until: float
    writing: bool = False
    dirty: bool = False


class ClusterRollouts:
    """The RolloutService's link to the cluster (see the module docstring)."""

    @classmethod
    def of(cls, replica: ClusterReplica, kept: int) -> ClusterRollouts:
        """The link of ``replica``: its Redis, key prefix and boot; leases as long as the replica's."""
        return cls(
            replica.link,
            replica.keys.prefix,
            replica.fence_prefix.rstrip("/"),
            replica._clock,
            replica.config.lease_ttl_seconds,
            kept,
            lambda: replica.available,
        )

    _log = Logger()

    def __init__(
        self,
        link: RedisLink,
        prefix: str,
        owner: str,
        clock: IReactorTime,
        ttl_seconds: float,
        kept: int,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._link = link
        #: Whether the replica's mirror holds the fleet (nothing is taken over before).
        self._ready = ready
        self._prefix = prefix
        #: ``<replica>/<boot>``: whose lease is whose.
        self._owner = owner
        self._clock = clock
        self.ttl_seconds = ttl_seconds
        self._ttl_ms = int(ttl_seconds * 1000)
        self._kept = kept
        self._service: Optional[RolloutService] = None
        #: The rollouts run here.
        self._runs: dict[str, _Run] = {}
        #: The stored version of each mirrored rollout.
        self._versions: dict[str, int] = {}
        self._flush: Optional[IDelayedCall] = None
        self._pending: dict[str, None] = {}
        self._syncing = False
        self._loop = LoopingCall(self._sync)
        self._loop.clock = clock
        #: For logs and tests: rollouts taken over from another replica.
        self.taken_over = 0

    # -- wiring ---------------------------------------------------------------------------

    def attach(self, service: RolloutService) -> None:
        """Serve ``service`` (which calls :meth:`created`, :meth:`changed`, ...)."""
        self._service = service

    def start(self) -> None:
        """Start the sync loop: leases refreshed, mirrors updated, takeovers, at a third of the TTL."""
        if not self._loop.running:
            self._loop.start(self.ttl_seconds / 3.0, now=False)

    def stop(self) -> None:
        """Stop syncing (the leases then expire and other replicas take the rollouts over)."""
        if self._loop.running:
            self._loop.stop()
        if self._flush is not None and self._flush.active():
            self._flush.cancel()

    def runs(self, rollout_id: str) -> bool:
        """Whether this replica runs ``rollout_id`` and is sure to still hold its lease."""
        run = self._runs.get(rollout_id)
        return run is not None and self._clock.seconds() < run.valid_until

    # -- the service's hooks ----------------------------------------------------------------

    def created(self, rollout: rs.Rollout) -> None:
        """A rollout created here: take its lease (nobody else knows it) and write it."""
        sent = self._clock.seconds()
        # Run at once: its id is new, so the lease is ours unless Redis is away.
        self._runs[rollout.rollout_id] = _Run(0, sent + self.ttl_seconds)
        d = self._link.run(ACQUIRE, self._prefix, rollout.rollout_id, self._owner, self._ttl_ms)

        def taken(epoch: Any) -> None:
            if not int(epoch or 0):
                self._lost(rollout.rollout_id, "its lease is held elsewhere")
                return
            run = self._runs.get(rollout.rollout_id)
            if run is not None:
                run.epoch = int(epoch)
                self.changed(rollout)

        d.addCallback(taken)
        d.addErrback(self._failed, rollout.rollout_id, "take its lease")

    def changed(self, rollout: rs.Rollout) -> None:
        """``rollout`` changed: written at the end of this reactor turn (if run here)."""
        run = self._runs.get(rollout.rollout_id)
        if run is None or not run.epoch:
            return
        self._pending[rollout.rollout_id] = None
        if self._flush is None or not self._flush.active():
            self._flush = self._clock.callLater(0, self._write_pending)

    def request(self, rollout_id: str, move: str) -> Deferred[Any]:
        """Hand ``move`` to the runner of a rollout run elsewhere."""
        assert move in MOVES
        return self._link.call("RPUSH", f"{self._prefix}:rollout_requests:{rollout_id}", move)

    # -- writing -------------------------------------------------------------------------------

    def _write_pending(self) -> None:
        pending, self._pending = list(self._pending), {}
        for rollout_id in pending:
            self._write(rollout_id)

    def _write(self, rollout_id: str) -> None:
        run = self._runs.get(rollout_id)
        service = self._service
        if run is None or service is None:
            return
        if run.writing:
            run.dirty = True  # one write in flight per rollout; the next carries every change
            return
        rollout = service.find(rollout_id)
        if rollout is None:
            return
        text = json.dumps(rollout_dict(rollout), separators=(",", ":"))
        if len(text) > MAX_STATE_BYTES:
            self._log.error(
                "rollout {rollout_id}: its state ({size} bytes) is above {limit}: not stored",
                rollout_id=rollout_id,
                size=len(text),
                limit=MAX_STATE_BYTES,
            )
            return
        run.writing = True
        d = self._link.run(
            WRITE,
            self._prefix,
            rollout_id,
            f"{self._owner}/{run.epoch}",
            text,
            repr(rollout.created_at),
            "1" if rollout.settled else "0",
            self._kept,
        )

        def written(ok: Any) -> None:
            run.writing = False
            if not int(ok or 0):
                self._lost(rollout_id, "another replica holds its lease now")
                return
            if rollout.settled:
                self._runs.pop(rollout_id, None)  # nothing more to run; its lease expires
            if run.dirty:
                run.dirty = False
                self._write(rollout_id)

        def failed(failure: Failure) -> None:
            run.writing = False
            run.dirty = True  # written again at the next sync, while the lease holds
            self._failed(failure, rollout_id, "write its state")

        d.addCallbacks(written, failed)

    def _lost(self, rollout_id: str, why: str) -> None:
        """The lease is not (or no longer) ours: stop running it; it is mirrored from now on."""
        if self._runs.pop(rollout_id, None) is None:
            return
        self._versions.pop(rollout_id, None)
        if self._service is not None:
            self._service.let_go(rollout_id)
        self._log.warn("rollout {rollout_id} is no longer run here: {why}", rollout_id=rollout_id, why=why)

    def _failed(self, failure: Failure, rollout_id: str, what: str) -> None:
        self._log.warn(
            "rollout {rollout_id}: could not {what}: {error}",
            rollout_id=rollout_id,
            what=what,
            error=failure.getErrorMessage(),
        )

    # -- the sync loop ------------------------------------------------------------------------------

    def _sync(self) -> None:
        now = self._clock.seconds()
        for rollout_id, run in list(self._runs.items()):
            if now >= run.valid_until:
                # Not confirmed within its TTL: another replica may take it any moment.
                self._lost(rollout_id, "its lease could not be refreshed in time")
        if self._syncing or not self._link.up or not self._ready():
            return
        self._syncing = True
        d = self._sync_once(now)
        d.addErrback(lambda f: self._log.warn("rollouts: sync with the cluster failed: {e}", e=f.getErrorMessage()))
        d.addBoth(self._synced)

    def _synced(self, _: object) -> None:
        self._syncing = False

    @inlineCallbacks
    def _sync_once(self, sent: float) -> Any:
        service = self._service
        assert service is not None
        for rollout_id, run in list(self._runs.items()):
            if not run.epoch:
                continue
            ok = yield self._link.run(REFRESH, self._prefix, rollout_id, f"{self._owner}/{run.epoch}", self._ttl_ms)
            if not int(ok or 0):
                self._lost(rollout_id, "another replica holds its lease now")
                continue
            run.valid_until = sent + self.ttl_seconds
            if run.dirty and not run.writing:
                run.dirty = False
                self._write(rollout_id)
            moves = yield self._link.run(TAKE_REQUESTS, self._prefix, rollout_id)
            for move in moves or ():
                service.requested(rollout_id, str(move))
        flat = yield self._link.run(VERSIONS, self._prefix, "", self._kept)
        flat = list(flat or ())
        for i in range(0, len(flat) - 3, 4):
            rollout_id, version, settled, holder = (str(v) for v in flat[i : i + 4])
            if rollout_id in self._runs:
                continue
            if holder == "" and settled != "1":
                yield self._take_over(rollout_id)
            elif self._versions.get(rollout_id) != int(version):
                yield self._mirror(rollout_id)

    @inlineCallbacks
    def _load(self, rollout_id: str) -> Any:
        """The stored rollout and its version (None when absent or unreadable)."""
        stored = yield self._link.call("HMGET", f"{self._prefix}:rollout:{rollout_id}", "state", "version")
        if not stored or stored[0] is None:
            return None
        try:
            return rollout_from(json.loads(stored[0])), int(stored[1] or 0)
        except ValueError as e:
            self._log.error("rollout {rollout_id}: its stored state is unreadable: {e}", rollout_id=rollout_id, e=e)
            return None

    @inlineCallbacks
    def _mirror(self, rollout_id: str) -> Any:
        loaded = yield self._load(rollout_id)
        if loaded is None or rollout_id in self._runs or self._service is None:
            return
        rollout, version = loaded
        self._versions[rollout_id] = version
        self._service.mirrored(rollout)

    @inlineCallbacks
    def _take_over(self, rollout_id: str) -> Any:
        """Its runner's lease expired: take it, load the state and run it from there."""
        sent = self._clock.seconds()
        epoch = int((yield self._link.run(ACQUIRE, self._prefix, rollout_id, self._owner, self._ttl_ms)) or 0)
        if not epoch:
            return  # another replica was quicker
        loaded = yield self._load(rollout_id)
        if loaded is None or self._service is None:
            return
        rollout, version = loaded
        self._versions[rollout_id] = version
        self._runs[rollout_id] = _Run(epoch, sent + self.ttl_seconds)
        self.taken_over += 1
        self._log.info(
            "rollout {rollout_id} taken over (lease epoch {epoch}): {in_flight} execution(s) in flight are "
            "dispatched again under their idempotency keys",
            rollout_id=rollout_id,
            epoch=epoch,
            in_flight=rollout.counts[rs.IN_FLIGHT],
        )
        self._service.adopt(rollout)
        self.changed(rollout)
