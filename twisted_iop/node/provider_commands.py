"""The Edge's ``provider.*`` commands, as the Node runs and answers them.

A ``NodeProviderCommandRequest`` from the node wire becomes one call on
the :class:`~twisted_iop.node.supervisor.EngineSupervisor` (restart,
stop, start, logs) and its outcome one ``NodeProviderCommandResponse``.
Every value from the Edge is checked here: an unknown action is refused,
times and the log answer are bounded.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from twisted_iop.node.supervisor import ActionOutcome, EngineSupervisor, NotLaunched
from twisted_iop.wire import control_pb2 as pb

#: A provider command's answer is due after this long when the Edge gives no time.
DEFAULT_ANSWER_SECONDS = 10.0
#: The longest a provider command may run before its answer, and the longest drain.
MAX_COMMAND_SECONDS = 3600.0
#: Bytes of output ``provider.logs`` returns unless asked for fewer.
DEFAULT_LOG_ANSWER_BYTES = 16 * 1024
#: The most bytes of output one ``provider.logs`` answer carries.
MAX_LOG_ANSWER_BYTES = 64 * 1024


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
            return await supervisor.restart(provider_id, request.drain, drain_timeout, answer_within)
        if action == pb.PROVIDER_ACTION_STOP:
            return await supervisor.stop(provider_id, request.drain, drain_timeout, answer_within)
        if action == pb.PROVIDER_ACTION_START:
            return await supervisor.start(provider_id, answer_within)
        if action == pb.PROVIDER_ACTION_LOGS:
            wanted = request.max_log_bytes or DEFAULT_LOG_ANSWER_BYTES
            return supervisor.logs(provider_id, min(wanted, MAX_LOG_ANSWER_BYTES))
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
