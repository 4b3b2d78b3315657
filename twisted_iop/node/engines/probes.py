"""Provider health probes and load readings.

* HTTP kinds: the engine adapter of the provider's kind
  (:mod:`twisted_iop.node.engines`) names the paths and reads the
  answers. A probe asks the engine's health endpoint (when the adapter
  has one and the engine answers it; otherwise the models list is the
  health check), then its models list: every configured model listed is
  healthy, some missing is degraded, an error status, a bad body or no
  configured model served is unhealthy, no connection is offline.
* **Busy is not down.** An engine that runs one request at a time may
  not answer a probe while it generates. A probe that times out while
  this Node has requests running on that provider keeps the last good
  health, with a reason saying so (``busy: health check timed out while
  serving 3 requests``); refused, reset or unreachable is offline
  whatever is running.
* ``mock``: built in; healthy unless its options (or its health file) say
  otherwise.

Every answer is read up to :data:`MAX_PROBE_BODY_BYTES` (a larger one is
a failed read, not a truncated one). The connection pool is persistent
and quiet: an engine that drops idle connections every few seconds
makes no "Starting factory" / "Stopping factory" log lines.

Reasons never contain the provider's address: they travel to the Edge and
the Control Plane.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Protocol, cast

import attrs
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.error import ConnectError, ConnectingCancelledError, ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import (
    Agent,
    HTTPConnectionPool,
    ResponseDone,
    ResponseFailed,
    ResponseNeverReceived,
)
from twisted.web.http import PotentialDataLoss

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.node.config import MOCK_HEALTH_VALUES, NodeProviderConfig
from twisted_iop.node.engines.base import LoadReading
from twisted_iop.node.engines.http import QuietConnectionPool
from twisted_iop.node.engines.kinds import adapter_for
from twisted_iop.wire import control_pb2 as pb

#: At most this many served model names are reported per provider.
MAX_REPORTED_MODELS = 256
#: Largest answer read from an engine's health, models or load endpoint
#: (a vLLM /metrics with a few models is some 50 KiB).
MAX_PROBE_BODY_BYTES = 1024 * 1024
#: Idle connections kept per engine (a probe and a load round may overlap).
MAX_IDLE_PROBE_CONNECTIONS = 2

_HEALTH_BY_NAME = {
    "healthy": pb.PROVIDER_HEALTH_HEALTHY,
    "degraded": pb.PROVIDER_HEALTH_DEGRADED,
    "unhealthy": pb.PROVIDER_HEALTH_UNHEALTHY,
    "offline": pb.PROVIDER_HEALTH_OFFLINE,
}
_GOOD = (pb.PROVIDER_HEALTH_HEALTHY, pb.PROVIDER_HEALTH_DEGRADED)

#: How many requests this Node is running on a provider, by provider id.
RunningCount = Callable[[str], int]


class HTTPClient(Protocol):
    """The part of treq (or ``treq.testing.StubTreq``) the probes use."""

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        """Issue a GET request (called with ``unbuffered=True``: the body is read through ``deliverBody``)."""


def probe_http_client(reactor: Reactor) -> HTTPClient:
    """The probes' treq client: a quiet persistent pool, at most two idle connections per engine."""
    from treq.client import HTTPClient as TreqClient

    pool = QuietConnectionPool(reactor, persistent=True)
    pool.maxPersistentPerHost = MAX_IDLE_PROBE_CONNECTIONS
    client = TreqClient(Agent(reactor, pool=pool))
    client.pool = pool  # type: ignore[attr-defined]  # for ProviderProber.close
    return cast(HTTPClient, client)


class AnswerTooLarge(Exception):
    """An engine's answer was larger than :data:`MAX_PROBE_BODY_BYTES`."""


@attrs.frozen
class Answer:
    """One HTTP answer of an engine: status and (bounded) body."""

    status: int
    body: bytes


