"""``iopctl slo``: the SLOs, their error budgets and alerts.

::

    iopctl slo list          every SLO: objective, value, budget left, alerts firing
    iopctl slo show NAME     one SLO: figures, burn rate per window, each alert

``--json`` prints the view as the Control Plane answered it. This module
builds on :mod:`twisted_iop.client.cli`, which imports it when it builds
its parser and runs this command.
"""

from __future__ import annotations

import argparse
from typing import Any

from twisted_iop.client.iopctl import slo_render
from twisted_iop.client.iopctl.cli_base import EXIT_OK, Console


def add_parser(parser: argparse.ArgumentParser, common: argparse.ArgumentParser) -> None:
    """Add the ``slo`` actions to ``parser`` (the ``slo`` subcommand's)."""
    sub = parser.add_subparsers(dest="slo_action", metavar="ACTION", required=True, parser_class=type(parser))

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, parents=[common])

    add("list", "every SLO: objective, value over the window, error budget left, alerts firing")
    p = add("show", "one SLO: its figures, the burn rate per window and each alert")
    p.add_argument("name", metavar="NAME", help="the SLO's name")


async def dispatch(args: argparse.Namespace, repository: Any, console: Console) -> int:
    """Run one ``iopctl slo`` action; answers the exit code (server errors propagate)."""
    if args.slo_action == "list":
        console.result(await repository.slos(), slo_render.render_slos)
    else:
        console.result(await repository.slo(args.name), slo_render.render_slo)
    return EXIT_OK
