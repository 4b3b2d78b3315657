"""Whether a launched engine is ready: the check asked while it starts and loads.

By default the adapter's own probe of the engine's kind (health endpoint,
then models list), so llama.cpp's 503 "Loading model", a vLLM ``/health``
that is not 200 yet or a port not yet bound is *not ready*, with the
probe's reason; with ``launch.readiness.path`` a plain GET that must
answer 200. A check never fails: whatever goes wrong is a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Optional

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.error import ConnectError, ConnectingCancelledError, ConnectionRefusedError
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.probes import ProbeResult, ProviderProber
from twisted_iop.wire import control_pb2 as pb

#: Health values under which a readiness probe counts as ready.
READY_HEALTH = (pb.PROVIDER_HEALTH_HEALTHY, pb.PROVIDER_HEALTH_DEGRADED)


@attrs.frozen
class ReadinessAnswer:
    """What one readiness check found; ``result`` is the probe when it was one."""

    ready: bool
    reason: str = ""
    result: Optional[ProbeResult] = None


#: Asks a provider's engine whether it is ready; never fails.
ReadinessCheck = Callable[[NodeProviderConfig], Deferred[ReadinessAnswer]]


def readiness_check(prober: ProviderProber) -> ReadinessCheck:
    """The readiness check of launched engines, by way of ``prober``."""

    def check(provider: NodeProviderConfig) -> Deferred[ReadinessAnswer]:
        assert provider.launch is not None
        settings = provider.launch.readiness
        if settings.path is None:
            probe = prober.probe(provider, settings.request_timeout_seconds)

            def probed(result: ProbeResult) -> ReadinessAnswer:
                return ReadinessAnswer(result.health in READY_HEALTH, result.reason or "not ready yet", result)

            return probe.addCallback(probed)
        path = settings.path

        def answered(answer: Any) -> ReadinessAnswer:
            if answer.status == 200:
                return ReadinessAnswer(True)
            return ReadinessAnswer(False, f"GET {path} answered {answer.status}")

        def unanswered(failure: Failure) -> ReadinessAnswer:
            return ReadinessAnswer(False, _unanswered_reason(failure, settings.request_timeout_seconds))

        d = prober.get(provider.base_url + path, settings.request_timeout_seconds)
        return d.addCallbacks(answered, unanswered)

    return check


def failed_check(failure: Failure) -> ReadinessAnswer:
    """A check that failed unexpectedly counts as not ready."""
    return ReadinessAnswer(False, f"check failed ({type(failure.value).__name__})")


def _unanswered_reason(failure: Failure, timeout: float) -> str:
    if failure.check(DeferredTimeoutError, CancelledError, ConnectingCancelledError):
        return f"no answer within {timeout:g}s"
    if failure.check(ConnectionRefusedError):
        return "connection refused"
    if failure.check(ResponseNeverReceived, ResponseFailed):
        return "connection lost before the answer"
    if failure.check(ConnectError):
        return "cannot connect"
    return f"check failed ({type(failure.value).__name__})"
