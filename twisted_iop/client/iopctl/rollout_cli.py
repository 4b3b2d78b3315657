"""``iopctl rollout``: staged rollouts of one command to many edges.

::

    iopctl rollout create --command NAME -l SELECTOR [--target NODE | --node-selector SEL]
                          [--arg k=v ...] [--batch-size N | --batch-percent P] [--max-in-flight N]
                          [--pause S] [--increase-factor F]
                          [--abort-percent P [--min-executed N] | --abort-on-any-failure]
                          [--abort-on-latency METRIC:P[:N]]
                          [--timeout S] [--skip-disconnected | --wait-seconds S]
                          [--idempotency-key K] [--watch [--interval S]]
    iopctl rollout list [--limit N]
    iopctl rollout show ID [--executions [--state S]] [--watch [--interval S]]
    iopctl rollout pause|resume|cancel ID

``--watch`` polls ``GET /rollouts/{id}`` until the rollout ends: on a
terminal it redraws one line (a progress bar and the counts) in place;
otherwise (a pipe, a log) it prints one plain line per poll; with
``--json`` one compact document per poll. It exits 0 when the rollout
succeeded and 1 when it failed, was aborted or cancelled (or the watch was
interrupted). Server errors (400 ``invalid_selector``, 404
``unknown_rollout``, 409 ``invalid_transition`` ...) are reported by
:func:`twisted_iop.client.cli.run` as every other error: one line with the
server's code and message, exit 1.

This module builds on :mod:`twisted_iop.client.cli`, which imports it only
when it builds its parser or runs this command.
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from twisted_iop.client.iopctl import rollout_render
from twisted_iop.client.iopctl.cli_base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    REDRAW,
    Console,
    WatchPause,
    add_argument_option,
    add_watch_options,
    is_terminal,
    polling_interval,
)
from twisted_iop.client.iopctl.cli_base import ArgumentParser as _ArgumentParser
from twisted_iop.client.iopctl.cli_base import command_timeout as _command_timeout
from twisted_iop.client.iopctl.cli_base import page_limit as _limit
from twisted_iop.client.models import to_json
from twisted_iop.client.rollouts import (
    Rollout,
    RolloutAbort,
    RolloutCommand,
    RolloutLatency,
    RolloutRequest,
    RolloutStrategy,
)
from twisted_iop.label_selectors import SelectorError, parse_selector

#: Seconds between polls of ``--watch`` on a terminal, and otherwise.
#: The longest ``--interval`` accepted.
MAX_WATCH_INTERVAL_SECONDS = 3600.0
#: How many rollouts ``list`` shows without ``--limit``.
DEFAULT_LIST_LIMIT = 50
#: Erase the terminal line and go back to its start (redrawn in place).


def _selector(text: str) -> str:
    """A selector checked here, so a typo is a usage error naming its position."""
    try:
        parse_selector(text)
    except SelectorError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _number(text: str, kind: type, what: str) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _positive_int(text: str) -> int:
    value: int = _number(text, int, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _non_negative_int(text: str) -> int:
    value: int = _number(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _percent(text: str) -> float:
    value: float = _number(text, float, "a percentage")
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 100, not {value:g}")
    return value


#: The figures ``--abort-on-latency`` takes.
LATENCY_METRICS = ("ttft_p95", "tpot_p95", "duration_p95")


def _latency(text: str) -> RolloutLatency:
    """``ttft_p95:20`` or ``ttft_p95:20:100``."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in LATENCY_METRICS:
        raise argparse.ArgumentTypeError(
            f"expected METRIC:PERCENT[:REQUESTS] with METRIC one of {', '.join(LATENCY_METRICS)}"
        )
    try:
        percent = float(parts[1])
        requests = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise argparse.ArgumentTypeError("PERCENT must be a number and REQUESTS a whole number") from None
    if percent < 0 or (requests is not None and requests < 1):
        raise argparse.ArgumentTypeError("PERCENT must be >= 0 and REQUESTS >= 1")
    return RolloutLatency(metric=parts[0], max_increase_percent=percent, min_requests=requests)


def _abort_percent(text: str) -> float:
    value: float = _number(text, float, "a percentage")
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, not {value:g}")
    return value