class _BoundedBody(TwistedProtocol):
    """Collects a body up to a limit; past it, stops reading and fails."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._size = 0
        self.done: Deferred[bytes] = Deferred(lambda _: self._stop())

    def dataReceived(self, data: bytes) -> None:
        if self.done.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._stop()
            self.done.errback(AnswerTooLarge(f"answer larger than {self._limit} bytes"))
            return
        self._parts.append(data)

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self._parts))
        else:
            self.done.errback(reason)

    def _stop(self) -> None:
        if self.transport is not None:
            cast(Any, self.transport).stopProducing()


@attrs.frozen
class ProbeResult:
    """The health of one provider after one probe."""

    provider_id: str
    health: pb.ProviderHealth
    reason: str = ""
    models: tuple[str, ...] = ()

    def to_report(self) -> pb.ProviderHealthReport:
        """The wire form."""
        return pb.ProviderHealthReport(
            provider_id=self.provider_id, health=self.health, reason=self.reason, models=list(self.models)
        )

    @property
    def busy(self) -> bool:
        """Whether this health was kept because the engine was too busy to answer."""
        return self.reason.startswith("busy:")


class ProviderProber:
    """Probes providers of any kind and reads their engines' load.

    ``running_on`` says how many requests this Node runs on a provider
    (the busy rule); it may be set after construction (the runtime sets
    it when it is left ``None``).
    """

    _log = Logger()

    def __init__(
        self, clock: IReactorTime, http: Optional[HTTPClient] = None, running_on: Optional[RunningCount] = None
    ) -> None:
        self._clock = clock
        # Only a running reactor comes without ``http``.
        self._http: HTTPClient = http if http is not None else probe_http_client(cast(Reactor, clock))
        self.running_on = running_on
        #: The last good (healthy or degraded) answered result per provider: what busy keeps.
        self._last_good: dict[str, ProbeResult] = {}

    def probe(self, provider: NodeProviderConfig, timeout: float) -> Deferred[ProbeResult]:
        """Probe ``provider``; never fails (a failure is a health value)."""
        if provider.kind == "mock":
            return succeed(self._probe_mock(provider))
        return Deferred.fromCoroutine(self._probe_http(provider, timeout))

    def read_load(self, provider: NodeProviderConfig, timeout: float) -> Deferred[Optional[LoadReading]]:
        """The engine's own load, ``None`` when it exports none or the reading failed; never fails."""
        if provider.kind == "mock":
            # The mock runs in process: its load is this Node's count (parallel unknown).
            return succeed(LoadReading(running=self._running(provider.provider_id)))
        if not adapter_for(provider.kind).load_paths:
            return succeed(None)
        return Deferred.fromCoroutine(self._read_load(provider, timeout))

    def close(self) -> Deferred[None]:
        """Close the idle connections of the prober's own pool (the Node is stopping)."""
        pool = getattr(self._http, "pool", None)
        if isinstance(pool, HTTPConnectionPool):
            return cast("Deferred[None]", pool.closeCachedConnections())
        return succeed(None)

    def forget(self, keep: set[str]) -> None:
        """Drop what is remembered of providers not in ``keep`` (they left the configuration)."""
        for provider_id in [p for p in self._last_good if p not in keep]:
            del self._last_good[provider_id]

    # -- HTTP ---------------------------------------------------------------------

    def get(self, url: str, timeout: float) -> Deferred[Answer]:
        """GET ``url``: status and body (bounded), within ``timeout`` for the whole answer."""
        d = Deferred.fromCoroutine(self._get(url))
        d.addTimeout(timeout, self._clock)
        return d

    async def _get(self, url: str) -> Answer:
        response = await self._http.get(url, unbuffered=True)
        reader = _BoundedBody(MAX_PROBE_BODY_BYTES)
        response.deliverBody(reader)
        body = await reader.done
        return Answer(int(response.code), body)

    async def _read_load(self, provider: NodeProviderConfig, timeout: float) -> Optional[LoadReading]:
        adapter = adapter_for(provider.kind)
        answers: dict[str, bytes] = {}
        for path in adapter.load_paths:
            try:
                answer = await self.get(provider.base_url + path, timeout)
            except Exception as e:
                self._log.debug(
                    "load of provider {provider_id} not read from {path}: {error}",
                    provider_id=provider.provider_id,
                    path=path,
                    error=type(e).__name__,
                )
                continue
            if answer.status == 200:
                answers[path] = answer.body
        try:
            return adapter.read_load(answers)
        except Exception:
            self._log.failure("reading the load of provider {provider_id} failed", provider_id=provider.provider_id)
            return None

    def _running(self, provider_id: str) -> int:
        if self.running_on is None:
            return 0
        try:
            return max(0, int(self.running_on(provider_id)))
        except Exception:
            self._log.failure("counting the requests running on {provider_id} failed", provider_id=provider_id)
            return 0

    # -- health -------------------------------------------------------------------

    def _probe_mock(self, provider: NodeProviderConfig) -> ProbeResult:
        options = provider.mock
        health, reason = options.health, options.reason
        if options.health_file:
            try:
                words = Path(options.health_file).read_text(encoding="utf-8").split()
            except OSError:
                words = []
            if words and words[0] in MOCK_HEALTH_VALUES:
                health = words[0]
                reason = " ".join(words[1:])
        if health != "healthy" and not reason:
            reason = f"mock provider configured {health}"
        return ProbeResult(
            provider.provider_id, _HEALTH_BY_NAME[health], reason if health != "healthy" else "", provider.models
        )

    async def _probe_http(self, provider: NodeProviderConfig, timeout: float) -> ProbeResult:
        started = self._clock.seconds()
        try:
            result = await self._ask_engine(provider, timeout)
        except Exception as e:
            return self._unanswered(provider, e, timeout, self._clock.seconds() - started)
        if result.health in _GOOD:
            self._last_good[provider.provider_id] = result
        return result

    async def _ask_engine(self, provider: NodeProviderConfig, timeout: float) -> ProbeResult:
        pid = provider.provider_id
        adapter = adapter_for(provider.kind)
        said = ""
        if adapter.health_path is not None:
            answer = await self.get(provider.base_url + adapter.health_path, timeout)
            check = adapter.check_health(answer.status, answer.body)
            if check is not None and check.health not in _GOOD:
                return ProbeResult(pid, check.health, check.reason)
            said = check.reason if check is not None else ""
        path = adapter.models_path
        answer = await self.get(provider.base_url + path, timeout)
        if answer.status != 200:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"GET {path} answered {answer.status}")
        served = adapter.served_models(answer.body)
        if served is None:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"GET {path}: unexpected body")
        missing = [m for m in provider.models if m not in served]
        reported = tuple(sorted(served)[:MAX_REPORTED_MODELS])
        if len(missing) == len(provider.models):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"serves none of: {', '.join(missing)}", reported)
        if missing:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_DEGRADED, f"does not serve: {', '.join(missing)}", reported)
        return ProbeResult(pid, pb.PROVIDER_HEALTH_HEALTHY, said, reported)

    def _unanswered(self, provider: NodeProviderConfig, error: Exception, timeout: float, took: float) -> ProbeResult:
        pid = provider.provider_id
        # A connect still pending at the timeout is cancelled (a host that drops SYNs, a full
        # backlog): that is no answer in time, not a bug to log with its traceback every probe.
        timed_out = isinstance(error, (DeferredTimeoutError, CancelledError, ConnectingCancelledError)) or (
            isinstance(error, (ResponseNeverReceived, ResponseFailed)) and took >= timeout
        )
        if timed_out:
            running = self._running(pid)
            if running > 0:
                return self._busy(provider, running)
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"no answer within {timeout:g}s")
        if isinstance(error, (ResponseNeverReceived, ResponseFailed)):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "connection lost before the answer")
        if isinstance(error, ConnectionRefusedError):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "connection refused")
        if isinstance(error, DNSLookupError):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "host name does not resolve")
        if isinstance(error, ConnectError):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"cannot connect ({type(error).__name__})")
        if isinstance(error, AnswerTooLarge):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"{error}")
        self._log.failure("probe of provider {provider_id} failed unexpectedly", Failure(error), provider_id=pid)
        return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"probe failed ({type(error).__name__})")

    def _busy(self, provider: NodeProviderConfig, running: int) -> ProbeResult:
        """The last good health, kept: the engine is serving this Node's requests."""
        requests = "request" if running == 1 else "requests"
        reason = f"busy: health check timed out while serving {running} {requests}"
        last = self._last_good.get(provider.provider_id)
        if last is None:
            return ProbeResult(provider.provider_id, pb.PROVIDER_HEALTH_HEALTHY, reason, provider.models)
        if last.reason and not last.busy:
            reason = f"{reason}; {last.reason}"
        return attrs.evolve(last, reason=reason)
