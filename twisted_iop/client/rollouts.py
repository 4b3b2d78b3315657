"""Rollouts in the client: their models and the repository's rollout methods.

A rollout sends one command to every edge a label selector matches, in
batches (docs/http-api.md, "Rollouts"). The models here mirror the
Control Plane's documents field for field and are read by the same
generic reader as every other view (:func:`twisted_iop.client.model_json.read`);
:class:`RolloutRequest` is the body of ``POST /rollouts``, written with
:func:`~twisted_iop.client.model_json.to_json` (options left ``None`` are left
out, so the server's defaults apply).

:class:`RolloutViews` holds the repository's methods for ``/rollouts``;
:class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`
inherits them, so there is one repository object for every view.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Literal, Optional
from urllib.parse import quote

import attrs

from twisted_iop.client.base_errors import InvalidResponse
from twisted_iop.client.model_json import DEFAULTED, OPTIONAL, read, to_json

RolloutState = Literal["pending", "running", "paused", "succeeded", "failed", "aborted", "cancelled"]
#: Rollout states after which nothing changes any more.
ROLLOUT_ENDED_STATES = frozenset({"succeeded", "failed", "aborted", "cancelled"})
#: Execution states after which an execution changes no more.
EXECUTION_ENDED_STATES = ("succeeded", "failed", "timed_out", "skipped", "cancelled")
#: Every execution state, in the order a rollout moves its targets through them.
EXECUTION_STATES = ("pending", "waiting", "in_flight", *EXECUTION_ENDED_STATES)
#: The largest page ``GET /rollouts`` and the executions view hand out.
MAX_ROLLOUT_PAGE_LIMIT = 1000


def _optional() -> Any:
    return attrs.field(default=None, metadata=OPTIONAL)


@attrs.frozen
class RolloutCommand:
    """The command each target edge runs: name, node target or node selector, arguments."""

    name: str
    target: Optional[str] = _optional()
    node_selector: Optional[str] = _optional()
    arguments: dict[str, str] = attrs.field(factory=dict, metadata=DEFAULTED)

    def __attrs_post_init__(self) -> None:
        if self.target is not None and self.node_selector is not None:
            raise ValueError("command: give a target or a node_selector, not both")


@attrs.frozen
class RolloutStrategy:
    """How fast a rollout goes: batch size (or percentage of the targets), the
    most executions in flight, the pause between batches and the factor each
    batch grows by. ``None`` leaves a member to the server's default."""

    batch_size: Optional[int] = _optional()
    batch_percent: Optional[float] = _optional()
    max_in_flight: Optional[int] = _optional()
    pause_seconds: Optional[float] = _optional()
    increase_factor: Optional[float] = _optional()

    def __attrs_post_init__(self) -> None:
        if self.batch_size is not None and self.batch_percent is not None:
            raise ValueError("strategy: give batch_size or batch_percent, not both")


@attrs.frozen
class RolloutLatency:
    """Abort when an executed edge's ``metric`` (``ttft_p95``, ``tpot_p95``,
    ``duration_p95``) rose by more than ``max_increase_percent`` after its
    execution, over ``min_requests`` requests (docs/rollouts.md)."""

    metric: str
    max_increase_percent: float
    min_requests: Optional[int] = _optional()
    watch_seconds: Optional[float] = _optional()


@attrs.frozen
class RolloutAbort:
    """When a rollout stops by itself: the share of failed or timed-out
    executions above ``failure_percent`` once ``min_executed`` have ended, or
    any failure at all."""

    failure_percent: Optional[float] = _optional()
    min_executed: Optional[int] = _optional()
    any_failure: Optional[bool] = _optional()
    latency: Optional[RolloutLatency] = _optional()

    def __attrs_post_init__(self) -> None:
        if self.any_failure and self.failure_percent is not None:
            raise ValueError("abort: give failure_percent or any_failure, not both")


@attrs.frozen
class RolloutCounts:
    """How many targets are in each execution state."""

    pending: int
    waiting: int
    in_flight: int
    succeeded: int
    failed: int
    timed_out: int
    skipped: int
    cancelled: int

    @property
    def ended(self) -> int:
        """Executions in a terminal state."""
        return sum(getattr(self, name) for name in EXECUTION_ENDED_STATES)

    def as_dict(self) -> dict[str, int]:
        """The counts by state, in :data:`EXECUTION_STATES` order."""
        return {name: getattr(self, name) for name in EXECUTION_STATES}


@attrs.frozen
class RolloutBatch:
    """The batch being dispatched: its number (from 1) and size."""

    number: int
    size: int


@attrs.frozen
class Rollout:
    """``GET /rollouts/{id}``: one rollout, its counts and progress.

    ``progress`` is the share (0..1) of the targets whose execution ended;
    ``reason`` says why a rollout aborted or failed.
    """

    rollout_id: str
    state: RolloutState
    command: RolloutCommand
    selector: str
    targets: int
    counts: RolloutCounts
    progress: float
    reason: Optional[str] = None
    strategy: RolloutStrategy = RolloutStrategy()
    abort: RolloutAbort = RolloutAbort()
    timeout_seconds: Optional[float] = None
    disconnected: str = "wait"
    created_at: Optional[datetime] = None
    started_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None
    batch: Optional[RolloutBatch] = None
    idempotency_key: Optional[str] = None

    @property
    def ended(self) -> bool:
        """Whether the rollout is in a terminal state."""
        return self.state in ROLLOUT_ENDED_STATES


