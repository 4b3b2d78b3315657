"""``iopctl``: the operator CLI of the Control Plane.

::

    iopctl [--url URL] [--wire-url URL] [--token T] [--json] COMMAND ...

    edges [-l SEL] [--state S] [--q TEXT]   list known edges (filtered)
    edge ID                   one edge: connection, buffers
    status ID                 fresh status: per-node and per-provider rows
    fleet [-l SEL] [--state S] [--q TEXT]   fleet status: totals and one row per edge
    events ID [--since N] [--limit N] [--follow]
    operations ID [--limit N]
    operation ID OPERATION_ID
    commands ID               the edge's command catalog
    command ID NAME [--target T] [--arg k=v ...] [--timeout S] [--idempotency-key K]
    hello                     say hello on the WebSocket wire
    completion bash|zsh       print a shell completion script
    rollout create|list|show|pause|resume|cancel ...   staged rollouts (iopctl rollout -h)
    slo list|show NAME        SLOs: error budgets, burn rates and alerts
    deploy apply -f FILE [--dry-run] | list | show NAME | status NAME [--watch] | delete NAME
           | pause NAME | resume NAME | cancel NAME
                              deployments: which model runs where, and whether it got there
    history [EDGE] [--since 2h] [--step S] [--model M] [-l SEL] [--series F,...|--latency] [--sparklines|--table]

Exit codes: 0 ok, 1 the server answered an error (or a command did not
succeed), 2 usage error, 3 the Control Plane cannot be reached. Errors are
one line on stderr (``iopctl: <code>: <message>``), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, Optional, TextIO

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.task import react

from twisted_iop import __version__
from twisted_iop.client.errors import (
    ControlPlaneError,
    ControlPlaneUnreachable,
    EdgeNotConnectedError,
    HelloRejected,
    InvalidResponse,
    OperationError,
    WireClientError,
    WireRequestError,
)
from twisted_iop.client.iopctl import completion, deploy_cli, history_cli, render, rollout_cli, slo_cli
from twisted_iop.client.iopctl.cli_base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Console,
    UsageError,
    add_argument_option,
)
from twisted_iop.client.iopctl.cli_base import ArgumentParser as _ArgumentParser
from twisted_iop.client.iopctl.cli_base import command_timeout as _command_timeout
from twisted_iop.client.iopctl.cli_base import non_negative_int as _non_negative_int
from twisted_iop.client.iopctl.cli_base import page_limit as _limit
from twisted_iop.client.model_json import to_json
from twisted_iop.client.repository import API_TOKEN_ENV, ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient, EventSubscription, event_from_wire
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.wire import control_pb2 as pb

#: The ``--state`` values of ``iopctl edges`` and ``iopctl fleet`` (docs/http-api.md#filters).
EDGE_STATES = ("connected", "disconnected")
FLEET_STATES = ("connected", "disconnected", "ok", "error", "timeout")

RepositoryFactory = Callable[[argparse.Namespace], Any]
WireFactory = Callable[[argparse.Namespace], Any]


def _global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Options valid before and after the subcommand.

    On subcommand parsers their defaults are suppressed so a value given
    before the subcommand is not overwritten by the subparser's default.
    """
    default: Any = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--url",
        metavar="URL",
        default=default,
        help="Control Plane HTTP base URL (default: $IOP_CONTROL_PLANE_HTTP_URL or http://127.0.0.1:8080)",
    )
    parser.add_argument(
        "--wire-url",
        metavar="URL",
        default=default,
        help="Control Plane client WebSocket URL (default: $IOP_CONTROL_PLANE_WIRE_URL or ws://127.0.0.1:8081/client)",
    )
    parser.add_argument(
        "--token",
        metavar="TOKEN",
        default=default,
        help=f"HTTP API token (default: ${API_TOKEN_ENV})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print JSON for scripts instead of tables",
    )


