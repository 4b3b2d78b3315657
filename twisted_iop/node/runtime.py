"""The Node runtime's state: its providers, their health and the probe rounds.

:class:`NodeRuntime` is a service that owns the provider list (re-read from
node.yaml when the Edge asks), runs probe rounds (at connect, periodically
and on request) and tells the current Edge connection about readiness and
health changes through the small :class:`EdgeSession` interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Optional, Protocol

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from twisted_iop.configuration import ConfigError, Section, load_yaml_mapping
from twisted_iop.node.config import NodeProviderConfig, NodeRuntimeConfig, parse_node_providers
from twisted_iop.node.probes import ProbeResult, ProviderProber
from twisted_iop.wire import control_pb2 as pb

if TYPE_CHECKING:
    from twisted_iop.node.inference import InferenceRunner

#: Something that re-reads the providers of node.yaml.
ProvidersLoader = Callable[[], tuple[NodeProviderConfig, ...]]


class EdgeSession(Protocol):
    """What the runtime needs from an accepted Edge connection."""

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeReady``."""

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Send ``NodeHealthReport``."""


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
        self._load_providers = load_providers if load_providers is not None else providers_from_file(config.source_path)
        self.providers: tuple[NodeProviderConfig, ...] = config.providers
        self.health: dict[str, ProbeResult] = {}
        self.session: Optional[EdgeSession] = None
        #: Runs the inference requests the Edge forwards (set by the tap).
        self.inference: Optional[InferenceRunner] = None
        self.ready_sent = False
        self.rounds = 0
        self._loop = LoopingCall(self._periodic)
        self._loop.clock = clock

    def startService(self) -> None:
        super().startService()
        self._loop.start(self.config.probes.interval_seconds, now=False)

    def stopService(self) -> Deferred[None] | None:
        if self._loop.running:
            self._loop.stop()
        return super().stopService()

    # -- the Edge connection --------------------------------------------------

    def session_accepted(self, session: EdgeSession) -> Deferred[None]:
        """The Edge accepted hello: probe every provider, then send ``NodeReady``."""
        self.session = session
        self.ready_sent = False

        def probed(results: list[ProbeResult]) -> None:
            if self.session is not session:
                return
            self.ready_sent = True
            session.send_ready([r.to_report() for r in results])
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
            self.inference.session_lost(session)  # type: ignore[arg-type]

    def provider_specs(self) -> list[pb.NodeProviderSpec]:
        """What the Edge may know of the providers: id, kind and models only."""
        return [
            pb.NodeProviderSpec(provider_id=p.provider_id, kind=p.kind, models=list(p.models)) for p in self.providers
        ]

    def answer_probe_request(self) -> Deferred[pb.NodeProbeResponse]:
        """Re-read the providers (if there is a config file), probe, answer."""
        if self._load_providers is not None:
            try:
                self.providers = self._load_providers()
            except ConfigError as e:
                self._log.warn("keeping the current providers; node.yaml not re-read: {error}", error=str(e))

        def answer(results: list[ProbeResult]) -> pb.NodeProbeResponse:
            return pb.NodeProbeResponse(providers=self.provider_specs(), health=[r.to_report() for r in results])

        return self.probe_round(report_changes=False).addCallback(answer)

    # -- probing --------------------------------------------------------------

    def probe_round(self, report_changes: bool = True) -> Deferred[list[ProbeResult]]:
        """Probe every provider at once; record health; report changes if ready."""
        providers = self.providers
        timeout = self.config.probes.timeout_seconds
        probes = [self._prober.probe(p, timeout) for p in providers]

        def done(outcomes: list[tuple[bool, ProbeResult]]) -> list[ProbeResult]:
            self.rounds += 1
            results = [value for ok, value in outcomes if ok]
            changed = self._record(results, providers)
            if report_changes and changed and self.session is not None and self.ready_sent:
                self.session.send_health([r.to_report() for r in changed])
            return results

        return DeferredList(probes, consumeErrors=True).addCallback(done)

    def _record(self, results: list[ProbeResult], providers: tuple[NodeProviderConfig, ...]) -> list[ProbeResult]:
        wanted = {p.provider_id for p in providers}
        for provider_id in [p for p in self.health if p not in wanted]:
            del self.health[provider_id]
        changed = []
        for result in results:
            old = self.health.get(result.provider_id)
            self.health[result.provider_id] = result
            if old is None or (old.health, old.reason) != (result.health, result.reason):
                changed.append(result)
                if old is not None:
                    self._log.info(
                        "provider {provider_id} health {before} -> {after} {reason}",
                        provider_id=result.provider_id,
                        before=pb.ProviderHealth.Name(old.health),
                        after=pb.ProviderHealth.Name(result.health),
                        reason=result.reason,
                    )
        return changed

    def _periodic(self) -> None:
        # A periodic round must never stop the loop: failures are logged.
        self.probe_round().addErrback(lambda f: self._log.failure("probe round failed", f))
