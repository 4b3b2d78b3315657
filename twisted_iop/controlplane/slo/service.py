"""The SLO service: reads the edges' kept snapshots on an interval, feeds each SLO, records its alerts.

Every ``slos.interval_seconds`` (default 10 s) the :class:`SloService`:

1. makes sure the edges' kept snapshots are fresh: if a fleet round ended
   within the interval (the history, the console or iopctl asked for one)
   it uses them, else it starts one through the gateway (joining one in
   progress) and goes on when it ends;
2. for each connected edge that some SLO's ``edge_selector`` matches and
   whose snapshot is new since the last look, parses it once and takes
   each provider's delta since its last reading
   (:class:`~.readings.ProviderReadings`), at the time the snapshot arrived;
3. hands each delta to every SLO whose model the provider serves and whose
   selector matches the edge: ``bad`` is the delta's count over the
   objective (``LatencySketch.count_above``) for a latency metric, its
   errors for ``error_ratio``;
4. evaluates every SLO (:meth:`SloState.evaluate <.evaluator.SloState.evaluate>`)
   and records an ``slo.alert.firing`` / ``slo.alert.resolved`` event for
   each alert that changed (in the fleet's stream, with no edge, beside the
   ``rollout.*`` events);
5. every ``slos.persist_seconds`` (and at once on a PUT or DELETE, and at
   stop) writes each changed SLO's stored form to the store, so its spec,
   buckets and alerts outlive a restart.

In cluster mode only the replica that samples the history (the store's
``history_leader``) evaluates.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.fleet.event_log import EdgeEvents
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.slo.evaluator import FIRING, AlertChange, SloState
from twisted_iop.controlplane.slo.readings import Delta, ProviderReadings
from twisted_iop.controlplane.slo.settings import SloSettings
from twisted_iop.controlplane.slo.spec import ERROR_RATIO, LATENCY_METRICS, SloSpec, SpecError, parse_spec
from twisted_iop.controlplane.store.interface import SloStore
from twisted_iop.label_selectors import Selector
from twisted_iop.latency.sketch import LatencySketch, merged

#: Streams of edges no longer known are forgotten every this many evaluations.
FORGET_EVERY = 60
#: The bytes one SLO's stored form may take (its buckets are bounded far below).
MAX_STORED_BYTES = 4 * 1024 * 1024


class _Sums:
    """The deltas of the providers of one model on the edges of one label map, added up."""

    __slots__ = ("at", "errors", "requests", "sketches")

    def __init__(self) -> None:
        self.sketches: dict[str, LatencySketch] = {}
        self.requests = 0
        self.errors = 0
        self.at = 0.0

    def add(self, delta: Delta) -> None:
        """Add one provider's delta."""
        for metric, sketch in delta.sketches.items():
            kept = self.sketches.get(metric)
            if kept is None:
                kept = self.sketches[metric] = LatencySketch()
            kept.merge(sketch)
        self.requests += delta.requests
        self.errors += delta.errors
        self.at = max(self.at, delta.at)