def _filter_options(parser: argparse.ArgumentParser, states: tuple[str, ...]) -> None:
    """``-l/--selector``, ``--state`` and ``--q`` of the filtered views."""
    parser.add_argument(
        "-l",
        "--selector",
        default=None,
        metavar="SEL",
        help="only edges whose labels match this selector, e.g. 'region=eu,tier!=canary,gpu in (h100,a100),!legacy'",
    )
    completion.offer(
        parser.add_argument(
            "--state",
            default=None,
            metavar="STATE",
            help=f"only edges in one of these states (comma-separated: {', '.join(states)})",
        ),
        states,
    )
    parser.add_argument("--q", default=None, metavar="TEXT", help="only edges whose id contains TEXT (any case)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``iopctl``."""
    parser = _ArgumentParser(
        prog="iopctl",
        description="Operate a twisted-iop Control Plane: edges, status, events, operations, commands.",
        epilog="exit codes: 0 ok, 1 the server answered an error, 2 usage error, 3 Control Plane unreachable",
    )
    parser.add_argument("--version", action="version", version=f"iopctl {__version__}")
    _global_options(parser, suppress=False)
    common = _ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_ArgumentParser)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    p = add("edges", "list the known edges")
    _filter_options(p, EDGE_STATES)
    p = add("edge", "show one edge: connection and buffers")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p = add("status", "ask an edge for its status: nodes and providers")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p = add("fleet", "fleet status: totals and one row per edge")
    _filter_options(p, FLEET_STATES)
    p = add("events", "an edge's recorded events (or follow them live)")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p.add_argument("--since", type=_non_negative_int, default=None, metavar="N", help="events after sequence N")
    p.add_argument("--limit", type=_limit, default=None, metavar="N", help="at most N events (1..1000)")
    p.add_argument(
        "--follow", "-f", action="store_true", help="print events live as they arrive (WebSocket) until Ctrl-C"
    )
    p = add("operations", "an edge's command operations, newest first")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p.add_argument("--limit", type=_limit, default=None, metavar="N", help="at most N operations (1..1000)")
    p = add("operation", "one operation with its result and history")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p.add_argument("operation_id", metavar="OPERATION_ID", help="operation id")
    p = add("commands", "the commands an edge offers")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p = add("command", "run a command on an edge and wait for its outcome")
    p.add_argument("edge_id", metavar="ID", help="edge id")
    p.add_argument("name", metavar="NAME", help="command name, e.g. node.drain (see: iopctl commands ID)")
    p.add_argument("--target", default=None, metavar="T", help="the node (or other target) to act on")
    add_argument_option(p)
    p.add_argument(
        "--timeout", type=_command_timeout, default=None, metavar="S", help="seconds the edge may take (max 300)"
    )
    p.add_argument("--idempotency-key", default=None, metavar="K", help="run at most once for this key")
    add("hello", "say hello on the client WebSocket and show the server's answer")
    add("health", "is the Control Plane ready: listeners, the store (writing or not), cluster mode")
    p = add("completion", "print a shell completion script (bash or zsh)")
    p.add_argument("shell", choices=completion.SHELLS, metavar="SHELL", help="bash or zsh")
    rollout_cli.add_parser(add("rollout", "staged rollouts of one command to many edges"), common)
    history_cli.add_parser(add("history", "capacity over time: the fleet's or one edge's, as sparklines or a table"))
    slo_cli.add_parser(add("slo", "SLOs: their error budgets, burn rates and alerts"), common)
    deploy_cli.add_parser(add("deploy", "deployments: which model runs where, and whether the fleet got there"), common)
    return parser