def _seconds(text: str) -> float:
    value: float = _number(text, float, "a number of seconds")
    if not 0 <= value <= MAX_WATCH_INTERVAL_SECONDS:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_WATCH_INTERVAL_SECONDS:g} seconds")
    return value


def _factor(text: str) -> float:
    value: float = _number(text, float, "a number")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more (1: batches do not grow), not {value:g}")
    return value


def _watch_options(parser: argparse.ArgumentParser) -> None:
    add_watch_options(parser, "show progress until the rollout ends; exit 0 only if it succeeded")


def add_parser(parser: argparse.ArgumentParser, common: _ArgumentParser) -> None:
    """Add the ``rollout`` actions to ``parser`` (the ``rollout`` subcommand's);
    ``common`` holds the global options each action also takes."""
    sub = parser.add_subparsers(dest="rollout_action", metavar="ACTION", required=True, parser_class=_ArgumentParser)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    p = add("create", "start a rollout: one command to every edge the selector matches, in batches")
    p.add_argument("--command", dest="name", required=True, metavar="NAME", help="command name, e.g. node.drain")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--target", default=None, metavar="NODE", help="the node (or other target) to act on")
    where.add_argument(
        "--node-selector", type=_selector, default=None, metavar="SEL", help="act on the nodes these labels match"
    )
    add_argument_option(p)
    p.add_argument(
        "-l",
        "--selector",
        type=_selector,
        required=True,
        metavar="SEL",
        help="the edges to run on, by hello labels (region=eu,tier!=canary; '' for every edge)",
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument("--batch-size", type=_positive_int, default=None, metavar="N", help="edges in the first batch")
    size.add_argument(
        "--batch-percent", type=_percent, default=None, metavar="P", help="the first batch as a percentage of targets"
    )
    p.add_argument("--max-in-flight", type=_positive_int, default=None, metavar="N", help="most executions at once")
    p.add_argument("--pause", type=_seconds, default=None, metavar="S", help="seconds to wait between batches")
    p.add_argument(
        "--increase-factor", type=_factor, default=None, metavar="F", help="each batch is F times the one before"
    )
    abort = p.add_mutually_exclusive_group()
    abort.add_argument(
        "--abort-percent",
        type=_abort_percent,
        default=None,
        metavar="P",
        help="abort when more than P%% of the ended executions failed or timed out ...",
    )
    abort.add_argument("--abort-on-any-failure", action="store_true", help="abort at the first failure")
    p.add_argument(
        "--min-executed",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="... once at least N executions ended (with --abort-percent)",
    )
    p.add_argument(
        "--abort-on-latency",
        type=_latency,
        default=None,
        metavar="METRIC:P[:N]",
        help="abort when an executed edge's METRIC (ttft_p95, tpot_p95, duration_p95) rose more than P%% "
        "over N requests after its execution (default 50)",
    )
    p.add_argument(
        "--timeout", type=_command_timeout, default=None, metavar="S", help="seconds each edge may take (max 300)"
    )
    disconnected = p.add_mutually_exclusive_group()
    disconnected.add_argument(
        "--skip-disconnected", action="store_true", help="count an edge that is disconnected at its turn as skipped"
    )
    disconnected.add_argument(
        "--wait-seconds",
        type=_seconds,
        default=None,
        metavar="S",
        help="wait up to S seconds for an edge disconnected at its turn (the default is to wait)",
    )
    p.add_argument("--idempotency-key", default=None, metavar="K", help="start at most one rollout for this key")
    _watch_options(p)

    p = add("list", "the rollouts, newest first")
    p.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIST_LIMIT,
        metavar="N",
        help=f"at most N (default {DEFAULT_LIST_LIMIT})",
    )

    p = add("show", "one rollout: state, counts, progress (or its executions)")
    p.add_argument("rollout_id", metavar="ID", help="rollout id")
    p.add_argument("--executions", action="store_true", help="list its executions, one per target edge")
    p.add_argument("--state", default=None, metavar="S", help="with --executions: only those in state S")
    _watch_options(p)

    for action, text in (
        ("pause", "pause a rollout: no more dispatching until resumed"),
        ("resume", "resume a paused rollout"),
        ("cancel", "cancel a rollout: no more dispatching; executions in flight finish"),
    ):
        p = add(action, text)
        p.add_argument("rollout_id", metavar="ID", help="rollout id")


