"""HTTP routes of capacity history: ``GET /fleet/history`` and ``GET /edges/{id}/history``.

:func:`add_history_routes` puts them on the Control Plane's Klein app;
each runs on the :class:`~twisted_iop.controlplane.http.routes.ControlPlaneHttp`
it is bound to (its token checks and error handlers) and asks the
:class:`~twisted_iop.controlplane.history.queries.HistoryQueries` of its
history service. The query parameters (docs/http-api.md#capacity-history):
``from``, ``to``, ``step``, ``series`` (field names), ``model`` and, on
the fleet view, ``selector``. This module parses them and writes the JSON.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from klein import Klein
from twisted.web.iweb import IRequest

from twisted_iop.controlplane.fleet.edge_filters import EdgeFilter
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history.fields import (
    FLEET,
    FLEET_FIELDS,
    MODEL_FIELDS,
    edge_series,
    model_series,
)
from twisted_iop.controlplane.history.queries import (
    HistoryView,
    choose_tier,
    parse_fields,
    parse_range,
    parse_step,
)
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.http.auth import ApiToken
from twisted_iop.controlplane.http.errors import BadRequest, json_body, query_text
from twisted_iop.controlplane.http.json_views import iso
from twisted_iop.label_selectors import parse_selector

#: The longest model name a view accepts.
MAX_MODEL_CHARS = 256


class HistoryHost(Protocol):
    """What the history routes use of ``ControlPlaneHttp``."""

    _history: HistoryService
    _registry: EdgeRegistry

    @property
    def _now(self) -> float:
        """The clock's time."""

    def _shared(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, a viewer's at least."""

    def _edge(self, request: IRequest, edge_id: str) -> EdgeRecord:
        """The edge's record (404 ``unknown_edge``)."""


def _arg(request: IRequest, name: str) -> Optional[str]:
    return query_text(request, name)


def _model(request: IRequest) -> str:
    model = _arg(request, "model") or ""
    if len(model) > MAX_MODEL_CHARS:
        raise BadRequest(f"query parameter 'model' is longer than {MAX_MODEL_CHARS} characters")
    return model.strip()


def view_json(view: HistoryView, interval_seconds: float, **scope: Any) -> dict[str, Any]:
    """The JSON of a view (docs/http-api.md#capacity-history); ``interval_seconds``
    is how often its series is sampled (an edge's: the first edge tier's step)."""
    field_names = [field.name for field in view.fields]
    if view.rolled:
        columns = ["t", "count"] + [f"{name}.{part}" for name in field_names for part in ("mean", "max", "last")]
        points = [
            [t_ms / 1000, count, *(v for triple in values for v in triple)] for t_ms, count, values in view.points
        ]
    else:
        columns = ["t", *field_names]
        points = [[t_ms / 1000, *values] for t_ms, _, values in view.points]
    return {
        "series": view.series,
        **scope,
        "start": iso(view.start),
        "end": iso(view.end),
        "step_seconds": view.tier.step_seconds,
        "keep_seconds": view.tier.keep_seconds,
        "interval_seconds": interval_seconds,
        "rolled_up": view.rolled,
        "fields": field_names,
        "columns": columns,
        "points": points,
        "models": list(view.models),
        "edges": view.edges,
    }


def add_history_routes(app: Klein) -> None:
    """Add the history routes to ``app`` (ControlPlaneHttp's)."""

    def window(http: HistoryHost, request: IRequest, series: str) -> tuple[float, float, int]:
        """The range and the tier (of ``series``' tiers: the fleet's, or the edge tiers)."""
        tier_list = http._history.queries.tiers_for(series)
        now = http._now
        start, end = parse_range(_arg(request, "from"), _arg(request, "to"), now)
        tier_index = parse_step(_arg(request, "step"), tier_list)
        if tier_index is None:
            tier_index = choose_tier(tier_list, start, end, now)
        return start, end, tier_index

    @app.route("/fleet/history", methods=["GET"])
    async def fleet_history(http: HistoryHost, request: IRequest) -> bytes:
        """The fleet's capacity over time (or a model's, or a selector's edges added up)."""
        http._shared(request)
        queries = http._history.queries
        model = _model(request)
        selector_text = _arg(request, "selector")
        selector = parse_selector(selector_text)
        chosen = parse_fields(_arg(request, "series"), MODEL_FIELDS if model else FLEET_FIELDS)
        models = queries.models()
        label = model_series(model) if model else FLEET
        if selector.empty:
            start, end, tier_index = window(http, request, label)
            view = await queries.view(label, chosen, tier_index, start, end, models)
            interval = queries.tiers[0].step_seconds
        else:
            # A selector's edges are added up from their own series, in the edge tiers.
            start, end, tier_index = window(http, request, edge_series("-"))
            matched = EdgeFilter(selector).records(http._registry.edges())
            members = [model_series(model, r.edge_id) if model else edge_series(r.edge_id) for r in matched]
            view = await queries.aggregate_view(label, members, chosen, tier_index, start, end, models)
            interval = queries.edge_tiers[0].step_seconds
        body = view_json(
            view,
            interval,
            edge_id=None,
            model=model or None,
            selector=str(selector) if not selector.empty else None,
        )
        return json_body(request, 200, body)

    @app.route("/edges/<edge_id>/history", methods=["GET"])
    async def edge_history(http: HistoryHost, request: IRequest, edge_id: str) -> bytes:
        """One edge's capacity over time (or one of its models')."""
        http._edge(request, edge_id)
        queries = http._history.queries
        model = _model(request)
        chosen = parse_fields(_arg(request, "series"), MODEL_FIELDS if model else FLEET_FIELDS)
        series = model_series(model, edge_id) if model else edge_series(edge_id)
        start, end, tier_index = window(http, request, series)
        view = await queries.view(series, chosen, tier_index, start, end, queries.models(edge_id))
        body = view_json(
            view, queries.tiers_for(series)[0].step_seconds, edge_id=edge_id, model=model or None, selector=None
        )
        return json_body(request, 200, body)
