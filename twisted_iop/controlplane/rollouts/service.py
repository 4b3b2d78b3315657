"""Rollouts: the runner that drives each :class:`~.rollout_states.Rollout`
by the clock and dispatches its executions as ordinary operations.

* **Targets** are the known edges (connected or not) whose hello labels
  match the selector when the rollout is created, in edge id order.
* **Dispatch** goes through :meth:`EdgeGateway.dispatch
  <twisted_iop.controlplane.requests.gateway.EdgeGateway.dispatch>`, the code path
  of ``POST /edges/{id}/commands``: each execution is one operation per
  command (one per matching node with ``node_selector``), with its audit,
  late outcome and ``operation.*`` events as any other. Its idempotency
  key is ``rollout:<rollout_id>`` (``rollout:<rollout_id>:<node_id>`` per
  node), which links it to the rollout in ``/edges/{id}/operations`` and
  makes a second dispatch of the same execution a replay.
* **Events** ``rollout.*`` are recorded in the fleet's event stream (and
  so reach ``/client`` subscribers) with attribute ``rollout_id``; they name
  no edge (``edge_id`` is empty) and are kept in a buffer of their own.
* **Bounds.** At most ``max_kept`` rollouts are kept: the oldest settled
  ones are forgotten first (and their idempotency keys); when every kept
  one is still running a new one is refused (:class:`TooManyRollouts`).

Single process: everything lives here, in memory; a rollout's whole state
is its :class:`~.rollout_states.Rollout`.

Cluster mode (``cluster`` given, a
:class:`~twisted_iop.controlplane.cluster.rollout_store.ClusterRollouts`):
the state of every rollout run here is written to Redis after each change;
the others' are mirrored (views read the mirror); only the replica holding
a rollout's lease steps it; a rollout whose runner died is adopted and its
in-flight executions dispatched again under their idempotency keys, which
are reserved cluster-wide first (as ``POST /edges/{id}/commands`` does), so
that dispatch replays the existing operation instead of running the
command a second time.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

import attrs
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected, UnknownEdge
from twisted_iop.controlplane.fleet.event_log import EdgeEvents
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests.command_dispatch import IdempotencyConflict, UnknownCommand
from twisted_iop.controlplane.requests.errors import ShuttingDown
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.requests.operation_states import SUCCEEDED, TIMED_OUT
from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.controlplane.rollouts.requests import (
    RolloutRequest,
    RolloutSink,
    TooManyRollouts,
    TooManyTargets,
    UnknownRollout,
)
from twisted_iop.controlplane.rollouts.settings import DispatchPace, RolloutSettings
from twisted_iop.controlplane.slo.readings import Reading, cumulative_readings, observed_since, recent_sketch
from twisted_iop.label_selectors import Selector, parse_selector

if TYPE_CHECKING:
    from twisted_iop.controlplane.cluster.replica import ClusterReplica
    from twisted_iop.controlplane.cluster.rollout_store import ClusterRollouts

#: How often rollouts with executions waiting for their edge look again.
WAITING_POLL_SECONDS = 0.5
#: Why an execution with a node selector was skipped.
NO_MATCHING_NODE = "no node of this edge (in its last snapshot) matches node_selector"


@attrs.frozen
class _Target:
    """One execution's dispatch: its target, its idempotency key, the operation id reserved
    cluster-wide (``""``: none) or why it could not be reserved."""

    target: str
    key: str
    operation_id: str = ""
    problem: str = ""


class RolloutService:
    """Every kept rollout, and the clock that drives the running ones."""

    _log = Logger()

    def __init__(
        self,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        clock: IReactorTime,
        settings: RolloutSettings = RolloutSettings(),
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        cluster: Optional[ClusterRollouts] = None,
        replica: Optional[ClusterReplica] = None,
        store: Optional[RolloutSink] = None,
    ) -> None:
        self._registry = registry
        self._gateway = gateway
        self._clock = clock
        self.settings = settings
        self._new_id = new_id
        #: Kept rollouts by id, oldest first.
        self._rollouts: dict[str, rs.Rollout] = {}
        self._by_key: dict[str, str] = {}
        #: Rollouts not yet settled (ended with nothing in flight).
        self._active: dict[str, None] = {}
        #: The node selectors of the active rollouts, parsed once.
        self._node_selectors: dict[str, Selector] = {}
        #: The ``rollout.*`` events' own buffer (they belong to no edge).
        self._events = registry.event_log.edge_buffer()
        self._timer: Optional[IDelayedCall] = None
        self._timer_at: Optional[float] = None
        self._pace = DispatchPace(settings.max_dispatch_per_second)
        self.stopped = False
        #: For /metrics: operations dispatched by rollouts.
        self.dispatched_total = 0
        #: Cluster mode: the rollouts' store and leases, and the replica (idempotency keys).
        self._cluster = cluster
        self._replica = replica
        if cluster is not None:
            cluster.attach(self)
        #: The store that keeps rollouts across restarts (single process).
        self._store = store
        #: Per watched execution (``abort.latency``): its edge's cumulative readings when it ended.
        self._baselines: dict[tuple[str, str], dict[tuple[str, str], Reading]] = {}

    # -- views -------------------------------------------------------------------------

    def get(self, rollout_id: str) -> rs.Rollout:
        """The kept rollout ``rollout_id``; raises :class:`UnknownRollout`."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise UnknownRollout(rollout_id[:80])
        return rollout

    def find(self, rollout_id: str) -> Optional[rs.Rollout]:
        """The kept rollout ``rollout_id``, or None."""
        return self._rollouts.get(rollout_id)

    def newest_first(self) -> list[rs.Rollout]:
        """Every kept rollout, newest first."""
        return list(reversed(self._rollouts.values()))

    def __len__(self) -> int:
        return len(self._rollouts)

    def figures(self) -> tuple[dict[str, int], dict[str, int]]:
        """For /metrics: kept rollouts by state, and their executions by state."""
        by_state: dict[str, int] = {}
        executions: dict[str, int] = {}
        for rollout in self._rollouts.values():
            by_state[rollout.state] = by_state.get(rollout.state, 0) + 1
            for state, count in rollout.counts.items():
                executions[state] = executions.get(state, 0) + count
        return by_state, executions

    # -- requests ----------------------------------------------------------------------

    def create(self, request: RolloutRequest, requested_by: str = "") -> tuple[rs.Rollout, bool]:
        """Start a rollout; return it and whether its idempotency key replayed an earlier one.

        Raises :class:`TooManyTargets` or :class:`TooManyRollouts` (nothing
        is created then) and ShuttingDown while the Control Plane stops.
        """
        key = request.idempotency_key
        if key and key in self._by_key:
            return self._rollouts[self._by_key[key]], True
        if self._gateway.stopping or self.stopped:
            raise ShuttingDown()
        selector = request.selector
        targets = [record.edge_id for record in self._registry.edges() if selector.matches(record.hello.labels)]
        if len(targets) > self.settings.max_targets:
            raise TooManyTargets(
                f"the selector matches {len(targets)} edges; a rollout may have at most "
                f"{self.settings.max_targets} (rollouts.max_targets)"
            )
        targets.sort()
        self._make_room()
        now = self._clock.seconds()
        rollout = rs.Rollout(
            rollout_id=self._new_id(),
            command=request.command,
            selector=str(selector),
            strategy=request.strategy,
            abort=request.abort,
            timeout_seconds=request.timeout_seconds,
            disconnected=request.disconnected,
            wait_seconds=request.wait_seconds,
            created_at=now,
            targets=targets,
            idempotency_key=key,
            requested_by=requested_by,
        )
        self._rollouts[rollout.rollout_id] = rollout
        if key:
            self._by_key[key] = rollout.rollout_id
        if request.command.node_selector:
            self._node_selectors[rollout.rollout_id] = parse_selector(request.command.node_selector)
        self._active[rollout.rollout_id] = None
        if self._cluster is not None:
            self._cluster.created(rollout)
        rollout.start(now)
        self._changed(rollout)
        return rollout, False

    def pause(self, rollout_id: str) -> rs.Rollout:
        """Pause: nothing new is dispatched until resumed. Raises InvalidTransition."""
        rollout = self.get(rollout_id)
        rollout.pause(self._clock.seconds())
        self._moved(rollout, "pause")
        return rollout

    def resume(self, rollout_id: str) -> rs.Rollout:
        """Resume a paused rollout. Raises InvalidTransition."""
        rollout = self.get(rollout_id)
        rollout.resume(self._clock.seconds())
        self._moved(rollout, "resume")
        return rollout

    def cancel(self, rollout_id: str) -> rs.Rollout:
        """Cancel: nothing new is dispatched; what is in flight ends and is recorded."""
        rollout = self.get(rollout_id)
        rollout.cancel(self._clock.seconds())
        self._moved(rollout, "cancel")
        return rollout

    def _moved(self, rollout: rs.Rollout, move: str) -> None:
        if self._cluster is not None and rollout.rollout_id not in self._active:
            # Run by another replica: it is handed the move (this mirror shows
            # it at once; the runner's next write is the truth).
            rollout.take_notices()
            self._cluster.request(rollout.rollout_id, move).addErrback(
                lambda f: self._log.warn(
                    "rollout {id}: {move} not handed over: {e}", id=rollout.rollout_id, move=move, e=f.getErrorMessage()
                )
            )
            return
        self._changed(rollout)

    # -- cluster mode: the store's hooks ---------------------------------------------------

    def requested(self, rollout_id: str, move: str) -> None:
        """A move asked on another replica of a rollout run here."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None or rollout_id not in self._active:
            return
        try:
            getattr(rollout, move)(self._clock.seconds())
        except rs.InvalidTransition as e:
            self._log.info("rollout {id}: {move} asked elsewhere not applied: {e}", id=rollout_id, move=move, e=e)
            return
        self._changed(rollout)

    def mirrored(self, rollout: rs.Rollout) -> None:
        """A rollout run by another replica, as it stored it."""
        if rollout.rollout_id in self._active:
            return
        if rollout.rollout_id not in self._rollouts:
            try:
                self._make_room()
            except TooManyRollouts:
                return
        self._rollouts[rollout.rollout_id] = rollout
        self._rollouts = dict(sorted(self._rollouts.items(), key=lambda item: item[1].created_at))
        if rollout.idempotency_key:
            self._by_key[rollout.idempotency_key] = rollout.rollout_id

    def adopt(self, rollout: rs.Rollout) -> None:
        """Run ``rollout`` from its stored state (its runner died): its
        in-flight executions are dispatched again under their keys (replays)."""
        self.mirrored(rollout)
        if self.stopped or rollout.rollout_id not in self._rollouts:
            return
        self._rollouts[rollout.rollout_id] = rollout
        if rollout.settled:
            return
        self._active[rollout.rollout_id] = None
        if rollout.command.node_selector:
            self._node_selectors[rollout.rollout_id] = parse_selector(rollout.command.node_selector)
        for edge_id in rollout.targets:
            if rollout.executions[edge_id].state == rs.IN_FLIGHT:
                self._dispatch(rollout, edge_id)
        for edge_id in list(rollout.watching):
            self._watch(rollout, edge_id)  # its baseline begins again now
        self._changed(rollout)

    @property
    def event_buffer(self) -> EdgeEvents:
        """The ``rollout.*`` events' own buffer."""
        return self._events

    def restore(self, rollout: rs.Rollout) -> None:
        """A rollout an earlier process kept: shown again and, unless it had
        settled, run on from where it was (its in-flight executions are
        dispatched again under their idempotency keys, which replay the
        operations kept with them)."""
        self.adopt(rollout)

    def let_go(self, rollout_id: str) -> None:
        """This replica no longer holds the lease: stop stepping it (it is mirrored from now on)."""
        self._active.pop(rollout_id, None)
        self._node_selectors.pop(rollout_id, None)

    def start(self) -> None:
        """Cluster mode: start syncing with the cluster (leases, mirrors, takeovers)."""
        if self._cluster is not None:
            self._cluster.start()

    def shut_down(self) -> None:
        """Stop the clock: nothing more is dispatched (the gateway ends what is in flight)."""
        self.stopped = True
        self._stop_timer()
        if self._cluster is not None:
            self._cluster.stop()

    # -- bounds ------------------------------------------------------------------------

    def _make_room(self) -> None:
        """Forget the oldest settled rollouts until a new one fits."""
        if len(self._rollouts) < self.settings.max_kept:
            return
        for rollout_id in list(self._rollouts):
            if len(self._rollouts) < self.settings.max_kept:
                return
            if rollout_id not in self._active:
                forgotten = self._rollouts.pop(rollout_id)
                if forgotten.idempotency_key:
                    self._by_key.pop(forgotten.idempotency_key, None)
        if len(self._rollouts) >= self.settings.max_kept:
            raise TooManyRollouts(
                f"all {len(self._rollouts)} kept rollouts are still running (rollouts.max_kept); "
                "cancel one or wait for one to end"
            )

    # -- the clock ------------------------------------------------------------------------

    def _changed(self, rollout: rs.Rollout) -> None:
        """Record what ``rollout`` has to say, and let the clock look at it soon."""
        self._record_notices(rollout)
        if self._cluster is not None:
            self._cluster.changed(rollout)
        if self._store is not None:
            self._store.rollout_changed(rollout)
        if rollout.settled:
            self._active.pop(rollout.rollout_id, None)
            self._node_selectors.pop(rollout.rollout_id, None)
        self._wake_at(self._clock.seconds())

    def _wake_at(self, when: float) -> None:
        if self.stopped:
            return
        if self._timer is not None and self._timer.active():
            if self._timer_at is not None and self._timer_at <= when:
                return
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._clock.callLater(max(0.0, when - self._clock.seconds()), self._run)

    def _stop_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = self._timer_at = None

    def _run(self) -> None:
        """Step every active rollout: dispatch what is due, then sleep until the next wake."""
        self._timer = self._timer_at = None
        now = self._clock.seconds()
        wakes: list[float] = []
        for rollout_id in list(self._active):
            rollout = self._rollouts[rollout_id]
            if self._cluster is not None and not self._cluster.runs(rollout_id):
                wakes.append(now + WAITING_POLL_SECONDS)
                continue  # the lease is not confirmed: dispatch nothing until it is (or is lost)
            allowed = self._pace.allowed(now)
            if allowed == 0:
                wakes.append(self._pace.next_at(now))
                continue
            chosen = rollout.step(now, self._connected, allowed)
            self._pace.took(len(chosen))
            for edge_id in chosen:
                self._dispatch(rollout, edge_id)
            if allowed is not None and len(chosen) == allowed:
                wakes.append(self._pace.next_at(now))  # more may be due once the pace allows
            self._record_notices(rollout)
            if self._cluster is not None:
                self._cluster.changed(rollout)
            if rollout.settled:
                self._active.pop(rollout_id, None)
                self._node_selectors.pop(rollout_id, None)
                continue
            wake = rollout.next_wake()
            if wake is not None:
                wakes.append(wake)
            if rollout.counts[rs.WAITING]:
                # A waiting edge's reconnection is seen by looking again.
                wakes.append(now + WAITING_POLL_SECONDS)
        if wakes:
            self._wake_at(max(min(wakes), now))

    def _connected(self, edge_id: str) -> bool:
        record = self._registry.find(edge_id)
        return record is not None and record.connected

    # -- executions ------------------------------------------------------------------------

    def _dispatch(self, rollout: rs.Rollout, edge_id: str) -> None:
        """Dispatch one execution's operations; its end is noted when they all ended."""
        if rollout.abort.latency is not None:
            self._read_before(rollout, edge_id)
        command = rollout.command
        key = "rollout:" + rollout.rollout_id
        node_selector = self._node_selectors.get(rollout.rollout_id)
        if node_selector is None:
            targets = [(command.target, key)]
        else:
            targets = [(node, f"{key}:{node}") for node in self._matching_nodes(edge_id, node_selector)]
            if not targets:
                self._ended(rollout, edge_id, rs.SKIPPED, NO_MATCHING_NODE)
                return
        if self._replica is not None:
            d = ensureDeferred(self._reserve_and_dispatch(rollout, edge_id, targets))
            d.addErrback(self._log_failure, rollout, edge_id)
            return
        self._dispatch_all(rollout, edge_id, [_Target(t, k) for t, k in targets])

    async def _reserve_and_dispatch(self, rollout: rs.Rollout, edge_id: str, targets: list[tuple[str, str]]) -> None:
        """Cluster mode: take each key cluster-wide first (as the HTTP command
        path does), so that a dispatch after a takeover replays the operation
        the dead runner started instead of sending the command again."""
        replica = self._replica
        assert replica is not None
        reserved: list[_Target] = []
        for target, key in targets:
            try:
                operation_id = await replica.reserve_operation(edge_id, key)
            except Exception as e:  # Redis away: not dispatched, counted failed
                reserved.append(_Target(target, key, problem=str(e) or type(e).__name__))
                continue
            reserved.append(_Target(target, key, operation_id))
        if rollout.rollout_id in self._active:
            self._dispatch_all(rollout, edge_id, reserved)

    def _dispatch_all(self, rollout: rs.Rollout, edge_id: str, targets: list[_Target]) -> None:
        command = rollout.command
        waits: list[Deferred[Any]] = []
        problems: list[str] = []
        operation_ids: list[str] = []
        for target in targets:
            if target.problem:
                problems.append(target.problem)
                continue
            try:
                dispatched = self._gateway.dispatch(
                    edge_id,
                    command.name,
                    target.target,
                    command.arguments,
                    rollout.timeout_seconds,
                    target.key,
                    rollout.requested_by,
                    target.operation_id,
                )
            except (EdgeNotConnected, UnknownEdge, UnknownCommand, IdempotencyConflict, ShuttingDown) as e:
                problems.append(str(e) or type(e).__name__)
                continue
            if not dispatched.replayed:
                self.dispatched_total += 1
            operation_ids.append(dispatched.operation.operation_id)
            waits.append(dispatched.ended)
        known = rollout.executions[edge_id].operation_ids
        rollout.dispatched(edge_id, [i for i in operation_ids if i not in known])
        if not waits:
            self._ended(rollout, edge_id, rs.FAILED, "; ".join(problems))
            return
        ended: Deferred[list[tuple[bool, Any]]] = DeferredList(waits, consumeErrors=True)
        ended.addCallback(self._operations_ended, rollout, edge_id, problems)
        ended.addErrback(self._log_failure, rollout, edge_id)

    def _matching_nodes(self, edge_id: str, selector: Selector) -> list[str]:
        record = self._registry.find(edge_id)
        if record is None or record.snapshot is None:
            return []
        return [node.node_id for node in record.snapshot.parse().nodes if selector.matches(node.labels)]

    def _operations_ended(
        self, results: list[tuple[bool, Any]], rollout: rs.Rollout, edge_id: str, problems: list[str]
    ) -> None:
        """Every operation of one execution ended: the execution ends."""
        failed = list(problems)
        timed_out: list[str] = []
        for ok, value in results:
            if not ok:
                assert isinstance(value, Failure)
                failed.append(value.getErrorMessage())
                continue
            assert isinstance(value, OperationRecord)
            if value.state == SUCCEEDED:
                continue
            why = f"{value.target + ': ' if value.target else ''}{value.state}" + (
                f": {value.reason}" if value.reason else ""
            )
            (timed_out if value.state == TIMED_OUT else failed).append(why)
        if failed:
            self._ended(rollout, edge_id, rs.FAILED, "; ".join(failed + timed_out))
        elif timed_out:
            self._ended(rollout, edge_id, rs.TIMED_OUT, "; ".join(timed_out))
        else:
            self._ended(rollout, edge_id, rs.SUCCEEDED, "")

    def _ended(self, rollout: rs.Rollout, edge_id: str, outcome: str, reason: str) -> None:
        rollout.execution_ended(edge_id, outcome, reason[:1000], self._clock.seconds())
        if edge_id in rollout.watching:
            self._watch(rollout, edge_id)
        self._changed(rollout)

    # -- the latency criterion: reading each executed edge's figures -------------------------

    def _read_before(self, rollout: rs.Rollout, edge_id: str) -> None:
        """The edge's figure before its execution: the recent window of the
        status it answers now (asked before the command is sent, so the edge
        answers it first), or of its kept snapshot when it cannot answer."""
        criterion = rollout.abort.latency
        assert criterion is not None
        metric, quantile = rs.LATENCY_FIGURES[criterion.metric]

        def took(snapshot: Optional[StatusSnapshot]) -> None:
            if snapshot is not None and rollout.executions[edge_id].latency_before is None:
                rollout.latency_read_before(edge_id, recent_sketch(snapshot.parse(), metric).quantile(quantile))

        def failed(_: Failure) -> None:
            record = self._registry.find(edge_id)
            took(None if record is None else record.snapshot)

        self._gateway.status(edge_id).addCallbacks(took, failed)

    def _watch(self, rollout: rs.Rollout, edge_id: str) -> None:
        """Take the edge's cumulative readings now (the baseline), then read
        again every ``latency_poll_seconds`` until ``min_requests`` ended since."""
        criterion = rollout.abort.latency
        assert criterion is not None
        metric = rs.LATENCY_FIGURES[criterion.metric][0]
        key = (rollout.rollout_id, edge_id)

        def baseline(snapshot: StatusSnapshot) -> None:
            self._baselines[key] = cumulative_readings(snapshot.parse(), metric)
            self._poll_later(rollout, edge_id)

        def failed(failure: Failure) -> None:
            record = self._registry.find(edge_id)
            if record is not None and record.snapshot is not None:
                baseline(record.snapshot)
            else:
                self._poll_later(rollout, edge_id)

        self._gateway.status(edge_id).addCallbacks(baseline, failed)

    def _poll_later(self, rollout: rs.Rollout, edge_id: str) -> None:
        if not self.stopped and edge_id in rollout.watching:
            self._clock.callLater(self.settings.latency_poll_seconds, self._poll, rollout, edge_id)
        else:
            self._baselines.pop((rollout.rollout_id, edge_id), None)

    def _poll(self, rollout: rs.Rollout, edge_id: str) -> None:
        key = (rollout.rollout_id, edge_id)
        if edge_id not in rollout.watching or self.stopped:
            self._baselines.pop(key, None)
            return
        if key not in self._baselines:
            self._watch(rollout, edge_id)
            return
        d = self._gateway.status(edge_id)
        d.addCallbacks(self._read_after, lambda _: self._poll_later(rollout, edge_id), callbackArgs=(rollout, edge_id))
        d.addErrback(self._log_failure, rollout, edge_id)

    def _read_after(self, snapshot: StatusSnapshot, rollout: rs.Rollout, edge_id: str) -> None:
        criterion = rollout.abort.latency
        key = (rollout.rollout_id, edge_id)
        if criterion is None or edge_id not in rollout.watching:
            self._baselines.pop(key, None)
            return
        metric, quantile = rs.LATENCY_FIGURES[criterion.metric]
        since = observed_since(self._baselines[key], cumulative_readings(snapshot.parse(), metric), metric)
        if since.count < criterion.min_requests:
            self._poll_later(rollout, edge_id)
            return
        del self._baselines[key]
        before = rollout.executions[edge_id].latency_before
        rollout.latency_judged(edge_id, before, since.quantile(quantile), self._clock.seconds())
        self._changed(rollout)

    def _log_failure(self, failure: Failure, rollout: rs.Rollout, edge_id: str) -> None:
        self._log.failure(
            "rollout {rollout_id}: execution on {edge_id} failed",
            failure,
            rollout_id=rollout.rollout_id,
            edge_id=edge_id,
        )

    # -- events ------------------------------------------------------------------------------

    def _record_notices(self, rollout: rs.Rollout) -> None:
        for notice in rollout.take_notices():
            attributes = dict(notice.attributes)
            attributes["rollout_id"] = rollout.rollout_id
            attributes["command"] = rollout.command.name
            self._registry.event_log.record(
                "", self._events, notice.kind, message=notice.message, attributes=attributes
            )
