"""HTTP routes of rollouts: ``/rollouts`` and below (see docs/rollouts.md).

:func:`add_rollout_routes` puts them on the Control Plane's Klein app;
each runs on the :class:`~twisted_iop.controlplane.http.routes.ControlPlaneHttp`
it is bound to, with its token checks, body reading and error handlers,
and asks its :class:`~twisted_iop.controlplane.rollouts.service.RolloutService`.
This module checks bodies (every bad field is a 400 naming it) and draws
the JSON of rollouts and executions.
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Optional, Protocol

import attrs
from klein import Klein
from twisted.web.iweb import IRequest

from twisted_iop.controlplane.http.auth import ApiToken
from twisted_iop.controlplane.http.errors import BadRequest, body_field, error_body, json_body, query_int, query_text
from twisted_iop.controlplane.http.json_views import iso
from twisted_iop.controlplane.http.settings import HttpSettings
from twisted_iop.controlplane.requests.command_body import parse_command_body
from twisted_iop.controlplane.rollouts import states as rs
from twisted_iop.controlplane.rollouts.requests import RolloutRequest, TooManyRollouts, TooManyTargets, UnknownRollout
from twisted_iop.controlplane.rollouts.service import RolloutService
from twisted_iop.label_selectors import Selector, SelectorError, parse_selector


class RolloutHost(Protocol):
    """What the rollout routes use of the object their app's routes run on (``ControlPlaneHttp``)."""

    _rollouts: RolloutService
    _settings: HttpSettings

    def _authorize(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, required to be an operator's."""

    def _shared(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, a viewer's at least."""

    def _body(self, request: IRequest) -> dict[str, Any]:
        """The request's JSON object body."""


DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_KEY_CHARS = 200
#: Most a batch may grow by per batch, and most in flight at once.
MAX_INCREASE_FACTOR = 100.0
MAX_IN_FLIGHT = 10_000

_TOP_KEYS = frozenset(
    {"command", "selector", "strategy", "abort", "timeout_seconds", "disconnected", "wait_seconds", "idempotency_key"}
)
_COMMAND_KEYS = frozenset({"name", "target", "node_selector", "arguments"})
_STRATEGY_KEYS = frozenset({"batch_size", "batch_percent", "max_in_flight", "pause_seconds", "increase_factor"})
_ABORT_KEYS = frozenset({"failure_percent", "min_executed", "any_failure", "latency"})
_LATENCY_KEYS = frozenset({"metric", "max_increase_percent", "min_requests", "watch_seconds"})
#: The longest an executed edge may be watched for its latency verdict.
MAX_WATCH_SECONDS = 86_400.0


# -- views ----------------------------------------------------------------------------------


def rollout_json(rollout: rs.Rollout) -> dict[str, Any]:
    """One rollout: its request, state, counts by execution state, progress and batch."""
    command, strategy, abort = rollout.command, rollout.strategy, rollout.abort
    return {
        "rollout_id": rollout.rollout_id,
        "state": rollout.state,
        "reason": rollout.reason,
        "command": {
            "name": command.name,
            "target": command.target or None,
            "node_selector": command.node_selector or None,
            "arguments": dict(command.arguments),
        },
        "selector": rollout.selector,
        "strategy": {
            "batch_size": strategy.batch_size,
            "batch_percent": strategy.batch_percent,
            "max_in_flight": strategy.max_in_flight,
            "pause_seconds": strategy.pause_seconds,
            "increase_factor": strategy.increase_factor,
        },
        "abort": {
            "failure_percent": abort.failure_percent,
            "min_executed": abort.min_executed,
            "any_failure": abort.any_failure,
            "latency": None if abort.latency is None else attrs.asdict(abort.latency),
        },
        "watching": len(rollout.watching),
        "timeout_seconds": rollout.timeout_seconds,
        "disconnected": rollout.disconnected,
        "wait_seconds": rollout.wait_seconds,
        "created_at": iso(rollout.created_at),
        "started_at": iso(rollout.started_at),
        "finished_at": iso(rollout.finished_at),
        "targets": len(rollout.targets),
        "counts": dict(rollout.counts),
        "progress": rollout.progress,
        "batch": {"number": rollout.batch_number, "size": rollout.batch_size} if rollout.batch_number else None,
        "idempotency_key": rollout.idempotency_key or None,
        "requested_by": rollout.requested_by or None,
    }


def execution_json(execution: rs.Execution) -> dict[str, Any]:
    """One target edge's execution."""
    return {
        "edge_id": execution.edge_id,
        "state": execution.state,
        "operation_ids": list(execution.operation_ids),
        "reason": execution.reason or None,
        "started_at": iso(execution.started_at),
        "finished_at": iso(execution.finished_at),
        "latency_before_seconds": execution.latency_before,
        "latency_after_seconds": execution.latency_after,
    }


# -- checking a request ------------------------------------------------------------------------


def _object(body: dict[str, Any], field: str, keys: frozenset[str]) -> dict[str, Any]:
    value = body.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"field {field!r} must be an object")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise BadRequest(f"field {field!r} has unknown keys {unknown} (known: {sorted(keys)})")
    return value


def _plain(value: float) -> str:
    """A bound as people write it: 1000000, not 1e+06; 0.5 stays 0.5."""
    return f"{int(value)}" if value == int(value) else f"{value:g}"


def _number(
    section: dict[str, Any], field: str, name: str, minimum: float, maximum: float, whole: bool = False
) -> Optional[float]:
    value = section.get(name)
    if value is None:
        return None
    # A whole number may be written 2.0: JSON (and JSON Schema's "integer") has one number
    # type. An int is never turned into a float here: 10**400 would not fit (a 500).
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not (math.isfinite(value) and (value.is_integer() or not whole)))
    ):
        raise BadRequest(f"field '{field}{name}' must be a {'whole ' if whole else ''}number")
    if not minimum <= value <= maximum:
        raise BadRequest(f"field '{field}{name}' must be between {_plain(minimum)} and {_plain(maximum)}")
    return value


