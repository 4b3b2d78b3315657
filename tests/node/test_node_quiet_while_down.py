"""An engine that is down costs one log line when it goes down, not one per probe.

The Node probes a provider found down at 0.5 s, doubling up to the probe
interval, and reads no load of an offline provider; however its engine is
down (refused, or a connect that never completes and is cancelled at the
probe's timeout), the Node logs the change once and nothing per probe.
"""

from __future__ import annotations

from typing import Any, cast

from twisted.internet.defer import Deferred, fail
from twisted.internet.error import ConnectingCancelledError, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.logger import ILogObserver, LogLevel, globalLogPublisher

from twisted_iop.node.config import parse_node_config
from twisted_iop.node.engines.probes import ProviderProber
from twisted_iop.node.runtime import NodeRuntime
from twisted_iop.wire import control_pb2 as pb

PROVIDER = {"provider_id": "p1", "kind": "llamacpp", "models": ["m"], "base_url": "http://engine.test:8080"}


class Session:
    """An Edge session that keeps the health reports sent."""

    def __init__(self) -> None:
        self.health: list[pb.ProviderHealthReport] = []

    def send_ready(self, reports: list[pb.ProviderHealthReport]) -> None:
        """NodeReady."""

    def send_health(self, reports: list[pb.ProviderHealthReport]) -> None:
        """Keep NodeHealthReport."""
        self.health.extend(reports)

    def send_load(self, reports: list[pb.ProviderLoadReport]) -> None:
        """NodeLoadReport."""

    def send_instances(self, report: pb.NodeInstancesReport) -> None:
        """NodeInstancesReport."""


class HangingConnects:
    """An HTTP client whose connects never complete: cancelled, they fail as Twisted's Agent's do."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        """A request whose connection attempt hangs until cancelled."""
        self.asked.append(url)
        return Deferred(lambda d: d.errback(ConnectingCancelledError(url)))


class RefusedConnects:
    """An HTTP client whose every connect is refused (the engine's process is gone)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def get(self, url: str, **kwargs: Any) -> Deferred[Any]:
        """A request refused at once."""
        self.asked.append(url)
        return fail(ConnectionRefusedError())


def run_down(http: Any, seconds: int) -> tuple[list[dict[str, Any]], Session, NodeRuntime]:
    """Probe a provider through ``http`` for ``seconds`` of a fake clock; the log events and the session."""
    clock = Clock()
    config = parse_node_config(
        {
            "node_id": "node-1",
            "probes": {"interval_seconds": 5, "load_interval_seconds": 1, "timeout_seconds": 1},
            "providers": [PROVIDER],
        }
    )
    runtime = NodeRuntime(config, clock, ProviderProber(clock, http=http, running_on=lambda _: 0))
    session = Session()
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    try:
        runtime.startService()
        runtime.session_accepted(session)
        for _ in range(seconds * 10):
            clock.advance(0.1)
        runtime.stopService()
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
    return [e for e in events if str(e.get("log_namespace", "")).startswith("twisted_iop")], session, runtime


def test_a_connect_that_never_completes_is_offline_without_a_traceback() -> None:
    """A connect cancelled at the probe's timeout is "no answer within 1s", offline: no failure is
    logged, however many times the engine is probed in a minute."""
    http = HangingConnects()
    events, session, runtime = run_down(http, 60)
    assert len(http.asked) >= 12  # probed again and again: every 5 s at most, sooner at first
    result = runtime.health["p1"]
    assert (result.health, result.reason) == (pb.PROVIDER_HEALTH_OFFLINE, "no answer within 1s")
    assert [e for e in events if e["log_level"] in (LogLevel.critical, LogLevel.error, LogLevel.warn)] == []
    assert len(events) <= 1, [e.get("log_format") for e in events]
    assert {r.reason for r in session.health} <= {"no answer within 1s"}


def test_an_engine_that_stays_down_logs_its_change_once() -> None:
    """An engine that refuses every connection for a minute: the Node says it went down once (the
    ready line), sends no repeated health report, asks no load and logs nothing per probe."""
    http = RefusedConnects()
    events, session, runtime = run_down(http, 60)
    assert runtime.health["p1"].health == pb.PROVIDER_HEALTH_OFFLINE
    assert all(url.endswith(("/health", "/v1/models")) for url in http.asked)  # no load asked
    assert len(events) <= 1, [e.get("log_format") for e in events]
    assert session.health == []  # the ready report said it; nothing changed since