@attrs.frozen
class RolloutPage:
    """``GET /rollouts``: one page of rollouts, newest first."""

    items: tuple[Rollout, ...]
    total: int
    next_cursor: Optional[str] = None


@attrs.frozen
class RolloutExecution:
    """One target edge of a rollout: its execution state and the operations it ran."""

    edge_id: str
    state: str
    operation_ids: tuple[str, ...] = ()
    reason: Optional[str] = None
    started_at: Optional[datetime] = None
    finished_at: Optional[datetime] = None


@attrs.frozen
class RolloutExecutionPage:
    """``GET /rollouts/{id}/executions``: one page of executions (or every page, joined)."""

    items: tuple[RolloutExecution, ...]
    total: Optional[int] = _optional()
    next_cursor: Optional[str] = _optional()


@attrs.frozen
class RolloutRequest:
    """The body of ``POST /rollouts``.

    ``disconnected`` is ``"wait"`` (an edge disconnected when its turn comes
    is waited for, up to ``wait_seconds``) or ``"skip"`` (it is counted
    ``skipped``); ``None`` leaves it to the server (which waits).
    """

    command: RolloutCommand
    selector: str
    strategy: RolloutStrategy = RolloutStrategy()
    abort: RolloutAbort = RolloutAbort()
    timeout_seconds: Optional[float] = _optional()
    disconnected: Optional[Literal["wait", "skip"]] = _optional()
    wait_seconds: Optional[float] = _optional()
    idempotency_key: Optional[str] = _optional()

    def __attrs_post_init__(self) -> None:
        if self.disconnected == "skip" and self.wait_seconds is not None:
            raise ValueError("wait_seconds only applies when disconnected edges are waited for")

    def body(self) -> dict[str, Any]:
        """The JSON body, without the options left to the server."""
        document: dict[str, Any] = to_json(self)
        return document


Request = Callable[..., Awaitable[Any]]


class RolloutViews:
    """The repository's methods for ``/rollouts`` (mixed into
    :class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`,
    which provides ``_request``)."""

    _request: Request

    @staticmethod
    def _rollout_path(rollout_id: str, *rest: str) -> str:
        return "/" + "/".join(["rollouts", quote(rollout_id, safe=""), *rest])

    async def create_rollout(self, request: RolloutRequest) -> Rollout:
        """``POST /rollouts``: start a rollout; answers it as created (or, when
        the idempotency key replays an earlier one, that one)."""
        return read(Rollout, await self._request("POST", "/rollouts", body=request.body()))

    async def rollouts(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> RolloutPage:
        """``GET /rollouts``: one page of rollouts, newest first."""
        return read(RolloutPage, await self._request("GET", "/rollouts", {"limit": limit, "cursor": cursor}))

    async def rollout(self, rollout_id: str) -> Rollout:
        """``GET /rollouts/{id}``: the rollout with its counts, progress and batch.

        Raises ``ControlPlaneError`` with code ``unknown_rollout`` (404) for
        an id the server does not know.
        """
        return read(Rollout, await self._request("GET", self._rollout_path(rollout_id)))

    async def rollout_executions(
        self,
        rollout_id: str,
        state: Optional[str] = None,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
    ) -> RolloutExecutionPage:
        """``GET /rollouts/{id}/executions``: one page, of one execution state if given."""
        query: Mapping[str, Any] = {"state": state, "limit": limit, "cursor": cursor}
        data = await self._request("GET", self._rollout_path(rollout_id, "executions"), query)
        return read(RolloutExecutionPage, data)

    async def all_rollout_executions(self, rollout_id: str, state: Optional[str] = None) -> RolloutExecutionPage:
        """Every execution of a rollout (of one state if given), following the
        cursors, as one page (``total`` of the first page)."""
        first = await self.rollout_executions(rollout_id, state=state, limit=MAX_ROLLOUT_PAGE_LIMIT)
        items = list(first.items)
        cursor = first.next_cursor
        seen: set[str] = set()
        while cursor:
            if cursor in seen:
                raise InvalidResponse(f"the Control Plane repeated the page cursor {cursor!r}")
            seen.add(cursor)
            page = await self.rollout_executions(rollout_id, state=state, limit=MAX_ROLLOUT_PAGE_LIMIT, cursor=cursor)
            items.extend(page.items)
            cursor = page.next_cursor
        return RolloutExecutionPage(items=tuple(items), total=first.total, next_cursor=None)

    async def _transition(self, rollout_id: str, action: str) -> Rollout:
        return read(Rollout, await self._request("POST", self._rollout_path(rollout_id, action), body={}))

    async def pause_rollout(self, rollout_id: str) -> Rollout:
        """``POST /rollouts/{id}/pause``: dispatch no more until resumed
        (code ``invalid_transition``, 409, when the rollout cannot pause)."""
        return await self._transition(rollout_id, "pause")

    async def resume_rollout(self, rollout_id: str) -> Rollout:
        """``POST /rollouts/{id}/resume``: go on dispatching after a pause."""
        return await self._transition(rollout_id, "resume")

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """``POST /rollouts/{id}/cancel``: stop dispatching; executions in flight
        finish and are recorded, those not started are counted ``cancelled``."""
        return await self._transition(rollout_id, "cancel")