def _selector(text: Any, field: str) -> Selector:
    if not isinstance(text, str):
        raise BadRequest(f'field {field!r} must be a string (a label selector; "" selects every edge)')
    try:
        return parse_selector(text)
    except SelectorError as e:
        raise BadRequest(f"field {field!r}: {e}", "invalid_selector") from None


def _command(body: dict[str, Any]) -> rs.RolloutCommand:
    if not isinstance(body.get("command"), dict):
        raise BadRequest("field 'command' must be an object with at least a name")
    command = _object(body, "command", _COMMAND_KEYS)
    parsed = parse_command_body(command, "command.")
    node_selector = body_field(command, "node_selector", "")
    if node_selector != "":
        if parsed.target:
            raise BadRequest("fields 'command.target' and 'command.node_selector' exclude each other")
        node_selector = str(_selector(node_selector, "command.node_selector"))
    return rs.RolloutCommand(parsed.name, parsed.target, node_selector, parsed.arguments)


def _strategy(body: dict[str, Any], default_in_flight: int, max_pause: float) -> rs.Strategy:
    strategy = _object(body, "strategy", _STRATEGY_KEYS)
    field = "strategy."
    size = _number(strategy, field, "batch_size", 1, MAX_IN_FLIGHT * 100, whole=True)
    percent = _number(strategy, field, "batch_percent", 0, 100)
    if size is not None and percent is not None:
        raise BadRequest("fields 'strategy.batch_size' and 'strategy.batch_percent' exclude each other")
    if percent is not None and percent <= 0:
        raise BadRequest("field 'strategy.batch_percent' must be above 0")
    in_flight = _number(strategy, field, "max_in_flight", 1, MAX_IN_FLIGHT, whole=True)
    pause = _number(strategy, field, "pause_seconds", 0, max_pause)
    factor = _number(strategy, field, "increase_factor", 1, MAX_INCREASE_FACTOR)
    return rs.Strategy(
        batch_size=None if size is None else int(size),
        batch_percent=None if percent is None else float(percent),
        max_in_flight=default_in_flight if in_flight is None else int(in_flight),
        pause_seconds=0.0 if pause is None else float(pause),
        increase_factor=1.0 if factor is None else float(factor),
    )


def _abort(body: dict[str, Any]) -> rs.AbortCriteria:
    abort = _object(body, "abort", _ABORT_KEYS)
    percent = _number(abort, "abort.", "failure_percent", 0, 100)
    executed = _number(abort, "abort.", "min_executed", 0, 10**9, whole=True)
    any_failure = abort.get("any_failure", False)
    if not isinstance(any_failure, bool):
        raise BadRequest("field 'abort.any_failure' must be true or false")
    return rs.AbortCriteria(
        failure_percent=None if percent is None else float(percent),
        min_executed=0 if executed is None else int(executed),
        any_failure=any_failure,
        latency=_latency(abort),
    )


