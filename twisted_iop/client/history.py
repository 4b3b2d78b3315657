"""Capacity history in the client: its model and the repository's history methods.

:class:`HistoryView` mirrors the ``HistoryView`` schema of the OpenAPI
document field for field (read by the generic
:func:`~twisted_iop.client.model_json.read`). :class:`HistoryViews` holds the
repository's methods for ``GET /fleet/history`` and ``GET
/edges/{id}/history``;
:class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`
inherits them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Optional, Union
from urllib.parse import quote

import attrs

from twisted_iop.client.model_json import read

Value = Optional[float]


@attrs.frozen
class HistoryView:
    """Capacity over time: one series at one tier (docs/http-api.md#capacity-history).

    Each point is ``[t, value per field]`` on the finest tier, or ``[t,
    count, mean, max, last per field]`` on a rolled-up one (``rolled_up``);
    ``columns`` names each place. ``t`` is seconds since the epoch; a
    value nobody reported is ``None``.
    """

    series: str
    step_seconds: float
    keep_seconds: float
    interval_seconds: float
    rolled_up: bool
    fields: tuple[str, ...]
    columns: tuple[str, ...]
    points: tuple[tuple[Value, ...], ...]
    edge_id: Optional[str] = None
    model: Optional[str] = None
    selector: Optional[str] = None
    start: Optional[datetime] = None
    end: Optional[datetime] = None
    models: tuple[str, ...] = ()
    edges: Optional[int] = None

    def times(self) -> list[datetime]:
        """Each point's time."""
        return [datetime.fromtimestamp(float(point[0] or 0), tz=UTC) for point in self.points]

    def column(self, name: str) -> list[Value]:
        """One column by name: a field (on a rolled-up tier, its mean), or
        ``<field>.max`` / ``.last`` / ``.mean``, or ``count``."""
        if self.rolled_up and name in self.fields:
            name = f"{name}.mean"
        if name not in self.columns:
            raise KeyError(f"{name!r} is not a column of this view (columns: {', '.join(self.columns)})")
        at = self.columns.index(name)
        return [point[at] if at < len(point) else None for point in self.points]


Request = Callable[..., Awaitable[Any]]
#: ``series``: field names, as a comma-separated string or a list.
Fields = Union[str, Iterable[str], None]


def history_query(
    start: Optional[str], end: Optional[str], step: Optional[str], series: Fields, model: Optional[str]
) -> dict[str, Optional[str]]:
    """The query parameters of a history view (``None``: not sent)."""
    if series is not None and not isinstance(series, str):
        series = ",".join(series)
    return {"from": start, "to": end, "step": step, "series": series or None, "model": model or None}


class HistoryViews:
    """The repository's methods for capacity history (mixed into
    :class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`,
    which provides ``_request``)."""

    _request: Request

    async def fleet_history(
        self,
        start: Optional[str] = None,
        end: Optional[str] = None,
        step: Optional[str] = None,
        series: Fields = None,
        model: Optional[str] = None,
        selector: Optional[str] = None,
    ) -> HistoryView:
        """``GET /fleet/history``: the fleet's capacity over time.

        ``start`` / ``end`` are ISO 8601 times, seconds since the epoch,
        ``now`` or relative (``-2h``); the default is the last hour.
        ``step`` picks a tier (``15s``, ``1m``, ``10m``), ``series`` the
        fields, ``model`` one model's series, ``selector`` the matching
        edges added up. Bad values raise ``ControlPlaneError`` with code
        ``invalid_range``, ``invalid_step``, ``invalid_series`` or
        ``invalid_selector``.
        """
        query = {**history_query(start, end, step, series, model), "selector": selector or None}
        return read(HistoryView, await self._request("GET", "/fleet/history", query))

    async def edge_history(
        self,
        edge_id: str,
        start: Optional[str] = None,
        end: Optional[str] = None,
        step: Optional[str] = None,
        series: Fields = None,
        model: Optional[str] = None,
    ) -> HistoryView:
        """``GET /edges/{id}/history``: one edge's capacity over time (the
        parameters of :meth:`fleet_history` but the selector)."""
        path = "/edges/" + quote(edge_id, safe="") + "/history"
        return read(HistoryView, await self._request("GET", path, history_query(start, end, step, series, model)))
