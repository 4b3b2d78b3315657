"""Mutual TLS with the real daemons' services: an Edge presents its client
certificate to the Control Plane, Nodes present theirs to the Edge."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest_twisted
import yaml
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher

from twisted_iop.edge.tap import EdgeService
from twisted_iop.testing.configs import edge_yaml, node_yaml, write_yaml
from twisted_iop.testing.harness import eventually, start_control_plane, start_edge, start_node, stop
from twisted_iop.testing.pki import CertificateAuthority
from twisted_iop.testing.wires.peers import ScriptedEdge


def _ready(edge: EdgeService) -> set[str]:
    return {n.node_id for n in edge.registry.nodes() if edge.registry.is_ready(n.node_id)}


@pytest_twisted.ensureDeferred
async def test_edge_and_nodes_enroll_with_their_certificates_and_never_as_another(tmp_path: Path) -> None:
    """iop-edge enrolls with a certificate for its id; on the node wire a Node enrolls as its
    certificate's id, is refused identity_mismatch as another id, and gets nowhere without one."""
    ca = CertificateAuthority(tmp_path / "ca")
    tls = ca.tls_section(ca.server("cp"))
    cp = await start_control_plane(config_text=yaml.safe_dump({"edge_wire": {"tls": tls}}))
    services: list[Any] = []
    try:
        edge_cert = ca.issue("edge-a", uris=("iop:edge:edge-a",))
        config = edge_yaml(ca.dial(cp.edge_wire_port, edge_cert))
        config["node_server"]["tls"] = ca.tls_section(ca.server("edge-node-listener"))
        edge = await start_edge(write_yaml(tmp_path / "edge.yaml", config))
        services.append(edge)
        await eventually(
            lambda: cp.registry.find("edge-a") is not None and cp.registry.get("edge-a").connected,
            message="edge-a enrolled with its certificate",
        )

        # The same Edge certificate configured for another edge id never enrolls.
        wrong = edge_yaml(ca.dial(cp.edge_wire_port, edge_cert), edge_id="edge-b")
        impostor = await start_edge(write_yaml(tmp_path / "edge-b.yaml", wrong))
        services.append(impostor)
        await eventually(
            lambda: (impostor.link.permanent_rejection or "").startswith("identity_mismatch"),
            message="edge-b refused for its certificate",
        )
        assert cp.registry.find("edge-b") is None

        node_1 = ca.issue("node-1", uris=("iop:node:node-1",))
        node_config = node_yaml("node-1", 0)
        node_config["edge"]["address"] = ca.dial(edge.node_port, node_1)
        services.append(start_node(write_yaml(tmp_path / "node-1.yaml", node_config)))
        await eventually(lambda: _ready(edge) == {"node-1"}, message="node-1 ready over mutual TLS")

        # node-1's certificate cannot enroll node-2 (whose credential is right).
        stolen = node_yaml("node-2", 0)
        stolen["edge"]["address"] = ca.dial(edge.node_port, node_1)
        thief = start_node(write_yaml(tmp_path / "node-2-stolen.yaml", stolen))
        services.append(thief)
        await eventually(
            lambda: (thief.link.permanent_rejection or "").startswith("identity_mismatch"),
            message="node-2 refused with node-1's certificate",
        )

        # Without a client certificate the handshake never completes.
        bare = node_yaml("node-2", 0)
        bare["edge"]["address"] = ca.dial(edge.node_port)
        anonymous = start_node(write_yaml(tmp_path / "node-2-bare.yaml", bare))
        services.append(anonymous)
        await eventually(lambda: anonymous.link.failed_attempts >= 2, message="two failed sessions without a cert")
        assert anonymous.link.acceptances == 0 and thief.link.acceptances == 0
        assert _ready(edge) == {"node-1"}
    finally:
        await stop(*reversed(services))
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_an_edge_told_to_retry_later_waits_and_then_enrolls(tmp_path: Path) -> None:
    """Over the Control Plane's hello rate, with no room to queue, an Edge is refused retry_later, waits the
    hint, and enrolls after."""
    events: list[LogEvent] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    cp = await start_control_plane(
        config_text="edge_wire:\n  max_hellos_per_second: 0.5\n  hello_admission:\n    max_queue_wait_ms: 1\n"
    )
    services: list[Any] = []
    scripted: list[ScriptedEdge] = []
    try:
        # Use up the burst (one hello) so the real Edge's first hello is over the rate.
        for i in range(1):
            other = ScriptedEdge(f"other-{i}")
            await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port), other)
            scripted.append(other)
            assert (await other.hello()).accepted
        edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_yaml(cp.edge_wire_address)))
        services.append(edge)
        await eventually(
            lambda: cp.registry.find("edge-a") is not None and cp.registry.get("edge-a").connected,
            message="edge-a enrolled after waiting",
        )
        assert edge.link.permanent_rejection is None
        lines = [formatEvent(event) for event in events]
        assert any("rejected edge edge-a for now (retry_later)" in line and "at least" in line for line in lines)
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
        for other in scripted:
            other.tcp.loseConnection()
        await stop(*services)
        await cp.stop()