def _latency(abort: dict[str, Any]) -> Optional[rs.LatencyCriterion]:
    if abort.get("latency") is None:
        return None
    latency = _object(abort, "latency", _LATENCY_KEYS)
    field = "abort.latency."
    metric = latency.get("metric")
    if not isinstance(metric, str) or metric not in rs.LATENCY_FIGURES:
        raise BadRequest(f"field 'abort.latency.metric' must be one of {', '.join(rs.LATENCY_FIGURES)}")
    increase = _number(latency, field, "max_increase_percent", 0, 100_000)
    if increase is None:
        raise BadRequest("field 'abort.latency.max_increase_percent' is required (a number, e.g. 20)")
    requests = _number(latency, field, "min_requests", 1, 10**9, whole=True)
    watch = _number(latency, field, "watch_seconds", 0, MAX_WATCH_SECONDS)
    if watch is not None and watch <= 0:
        raise BadRequest("field 'abort.latency.watch_seconds' must be above 0")
    return rs.LatencyCriterion(
        metric=metric,
        max_increase_percent=float(increase),
        min_requests=50 if requests is None else int(requests),
        watch_seconds=600.0 if watch is None else float(watch),
    )


def rollout_request(http: RolloutHost, request: IRequest, body: dict[str, Any]) -> RolloutRequest:
    """The checked request of a ``POST /rollouts`` body; raises BadRequest naming the field."""
    unknown = sorted(set(body) - _TOP_KEYS)
    if unknown:
        raise BadRequest(f"unknown fields {unknown} (known: {sorted(_TOP_KEYS)})")
    settings, limits = http._settings, http._rollouts.settings
    if "selector" not in body:
        raise BadRequest("field 'selector' is required (a label selector; \"\" selects every edge)")
    timeout = _number(body, "", "timeout_seconds", 0, settings.max_command_timeout_seconds)
    if timeout is not None and timeout <= 0:
        raise BadRequest("field 'timeout_seconds' must be above 0")
    disconnected = body.get("disconnected", rs.WAIT)
    if disconnected not in (rs.WAIT, rs.SKIP):
        raise BadRequest('field \'disconnected\' must be "wait" or "skip"')
    wait = _number(body, "", "wait_seconds", 0, limits.max_wait_seconds)
    key = body.get("idempotency_key")
    header = request.getHeader(b"idempotency-key")
    if key is None and header is not None:
        key = header.decode("utf-8", "replace")
    elif header is not None and len(header.decode("utf-8", "replace")) > MAX_KEY_CHARS:
        # The body's key wins, but a header over its documented bound is
        # still a bad request (not silently ignored).
        raise BadRequest(f"the Idempotency-Key header must be at most {MAX_KEY_CHARS} characters")
    if key is not None and (not isinstance(key, str) or len(key) > MAX_KEY_CHARS):
        raise BadRequest(f"field 'idempotency_key' must be a string of at most {MAX_KEY_CHARS} characters")
    command = _command(body)
    return RolloutRequest(
        command=command,
        selector=_selector(body["selector"], "selector"),
        strategy=_strategy(body, limits.default_max_in_flight, limits.max_pause_seconds),
        abort=_abort(body),
        timeout_seconds=settings.command_timeout(command.name) if timeout is None else float(timeout),
        disconnected=disconnected,
        wait_seconds=limits.default_wait_seconds if wait is None else float(wait),
        idempotency_key=key or "",
    )


def _query(request: IRequest, name: str) -> str:
    return query_text(request, name) or ""


def _limit(request: IRequest) -> int:
    return query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)


def _states(request: IRequest) -> Optional[frozenset[str]]:
    text = _query(request, "state")
    if not text:
        return None
    states = frozenset(part.strip() for part in text.split(","))
    unknown = sorted(states - set(rs.EXECUTION_STATES))
    if unknown:
        raise BadRequest(
            f"query parameter 'state': unknown execution states {unknown} (known: {', '.join(rs.EXECUTION_STATES)})",
            "invalid_state",
        )
    return states


# -- routes --------------------------------------------------------------------------------------