class UnknownSlo(Exception):
    """No SLO with that name is kept."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no SLO named {name!r} is kept")


class TooManySlos(Exception):
    """``slos.max_slos`` are kept already."""


class SloService(Service):
    """Every SLO, evaluated on the interval (see the module docstring)."""

    _log = Logger()
    name = "slos"

    def __init__(
        self,
        settings: SloSettings,
        registry: EdgeRegistry,
        gateway: EdgeGateway,
        store: SloStore,
        events: EdgeEvents,
        clock: IReactorTime,
    ) -> None:
        self.settings = settings
        self._registry = registry
        self._gateway = gateway
        self._store = store
        self._events = events
        self._clock = clock
        self._slos: dict[str, SloState] = {}
        self._selectors: dict[str, Selector] = {}
        self.readings = ProviderReadings(settings.max_streams)
        #: The snapshot last looked at, per edge (compared by identity).
        self._seen: dict[str, StatusSnapshot] = {}
        #: SLOs changed since they were last written to the store.
        self._dirty: set[str] = set()
        self._last_persist = 0.0
        self._loop: Optional[LoopingCall] = None
        self._waiting_for_round = False
        self._last_look_at = 0.0
        #: Whether what the store kept was read back (SLOs are not written before).
        self.restored = False
        #: For /metrics and tests.
        self.evaluations = 0
        self.evaluations_skipped = 0
        self.snapshots_parsed = 0

    # -- what is kept ----------------------------------------------------------------------

    def get(self, name: str) -> SloState:
        """The SLO ``name``; raises :class:`UnknownSlo`."""
        state = self._slos.get(name)
        if state is None:
            raise UnknownSlo(name[:80])
        return state

    def all(self) -> list[SloState]:
        """Every SLO, by name."""
        return [self._slos[name] for name in sorted(self._slos)]

    def __len__(self) -> int:
        return len(self._slos)

    def put(self, spec: SloSpec) -> tuple[SloState, bool]:
        """Keep ``spec`` (idempotent: the same spec changes nothing); the SLO and
        whether it is new. Raises :class:`TooManySlos`."""
        now = self._clock.seconds()
        kept = self._slos.get(spec.name)
        if kept is None:
            if len(self._slos) >= self.settings.max_slos:
                raise TooManySlos(f"{len(self._slos)} SLOs are kept already (slos.max_slos); delete one first")
            state = SloState(spec, now)
        elif kept.spec == spec:
            return kept, False
        else:
            state = kept.respecified(spec, now)
        self._slos[spec.name] = state
        self._selectors[spec.name] = spec.selector
        self._seen.clear()  # a new selector may match edges not looked at
        self._write(state)
        return state, kept is None

    def delete(self, name: str) -> None:
        """Forget SLO ``name``; raises :class:`UnknownSlo`."""
        self.get(name)
        del self._slos[name]
        del self._selectors[name]
        self._dirty.discard(name)
        self._store.slo_delete(name)

    # -- start and stop --------------------------------------------------------------------

    def restore_kept(self, kept: dict[str, bytes]) -> None:
        """Take the SLOs the store read back when it opened (before anything
        listens, so no view answers without them); start then reads nothing."""
        self._take(kept)

    def startService(self) -> None:
        super().startService()
        if self.restored:
            self._when_running()
            return
        self._store.slo_read().addCallbacks(self._restore, self._restore_failed)

    def _restore(self, kept: dict[str, bytes]) -> None:
        self._take(kept)
        self._when_running()

    def _take(self, kept: dict[str, bytes]) -> None:
        for name, data in sorted(kept.items()):
            try:
                value = json.loads(data)
                spec = parse_spec(name, value["spec"])
                state = SloState.from_json(spec, value)
            except (ValueError, KeyError, TypeError, SpecError) as e:
                self._log.warn("a kept SLO {name} was not restored: {error}", name=name[:80], error=str(e))
                continue
            if name not in self._slos and len(self._slos) < self.settings.max_slos:
                self._slos[name] = state
                self._selectors[name] = spec.selector
        self.restored = True
        for spec in self.settings.declared:
            # Declared in control-plane.yaml: the file's spec wins at start (buckets kept when it means the same).
            try:
                self.put(spec)
            except TooManySlos as e:
                self._log.error("slos.objectives.{name}: not kept: {error}", name=spec.name, error=str(e))
        if self._slos:
            self._log.info("SLOs: {count} kept", count=len(self._slos))
        self.persist(force=True)

    def _when_running(self) -> None:
        # With a reactor, once it runs (a wiring test's MemoryReactor never
        # runs and has no clock); a bare clock, now.
        when_running = getattr(self._clock, "callWhenRunning", None)
        if when_running is not None:
            when_running(self._start_timer)
        else:
            self._start_timer()

    def _restore_failed(self, failure: Failure) -> None:
        self._log.error("SLOs: the kept SLOs could not be read: {error}", error=failure.getErrorMessage())
        self._restore({})

    def _start_timer(self) -> None:
        if not self.running or self._loop is not None:
            return
        loop = self._loop = LoopingCall(self.tick)
        loop.clock = self._clock
        loop.start(self.settings.interval_seconds, now=False).addErrback(self._loop_failed)

    def _loop_failed(self, failure: Failure) -> None:
        self._log.failure("SLOs: the evaluation timer stopped", failure)

    def stopService(self) -> Any:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        self.persist(force=True)
        return super().stopService()

    # -- the interval ----------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        """Whether this process evaluates (cluster mode: the history's sampler only)."""
        leader = getattr(self._store, "history_leader", None)
        return leader is None or bool(leader())

    def tick(self) -> None:
        """One interval: evaluate from a fresh fleet round (started if none is)."""
        if not self._slos or not self.leading:
            return
        if self._waiting_for_round:
            self.evaluations_skipped += 1
            return
        now = self._clock.seconds()
        last = self._gateway.last_round
        if (
            last is not None
            and last.finished_at > self._last_look_at
            and now - last.finished_at <= self.settings.interval_seconds
        ):
            self.evaluate(now)
            return
        if self._gateway.stopping:
            return
        self._waiting_for_round = True
        self._gateway.fleet_status().addCallbacks(self._round_ended, self._round_failed)

    def _round_ended(self, _: object) -> None:
        self._waiting_for_round = False
        if self.running:
            self.evaluate(self._clock.seconds())

    def _round_failed(self, failure: Failure) -> None:
        self._waiting_for_round = False
        self.evaluations_skipped += 1
        self._log.warn("SLOs: the fleet round of an evaluation failed: {error}", error=failure.getErrorMessage())

    def evaluate(self, now: float) -> list[AlertChange]:
        """Take every new snapshot's deltas, evaluate every SLO, record the alerts' changes.

        The deltas are added up per distinct label map of the edges and per
        model first (one merge per provider and metric in use), then each
        SLO takes the sums of the groups its selector matches, once per
        evaluation, at the newest time among them.
        """
        self._last_look_at = self._clock.seconds()
        metrics = {s.spec.metric for s in self._slos.values()} & set(LATENCY_METRICS)
        models = {s.spec.model for s in self._slos.values()}
        #: Per distinct label map (by id): the SLOs whose selector matches it.
        verdicts: dict[int, list[SloState]] = {}
        kept_labels: list[object] = []  # keeps each map alive, so its id is not reused this evaluation
        sums: dict[tuple[int, str], _Sums] = {}
        for record in list(self._registry.edges()):
            snapshot = record.snapshot
            if record.token is None or snapshot is None or self._seen.get(record.edge_id) is snapshot:
                continue
            # Looked at once per snapshot, whether or not an SLO wants it (a new SLO looks again).
            self._seen[record.edge_id] = snapshot
            labels = record.hello.labels
            interested = verdicts.get(id(labels))
            if interested is None:
                # Edges share their label maps: each distinct one is matched once per evaluation.
                interested = [self._slos[n] for n, sel in self._selectors.items() if sel.matches(labels)]
                verdicts[id(labels)] = interested
                kept_labels.append(labels)
            if not interested:
                continue
            self.snapshots_parsed += 1
            for delta in self.readings.take(record.edge_id, snapshot.parse(), snapshot.received_at, metrics):
                for model in models.intersection(delta.models):
                    group = sums.get((id(labels), model))
                    if group is None:
                        group = sums[(id(labels), model)] = _Sums()
                    group.add(delta)
        gathered: dict[str, list[_Sums]] = {}
        for (labels_id, model), group in sums.items():
            for state in verdicts[labels_id]:
                if state.spec.model == model:
                    gathered.setdefault(state.spec.name, []).append(group)
        changes: list[AlertChange] = []
        for state in self._slos.values():
            self._feed(state, gathered.get(state.spec.name, []))
            moved = state.evaluate(now)
            if moved:
                self._dirty.add(state.spec.name)
            changes.extend(moved)
        for change in changes:
            self._record(change)
        self.evaluations += 1
        if self.evaluations % FORGET_EVERY == 0:
            known = {record.edge_id for record in self._registry.edges()}
            self.readings.forget_except(known)
            for edge_id in [e for e in self._seen if e not in known]:
                del self._seen[edge_id]
        self.persist()
        return changes

    def _feed(self, state: SloState, groups: list[_Sums]) -> None:
        """Record what the groups matched by ``state`` did (``bad`` of ``total``, and the sketch)."""
        if not groups:
            return
        spec = state.spec
        at = max(group.at for group in groups)
        if spec.metric == ERROR_RATIO:
            state.record(at, sum(g.errors for g in groups), sum(g.requests for g in groups))
        else:
            sketch = merged(g.sketches[spec.metric] for g in groups if spec.metric in g.sketches)
            if not sketch.count:
                return
            assert spec.objective_seconds is not None
            state.record(at, sketch.count_above(spec.objective_seconds), sketch.count, sketch)
        self._dirty.add(spec.name)

    def _record(self, change: AlertChange) -> None:
        state = self._slos[change.slo]
        spec = state.spec
        verb = "firing" if change.state == FIRING else "resolved"
        message = (
            f"SLO {spec.name}: {change.alert} alert {verb} (burn rate {change.long_burn_rate:.3g} over "
            f"{change.long_window}, {change.short_burn_rate:.3g} over {change.short_window}; "
            f"threshold {change.threshold:g})"
        )
        self._registry.event_log.record(
            "",
            self._events,
            "slo.alert." + verb,
            message=message,
            attributes={
                "slo": spec.name,
                "alert": change.alert,
                "model": spec.model,
                "metric": spec.metric,
                "long_window": change.long_window,
                "short_window": change.short_window,
                "long_burn_rate": f"{change.long_burn_rate:.6g}",
                "short_burn_rate": f"{change.short_burn_rate:.6g}",
            },
        )
        (self._log.warn if change.state == FIRING else self._log.info)("{message}", message=message)

    # -- the store ---------------------------------------------------------------------------

    def persist(self, force: bool = False) -> None:
        """Write the changed SLOs when ``persist_seconds`` passed since the last write (or ``force``)."""
        now = self._clock.seconds()
        if not self._dirty or not self.restored:
            return
        if not force and now - self._last_persist < self.settings.persist_seconds:
            return
        self._last_persist = now
        for name in sorted(self._dirty):
            state = self._slos.get(name)
            if state is not None:
                self._write(state)
        self._dirty.clear()

    def _write(self, state: SloState) -> None:
        if not self.restored:
            self._dirty.add(state.spec.name)  # written once what the store kept is read back
            return
        data = json.dumps(state.as_json(), separators=(",", ":")).encode()
        if len(data) > MAX_STORED_BYTES:
            self._log.error(
                "SLO {name}: its stored form is over {limit} bytes: not written",
                name=state.spec.name,
                limit=MAX_STORED_BYTES,
            )
            return
        self._store.slo_write(state.spec.name, data)
        self._dirty.discard(state.spec.name)

    # -- figures for /metrics ---------------------------------------------------------------

    def now(self) -> float:
        """The clock's time (what the figures are computed at)."""
        return self._clock.seconds()

    def firing(self) -> list[tuple[str, str, bool]]:
        """``(slo, alert, firing)`` of every alert of every SLO."""
        return [
            (state.spec.name, alert.name, alert.state == FIRING)
            for state in self.all()
            for alert in state.alerts.values()
        ]
