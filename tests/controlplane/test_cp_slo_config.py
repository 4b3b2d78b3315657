"""The ``slos`` section of control-plane.yaml, and the SLO service in the daemon's wiring."""

from __future__ import annotations

import pytest
from twisted.internet.testing import MemoryReactorClock

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text


def test_declared_objectives_are_parsed_with_the_settings() -> None:
    """Settings and declared objectives are read; the defaults hold without a section."""
    config = config_from_text(
        "slos:\n  interval_seconds: 2\n  max_slos: 5\n  objectives:\n"
        "    chat-ttft: {metric: ttft, percentile: 95, objective_seconds: 0.5, model: llama-3-8b, edge_selector: region=eu}\n"
        "    errors: {metric: error_ratio, objective_ratio: 0.01, model: m, window: 7d}\n"
    )
    slos = config.slos
    assert (slos.interval_seconds, slos.max_slos) == (2.0, 5)
    assert [(s.name, s.metric, s.window) for s in slos.declared] == [
        ("chat-ttft", "ttft", "30d"),
        ("errors", "error_ratio", "7d"),
    ]
    assert config_from_text("").slos.declared == () and config_from_text("").slos.interval_seconds == 10.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slos: {interval_seconds: 0}", "slos.interval_seconds: must be greater than 0"),
        ("slos: {colour: red}", "slos.colour: unknown setting"),
        (
            "slos:\n  objectives:\n    chat: {metric: ttft, percentile: 120, objective_seconds: 0.5, model: m}",
            "slos.objectives.chat.percentile: must be a number between 0 and 100",
        ),
        (
            "slos:\n  objectives:\n    chat: {metric: ttft, percentile: 95, objective_seconds: 0.5}",
            "slos.objectives.chat.model",
        ),
        (
            "slos:\n  objectives:\n    'bad name': {metric: error_ratio, objective_ratio: 0.1, model: m}",
            "slos.objectives.bad name",
        ),
        ("slos:\n  objectives: [1]", "slos.objectives: must be a mapping"),
        (
            "slos:\n  max_slos: 1\n  objectives:\n    a: {metric: error_ratio, objective_ratio: 0.1, model: m}\n"
            "    b: {metric: error_ratio, objective_ratio: 0.1, model: m}",
            "slos.objectives: 2 objectives, over max_slos 1",
        ),
    ],
)
def test_errors_name_the_dotted_field(text: str, message: str) -> None:
    """A bad setting or objective names its dotted path."""
    with pytest.raises(ConfigError) as raised:
        config_from_text(text)
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_daemon_evaluates_declared_slos_on_its_interval() -> None:
    """The Control Plane holds an SLO service that puts the declared SLOs at
    start and evaluates on its interval with the reactor's clock."""
    config = config_from_text(
        "store: {backend: memory}\nhistory: {enabled: false}\n"
        "slos:\n  interval_seconds: 3\n  objectives:\n"
        "    chat: {metric: duration, percentile: 99, objective_seconds: 2, model: m}\n"
    )
    reactor = MemoryReactorClock()
    service = tap.ControlPlaneService(config, reactor)
    service.privilegedStartService()
    service.startService()
    reactor.running = True
    for call in reactor.whenRunningHooks:
        call[0](*call[1], **call[2])
    assert [s.spec.name for s in service.slos.all()] == ["chat"]
    before = service.slos.evaluations
    reactor.advance(3)
    reactor.advance(3)
    # No edge is connected: each interval's fleet round is empty and ends at once.
    assert service.slos.evaluations >= before + 1
    service.stopService()
