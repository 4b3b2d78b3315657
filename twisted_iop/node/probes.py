"""Provider health probes.

* HTTP kinds (``openai``, ``vllm``, ``ollama``): ``GET {base_url}/v1/models``
  through an injectable treq-like client, with a timeout. 200 with every
  configured model listed is healthy; some models missing is degraded; an
  error status, a bad body or no configured model served is unhealthy; no
  answer at all is offline.
* ``mock``: built in; healthy unless its options (or its health file) say
  otherwise.

Reasons never contain the provider's address: they travel to the Edge and
the Control Plane.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Protocol, cast

import attrs
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeoutError
from twisted.internet.error import ConnectError, ConnectionRefusedError, DNSLookupError
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from twisted_iop.node.config import MOCK_HEALTH_VALUES, NodeProviderConfig
from twisted_iop.wire import control_pb2 as pb

#: At most this many served model names are reported per provider.
MAX_REPORTED_MODELS = 256

_HEALTH_BY_NAME = {
    "healthy": pb.PROVIDER_HEALTH_HEALTHY,
    "degraded": pb.PROVIDER_HEALTH_DEGRADED,
    "unhealthy": pb.PROVIDER_HEALTH_UNHEALTHY,
    "offline": pb.PROVIDER_HEALTH_OFFLINE,
}


class HTTPClient(Protocol):
    """The part of treq (or ``treq.testing.StubTreq``) the probes use."""

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        """Issue a GET request."""

    def json_content(self, response: Any) -> Deferred[Any]:
        """Read a response body as JSON."""


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


class ProviderProber:
    """Probes providers of any kind."""

    _log = Logger()

    def __init__(self, clock: IReactorTime, http: Optional[HTTPClient] = None) -> None:
        self._clock = clock
        if http is None:
            import treq

            http = cast(HTTPClient, treq)
        self._http: HTTPClient = http

    def probe(self, provider: NodeProviderConfig, timeout: float) -> Deferred[ProbeResult]:
        """Probe ``provider``; never fails (a failure is a health value)."""
        if provider.kind == "mock":
            return succeed(self._probe_mock(provider))
        return Deferred.fromCoroutine(self._probe_http(provider, timeout))

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
        pid = provider.provider_id
        started = self._clock.seconds()
        try:
            request = self._http.get(provider.base_url + "/v1/models", timeout=timeout)
            request.addTimeout(timeout, self._clock)
            response = await request
            if response.code != 200:
                return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"GET /v1/models answered {response.code}")
            reading = self._http.json_content(response)
            reading.addTimeout(timeout, self._clock)
            body = await reading
        except (DeferredTimeoutError, CancelledError):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"no answer within {timeout:g}s")
        except (ResponseNeverReceived, ResponseFailed):
            if self._clock.seconds() - started >= timeout:
                return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"no answer within {timeout:g}s")
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "connection lost before the answer")
        except ConnectionRefusedError:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "connection refused")
        except DNSLookupError:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, "host name does not resolve")
        except ConnectError as e:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"cannot connect ({type(e).__name__})")
        except ValueError:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, "GET /v1/models: body is not JSON")
        except Exception as e:
            self._log.failure("probe of provider {provider_id} failed unexpectedly", Failure(), provider_id=pid)
            return ProbeResult(pid, pb.PROVIDER_HEALTH_OFFLINE, f"probe failed ({type(e).__name__})")
        served = _served_models(body)
        if served is None:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, "GET /v1/models: unexpected body")
        missing = [m for m in provider.models if m not in served]
        reported = tuple(sorted(served)[:MAX_REPORTED_MODELS])
        if len(missing) == len(provider.models):
            return ProbeResult(pid, pb.PROVIDER_HEALTH_UNHEALTHY, f"serves none of: {', '.join(missing)}", reported)
        if missing:
            return ProbeResult(pid, pb.PROVIDER_HEALTH_DEGRADED, f"does not serve: {', '.join(missing)}", reported)
        return ProbeResult(pid, pb.PROVIDER_HEALTH_HEALTHY, "", reported)


def _served_models(body: Any) -> Optional[set[str]]:
    """Model ids from an OpenAI ``/v1/models`` body (``{"data": [{"id": ...}]}``)."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    served = set()
    for item in body["data"]:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            served.add(item["id"])
    return served