def add_rollout_routes(app: Klein) -> None:
    """Put the ``/rollouts`` routes on ``app`` (the ControlPlaneHttp's Klein app)."""

    @app.route("/rollouts", methods=["POST"])
    def create_rollout(http: RolloutHost, request: IRequest) -> bytes:
        """Start a rollout (201), or answer the one its idempotency key names (200)."""
        caller = http._authorize(request)
        http._shared(request)
        checked = rollout_request(http, request, http._body(request))
        try:
            rollout, replayed = http._rollouts.create(checked, caller.name if caller is not None else "")
        except TooManyTargets as e:
            return error_body(request, 400, "too_many_targets", str(e))
        except TooManyRollouts as e:
            return error_body(request, 409, "too_many_rollouts", str(e))
        return json_body(request, 200 if replayed else 201, rollout_json(rollout))

    @app.route("/rollouts", methods=["GET"])
    def list_rollouts(http: RolloutHost, request: IRequest) -> bytes:
        """Kept rollouts, newest first, paged by rollout id."""
        http._shared(request)
        rollouts = http._rollouts.newest_first()
        limit, cursor = _limit(request), _query(request, "cursor")
        start = 0
        if cursor:
            ids = [r.rollout_id for r in rollouts]
            if cursor not in ids:
                raise BadRequest("query parameter 'cursor' does not name a kept rollout")
            start = ids.index(cursor) + 1
        chosen = rollouts[start : start + limit]
        more = start + limit < len(rollouts)
        return json_body(
            request,
            200,
            {
                "items": [rollout_json(r) for r in chosen],
                "total": len(rollouts),
                "next_cursor": chosen[-1].rollout_id if more and chosen else None,
            },
        )

    @app.route("/rollouts/<rollout_id>", methods=["GET"])
    def show_rollout(http: RolloutHost, request: IRequest, rollout_id: str) -> bytes:
        """One rollout."""
        http._shared(request)
        try:
            return json_body(request, 200, rollout_json(http._rollouts.get(rollout_id)))
        except UnknownRollout as e:
            return error_body(request, 404, "unknown_rollout", str(e))

    @app.route("/rollouts/<rollout_id>/executions", methods=["GET"])
    def rollout_executions(http: RolloutHost, request: IRequest, rollout_id: str) -> bytes:
        """A rollout's executions in edge id order, filtered by ``state``, paged by edge id."""
        http._shared(request)
        try:
            rollout = http._rollouts.get(rollout_id)
        except UnknownRollout as e:
            return error_body(request, 404, "unknown_rollout", str(e))
        states, limit, cursor = _states(request), _limit(request), _query(request, "cursor")
        ids = rollout.targets
        if states is not None:
            ids = [i for i in ids if rollout.executions[i].state in states]
        # Targets are in edge id order: start after the cursor even if it is not among them.
        start = bisect.bisect_right(ids, cursor) if cursor else 0
        chosen = ids[start : start + limit]
        return json_body(
            request,
            200,
            {
                "rollout_id": rollout.rollout_id,
                "items": [execution_json(rollout.executions[i]) for i in chosen],
                "total": len(ids),
                "next_cursor": chosen[-1] if start + limit < len(ids) and chosen else None,
            },
        )

    def move(http: RolloutHost, request: IRequest, rollout_id: str, name: str) -> bytes:
        http._authorize(request)
        http._shared(request)
        moves = {"pause": http._rollouts.pause, "resume": http._rollouts.resume, "cancel": http._rollouts.cancel}
        try:
            return json_body(request, 200, rollout_json(moves[name](rollout_id)))
        except UnknownRollout as e:
            return error_body(request, 404, "unknown_rollout", str(e))
        except rs.InvalidTransition as e:
            return error_body(request, 409, "invalid_transition", str(e))

    @app.route("/rollouts/<rollout_id>/pause", methods=["POST"])
    def pause_rollout(http: RolloutHost, request: IRequest, rollout_id: str) -> bytes:
        """Pause: nothing new is dispatched; what is in flight goes on."""
        return move(http, request, rollout_id, "pause")

    @app.route("/rollouts/<rollout_id>/resume", methods=["POST"])
    def resume_rollout(http: RolloutHost, request: IRequest, rollout_id: str) -> bytes:
        """Resume a paused rollout."""
        return move(http, request, rollout_id, "resume")

    @app.route("/rollouts/<rollout_id>/cancel", methods=["POST"])
    def cancel_rollout(http: RolloutHost, request: IRequest, rollout_id: str) -> bytes:
        """Cancel: nothing new is dispatched; what is in flight ends and is recorded."""
        return move(http, request, rollout_id, "cancel")
