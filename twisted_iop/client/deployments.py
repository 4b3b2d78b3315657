"""Deployments in the client: their models and the repository's deployment methods.

The models mirror the Control Plane's ``Deployment`` documents field for
field (docs/deployments.md) and are read by the generic reader
(:func:`twisted_iop.client.models.read`). :class:`DeploymentViews` holds the
repository's methods for ``/deployments``;
:class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`
inherits them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Optional, Union
from urllib.parse import quote

import attrs

from twisted_iop.client.models import OPTIONAL, read


def _optional() -> Any:
    return attrs.field(default=None, metadata=OPTIONAL)


@attrs.frozen
class DeploymentInstance:
    """One instance on an edge: its node, state and reason."""

    instance_id: str
    node_id: str
    state: str
    reason: str
    spec_hash: str
    generation: int


@attrs.frozen
class DeploymentEdge:
    """A deployment on one edge: its state, the generation observed, its instances."""

    edge_id: str
    state: str
    reason: str
    observed_generation: int
    instances: tuple[DeploymentInstance, ...]


@attrs.frozen
class DeploymentEdges:
    """A page of a deployment's edges."""

    items: tuple[DeploymentEdge, ...]
    total: int
    next_cursor: Optional[str]


@attrs.frozen
class DeploymentRollup:
    """Edges by the deployment's state there; ``desired`` counts the edges it wants."""

    desired: int
    ready: int
    progressing: int
    out_of_sync: int
    failed: int
    offline: int
    held: int

    @property
    def done(self) -> bool:
        """Whether every edge it wants is ready."""
        return self.desired > 0 and self.ready == self.desired


@attrs.frozen
class DeploymentRoll:
    """The roll of a deployment's last change with ``rollout.max_in_flight``."""

    state: str
    reason: str
    from_generation: Optional[int]
    max_in_flight: Optional[int]
    reached: int
    pending: int
    failed: int


@attrs.frozen
class Deployment:
    """``GET /deployments/{name}``: the spec, generation and rollup (and, shown alone, its edges)."""

    name: str
    generation: int
    spec: dict[str, Any]
    spec_hash: str
    created_at: datetime
    updated_at: datetime
    updated_by: Optional[str]
    rollup: DeploymentRollup
    changed: Optional[bool] = _optional()
    edges: Optional[DeploymentEdges] = _optional()
    #: Its last roll (None: none ever ran, or a Control Plane older than rolls with states).
    roll: Optional[DeploymentRoll] = _optional()


@attrs.frozen
class DeploymentList:
    """``GET /deployments``: every deployment, by name."""

    items: tuple[Deployment, ...]
    total: int


@attrs.frozen
class DryRunChange:
    """What a dry run would do to one instance: start, restart, stay or stop."""

    action: str
    instance_id: str
    node_id: str


@attrs.frozen
class DryRunProblem:
    """An instance that cannot be placed, or that its node will refuse, and why."""

    instance_id: str
    reason: str


@attrs.frozen
class DryRunEdge:
    """A dry run on one edge."""

    edge_id: str
    connected: bool
    held: bool
    selected: bool
    note: str
    changes: tuple[DryRunChange, ...]
    problems: tuple[DryRunProblem, ...]


@attrs.frozen
class DryRunSummary:
    """A dry run's counts."""

    start: int
    restart: int
    stay: int
    stop: int
    unplaceable: int


@attrs.frozen
class DeploymentDryRun:
    """``PUT /deployments/{name}?dry_run=true``: what applying would do, nothing changed."""

    name: str
    dry_run: bool
    generation: int
    spec: dict[str, Any]
    spec_hash: str
    summary: DryRunSummary
    edges: tuple[DryRunEdge, ...]


@attrs.frozen
class DeploymentDeleted:
    """``DELETE /deployments/{name}``."""

    name: str
    deleted: bool
    generation: int


Request = Callable[..., Awaitable[Any]]


class DeploymentViews:
    """The repository's methods for ``/deployments`` (mixed into the status repository, which provides ``_request``)."""

    _request: Request

    async def deployments(self) -> DeploymentList:
        """``GET /deployments``: every deployment."""
        return read(DeploymentList, await self._request("GET", "/deployments"))

    async def deployment(
        self, name: str, state: Optional[str] = None, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> Deployment:
        """``GET /deployments/{name}`` (``ControlPlaneError`` code ``unknown_deployment``, 404, for a name not kept)."""
        query = {k: v for k, v in (("state", state), ("limit", limit), ("cursor", cursor)) if v is not None}
        return read(Deployment, await self._request("GET", _path(name), query=query or None))

    async def apply_deployment(
        self, name: str, spec: Mapping[str, Any], dry_run: bool = False
    ) -> Union[Deployment, DeploymentDryRun]:
        """``PUT /deployments/{name}``: the deployment created or replaced, or (``dry_run``) the placement."""
        if dry_run:
            answer = await self._request("PUT", _path(name), query={"dry_run": "true"}, body=spec)
            return read(DeploymentDryRun, answer)
        return read(Deployment, await self._request("PUT", _path(name), body=spec))

    async def pause_deployment(self, name: str) -> Deployment:
        """``POST /deployments/{name}/pause`` (``ControlPlaneError`` code ``no_rollout`` or
        ``invalid_transition``, 409, when its roll is not running)."""
        return read(Deployment, await self._request("POST", _path(name) + "/pause"))

    async def resume_deployment(self, name: str) -> Deployment:
        """``POST /deployments/{name}/resume``: its paused roll goes on."""
        return read(Deployment, await self._request("POST", _path(name) + "/resume"))

    async def cancel_deployment(self, name: str) -> Deployment:
        """``POST /deployments/{name}/cancel``: its roll ends; the edges not reached keep the previous spec."""
        return read(Deployment, await self._request("POST", _path(name) + "/cancel"))

    async def delete_deployment(self, name: str) -> DeploymentDeleted:
        """``DELETE /deployments/{name}``: its instances stop everywhere."""
        return read(DeploymentDeleted, await self._request("DELETE", _path(name)))


def _path(name: str) -> str:
    return "/deployments/" + quote(name, safe="")
