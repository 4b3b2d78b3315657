"""The real producer for client tests: a Control Plane fed by scripted edges.

The client is tested against the server it talks to, never against a copy
of it: :func:`start_fleet` runs a real Control Plane on loopback with
scripted edges connected (support.start_control_plane,
scripted_edge.connect_edge), and :func:`stub_repository` puts a repository
on the real Klein app through ``treq.testing.StubTreq`` where no edge is
needed.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Optional

import attrs
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from scripted_edge import ScriptedEdge, connect_edge
from support import ControlPlaneHarness, eventually, start_control_plane
from treq.testing import StubTreq
from twisted.internet.task import Clock

from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.http_routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.registry import EdgeRegistry

#: How long the Control Plane waits for a status answer in these tests.
STATUS_TIMEOUT_SECONDS = 0.5


@attrs.define
class Fleet:
    """A running Control Plane and the scripted edges connected to it."""

    cp: ControlPlaneHarness
    edges: dict[str, ScriptedEdge]

    def repository(self, token: Optional[str] = None) -> ControlPlaneStatusRepository:
        """A repository on the real HTTP listener."""
        return ControlPlaneStatusRepository(self.cp.http_url, api_token=token, timeout=10)

    def freeze(self, edge_id: str) -> None:
        """The edge stays connected but never answers a status request again."""
        self.edges[edge_id].status = lambda: None

    async def disconnect(self, edge_id: str) -> None:
        """Close the edge's connection and wait until the Control Plane knows."""
        edge = self.edges[edge_id]
        assert edge.transport is not None
        edge.transport.loseConnection()
        await edge.lost
        await eventually(
            lambda: not self.cp.registry.get(edge_id).connected, timeout=5, message=f"{edge_id} disconnected"
        )

    async def stop(self) -> None:
        """Stop the Control Plane (its edges' connections close with it)."""
        await self.cp.stop()


async def start_fleet(*edge_ids: str, config_text: str = "", api_token: str = "") -> Fleet:
    """A real Control Plane with a scripted edge connected for each of ``edge_ids``.

    ``config_text`` is more control-plane.yaml (not an ``http`` section:
    that one is written here).
    """
    text = f"http:\n  status_timeout_seconds: {STATUS_TIMEOUT_SECONDS}\n"
    if api_token:
        text += f"  api_token: {api_token}\n"
    text += config_text
    cp = await start_control_plane(config_text=text)
    edges: dict[str, ScriptedEdge] = {}
    try:
        for edge_id in edge_ids:
            edge, hello = await connect_edge(cp.edge_wire_port, edge_id)
            assert hello is not None and hello.accepted, hello
            edges[edge_id] = edge
    except BaseException:
        await cp.stop()
        raise
    return Fleet(cp, edges)


def stub_repository(
    token: Optional[str] = None, api_token: str = "", base_url: str = "http://cp.test:8080/"
) -> ControlPlaneStatusRepository:
    """A repository on the real Klein app (no sockets, no edges, no bound listener)."""
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    # Settings come through the config parser, as the daemon's do.
    settings = config_from_text(f"http:\n  api_token: {api_token}\n" if api_token else "").http
    api = ControlPlaneHttp(registry, EdgeGateway(registry, clock), clock, ListenerReadiness([]), settings)
    return ControlPlaneStatusRepository(base_url, api_token=token, http_client=StubTreq(api.app.resource()))


def contract_validator(schema_name: str) -> Draft202012Validator:
    """A validator for one component schema of the packaged OpenAPI document."""
    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    registry: Registry[Any] = Registry().with_resource("urn:iop:openapi", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:iop:openapi#/components/schemas/{schema_name}"}, registry=registry)
