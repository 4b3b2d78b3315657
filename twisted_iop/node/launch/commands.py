"""The Edge's ``provider.*`` commands, as the Node runs and answers them.

A ``NodeProviderCommandRequest`` from the node wire becomes one action on
an engine of the :class:`~twisted_iop.node.launch.supervisor.EngineSupervisor`
(:func:`restart`, :func:`stop`, :func:`start`, :func:`logs`) and its
outcome one ``NodeProviderCommandResponse``. Every value from the Edge is
checked here: an unknown action is refused, times and the log answer are
bounded. Restart and stop may drain first (the engine is ``draining``: no
new leases; the action waits for this Node's requests on it to finish, up
to the drain timeout, then cuts off what still runs); restart and start
answer once the engine is ready again, or when the answer is due (it goes
on starting).
"""

from __future__ import annotations

from typing import Optional

import attrs
from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.daemon import wait_until
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.node.launch.supervisor import EngineSupervisor, LaunchedEngine, NotLaunched
from twisted_iop.wire import control_pb2 as pb

#: A provider command's answer is due after this long when the Edge gives no time.
DEFAULT_ANSWER_SECONDS = 10.0
#: The longest a provider command may run before its answer, and the longest drain.
MAX_COMMAND_SECONDS = 3600.0
#: Bytes of output ``provider.logs`` returns unless asked for fewer.
DEFAULT_LOG_ANSWER_BYTES = 16 * 1024
#: The most bytes of output one ``provider.logs`` answer carries.
MAX_LOG_ANSWER_BYTES = 64 * 1024

_log = Logger()


@attrs.frozen
class ActionOutcome:
    """How a provider command ended."""

    ok: bool
    reason: str
    launch: Optional[pb.EngineLaunch] = None
    drained_requests: int = 0
    cut_requests: int = 0
    log_text: str = ""
    log_lines: int = 0


def answer_provider_command(
    supervisor: EngineSupervisor, request: pb.NodeProviderCommandRequest
) -> Deferred[pb.NodeProviderCommandResponse]:
    """Run the Edge's ``NodeProviderCommandRequest`` and answer it (never fails: a refusal is ``ok=false``).

    Every value from the Edge is checked: an unknown action is refused,
    times are bounded by :data:`MAX_COMMAND_SECONDS`, the log answer by
    :data:`MAX_LOG_ANSWER_BYTES`.
    """

    def seconds(milliseconds: int, default: float) -> float:
        return min(milliseconds / 1000.0, MAX_COMMAND_SECONDS) if milliseconds else default

    answer_within = seconds(request.timeout_ms, DEFAULT_ANSWER_SECONDS)
    drain_timeout = seconds(request.drain_timeout_ms, answer_within / 2)
    provider_id = request.provider_id
    action = request.action

    async def run() -> ActionOutcome:
        if action == pb.PROVIDER_ACTION_RESTART:
            return await restart(supervisor, provider_id, request.drain, drain_timeout, answer_within)
        if action == pb.PROVIDER_ACTION_STOP:
            return await stop(supervisor, provider_id, request.drain, drain_timeout, answer_within)
        if action == pb.PROVIDER_ACTION_START:
            return await start(supervisor, provider_id, answer_within)
        if action == pb.PROVIDER_ACTION_LOGS:
            wanted = request.max_log_bytes or DEFAULT_LOG_ANSWER_BYTES
            return logs(supervisor, provider_id, min(wanted, MAX_LOG_ANSWER_BYTES))
        return ActionOutcome(False, f"unknown provider action {action}")

    def answered(outcome: ActionOutcome) -> pb.NodeProviderCommandResponse:
        response = pb.NodeProviderCommandResponse(
            ok=outcome.ok,
            reason=outcome.reason,
            log_text=outcome.log_text,
            log_lines=outcome.log_lines,
            drained_requests=outcome.drained_requests,
            cut_requests=outcome.cut_requests,
        )
        if outcome.launch is not None:
            response.launch.CopyFrom(outcome.launch)
        return response

    def refused(failure: Failure) -> pb.NodeProviderCommandResponse:
        failure.trap(NotLaunched)
        return pb.NodeProviderCommandResponse(ok=False, reason=str(failure.value))

    return Deferred.fromCoroutine(run()).addCallbacks(answered, refused)


