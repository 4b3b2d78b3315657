"""The deployment service: keeps deployments, sends each edge its desired set, reads what runs.

The :class:`DeploymentService`:

1. keeps every deployment (spec, generation, who changed it last, and where
   its instances were placed on each edge) in the store, so it outlives a
   restart; nothing is sent to any edge before what the store kept is read
   back (an empty set sent too early would stop every engine);
2. on every change (``PUT``, ``DELETE``) and whenever an edge's connection
   is accepted, asks the edge for a status snapshot (its nodes, their
   profiles, free ports and GPU slots, and the instances it reports),
   places the instances of every deployment that selects it
   (:func:`~.placement.place_edge`, converging, never churning) and sends
   the edge its whole desired set (``EdgeDeploymentsRequest``) under a new
   version when it differs from what the edge holds, and always on a new
   connection;
3. keeps what each edge says (``EdgeDeploymentsResponse``, and the
   ``instances`` / ``observed_deployments_version`` / ``held`` of every
   status snapshot the Control Plane receives), and every
   ``poll_seconds`` asks the edges whose instances are not all ready for a
   fresh snapshot (again placing, for nodes that came meanwhile);
4. computes each deployment's rollup (:mod:`.rollup`);
5. records ``deployment.created`` / ``deployment.updated`` /
   ``deployment.deleted`` events with who did it (the token's name);
6. rolls a change with ``rollout.max_in_flight`` out that many edges at a
   time: the roll (:mod:`.roll`) may be paused, resumed and cancelled
   (``deployment.paused`` / ``resumed`` / ``cancelled``), and aborts by
   itself when its reached edges fail past ``rollout.abort``
   (``deployment.aborted``); its state is kept with the deployment.

What each edge was last sent, the versions of the sets and their answers
are :mod:`.desired_sets`'s.

In cluster mode each replica sends the sets of the edges whose connection
it holds, and reads the kept deployments only at its start (a change made
through one replica reaches the others' edges after they restart; see
docs/deployments.md).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any, Optional

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster.remote import RemotePeer
from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments import roll
from twisted_iop.controlplane.deployments.desired_sets import DesiredSets
from twisted_iop.controlplane.deployments.dry_run import dry_run_answer
from twisted_iop.controlplane.deployments.kept import DeploymentState, TooManyDeployments, UnknownDeployment
from twisted_iop.controlplane.deployments.reports import EdgeReports, takes_deployments
from twisted_iop.controlplane.deployments.rollup import (
    EDGE_STATES,
    FAILED,
    OUT_OF_SYNC,
    READY,
    EdgeRollup,
    edge_rollup,
    rollup_counts,
)
from twisted_iop.controlplane.deployments.spec import SKIP, DeploymentSpec, SpecError
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.event_log import EdgeEvents
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.interface import DeploymentStore

#: The most deployments kept.
MAX_DEPLOYMENTS = 1000
#: How often edges whose instances are not all ready are asked for a snapshot.
POLL_SECONDS = 2.0
#: The most snapshots asked for in one poll.
MAX_POLLS = 200


class DeploymentService(Service):
    """Every deployment, sent to the edges it selects (see the module docstring)."""

    _log = Logger()
    name = "deployments"

    def __init__(
        self,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        store: DeploymentStore,
        events: EdgeEvents,
        clock: IReactorTime,
        poll_seconds: float = POLL_SECONDS,
        max_deployments: int = MAX_DEPLOYMENTS,
    ) -> None:
        self._registry = registry
        self._gateway = gateway
        self._store = store
        self._events = events
        self._clock = clock
        self.poll_seconds = poll_seconds
        self.max_deployments = max_deployments
        self._deployments: dict[str, DeploymentState] = {}
        #: What each edge says of its deployments (its answers and its snapshots).
        self.reports = EdgeReports(registry)
        #: What each edge was last sent, and sending it.
        self.desired = DesiredSets(registry, self.reports, clock)
        #: Deployments whose placement changed and is not written yet (written at the end of the turn).
        self._unwritten: set[str] = set()
        self._flush_call: Optional[IDelayedCall] = None
        self._loop: Optional[LoopingCall] = None
        #: Whether what the store kept was read back (nothing is sent before).
        self.restored = False
        registry.add_connect_listener(self.edge_connected)

    # -- what is kept ------------------------------------------------------------------------

    def get(self, name: str) -> DeploymentState:
        """The deployment ``name``; raises :class:`UnknownDeployment`."""
        state = self._deployments.get(name)
        if state is None:
            raise UnknownDeployment(name[:80])
        return state

    def all(self) -> list[DeploymentState]:
        """Every deployment, by name."""
        return [self._deployments[name] for name in sorted(self._deployments)]

    def __len__(self) -> int:
        return len(self._deployments)

    def put(self, spec: DeploymentSpec, actor: str = "") -> tuple[DeploymentState, bool, bool]:
        """Keep ``spec``: the deployment, whether it is new, whether it changed (the same spec
        again changes nothing, not even its generation). Raises :class:`TooManyDeployments`."""
        now = self._clock.seconds()
        kept = self._deployments.get(spec.name)
        if kept is not None and kept.spec == spec:
            return kept, False, False
        if kept is None:
            if len(self._deployments) >= self.max_deployments:
                raise TooManyDeployments(f"{len(self._deployments)} deployments are kept already; delete one first")
            state = DeploymentState(spec, 1, now, now, actor)
            old_spec = None
        else:
            old_spec = kept.spec
            state = DeploymentState(spec, kept.generation + 1, kept.created_at, now, actor, kept.placement)
            if spec.max_in_flight:
                # Rolled out max_in_flight edges at a time: the others keep what they run. A change
                # while a roll goes on (or after one was cancelled or aborted) keeps the spec the edges
                # not reached yet run; a paused roll stays paused, any other runs again.
                if kept.rolling_from is not None:
                    state.rolling_from, state.rolling_generation = kept.rolling_from, kept.rolling_generation
                    state.promoted = set(kept.promoted)
                else:
                    state.rolling_from, state.rolling_generation = kept.spec, kept.generation
                state.roll_state = roll.PAUSED if kept.roll_state == roll.PAUSED else roll.RUNNING
        self._deployments[spec.name] = state
        kind = "deployment.created" if kept is None else "deployment.updated"
        self._record(kind, state, actor, f"deployment {spec.name}: generation {state.generation}")
        self._advance(state)
        self._write(state)
        specs = [spec] if old_spec is None else [spec, old_spec]
        if state.rolling_from is not None:
            specs.append(state.rolling_from)
        self._reconcile_selected(specs)
        return state, kept is None, True

    def delete(self, name: str, actor: str = "") -> DeploymentState:
        """Forget deployment ``name`` (its instances stop everywhere); raises :class:`UnknownDeployment`."""
        state = self.get(name)
        del self._deployments[name]
        self._unwritten.discard(name)
        self._store.deployment_delete(name)
        self._record("deployment.deleted", state, actor, f"deployment {name} deleted: its instances stop")
        self._reconcile_selected([state.spec])
        return state

    def pause(self, name: str, actor: str = "") -> DeploymentState:
        """Pause the roll of deployment ``name``: no further edge is reached (the reached ones keep
        converging). Raises :class:`UnknownDeployment`, :class:`~.roll.NoRoll`, :class:`~.roll.InvalidMove`."""
        return self._move(name, "pause", actor)

    def resume(self, name: str, actor: str = "") -> DeploymentState:
        """Resume the paused roll of deployment ``name`` (the next edges are reached at once if there is room)."""
        return self._move(name, "resume", actor)

    def cancel(self, name: str, actor: str = "") -> DeploymentState:
        """End the roll of deployment ``name``: the edges not reached keep the previous generation's
        spec (shown ``out_of_sync``) until a later change starts a new roll."""
        return self._move(name, "cancel", actor)

    def _move(self, name: str, move: str, actor: str) -> DeploymentState:
        state = self.get(name)
        state.roll_state = roll.moved(name, state.roll_state, move)
        who = actor or "anonymous"
        state.roll_reason = {
            "pause": f"paused by {who}",
            "resume": "",
            "cancel": f"cancelled by {who}: the edges not reached keep generation {state.rolling_generation}",
        }[move]
        kind = {"pause": "deployment.paused", "resume": "deployment.resumed", "cancel": "deployment.cancelled"}[move]
        reached = len(state.promoted)
        self._record(
            kind,
            state,
            actor,
            f"deployment {name}: the rollout of generation {state.generation} is {state.roll_state} "
            f"({reached} edge(s) reached)",
        )
        if move == "resume":
            self._advance(state)
        self._write(state)
        return state

    def _write(self, state: DeploymentState) -> None:
        self._unwritten.discard(state.spec.name)
        self._store.deployment_write(state.spec.name, json.dumps(state.as_json(), separators=(",", ":")).encode())

    def _write_soon(self, state: DeploymentState) -> None:
        """Write ``state`` once the placements of this turn are done: a change placed on 5,000
        edges is one write of the deployment, not one per edge (each the size of them all)."""
        self._unwritten.add(state.spec.name)
        if self._flush_call is None or not self._flush_call.active():
            self._flush_call = self._clock.callLater(0, self.flush)

    def flush(self) -> None:
        """Write every deployment whose placement changed since it was last written."""
        for name in sorted(self._unwritten):
            state = self._deployments.get(name)
            if state is not None:
                self._write(state)
        self._unwritten.clear()

    def _record(self, kind: str, state: DeploymentState, actor: str, message: str) -> None:
        self._registry.event_log.record(
            "",
            self._events,
            kind,
            message=message,
            attributes={
                "deployment": state.spec.name,
                "generation": str(state.generation),
                "model": state.spec.model,
                "profile": state.spec.profile,
                "actor": actor or "anonymous",
            },
        )
        self._log.info("{kind}: {message} (by {actor})", kind=kind, message=message, actor=actor or "anonymous")

    # -- start and stop ----------------------------------------------------------------------

    def restore_kept(self, kept: dict[str, bytes]) -> None:
        """Take the deployments the store read back when it opened (before anything listens, so
        no view answers without them); start then reads nothing."""
        self._take(kept)

    def startService(self) -> None:
        """Read the kept deployments back unless the store gave them at open (nothing is sent
        before), then start the poll."""
        super().startService()
        if self.restored:
            self._when_running()
            return
        self._store.deployment_read().addCallbacks(self._restore, self._restore_failed)

    def _restore(self, kept: dict[str, bytes]) -> None:
        self._take(kept)
        self._when_running()

    def _take(self, kept: dict[str, bytes]) -> None:
        for name, data in sorted(kept.items()):
            try:
                state = DeploymentState.from_json(name, json.loads(data))
            except (ValueError, KeyError, TypeError, SpecError) as e:
                self._log.warn("a kept deployment {name} was not restored: {error}", name=name[:80], error=str(e))
                continue
            self._deployments.setdefault(name, state)
        self.restored = True
        if self._deployments:
            self._log.info("deployments: {count} kept", count=len(self._deployments))

    def _when_running(self) -> None:
        """Restored and running: every connected edge gets its set, and the poll starts."""
        for record in list(self._registry.edges()):
            if record.token is not None:
                self.edge_connected(record.edge_id, record.token)
        if self.running:
            loop = self._loop = LoopingCall(self.poll)
            loop.clock = self._clock
            loop.start(self.poll_seconds, now=False).addErrback(self._loop_failed)

    def _restore_failed(self, failure: Failure) -> None:
        # Nothing is sent: an empty set would stop every engine the fleet runs.
        self._log.error(
            "deployments: the kept deployments could not be read; no desired set is sent: {error}",
            error=failure.getErrorMessage(),
        )

    def _loop_failed(self, failure: Failure) -> None:
        self._log.failure("deployments: the poll timer stopped", failure)

    def stopService(self) -> Any:
        """Stop the poll and write what is not written yet."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self.flush()
        return super().stopService()

    # -- edges -------------------------------------------------------------------------------

    def edge_connected(self, edge_id: str, token: int) -> None:
        """An edge's connection was accepted: it gets its whole set (once its snapshot is here,
        when a deployment selects it; at once when none does, which stops what it may still run)."""
        self.desired.connected(edge_id)
        self.reports.connected(edge_id)
        record = self._registry.find(edge_id)
        if not self.restored or record is None or not takes_deployments(record):
            return
        if any(s.spec.edge_selector_parsed.matches(record.hello.labels) for s in self._deployments.values()):
            self._refresh(edge_id, token, always_send=True)
        else:
            self._reconcile(edge_id, token, always_send=True)

    def _refresh(self, edge_id: str, token: int, always_send: bool = False) -> None:
        """Ask for a fresh snapshot, then place and send (if the connection is still current)."""

        def answered(_: object) -> None:
            self._reconcile(edge_id, token, always_send)

        def failed(failure: Failure) -> None:
            self._log.warn(
                "deployments: edge {edge_id} gave no status: {error}", edge_id=edge_id, error=failure.getErrorMessage()
            )
            if always_send:
                self._reconcile(edge_id, token, always_send)

        self._gateway.status(edge_id).addCallbacks(answered, failed)

    def _reconcile_selected(self, specs: Iterable[DeploymentSpec]) -> None:
        """Place and send on every connected edge one of ``specs`` selects (once its fresh snapshot is here)."""
        if not self.restored:
            return
        selectors = [s.edge_selector_parsed for s in specs]
        for record in list(self._registry.edges()):
            if (
                record.token is not None
                and takes_deployments(record)
                and any(sel.matches(record.hello.labels) for sel in selectors)
            ):
                # A fresh snapshot first: its nodes' profiles, free ports and GPU slots now.
                self._refresh(record.edge_id, record.token)

    def _reconcile(self, edge_id: str, token: int, always_send: bool = False) -> None:
        record = self._registry.find(edge_id)
        if record is None or record.token != token or record.peer is None or not self.restored:
            return
        view = self.reports.edge_view(record)
        plan = self._plan(view)
        sent = self.desired.get(edge_id)
        if not always_send and sent is not None and sent.plan.instances == plan.instances:
            sent.plan = plan
            return
        self.desired.send(record, token, plan)

    def _plan(self, view: pl.EdgeView, replace: Optional[DeploymentSpec] = None) -> pl.EdgePlan:
        """Place every deployment on ``view`` (with ``replace`` instead of the kept spec of its name);
        the kept placement is updated unless this is a dry run (``replace``)."""
        deployments = []
        previous: dict[str, str] = {}
        for state in self._deployments.values():
            spec, generation = state.spec_for(view.edge_id)
            if replace is not None and spec.name == replace.name:
                spec, generation = replace, generation + (replace != spec)
            deployments.append(pl.Deployment(spec, generation))
            previous.update(state.placement.get(view.edge_id, {}))
        if replace is not None and replace.name not in self._deployments:
            deployments.append(pl.Deployment(replace, 1))
        plan = pl.place_edge(deployments, view, previous)
        if replace is None:
            for state in self._deployments.values():
                now = plan.assignments(state.spec.name)
                if state.placement.get(view.edge_id, {}) != now:
                    if now:
                        state.placement[view.edge_id] = now
                    else:
                        state.placement.pop(view.edge_id, None)
                    self._write_soon(state)
        return plan

    def poll(self) -> None:
        """Move every roll on, and ask the connected edges whose instances are not all ready for a
        fresh snapshot."""
        if not self.restored or self._gateway.stopping:
            return
        for state in self.all():
            if state.rolling_from is not None and state.roll_state in roll.IN_PROGRESS and self._advance(state):
                self._write(state)
        self.desired.forget_unknown()
        self.reports.forget_unknown()
        for edge_id, token in itertools.islice(self.desired.unsettled(), MAX_POLLS):
            self._refresh(edge_id, token)

    def _advance(self, state: DeploymentState) -> bool:
        """Abort a roll whose reached edges failed past ``rollout.abort``; if it runs, reach the next
        edges while fewer than ``max_in_flight`` reached edges are not ready (an offline one counts
        with ``offline: wait``); end the roll once every edge is reached and ready (paused too).
        Whether anything changed."""
        if state.rolling_from is None or state.roll_state not in roll.IN_PROGRESS:
            return False
        spec = state.spec
        selectors = [spec.edge_selector_parsed, state.rolling_from.edge_selector_parsed]
        edges = sorted(
            (r for r in self._registry.edges() if any(sel.matches(r.hello.labels) for sel in selectors)),
            key=lambda r: r.edge_id,
        )
        states = {e.edge_id: e.state for e in self.edge_rollups(spec.name)}
        step = roll.next_step(
            [(r.edge_id, r.token is not None) for r in edges],
            state.promoted,
            states,
            {r.edge_id for r in edges if r.edge_id in state.promoted and self.desired.has_newest(r.edge_id, state)},
            spec.max_in_flight,
            spec.offline != SKIP,
            state.roll_state == roll.RUNNING,
            spec.abort,
        )
        if step.abort_reason is not None:
            state.roll_state, state.roll_reason = roll.ABORTED, step.abort_reason
            message = (
                f"deployment {spec.name}: the rollout of generation {state.generation} aborted: {step.abort_reason}"
            )
            self._record("deployment.aborted", state, state.updated_by, message)
            return True
        by_id = {r.edge_id: r for r in edges}
        reached = [by_id[edge_id] for edge_id in step.reach]
        state.promoted.update(step.reach)
        if reached:
            self._log.info(
                "deployments: {name} generation {generation} reaches {edges}",
                name=spec.name,
                generation=state.generation,
                edges=", ".join(r.edge_id for r in reached),
            )
            for record in reached:
                if record.token is not None and takes_deployments(record):
                    self._refresh(record.edge_id, record.token)
            return True
        if step.done:
            state.rolling_from, state.rolling_generation, state.promoted = None, 0, set()
            state.roll_state, state.roll_reason = roll.DONE, ""
            message = f"deployment {spec.name}: generation {state.generation} reached every edge"
            self._record("deployment.rolled_out", state, state.updated_by, message)
            return True
        return False

    # -- views -------------------------------------------------------------------------------

    def _selected(self, spec: DeploymentSpec) -> list[EdgeRecord]:
        selector = spec.edge_selector_parsed
        return sorted((r for r in self._registry.edges() if selector.matches(r.hello.labels)), key=lambda r: r.edge_id)

    def edge_rollups(self, name: str) -> list[EdgeRollup]:
        """The deployment on every edge it selects, by edge id."""
        state = self.get(name)
        spec = state.spec
        out = []
        for record in self._selected(spec):
            edge_id = record.edge_id
            sent = self.desired.get(edge_id)
            if record.token is None:
                out.append(edge_rollup(edge_id, spec.name, spec.spec_hash, False, [], [], 0, None))
                continue
            if isinstance(record.peer, RemotePeer):
                reason = "its connection is held by another Control Plane replica, which sends its set"
                out.append(EdgeRollup(edge_id, OUT_OF_SYNC, 0, (), reason))
                continue
            if not takes_deployments(record):
                out.append(EdgeRollup(edge_id, FAILED, 0, (), "this edge's software does not take deployments"))
                continue
            if sent is None:
                # Connected, its set not sent yet (its snapshot is asked for first).
                plan, version, observed = self._plan_readonly(record), 1, None
            else:
                plan, version, observed = sent.plan, sent.version, self.reports.observation(edge_id)
            if state.rolling_from is not None and edge_id not in state.promoted:
                waiting = edge_rollup(
                    edge_id,
                    spec.name,
                    spec.spec_hash,
                    True,
                    [i for i in plan.instances if i.deployment == spec.name],
                    [],
                    version,
                    observed,
                )
                reason = state.waiting_reason()
                out.append(EdgeRollup(edge_id, OUT_OF_SYNC, waiting.observed_generation, waiting.instances, reason))
                continue
            out.append(
                edge_rollup(
                    edge_id,
                    spec.name,
                    spec.spec_hash,
                    True,
                    [i for i in plan.instances if i.deployment == spec.name],
                    [u for u in plan.unplaced if u.deployment == spec.name],
                    version,
                    observed,
                )
            )
        return out

    def _plan_readonly(self, record: EdgeRecord) -> pl.EdgePlan:
        view = self.reports.edge_view(record)
        previous: dict[str, str] = {}
        for state in self._deployments.values():
            previous.update(state.placement.get(record.edge_id, {}))
        deployments = [pl.Deployment(*s.spec_for(record.edge_id)) for s in self._deployments.values()]
        return pl.place_edge(deployments, view, previous)

    def rollup(self, name: str, edges: Optional[list[EdgeRollup]] = None) -> dict[str, int]:
        """``desired`` and the count of edges in each state (of ``edges`` when given)."""
        state = self.get(name)
        if edges is None:
            edges = self.edge_rollups(name)
        return rollup_counts((e.state for e in edges), state.spec.offline)

    def dry_run_fresh(self, spec: DeploymentSpec) -> Deferred[dict[str, Any]]:
        """:meth:`dry_run` once the connected edges it concerns sent a fresh snapshot (or failed to)."""
        kept = self._deployments.get(spec.name)
        selectors = [spec.edge_selector_parsed] + ([kept.spec.edge_selector_parsed] if kept is not None else [])
        asks = [
            self._gateway.status(record.edge_id)
            for record in list(self._registry.edges())
            if record.token is not None
            and takes_deployments(record)
            and any(sel.matches(record.hello.labels) for sel in selectors)
        ]
        done: Deferred[Any] = DeferredList(asks, consumeErrors=True)
        return done.addCallback(lambda _: self.dry_run(spec))

    def dry_run(self, spec: DeploymentSpec) -> dict[str, Any]:
        """What applying ``spec`` would do on each edge it selects (or selected), changing nothing."""
        kept = self._deployments.get(spec.name)
        selectors = [spec.edge_selector_parsed] + ([kept.spec.edge_selector_parsed] if kept is not None else [])
        views = [
            self.reports.edge_view(record)
            for record in sorted(self._registry.edges(), key=lambda r: r.edge_id)
            if any(sel.matches(record.hello.labels) for sel in selectors)
        ]
        return dry_run_answer(spec, kept, views, lambda view: self._plan(view, replace=spec))

    # -- figures for /metrics ----------------------------------------------------------------

    def edges_by_state(self) -> dict[str, dict[str, int]]:
        """Per deployment: the count of edges in each state."""
        out = {}
        for state in self.all():
            counts = dict.fromkeys(EDGE_STATES, 0)
            for edge in self.edge_rollups(state.spec.name):
                counts[edge.state] += 1
            out[state.spec.name] = counts
        return out

    def ready(self, name: str) -> bool:
        """Whether every edge the deployment wants is ready."""
        counts = self.rollup(name)
        return counts["desired"] > 0 and counts[READY] == counts["desired"]