def parse_arguments(argv: Sequence[str]) -> argparse.Namespace:
    """Parse ``argv``; raises :class:`UsageError` with argparse's message."""
    args = build_parser().parse_args(list(argv))
    for name, default in (("url", None), ("wire_url", None), ("token", None), ("json", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    return args


def default_repository(args: argparse.Namespace) -> ControlPlaneStatusRepository:
    """The repository for the parsed options (token from the environment if not given)."""
    import os

    token = args.token or os.environ.get(API_TOKEN_ENV) or None
    return ControlPlaneStatusRepository(base_url=args.url, api_token=token)


def default_wire_client(reactor: Reactor) -> WireFactory:
    """A factory of wire clients on ``reactor`` for the parsed options."""
    import os

    def make(args: argparse.Namespace) -> ClientWireClient:
        token = args.token or os.environ.get(API_TOKEN_ENV) or None
        return ClientWireClient(
            url=args.wire_url, reactor=reactor, api_token=token, client_name=f"iopctl/{__version__}"
        )

    return make


async def run(
    reactor: Reactor,
    args: argparse.Namespace,
    repository: Any,
    wire_factory: WireFactory,
    out: TextIO,
    err: TextIO,
    interrupted: Optional[Deferred[None]] = None,
) -> int:
    """Run one parsed command; answers the exit code and never raises.

    ``interrupted`` ends ``events --follow`` when it fires (Ctrl-C in
    :func:`main`; tests fire it themselves).
    """
    console = Console(out, err, bool(args.json))
    try:
        return await _dispatch(reactor, args, repository, wire_factory, console, interrupted)
    except ControlPlaneUnreachable as e:
        console.note(str(e))
        return EXIT_UNREACHABLE
    except EdgeNotConnectedError as e:
        if console.as_json:
            console.json(dict(e.body))
        elif e.snapshot is not None:
            console.line(render.render_status(e.snapshot))
        console.error(e.code, e.message)
        return EXIT_ERROR
    except OperationError as e:
        if console.as_json:
            console.json(dict(e.body))
        elif e.operation is not None:
            console.line(render.render_operation(attrs.evolve(e.operation, replayed=e.replayed)))
        console.error(e.code, e.message)
        return EXIT_ERROR
    except ControlPlaneError as e:
        if console.as_json:
            console.json(dict(e.body) or {"error": {"code": e.code, "message": e.message, "status": e.status}})
        console.error(e.code, e.message)
        return EXIT_ERROR
    except InvalidResponse as e:
        console.error(InvalidResponse.code, e.message)
        return EXIT_ERROR
    except HelloRejected as e:
        console.error("hello_rejected", e.reason)
        return EXIT_ERROR
    except WireRequestError as e:
        console.error(e.code, e.message)
        return EXIT_ERROR
    except WireClientError as e:
        console.error("wire_error", str(e))
        return EXIT_ERROR
    except UsageError as e:
        # Found after parsing (a deployment file that cannot be read).
        console.error("usage", e.message)
        return EXIT_USAGE
    except Exception as e:
        console.error("internal_error", f"{e.__class__.__name__}: {e}")
        return EXIT_ERROR


async def _dispatch(
    reactor: Reactor,
    args: argparse.Namespace,
    repository: Any,
    wire_factory: WireFactory,
    console: Console,
    interrupted: Optional[Deferred[None]],
) -> int:
    command = args.command
    if command == "edges":
        edges = await repository.all_edges(selector=args.selector, state=args.state, q=args.q)
        console.result(edges, render.render_edges)
    elif command == "edge":
        console.result(await repository.edge(args.edge_id), render.render_edge)
    elif command == "status":
        console.result(await repository.edge_status(args.edge_id), render.render_status)
    elif command == "fleet":
        fleet = await repository.full_fleet_status(selector=args.selector, state=args.state, q=args.q)
        console.result(fleet, render.render_fleet)
    elif command == "events":
        if args.follow:
            return await _follow(args, wire_factory, console, interrupted)
        page = await repository.events(args.edge_id, since=args.since or 0, limit=args.limit)
        console.result(page, render.render_events)
    elif command == "operations":
        console.result(await repository.operations(args.edge_id, limit=args.limit), render.render_operations)
    elif command == "operation":
        console.result(await repository.operation(args.edge_id, args.operation_id), render.render_operation)
    elif command == "commands":
        console.result(await repository.commands(args.edge_id), render.render_commands)
    elif command == "command":
        operation = await repository.send_command(
            args.edge_id,
            args.name,
            target=args.target,
            arguments=dict(args.arguments),
            timeout_seconds=args.timeout,
            idempotency_key=args.idempotency_key,
        )
        console.result(operation, render.render_operation)
        if operation.state != "succeeded":
            console.error(operation.state, operation.reason or f"the command ended {operation.state}")
            return EXIT_ERROR
    elif command == "hello":
        return await _hello(args, wire_factory, console)
    elif command == "health":
        readiness = await repository.readyz()
        console.result(readiness, render.render_readiness)
        if not readiness.ready:
            store = readiness.store
            reason = (
                f"the store cannot write: {store.error}"
                if store is not None and not store.writable
                else "the Control Plane is not ready (see above)"
            )
            console.error("not_ready", reason)
            return EXIT_ERROR
    elif command == "completion":
        console.out.write(completion.script(build_parser(), args.shell))
        console.out.flush()
    elif command == "rollout":
        return await rollout_cli.dispatch(reactor, args, repository, console, interrupted)
    elif command == "history":
        return await history_cli.dispatch(args, repository, console)
    elif command == "slo":
        return await slo_cli.dispatch(args, repository, console)
    elif command == "deploy":
        return await deploy_cli.dispatch(reactor, args, repository, console, interrupted)
    else:  # pragma: no cover - argparse only lets known commands through
        raise UsageError(f"unknown command {command!r}")
    return EXIT_OK


async def _hello(args: argparse.Namespace, wire_factory: WireFactory, console: Console) -> int:
    client = wire_factory(args)
    try:
        response = await client.hello()
    finally:
        await client.close()
    document = {
        "url": client.url,
        "accepted": response.accepted,
        "reason": response.reason,
        "server_version": response.server_version,
        "protocol": f"{response.protocol_major}.{response.protocol_minor}",
        "features": list(response.features),
    }
    if console.as_json:
        console.json(document)
    else:
        width = max(len(k) for k in document)
        for key, value in document.items():
            if key == "reason" and not value:
                continue
            shown = (
                ", ".join(value)
                if isinstance(value, list)
                else ("yes" if value is True else "no" if value is False else value)
            )
            console.line(f"{key.replace('_', ' ').ljust(width)}  {shown or '-'}")
    if not response.accepted:
        console.error("hello_rejected", response.reason or "no reason given")
        return EXIT_ERROR
    return EXIT_OK


async def _follow(
    args: argparse.Namespace,
    wire_factory: WireFactory,
    console: Console,
    interrupted: Optional[Deferred[None]],
) -> int:
    """Print an edge's events live until interrupted or the subscription fails."""
    client = wire_factory(args)
    finished: Deferred[int] = Deferred()

    def on_event(event: pb.FleetEvent) -> None:
        model = event_from_wire(event)
        if console.as_json:
            console.json(to_json(model), compact=True)
        else:
            console.line(render.event_line(model))

    def on_lost(lost: pb.EventsLost) -> None:
        if console.as_json:
            console.json(
                {
                    "events_lost": {
                        "count": lost.count,
                        "first_sequence": lost.first_sequence,
                        "last_sequence": lost.last_sequence,
                        "reason": lost.reason,
                    }
                },
                compact=True,
            )
        else:
            console.line(
                f"-- {lost.count} events lost (sequences {lost.first_sequence}..{lost.last_sequence}, {lost.reason}) --"
            )

    def on_state(state: str, detail: str) -> None:
        if state == "disconnected":
            console.note(f"connection lost ({detail}); reconnecting")
        elif state == "resumed":
            console.note(f"reconnected, resuming {detail}")

    subscription: EventSubscription = await client.subscribe(
        edge_id=args.edge_id, since=args.since, on_event=on_event, on_lost=on_lost, on_state=on_state
    )
    if not console.as_json:
        console.note(f"following events of {args.edge_id} (Ctrl-C to stop)")

    def ended(_: object) -> None:
        if not finished.called:
            finished.callback(EXIT_OK)

    def failed(failure: Any) -> None:
        if not finished.called:
            finished.errback(failure)

    subscription.done.addCallbacks(ended, failed)
    if interrupted is not None:
        interrupted.addBoth(ended)
    try:
        return await finished
    finally:
        await client.close()


def main(argv: Optional[Sequence[str]] = None) -> None:
    """The ``iopctl`` console script."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_arguments(arguments)
    except UsageError as e:
        sys.stderr.write(e.usage)
        sys.stderr.write(f"iopctl: error: {e.message}\n")
        sys.exit(EXIT_USAGE)

    async def start(reactor: Reactor) -> None:
        interrupted: Deferred[None] = Deferred()
        running: Deferred[int] = Deferred.fromCoroutine(
            run(
                reactor,
                args,
                default_repository(args),
                default_wire_client(reactor),
                sys.stdout,
                sys.stderr,
                interrupted,
            )
        )

        def before_shutdown() -> Deferred[Any]:
            # Ctrl-C: end --follow cleanly (unsubscribe, close) before the reactor stops.
            if not interrupted.called:
                interrupted.callback(None)
            return running

        reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
        code = await running
        raise SystemExit(code)

    react(start)