class _ArgumentsError(Exception):
    """Options that parse one by one but not together."""


def request_from_arguments(args: argparse.Namespace) -> RolloutRequest:
    """The ``POST /rollouts`` body for ``rollout create``'s options."""
    if args.min_executed is not None and args.abort_percent is None:
        raise _ArgumentsError("--min-executed needs --abort-percent")
    return RolloutRequest(
        command=RolloutCommand(
            name=args.name, target=args.target, node_selector=args.node_selector, arguments=dict(args.arguments)
        ),
        selector=args.selector,
        strategy=RolloutStrategy(
            batch_size=args.batch_size,
            batch_percent=args.batch_percent,
            max_in_flight=args.max_in_flight,
            pause_seconds=args.pause,
            increase_factor=args.increase_factor,
        ),
        abort=RolloutAbort(
            failure_percent=args.abort_percent,
            min_executed=args.min_executed,
            any_failure=True if args.abort_on_any_failure else None,
            latency=args.abort_on_latency,
        ),
        timeout_seconds=args.timeout,
        disconnected="skip" if args.skip_disconnected else None,
        wait_seconds=args.wait_seconds,
        idempotency_key=args.idempotency_key,
    )


async def dispatch(
    reactor: IReactorTime,
    args: argparse.Namespace,
    repository: Any,
    console: Console,
    interrupted: Optional[Deferred[None]] = None,
) -> int:
    """Run one ``iopctl rollout`` action; answers the exit code.

    Server and connection errors propagate to :func:`twisted_iop.client.cli.run`.
    """
    action = args.rollout_action
    if action == "create":
        try:
            request = request_from_arguments(args)
        except _ArgumentsError as e:
            console.note(f"error: {e}")
            return EXIT_USAGE
        rollout = await repository.create_rollout(request)
        if not args.watch:
            console.result(rollout, rollout_render.render_rollout)
            return EXIT_OK
        if not console.as_json:
            console.note(f"rollout {rollout.rollout_id} created: {rollout.targets} target edges")
        return await watch(reactor, repository, rollout, console, args.interval, interrupted)
    if action == "list":
        console.result(await repository.rollouts(limit=args.limit), rollout_render.render_rollouts)
    elif action == "show":
        if args.state is not None and not args.executions:
            console.note("error: --state needs --executions")
            return EXIT_USAGE
        if args.executions:
            page = await repository.all_rollout_executions(args.rollout_id, state=args.state)
            console.result(page, rollout_render.render_executions)
        elif args.watch:
            rollout = await repository.rollout(args.rollout_id)
            return await watch(reactor, repository, rollout, console, args.interval, interrupted)
        else:
            console.result(await repository.rollout(args.rollout_id), rollout_render.render_rollout)
    else:
        change = {
            "pause": repository.pause_rollout,
            "resume": repository.resume_rollout,
            "cancel": repository.cancel_rollout,
        }[action]
        console.result(await change(args.rollout_id), rollout_render.render_rollout)
    return EXIT_OK


async def watch(
    reactor: IReactorTime,
    repository: Any,
    rollout: Rollout,
    console: Console,
    interval: Optional[float] = None,
    interrupted: Optional[Deferred[None]] = None,
) -> int:
    """Show ``rollout``'s progress, polling it every ``interval`` seconds until
    it ends; 0 when it succeeded, 1 when it did not or the watch was interrupted."""
    terminal = is_terminal(console.out) and not console.as_json
    interval = polling_interval(interval, terminal)
    pause = WatchPause(reactor, interrupted)
    while True:
        if console.as_json:
            console.json(to_json(rollout), compact=True)
        elif terminal:
            console.out.write(REDRAW + rollout_render.progress_line(rollout))
            console.out.flush()
        else:
            console.line(rollout_render.progress_line(rollout))
        if rollout.ended:
            break
        await pause.wait(interval)
        if pause.interrupted:
            if terminal:
                console.line("")
            console.note(f"stopped watching; rollout {rollout.rollout_id} is {rollout.state}")
            return EXIT_ERROR
        rollout = await repository.rollout(rollout.rollout_id)
    if terminal:
        console.line("")
    if rollout.state == "succeeded":
        return EXIT_OK
    console.error(rollout.state, rollout.reason or f"the rollout ended {rollout.state}")
    return EXIT_ERROR