async def restart(
    supervisor: EngineSupervisor, provider_id: str, drain: bool, drain_timeout: float, answer_within: float
) -> ActionOutcome:
    """Drain (if asked), stop, start and wait (up to ``answer_within`` in all) until ready."""
    engine = supervisor.commanded(provider_id)
    started = supervisor.clock.seconds()
    in_flight, cut = await _drain(supervisor, engine, drain, drain_timeout, "restart asked")
    engine.act(engine.lifecycle.restart(supervisor.clock.seconds(), "restart asked (provider.restart)"))
    return await _until_ready(supervisor, engine, started, answer_within, in_flight, cut)


async def start(supervisor: EngineSupervisor, provider_id: str, answer_within: float) -> ActionOutcome:
    """Start (also a failed or stopped engine) and wait until ready."""
    engine = supervisor.commanded(provider_id)
    started = supervisor.clock.seconds()
    engine.act(engine.lifecycle.start(started, "started by provider.start"))
    return await _until_ready(supervisor, engine, started, answer_within, 0, 0)


async def stop(
    supervisor: EngineSupervisor, provider_id: str, drain: bool, drain_timeout: float, answer_within: float
) -> ActionOutcome:
    """Drain (if asked), then stop; it stays stopped until started."""
    engine = supervisor.commanded(provider_id)
    clock = supervisor.clock
    started = clock.seconds()
    in_flight, cut = await _drain(supervisor, engine, drain, drain_timeout, "stop asked")
    engine.act(engine.lifecycle.stop(clock.seconds(), "stopped by provider.stop"))
    left = max(0.0, answer_within - (clock.seconds() - started))
    stopped = await engine.wait_for(lambda: not engine.lifecycle.running, left)
    reason = "stopped" if stopped else f"still {engine.lifecycle.state.value} when the answer was due"
    return ActionOutcome(stopped, reason, engine.report(), in_flight, cut)


def logs(supervisor: EngineSupervisor, provider_id: str, max_bytes: int) -> ActionOutcome:
    """The last lines of the engine's output, at most ``max_bytes`` bytes."""
    engine = supervisor.commanded(provider_id)
    lines = engine.tail.last(max_bytes)
    text = "".join(line.text + "\n" for line in lines)
    return ActionOutcome(True, "", engine.report(), log_text=text, log_lines=len(lines))


async def _drain(
    supervisor: EngineSupervisor, engine: LaunchedEngine, drain: bool, timeout: float, what: str
) -> tuple[int, int]:
    """Drain ``engine`` if asked and it is ready; (requests in flight at the start, still running at the end)."""
    provider_id = engine.provider_id
    running_on = supervisor.running_on
    in_flight = running_on(provider_id)
    if not drain:
        return in_flight, in_flight
    if not engine.lifecycle.drain(supervisor.clock.seconds(), f"{what}: waiting for {in_flight} requests in flight"):
        return in_flight, in_flight
    engine.act([])
    await wait_until(
        supervisor.clock,
        lambda: running_on(provider_id) == 0 or engine.lifecycle.state is not EngineState.DRAINING,
        timeout,
    )
    left = running_on(provider_id)
    if left:
        _log.warn(
            "provider {provider_id}: {count} requests still running after the {seconds:g}s drain; cutting them off",
            provider_id=provider_id,
            count=left,
            seconds=timeout,
        )
    return in_flight, left


async def _until_ready(
    supervisor: EngineSupervisor, engine: LaunchedEngine, started: float, answer_within: float, in_flight: int, cut: int
) -> ActionOutcome:
    left = max(0.0, answer_within - (supervisor.clock.seconds() - started))
    lifecycle = engine.lifecycle
    await engine.wait_for(lambda: lifecycle.state in (EngineState.READY, EngineState.FAILED), left)
    took = supervisor.clock.seconds() - started
    if lifecycle.state is EngineState.READY:
        return ActionOutcome(True, f"ready after {took:.1f}s", engine.report(), in_flight, cut)
    if lifecycle.state is EngineState.FAILED:
        return ActionOutcome(False, f"failed: {lifecycle.reason}", engine.report(), in_flight, cut)
    return ActionOutcome(
        False,
        f"not ready when the answer was due ({lifecycle.state.value}: {lifecycle.reason}); it goes on starting",
        engine.report(),
        in_flight,
        cut,
    )
