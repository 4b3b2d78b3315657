"""HTTP routes of SLOs: ``/slos`` and ``/slos/{name}`` (see docs/slos.md).

:func:`add_slo_routes` puts them on the Control Plane's Klein app; each runs
on the :class:`~twisted_iop.controlplane.http.routes.ControlPlaneHttp` it is
bound to (its token checks, body reading and error handlers) and asks its
:class:`~twisted_iop.controlplane.slo.service.SloService`. ``PUT`` and
``DELETE`` need an operator token, the reads a viewer's.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from klein import Klein
from twisted.web.iweb import IRequest

from twisted_iop.controlplane.http.auth import ApiToken
from twisted_iop.controlplane.http.errors import BadRequest, error_body, json_body
from twisted_iop.controlplane.http.json_views import iso
from twisted_iop.controlplane.slo.evaluator import RULES, SloState
from twisted_iop.controlplane.slo.service import SloService, TooManySlos, UnknownSlo
from twisted_iop.controlplane.slo.spec import ERROR_RATIO, SpecError, format_duration, parse_spec


class SloHost(Protocol):
    """What the SLO routes use of the object their app's routes run on (``ControlPlaneHttp``)."""

    _slos: SloService

    def _authorize(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, checked for the method's role."""

    def _shared(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, a viewer's at least."""

    def _body(self, request: IRequest) -> dict[str, Any]:
        """The request's JSON object body."""

    @property
    def _now(self) -> float:
        """The clock's time."""


def slo_json(state: SloState, now: float) -> dict[str, Any]:
    """One SLO: its spec, its value over the window, the budget left, burn rates and alerts."""
    spec = state.spec
    figures = state.figures(now)
    alerts = []
    for rule in RULES:
        alert = state.alerts[rule.name]
        long_seconds, short_seconds = state.windows(rule)
        alerts.append(
            {
                "name": rule.name,
                "severity": rule.severity,
                "state": alert.state,
                "since": iso(alert.since),
                "long_window": format_duration(long_seconds),
                "short_window": format_duration(short_seconds),
                "burn_rate_threshold": rule.burn_rate,
            }
        )
    return {
        "name": spec.name,
        "spec": spec.as_json(),
        "target": spec.target,
        "value": figures.value,
        "value_unit": "ratio" if spec.metric == ERROR_RATIO else "seconds",
        "good_ratio": figures.good_ratio,
        "error_budget_remaining": figures.error_budget_remaining,
        "requests": figures.total,
        "bad_requests": figures.bad,
        "burn_rates": [
            {"window": rate.window, "seconds": rate.seconds, "burn_rate": rate.burn_rate, "requests": rate.total}
            for rate in figures.burn_rates
        ],
        "alerts": alerts,
        "created_at": iso(state.created_at),
        "updated_at": iso(state.updated_at),
        "evaluated_at": iso(state.evaluated_at),
    }


def add_slo_routes(app: Klein) -> None:
    """Put the ``/slos`` routes on ``app`` (the ControlPlaneHttp's Klein app)."""

    @app.route("/slos", methods=["GET"])
    def list_slos(http: SloHost, request: IRequest) -> bytes:
        """Every SLO, by name."""
        http._shared(request)
        now = http._now
        items = [slo_json(state, now) for state in http._slos.all()]
        return json_body(request, 200, {"items": items, "total": len(items)})

    @app.route("/slos/<name>", methods=["GET"])
    def show_slo(http: SloHost, request: IRequest, name: str) -> bytes:
        """One SLO."""
        http._shared(request)
        try:
            return json_body(request, 200, slo_json(http._slos.get(name), http._now))
        except UnknownSlo as e:
            return error_body(request, 404, "unknown_slo", str(e))

    @app.route("/slos/<name>", methods=["PUT"])
    def put_slo(http: SloHost, request: IRequest, name: str) -> bytes:
        """Create (201) or replace (200) an SLO; the same body again changes nothing."""
        http._authorize(request)
        http._shared(request)
        try:
            spec = parse_spec(name, http._body(request))
        except SpecError as e:
            raise BadRequest(str(e), "invalid_slo") from None
        try:
            state, created = http._slos.put(spec)
        except TooManySlos as e:
            return error_body(request, 409, "too_many_slos", str(e))
        return json_body(request, 201 if created else 200, slo_json(state, http._now))

    @app.route("/slos/<name>", methods=["DELETE"])
    def delete_slo(http: SloHost, request: IRequest, name: str) -> bytes:
        """Forget an SLO (its buckets and alerts with it)."""
        http._authorize(request)
        http._shared(request)
        try:
            http._slos.delete(name)
        except UnknownSlo as e:
            return error_body(request, 404, "unknown_slo", str(e))
        return json_body(request, 200, {"name": name, "deleted": True})
