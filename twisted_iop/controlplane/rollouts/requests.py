"""What a rollout request is once checked, where rollouts are kept, and the errors a request
for a rollout can meet."""

from __future__ import annotations

from typing import Protocol

import attrs

from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.label_selectors import Selector


class RolloutSink(Protocol):
    """Where rollouts are kept across restarts (the store)."""

    def rollout_changed(self, rollout: rs.Rollout) -> None:
        """``rollout`` was created or changed."""


class UnknownRollout(Exception):
    """No rollout with that id is kept."""

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"no rollout named {rollout_id!r} is kept")


class TooManyRollouts(Exception):
    """Every kept rollout is still running: none can be forgotten for a new one."""


class TooManyTargets(Exception):
    """The selector matches more edges than one rollout may have."""


@attrs.frozen
class RolloutRequest:
    """A checked ``POST /rollouts`` body."""

    command: rs.RolloutCommand
    selector: Selector
    strategy: rs.Strategy
    abort: rs.AbortCriteria
    timeout_seconds: float
    disconnected: str = rs.WAIT
    wait_seconds: float = 300.0
    idempotency_key: str = ""
