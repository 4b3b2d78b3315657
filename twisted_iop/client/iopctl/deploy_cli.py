"""``iopctl deploy``: deployments, their placement and their rollout.

::

    iopctl deploy apply -f FILE [--dry-run]   create or replace the deployment FILE describes
    iopctl deploy list                        every deployment: model, profile, edges, ready of desired
    iopctl deploy show NAME [--state S]       one deployment: spec, rollup, each edge's instances
    iopctl deploy status NAME [--watch]       the rollup as a progress bar (--watch: until ready)
    iopctl deploy delete NAME                 delete it: its instances stop everywhere
    iopctl deploy pause NAME                  pause its roll: no further edge is reached
    iopctl deploy resume NAME                 resume its paused roll
    iopctl deploy cancel NAME                 end its roll: the edges not reached keep the previous spec

FILE is YAML or JSON: the deployment's ``name`` and its spec (``model``,
``profile``, ``parameters``, ``edge_selector`` ... as ``PUT
/deployments/{name}`` takes them). ``status --watch`` redraws until every
edge the deployment wants is ready (exit 0), or until interrupted or
``--timeout`` passes (exit 1). ``--json`` prints the views as the Control
Plane answered them. This module builds on :mod:`twisted_iop.client.cli`,
which imports it when it builds its parser and runs this command.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from twisted_iop.client.deployments import Deployment, DeploymentDryRun
from twisted_iop.client.iopctl import deployment_render
from twisted_iop.client.iopctl.cli_base import (
    EXIT_ERROR,
    EXIT_OK,
    REDRAW,
    Console,
    UsageError,
    WatchPause,
    add_watch_options,
    is_terminal,
    polling_interval,
)
from twisted_iop.client.models import to_json

#: How long ``status --watch`` waits for ready by default.
WATCH_TIMEOUT_SECONDS = 600.0
#: The largest deployment file read.
MAX_FILE_BYTES = 1024 * 1024
#: The moves of a deployment's roll, and what each does.
MOVES = {
    "pause": "pause the deployment's roll: no further edge is reached (the reached ones keep converging)",
    "resume": "resume the deployment's paused roll",
    "cancel": "end the deployment's roll: the edges not reached keep the previous generation's spec",
}


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError("must be above 0 and at most 86400")
    return value


def add_parser(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the ``deploy`` actions to ``parser`` (the ``deploy`` subcommand's)."""
    sub = parser.add_subparsers(dest="deploy_action", metavar="ACTION", required=True, parser_class=type(parser))

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    p = add("apply", "create or replace the deployment a YAML or JSON file describes (its name and spec)")
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="the deployment file ('-': standard input)")
    p.add_argument(
        "--dry-run", action="store_true", help="show what would start, restart, stay or stop; change nothing"
    )
    add("list", "every deployment: model, profile, edges, ready of desired")
    p = add("show", "one deployment: its spec, rollup and each edge's instances")
    p.add_argument("name", metavar="NAME", help="the deployment's name")
    p.add_argument("--state", default=None, metavar="S", help="only edges in these states (comma-separated)")
    p = add("status", "the deployment's rollup as a progress bar")
    p.add_argument("name", metavar="NAME", help="the deployment's name")
    add_watch_options(p, "redraw until every edge is ready; exit 0 when it is")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=WATCH_TIMEOUT_SECONDS,
        metavar="S",
        help=f"give up watching after this many seconds (default {WATCH_TIMEOUT_SECONDS:g})",
    )
    p = add("delete", "delete a deployment: its instances stop everywhere")
    p.add_argument("name", metavar="NAME", help="the deployment's name")
    for move, help_text in MOVES.items():
        p = add(move, help_text)
        p.add_argument("name", metavar="NAME", help="the deployment's name")


def read_file(path: str, stdin: Any = None) -> tuple[str, dict[str, Any]]:
    """The name and spec a deployment file holds; raises :class:`UsageError` naming what is wrong."""
    try:
        if path == "-":
            import sys

            text = (stdin or sys.stdin).read(MAX_FILE_BYTES + 1)
        else:
            with Path(path).open(encoding="utf-8") as file:
                text = file.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror or e}") from None
    if len(text) > MAX_FILE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not YAML or JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(document, dict):
        raise UsageError(f"{path}: must hold one object with the deployment's name and spec")
    spec = {str(k): v for k, v in document.items()}
    name = spec.pop("name", None)
    if not isinstance(name, str) or not name:
        raise UsageError(f"{path}: field 'name' is required: the deployment's name")
    return name, spec


async def dispatch(
    reactor: IReactorTime,
    args: argparse.Namespace,
    repository: Any,
    console: Console,
    interrupted: Optional[Deferred[None]] = None,
) -> int:
    """Run one ``iopctl deploy`` action; answers the exit code (server errors propagate)."""
    action = args.deploy_action
    if action == "apply":
        name, spec = read_file(args.file)
        answer = await repository.apply_deployment(name, spec, dry_run=args.dry_run)
        if isinstance(answer, DeploymentDryRun):
            console.result(answer, deployment_render.render_dry_run)
        else:
            console.result(answer, _applied)
    elif action == "list":
        console.result(await repository.deployments(), deployment_render.render_deployments)
    elif action == "show":
        console.result(await repository.deployment(args.name, state=args.state), deployment_render.render_deployment)
    elif action == "status":
        deployment = await repository.deployment(args.name, limit=1)
        if not args.watch:
            console.result(deployment, deployment_render.status_line)
            return EXIT_OK
        return await watch(reactor, repository, deployment, console, args.interval, args.timeout, interrupted)
    elif action in MOVES:
        moves = {
            "pause": repository.pause_deployment,
            "resume": repository.resume_deployment,
            "cancel": repository.cancel_deployment,
        }
        console.result(await moves[action](args.name), deployment_render.status_line)
    else:
        console.result(await repository.delete_deployment(args.name), deployment_render.render_deleted)
    return EXIT_OK


def _applied(deployment: Deployment) -> str:
    verb = "unchanged" if deployment.changed is False else "applied"
    return f"{deployment.name} {verb}: generation {deployment.generation}, spec hash {deployment.spec_hash}"


async def watch(
    reactor: IReactorTime,
    repository: Any,
    deployment: Deployment,
    console: Console,
    interval: Optional[float] = None,
    timeout: float = WATCH_TIMEOUT_SECONDS,
    interrupted: Optional[Deferred[None]] = None,
) -> int:
    """Redraw the deployment's status until every edge it wants is ready (0), or until
    interrupted or ``timeout`` seconds passed (1)."""
    terminal = is_terminal(console.out) and not console.as_json
    interval = polling_interval(interval, terminal)
    pause = WatchPause(reactor, interrupted)
    deadline = reactor.seconds() + timeout
    while True:
        if console.as_json:
            console.json(to_json(deployment), compact=True)
        elif terminal:
            console.out.write(REDRAW + deployment_render.status_line(deployment))
            console.out.flush()
        else:
            console.line(deployment_render.status_line(deployment))
        if deployment.rollup.done:
            break
        left = deadline - reactor.seconds()
        if left <= 0 or pause.interrupted:
            if terminal:
                console.line("")
            why = "interrupted" if pause.interrupted else f"not ready after {timeout:g} s"
            console.error("not_ready", f"stopped watching ({why}); {deployment_render.status_line(deployment)}")
            return EXIT_ERROR
        await pause.wait(min(interval, left))
        deployment = await repository.deployment(deployment.name, limit=1)
    if terminal:
        console.line("")
    return EXIT_OK
