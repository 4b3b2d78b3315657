"""The Node runtime's state: its providers, their health and the probe and load rounds.

:class:`NodeRuntime` is a service that owns the provider list (re-read from
node.yaml when the Edge asks), runs probe rounds (at connect, periodically
and on request) and load rounds (every ``probes.load_interval_seconds``:
each engine's own running and waiting requests and KV-cache use), and
tells the current Edge connection about readiness, health changes and
load through the small :class:`EdgeSession` interface.

A provider found offline or unhealthy is re-probed on its own with a short
backoff (:data:`FIRST_REPROBE_SECONDS`, doubling, up to the probe
interval) instead of at the next round, and the Edge hears of it the
moment it answers healthy: a returning engine is back in rotation within
one backoff step of its health check passing. A launched engine that is
starting or loading is the supervisor's to report (it says ``ready`` at
once); it is not re-probed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Optional, Protocol, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from twisted_iop.configuration import ConfigError, Section, load_yaml_mapping
from twisted_iop.node.config import NodeProviderConfig, NodeRuntimeConfig, parse_node_providers
from twisted_iop.node.engines.base import LoadReading
from twisted_iop.node.engines.probes import ProbeResult, ProviderProber
from twisted_iop.node.launch.commands import answer_provider_command
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.node.launch.supervisor import EngineSupervisor
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label

if TYPE_CHECKING:
    from twisted_iop.node.deployments.instances import NodeInstances
    from twisted_iop.node.inference import InferenceRunner

#: The first re-probe of a provider found down comes this soon; each next one twice later, up to the interval.
FIRST_REPROBE_SECONDS = 0.5

_DOWN = (pb.PROVIDER_HEALTH_OFFLINE, pb.PROVIDER_HEALTH_UNHEALTHY)

#: Something that re-reads the providers of node.yaml.
ProvidersLoader = Callable[[], tuple[NodeProviderConfig, ...]]


class EdgeSession(Protocol):
    """What the runtime needs from an accepted Edge connection."""

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeReady``."""

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeHealthReport``."""

    def send_load(self, reports: list[pb.ProviderLoadReport]) -> None:
        """Send ``NodeLoadReport``."""

    def send_instances(self, report: pb.NodeInstancesReport) -> None:
        """Send ``NodeInstancesReport`` (an instance changed state)."""


def providers_from_file(path: Optional[str]) -> Optional[ProvidersLoader]:
    """A loader re-reading ``providers`` of node.yaml, or ``None`` without a file."""
    if path is None:
        return None

    def load() -> tuple[NodeProviderConfig, ...]:
        data = load_yaml_mapping(path)
        return parse_node_providers(Section(data, "").raw("providers"))

    return load


class NodeRuntime(Service):
    """Providers, health and readiness of this Node."""

    _log = Logger()
    name = "runtime"

    def __init__(
        self,
        config: NodeRuntimeConfig,
        clock: IReactorTime,
        prober: Optional[ProviderProber] = None,
        load_providers: Optional[ProvidersLoader] = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._prober = prober if prober is not None else ProviderProber(clock)
        if self._prober.running_on is None:
            # Busy versus down: a probe that times out counts what this Node runs there.
            self._prober.running_on = self.running_on
        self._load_providers = load_providers if load_providers is not None else providers_from_file(config.source_path)
        #: The providers node.yaml configures (re-read when the Edge asks).
        self.configured_providers: tuple[NodeProviderConfig, ...] = config.providers
        #: The instances deployments run here (set by the tap when node.yaml declares ``engines:``).
        self.instances: Optional[NodeInstances] = None
        self.health: dict[str, ProbeResult] = {}
        self.session: Optional[EdgeSession] = None
        #: Runs the inference requests the Edge forwards (set by the tap).
        self.inference: Optional[InferenceRunner] = None
        #: Runs the engines of providers with a ``launch`` block (set by the tap).
        self.engines: Optional[EngineSupervisor] = None
        self.ready_sent = False
        self.rounds = 0
        #: The last load sent per provider (for tests and the metrics).
        self.load: dict[str, pb.EngineLoad] = {}
        self.load_rounds = 0
        self._loop = LoopingCall(self._periodic)
        self._loop.clock = clock
        self._load_loop = LoopingCall(self._periodic_load)
        self._load_loop.clock = clock
        #: The pending re-probe of each provider found down, with the delay it was scheduled at.
        self._reprobes: dict[str, tuple[IDelayedCall, float]] = {}

    @property
    def providers(self) -> tuple[NodeProviderConfig, ...]:
        """Every provider of this Node: the configured ones, then the instances deployments run."""
        if self.instances is None:
            return self.configured_providers
        return self.configured_providers + self.instances.providers()

    def startService(self) -> None:
        super().startService()
        self._loop.start(self.config.probes.interval_seconds, now=False)
        if self.config.probes.load_interval_seconds > 0:
            self._load_loop.start(self.config.probes.load_interval_seconds, now=False)

    def stopService(self) -> Deferred[None] | None:
        for loop in (self._loop, self._load_loop):
            if loop.running:
                loop.stop()
        for call, _ in self._reprobes.values():
            if call.active():
                call.cancel()
        self._reprobes.clear()
        self._prober.close()
        return cast("Deferred[None] | None", super().stopService())

    def running_on(self, provider_id: str) -> int:
        """Requests this Node is running on ``provider_id`` now."""
        return self.inference.running_on(provider_id) if self.inference is not None else 0

    # -- the Edge connection --------------------------------------------------

    def session_accepted(self, session: EdgeSession) -> Deferred[None]:
        """The Edge accepted hello: probe every provider, then send ``NodeReady``."""
        self.session = session
        self.ready_sent = False

        def probed(results: list[ProbeResult]) -> None:
            if self.session is not session:
                return
            self.ready_sent = True
            session.send_ready([self.report(r) for r in results])
            usable = sum(1 for r in results if r.health == pb.PROVIDER_HEALTH_HEALTHY)
            self._log.info(
                "node {node_id} ready: {usable}/{total} providers healthy",
                node_id=self.config.node_id,
                usable=usable,
                total=len(results),
            )

        return self.probe_round().addCallback(probed)

    def session_lost(self, session: EdgeSession) -> None:
        """The Edge connection closed."""
        if self.session is session:
            self.session = None
            self.ready_sent = False
        if self.inference is not None:
            self.inference.session_lost(session)  # type: ignore[arg-type]  # an accepted Edge connection is also an InferenceSession

    def provider_specs(self) -> list[pb.NodeProviderSpec]:
        """What the Edge may know of the providers: id, kind and models only."""
        return [
            pb.NodeProviderSpec(provider_id=p.provider_id, kind=p.kind, models=list(p.models)) for p in self.providers
        ]

    def answer_provider_command(
        self, request: pb.NodeProviderCommandRequest
    ) -> Deferred[pb.NodeProviderCommandResponse]:
        """Run the Edge's command on a provider's launched engine (refused when the Node launches none)."""
        if self.engines is None:
            return succeed(
                pb.NodeProviderCommandResponse(ok=False, reason="this node launches no engines (no launch blocks)")
            )
        return answer_provider_command(self.engines, request)

    def answer_probe_request(self) -> Deferred[pb.NodeProbeResponse]:
        """Re-read the providers (if there is a config file), probe, answer."""
        if self._load_providers is not None:
            try:
                configured = self._load_providers()
            except ConfigError as e:
                self._log.warn("keeping the current providers; node.yaml not re-read: {error}", error=str(e))
            else:
                taken = {p.provider_id for p in self.instances.providers()} if self.instances is not None else set()
                clashing = sorted(p.provider_id for p in configured if p.provider_id in taken)
                if clashing:
                    self._log.warn(
                        "node.yaml names providers {clashing} that run as deployment instances; they are left out",
                        clashing=clashing,
                    )
                self.configured_providers = tuple(p for p in configured if p.provider_id not in taken)
                if self.engines is not None:
                    self.engines.configure(self.providers)

        def answer(results: list[ProbeResult]) -> pb.NodeProbeResponse:
            return pb.NodeProbeResponse(providers=self.provider_specs(), health=[self.report(r) for r in results])

        return self.probe_round(report_changes=False).addCallback(answer)

    # -- probing --------------------------------------------------------------

    def probe_round(self, report_changes: bool = True) -> Deferred[list[ProbeResult]]:
        """Probe every provider at once; record health; report changes if ready."""
        providers = self.providers
        timeout = self.config.probes.timeout_seconds
        probes = [self._probe(p, timeout) for p in providers]

        def done(outcomes: list[tuple[bool, ProbeResult]]) -> list[ProbeResult]:
            self.rounds += 1
            results = [value for ok, value in outcomes if ok]
            self._liveness(results)
            changed = self._record(results, providers)
            if report_changes and changed and self.session is not None and self.ready_sent:
                self.session.send_health([self.report(r) for r in changed])
            for result in results:
                self._reprobe_if_down(result)
            return results

        return DeferredList(probes, consumeErrors=True).addCallback(done)

    @property
    def reprobes(self) -> dict[str, float]:
        """The delay of each provider's pending re-probe (for tests and the metrics)."""
        return {pid: delay for pid, (call, delay) in self._reprobes.items() if call.active()}

    def _reprobe_if_down(self, result: ProbeResult, last_delay: float = 0.0) -> None:
        """Schedule a re-probe of a provider found down (none if one is pending or it is up)."""
        pid = result.provider_id
        pending = self._reprobes.get(pid)
        if result.health not in _DOWN or not self.running or self._launch_health(pid) is not None:
            if pending is not None and pending[0].active():
                pending[0].cancel()
            self._reprobes.pop(pid, None)
            return
        if pending is not None and pending[0].active():
            return
        interval = self.config.probes.interval_seconds
        delay = min(interval, FIRST_REPROBE_SECONDS if last_delay <= 0 else last_delay * 2)
        self._reprobes[pid] = (self._clock.callLater(delay, self._reprobe, pid, delay), delay)

    def _reprobe(self, provider_id: str, delay: float) -> None:
        """Probe one provider found down; report a change at once; again later if still down."""
        self._reprobes.pop(provider_id, None)
        provider = next((p for p in self.providers if p.provider_id == provider_id), None)
        if provider is None or not self.running:
            return

        def done(result: ProbeResult) -> None:
            if provider_id not in {p.provider_id for p in self.providers}:
                return
            self._liveness([result])
            changed = self._record([result], self.providers, forget=False)
            if changed and self.session is not None and self.ready_sent:
                self.session.send_health([self.report(r) for r in changed])
            self._reprobe_if_down(result, delay)

        self._probe(provider, self.config.probes.timeout_seconds).addCallback(done).addErrback(
            lambda f: self._log.failure("re-probe of provider {provider_id} failed", f, provider_id=provider_id)
        )

    def _probe(self, provider: NodeProviderConfig, timeout: float) -> Deferred[ProbeResult]:
        """The provider's health: probed, unless its launched engine is not up (then that says it)."""
        derived = self._launch_health(provider.provider_id)
        return succeed(derived) if derived is not None else self._prober.probe(provider, timeout)

    def _launch_health(self, provider_id: str) -> Optional[ProbeResult]:
        """The health of a provider whose launched engine is not up, from its state; else ``None``."""
        engines = self.engines
        state = engines.state(provider_id) if engines is not None else None
        if engines is None or state is None or state in (EngineState.READY, EngineState.DRAINING):
            return None
        report = engines.report(provider_id)
        reason = f"engine {state.value}" + (f": {report.reason}" if report is not None and report.reason else "")
        if state in (EngineState.STARTING, EngineState.LOADING):
            return ProbeResult(provider_id, pb.PROVIDER_HEALTH_UNHEALTHY, reason)
        return ProbeResult(provider_id, pb.PROVIDER_HEALTH_OFFLINE, reason)

    def _liveness(self, results: list[ProbeResult]) -> None:
        """Tell the supervisor what the probes found of its ready engines (a busy one is alive)."""
        engines = self.engines
        if engines is None:
            return
        for result in results:
            if engines.state(result.provider_id) is EngineState.READY:
                down = result.health in (pb.PROVIDER_HEALTH_OFFLINE, pb.PROVIDER_HEALTH_UNHEALTHY)
                engines.probed(result.provider_id, not down, result.reason)

    def report(self, result: ProbeResult) -> pb.ProviderHealthReport:
        """The wire form of a provider's health, with its engine's state when the Node launches it."""
        report = result.to_report()
        launch = self.engines.report(result.provider_id) if self.engines is not None else None
        if launch is not None:
            report.launch.CopyFrom(launch)
        return report

    def launch_changed(self, provider_id: str, ready_probe: Optional[ProbeResult]) -> None:
        """A launched engine changed state: its health follows, and the Edge hears of it at once.

        ``ready_probe`` is the readiness probe that found it ready (its
        health counts now, not at the next periodic probe). An instance's
        new state goes to the Edge too (``NodeInstancesReport``).
        """
        self._instance_changed(provider_id)
        provider = next((p for p in self.providers if p.provider_id == provider_id), None)
        if provider is None:
            return
        result = ready_probe if ready_probe is not None else self._launch_health(provider_id)
        if result is not None:
            self._record([result], self.providers, forget=False)
        current = self.health.get(provider_id)
        if current is not None and self.session is not None and self.ready_sent:
            self.session.send_health([self.report(current)])

    # -- deployments ----------------------------------------------------------------

    def configured_ids(self) -> set[str]:
        """The ids of the providers node.yaml configures (no instance may take one)."""
        return {p.provider_id for p in self.configured_providers}

    def answer_instances_request(self, request: pb.NodeInstancesRequest) -> pb.NodeInstancesResponse:
        """Converge to the Edge's desired set; answer every instance's status.

        The instances' health follows at once (``NodeHealthReport``), so an
        Edge that just learnt of them need not wait for the next probe round.
        """
        instances = self.instances
        if instances is None:
            statuses = [
                pb.InstanceStatus(
                    instance_id=d.instance_id[:128],
                    deployment=d.deployment[:128],
                    generation=d.generation,
                    node_id=self.config.node_id,
                    state=pb.INSTANCE_STATE_REFUSED,
                    reason="this node declares no engine profiles (no engines: in node.yaml)",
                )
                for d in request.instances[:256]
            ]
            return pb.NodeInstancesResponse(instances=statuses)
        statuses = instances.converge(request.instances)
        response = pb.NodeInstancesResponse(
            instances=statuses, profiles=instances.profile_specs(), free_gpus=instances.free_gpus()
        )
        reports = [self.health[p.provider_id] for p in instances.providers() if p.provider_id in self.health]
        if reports and self.session is not None and self.ready_sent:
            self.session.send_health([self.report(r) for r in reports])
        return response

    def instances_applied(self, providers: tuple[NodeProviderConfig, ...]) -> None:
        """The instances' providers changed: forget the health of gone ones, give the engines the new set."""
        del providers  # self.providers reads them from the instances
        if self.engines is not None:
            self.engines.configure(self.providers)
        wanted = {p.provider_id for p in self.providers}
        for provider_id in [p for p in self.health if p not in wanted]:
            del self.health[provider_id]
        for provider_id in [p for p in self.load if p not in wanted]:
            del self.load[provider_id]

    def _instance_changed(self, provider_id: str) -> None:
        instances = self.instances
        if instances is None:
            return
        status = instances.engine_changed(provider_id)
        if status is not None and self.session is not None and self.ready_sent:
            self.session.send_instances(
                pb.NodeInstancesReport(
                    instances=[status], profiles=instances.profile_specs(), free_gpus=instances.free_gpus()
                )
            )

    def _record(
        self, results: list[ProbeResult], providers: tuple[NodeProviderConfig, ...], forget: bool = True
    ) -> list[ProbeResult]:
        if forget:
            wanted = {p.provider_id for p in providers}
            for provider_id in [p for p in self.health if p not in wanted]:
                del self.health[provider_id]
            for provider_id in [p for p in self.load if p not in wanted]:
                del self.load[provider_id]
            self._prober.forget(wanted)
        changed = []
        for result in results:
            old = self.health.get(result.provider_id)
            self.health[result.provider_id] = result
            if old is None or (old.health, old.reason) != (result.health, result.reason):
                changed.append(result)
                # Only the count changes from one busy round to the next: one line when it starts.
                if old is not None and not (old.busy and result.busy and old.health == result.health):
                    self._log.info(
                        "provider {provider_id} health {before} -> {after} {reason}",
                        provider_id=result.provider_id,
                        before=enum_label(pb.ProviderHealth, old.health),
                        after=enum_label(pb.ProviderHealth, result.health),
                        reason=result.reason,
                    )
        return changed

    def _periodic(self) -> None:
        # A periodic round must never stop the loop: failures are logged.
        self.probe_round().addErrback(lambda f: self._log.failure("probe round failed", f))

    # -- engine load ------------------------------------------------------------

    def load_round(self) -> Deferred[list[pb.ProviderLoadReport]]:
        """Read every provider's engine load at once; send it to the Edge if ready.

        A provider whose engine exports no load, whose reading failed, or
        that was last found offline (its engine is not asked) is sent with
        ``known=false``; ``age_ms`` is the time from the
        reading to the send.
        """
        providers = self.providers
        timeout = self.config.probes.timeout_seconds

        def read_at(reading: Optional[LoadReading]) -> tuple[Optional[LoadReading], float]:
            return reading, self._clock.seconds()

        readings = [self._read_load(p, timeout).addCallback(read_at) for p in providers]

        def done(outcomes: list[tuple[bool, tuple[Optional[LoadReading], float]]]) -> list[pb.ProviderLoadReport]:
            self.load_rounds += 1
            now = self._clock.seconds()
            reports = []
            for provider, (ok, value) in zip(providers, outcomes, strict=True):
                reading, when = value if ok else (None, now)
                load = reading.to_wire(int((now - when) * 1000)) if reading is not None else pb.EngineLoad(known=False)
                self.load[provider.provider_id] = load
                reports.append(pb.ProviderLoadReport(provider_id=provider.provider_id, load=load))
            if reports and self.session is not None and self.ready_sent:
                self.session.send_load(reports)
            return reports

        return DeferredList(readings, consumeErrors=True).addCallback(done)

    def _read_load(self, provider: NodeProviderConfig, timeout: float) -> Deferred[Optional[LoadReading]]:
        """The engine's load; not asked of a provider last found offline (unknown, and no failed reads logged)."""
        last = self.health.get(provider.provider_id)
        if last is not None and last.health == pb.PROVIDER_HEALTH_OFFLINE:
            return succeed(None)
        return self._prober.read_load(provider, timeout)

    def _periodic_load(self) -> Deferred[None]:
        if self.session is None or not self.ready_sent:
            return succeed(None)  # nobody to tell: no engine is asked
        # Returned, so the loop waits for a slow round instead of piling rounds up.
        return self.load_round().addCallbacks(lambda _: None, lambda f: self._log.failure("load round failed", f))
