"""``iopctl history``: capacity over time, as a table or as sparklines.

::

    iopctl history [EDGE] [--since 2h] [--until T] [--step S] [--model M]
                   [-l SELECTOR] [--series a,b,... | --latency] [--sparklines | --table]

Without ``EDGE``, the fleet (or, with ``-l``, the matching edges added
up); with it, that edge. ``--since`` is how far back (``2h``, ``30m``,
``7d``) or a time (ISO 8601); ``--until`` the end (default now). On a
terminal it prints one sparkline row per field, elsewhere (a pipe) a
table; ``--sparklines`` / ``--table`` choose; ``--json`` prints the view
as the Control Plane answered it. The fields default to the general and
long-context capacity, in flight and queued; ``--latency`` shows the
latency series instead (TTFT and TPOT p95, requests per second).

This module builds on :mod:`twisted_iop.client.cli`, which imports it
when it builds its parser and runs this command.
"""

from __future__ import annotations

import argparse
import re
import shutil
from typing import Any

from twisted_iop.client.iopctl import history_render
from twisted_iop.client.iopctl.cli_base import EXIT_OK, Console
from twisted_iop.client.models import to_json
from twisted_iop.label_selectors import SelectorError, parse_selector

#: The fields shown when ``--series`` is not given.
DEFAULT_FIELDS = (
    "capacity",
    "in_flight",
    "queued",
    "long_context_capacity",
    "long_context_in_flight",
    "long_context_queued",
)
#: The fields ``--latency`` shows.
LATENCY_FIELDS = ("ttft_p95", "tpot_p95", "requests_per_second")
_AGO = re.compile(r"^\d+(\.\d+)?[smhdw]$")


def _since(text: str) -> str:
    """``2h`` means two hours ago (``-2h``); anything else goes as written."""
    text = text.strip()
    return f"-{text}" if _AGO.match(text) else text


def _selector(text: str) -> str:
    try:
        parse_selector(text)
    except SelectorError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_parser(parser: argparse.ArgumentParser) -> None:
    """The options of ``iopctl history``."""
    parser.add_argument("edge_id", nargs="?", default=None, metavar="EDGE", help="an edge (default: the fleet)")
    parser.add_argument(
        "--since", default="1h", metavar="AGO", help="how far back: 2h, 30m, 7d, or an ISO 8601 time (default 1h)"
    )
    parser.add_argument("--until", default=None, metavar="T", help="the end: a time or how long ago (default now)")
    parser.add_argument("--step", default=None, metavar="S", help="the tier: 15s, 1m, 10m (default: by the range)")
    parser.add_argument("--model", default=None, metavar="M", help="one model's series")
    parser.add_argument(
        "-l", "--selector", type=_selector, default=None, metavar="SEL", help="the fleet: only edges matching SEL"
    )
    fields = parser.add_mutually_exclusive_group()
    fields.add_argument(
        "--series",
        default=None,
        metavar="F1,F2",
        help=f"fields to show (default {','.join(DEFAULT_FIELDS)}; all: capacity, in_flight, tokens_per_second, "
        "ttft_p95 ...)",
    )
    fields.add_argument(
        "--latency",
        action="store_true",
        help=f"the latency series: {', '.join(LATENCY_FIELDS)} (p95s of the Edges' last minute)",
    )
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--sparklines", dest="sparklines", action="store_true", default=None, help="one sparkline row per field"
    )
    shape.add_argument("--table", dest="sparklines", action="store_false", help="one row per point")


async def dispatch(args: argparse.Namespace, repository: Any, console: Console) -> int:
    """Run ``iopctl history``."""
    start = _since(args.since)
    end = _since(args.until) if args.until else None
    series = args.series or ",".join(LATENCY_FIELDS if args.latency else DEFAULT_FIELDS)
    if args.edge_id:
        if args.selector:
            console.note("-l/--selector applies to the fleet view only; it is ignored with an EDGE")
        view = await repository.edge_history(
            args.edge_id, start=start, end=end, step=args.step, series=series, model=args.model
        )
    else:
        view = await repository.fleet_history(
            start=start, end=end, step=args.step, series=series, model=args.model, selector=args.selector
        )
    if console.as_json:
        console.json(to_json(view))
        return EXIT_OK
    sparklines = args.sparklines
    if sparklines is None:
        isatty = getattr(console.out, "isatty", None)
        sparklines = bool(isatty is not None and isatty())
    if sparklines:
        width = shutil.get_terminal_size((100, 24)).columns
        console.line(history_render.render_history_sparklines(view, width))
    else:
        console.line(history_render.render_history_table(view))
    return EXIT_OK
