"""Capacity history for people: a table, or one sparkline row per field.

Both take a :class:`~twisted_iop.client.history.HistoryView` and return
text without a trailing newline. On a rolled-up tier a field's value is
its mean (``mean/max`` in the table). Missing values are ``-`` in the
table and a blank in a sparkline. The latency percentiles (``ttft_p95``,
``tpot_p95``: seconds in the view) are written as ``iopctl status``
writes them (``412ms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from twisted_iop.client.history import HistoryView
from twisted_iop.client.iopctl.render import NONE, render_table, seconds_text, time_text

#: The eight heights of a sparkline, lowest first.
BARS = "▁▂▃▄▅▆▇█"
#: A sparkline's place for a stretch with no value.
GAP = " "


def number_text(value: Optional[float]) -> str:
    """A value as people read it: whole numbers whole, others to two decimals."""
    if value is None:
        return NONE
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}"


#: The fields whose values are durations in seconds.
SECONDS_FIELDS = frozenset(("ttft_p95", "tpot_p95"))


def value_text(field: str, value: Optional[float]) -> str:
    """A value of ``field`` as people read it: a duration as ``412ms``, other figures by :func:`number_text`."""
    if field in SECONDS_FIELDS:
        return seconds_text(value)
    return number_text(value)


def _title(view: HistoryView) -> str:
    what = view.series
    if view.selector:
        what += f" of the {view.edges} edges matching {view.selector}"
    tier = f"every {view.step_seconds:g} s" + (" (mean/max of each step)" if view.rolled_up else "")
    return f"{what}: {len(view.points)} points {tier}, {time_text(view.start)} to {time_text(view.end)} UTC"


def render_history_table(view: HistoryView) -> str:
    """One row per point: its time, then each field (``mean/max`` on a rolled-up tier)."""
    rows: list[list[str]] = []
    for index, when in enumerate(view.times()):
        # Steps under a second (tests, demos) show milliseconds.
        cells = [time_text(when) if view.step_seconds >= 1 else when.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]]
        for field in view.fields:
            if view.rolled_up:
                mean = view.column(f"{field}.mean")[index]
                most = view.column(f"{field}.max")[index]
                cells.append(NONE if mean is None else f"{value_text(field, mean)}/{value_text(field, most)}")
            else:
                cells.append(value_text(field, view.column(field)[index]))
        rows.append(cells)
    table = render_table(["TIME (UTC)", *(f.upper() for f in view.fields)], rows, range(1, 1 + len(view.fields)))
    return f"{_title(view)}\n{table}" if rows else f"{_title(view)}\n(no points in this range)"


def sparkline(
    values: Sequence[Optional[float]],
    width: int,
    times: Optional[Sequence[float]] = None,
    span: Optional[tuple[float, float]] = None,
) -> str:
    """``values`` as at most ``width`` bars from 0 to their largest (each bar
    the largest value of its stretch; a stretch with none is a blank).

    With ``times`` and ``span`` (seconds), each value goes to the bar of its
    time within the span, so a stretch without points is a blank (a gap).
    """
    if not values or width < 1:
        return ""
    if times is not None and span is not None and span[1] > span[0]:
        count = width
        stretches: list[list[float]] = [[] for _ in range(count)]
        start, end = span
        for t, v in zip(times, values, strict=True):
            if v is not None and start <= t <= end:
                stretches[min(count - 1, int((t - start) / (end - start) * count))].append(v)
    else:
        count = min(width, len(values))
        stretches = []
        for i in range(count):
            part = values[i * len(values) // count : (i + 1) * len(values) // count]
            stretches.append([v for v in part if v is not None])
    top = max((max(s) for s in stretches if s), default=0.0)
    out = []
    for stretch in stretches:
        if not stretch:
            out.append(GAP)
        elif top <= 0:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int(max(stretch) / top * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def render_history_sparklines(view: HistoryView, width: int = 80) -> str:
    """One row per field: its name, a sparkline of the range (a bar per
    stretch of time; blank where there are no points), its last, min and max value."""
    name_width = max((len(f) for f in view.fields), default=0)
    figures_width = 34
    line_width = max(10, width - name_width - figures_width - 4)
    lines = [_title(view)]
    times = [float(point[0] or 0) for point in view.points]
    span = (view.start.timestamp(), view.end.timestamp()) if view.start and view.end else None
    for field in view.fields:
        values = view.column(field)
        if view.rolled_up:
            # The bars show each step's max, so a short burst is not averaged away.
            values = view.column(f"{field}.max")
        present = [v for v in values if v is not None]
        last = next((v for v in reversed(view.column(field)) if v is not None), None)
        figures = (
            f"last {value_text(field, last)}  min {value_text(field, min(present))}  "
            f"max {value_text(field, max(present))}"
            if present
            else "no values"
        )
        bars = sparkline(values, line_width, times, span)
        lines.append(f"{field.ljust(name_width)}  {bars.ljust(line_width)}  {figures}")
    return "\n".join(lines)
