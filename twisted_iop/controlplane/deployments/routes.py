"""HTTP routes of deployments: ``/deployments`` and ``/deployments/{name}`` (see docs/deployments.md).

:func:`add_deployment_routes` puts them on the Control Plane's Klein app;
each runs on the :class:`~twisted_iop.controlplane.http.routes.ControlPlaneHttp`
it is bound to (its token checks, body reading and error handlers) and asks
its :class:`~.service.DeploymentService`. ``PUT``, ``DELETE`` and the roll's
moves (``POST /deployments/{name}/pause``, ``/resume``, ``/cancel``) need an
operator token, the reads a viewer's. ``PUT`` is idempotent by itself: the
same body again changes nothing, not even the generation.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from klein import Klein
from twisted.web.iweb import IRequest

from twisted_iop.controlplane.deployments import roll
from twisted_iop.controlplane.deployments.kept import DeploymentState, TooManyDeployments, UnknownDeployment
from twisted_iop.controlplane.deployments.rollup import EDGE_STATES, EdgeRollup
from twisted_iop.controlplane.deployments.service import DeploymentService
from twisted_iop.controlplane.deployments.spec import SpecError, parse_spec
from twisted_iop.controlplane.http.auth import ApiToken
from twisted_iop.controlplane.http.errors import BadRequest, error_body, json_body, query_int, query_text
from twisted_iop.controlplane.http.json_views import iso

#: Edges shown per page of ``GET /deployments/{name}``.
DEFAULT_EDGE_PAGE = 100
MAX_EDGE_PAGE = 1000


class DeploymentHost(Protocol):
    """What the deployment routes use of the object their app's routes run on (``ControlPlaneHttp``)."""

    _deployments: DeploymentService

    def _authorize(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, checked for the method's role."""

    def _shared(self, request: IRequest) -> Optional[ApiToken]:
        """The caller's token, a viewer's at least."""

    def _body(self, request: IRequest) -> dict[str, Any]:
        """The request's JSON object body."""


def edge_json(edge: EdgeRollup) -> dict[str, Any]:
    """A deployment on one edge: its state, the generation observed, its instances."""
    return {
        "edge_id": edge.edge_id,
        "state": edge.state,
        "reason": edge.reason,
        "observed_generation": edge.observed_generation,
        "instances": [
            {
                "instance_id": row.instance_id,
                "node_id": row.node_id,
                "state": row.state,
                "reason": row.reason,
                "spec_hash": row.spec_hash,
                "generation": row.generation,
            }
            for row in edge.instances
        ],
    }


def deployment_json(
    service: DeploymentService, state: DeploymentState, edges: Optional[list[EdgeRollup]] = None
) -> dict[str, Any]:
    """One deployment: its spec, generation, rollup and roll (from ``edges`` when given)."""
    spec = state.spec
    if edges is None:
        edges = service.edge_rollups(spec.name)
    return {
        "name": spec.name,
        "generation": state.generation,
        "spec": spec.as_json(),
        "spec_hash": spec.spec_hash,
        "created_at": iso(state.created_at),
        "updated_at": iso(state.updated_at),
        "updated_by": state.updated_by or None,
        "rollup": service.rollup(spec.name, edges),
        "roll": state.roll_view(edges),
    }


def _states(request: IRequest) -> Optional[frozenset[str]]:
    text = query_text(request, "state")
    if not text:
        return None
    states = frozenset(part.strip() for part in text.split(","))
    unknown = sorted(states - set(EDGE_STATES))
    if unknown:
        raise BadRequest(
            f"query parameter 'state': unknown edge states {unknown} (known: {', '.join(EDGE_STATES)})",
            "invalid_state",
        )
    return states


def _dry_run(request: IRequest) -> bool:
    text = query_text(request, "dry_run")
    if text is None or text == "false":
        return False
    if text == "true":
        return True
    raise BadRequest("query parameter 'dry_run' must be true or false")


def add_deployment_routes(app: Klein) -> None:
    """Put the ``/deployments`` routes on ``app`` (the ControlPlaneHttp's Klein app)."""

    @app.route("/deployments", methods=["GET"])
    def list_deployments(http: DeploymentHost, request: IRequest) -> bytes:
        """Every deployment, by name, with its rollup."""
        http._shared(request)
        service = http._deployments
        items = [deployment_json(service, state) for state in service.all()]
        return json_body(request, 200, {"items": items, "total": len(items)})

    @app.route("/deployments/<name>", methods=["GET"])
    def show_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """One deployment, with its edges paged by edge id and filtered by state."""
        http._shared(request)
        service = http._deployments
        states = _states(request)
        limit = query_int(request, "limit", DEFAULT_EDGE_PAGE, 1, MAX_EDGE_PAGE)
        cursor = query_text(request, "cursor") or ""
        try:
            state = service.get(name)
        except UnknownDeployment as e:
            return error_body(request, 404, "unknown_deployment", str(e))
        every = service.edge_rollups(name)
        edges = [e for e in every if states is None or e.state in states]
        chosen = [e for e in edges if e.edge_id > cursor][:limit]
        more = bool(chosen) and edges[-1].edge_id != chosen[-1].edge_id
        body = deployment_json(service, state, every)
        body["edges"] = {
            "items": [edge_json(e) for e in chosen],
            "total": len(edges),
            "next_cursor": chosen[-1].edge_id if more else None,
        }
        return json_body(request, 200, body)

    @app.route("/deployments/<name>", methods=["PUT"])
    async def put_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """Create (201) or replace (200) a deployment; ``?dry_run=true`` answers its placement
        and changes nothing."""
        caller = http._authorize(request)
        http._shared(request)
        dry_run = _dry_run(request)
        try:
            spec = parse_spec(name, http._body(request))
        except SpecError as e:
            raise BadRequest(str(e), "invalid_deployment") from None
        service = http._deployments
        if dry_run:
            return json_body(request, 200, await service.dry_run_fresh(spec))
        try:
            state, created, changed = service.put(spec, caller.name if caller is not None else "")
        except TooManyDeployments as e:
            return error_body(request, 409, "too_many_deployments", str(e))
        body = deployment_json(service, state)
        body["changed"] = changed
        return json_body(request, 201 if created else 200, body)

    @app.route("/deployments/<name>", methods=["DELETE"])
    def delete_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """Forget a deployment: its instances stop everywhere."""
        caller = http._authorize(request)
        http._shared(request)
        try:
            state = http._deployments.delete(name, caller.name if caller is not None else "")
        except UnknownDeployment as e:
            return error_body(request, 404, "unknown_deployment", str(e))
        return json_body(request, 200, {"name": name, "deleted": True, "generation": state.generation})

    def move(http: DeploymentHost, request: IRequest, name: str, move: str) -> bytes:
        caller = http._authorize(request)
        http._shared(request)
        service = http._deployments
        moves = {"pause": service.pause, "resume": service.resume, "cancel": service.cancel}
        try:
            state = moves[move](name, caller.name if caller is not None else "")
        except UnknownDeployment as e:
            return error_body(request, 404, "unknown_deployment", str(e))
        except roll.NoRoll as e:
            return error_body(request, 409, "no_rollout", str(e))
        except roll.InvalidMove as e:
            return error_body(request, 409, "invalid_transition", str(e))
        return json_body(request, 200, deployment_json(service, state))

    @app.route("/deployments/<name>/pause", methods=["POST"])
    def pause_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """Pause the deployment's roll: no further edge is reached (the reached ones keep converging)."""
        return move(http, request, name, "pause")

    @app.route("/deployments/<name>/resume", methods=["POST"])
    def resume_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """Resume the deployment's paused roll."""
        return move(http, request, name, "resume")

    @app.route("/deployments/<name>/cancel", methods=["POST"])
    def cancel_deployment(http: DeploymentHost, request: IRequest, name: str) -> bytes:
        """Cancel the deployment's roll: the edges not reached keep the previous generation's spec."""
        return move(http, request, name, "cancel")
