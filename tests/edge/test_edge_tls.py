"""The Edge daemon's service dials the Control Plane over TLS (tls: endpoint)."""

from __future__ import annotations

from pathlib import Path

import pytest_twisted

from twisted_iop.testing.configs import edge_yaml, write_yaml
from twisted_iop.testing.harness import eventually, self_signed, start_control_plane, start_edge, stop


@pytest_twisted.ensureDeferred
async def test_edge_enrolls_over_tls_and_refuses_an_untrusted_server(tmp_path: Path) -> None:
    """With control_plane.address = tls:..., the Edge verifies the certificate and enrolls."""
    key, cert = self_signed(tmp_path)
    cp = await start_control_plane(edge_wire_listen=f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}")
    edge = None
    untrusting = None
    try:
        port = cp.edge_wire_port
        edge = await start_edge(
            write_yaml(tmp_path / "edge.yaml", edge_yaml(f"tls:localhost:{port}:trustRoots={cert.parent}"))
        )
        await eventually(
            lambda: cp.registry.find("edge-a") is not None and cp.registry.get("edge-a").connected,
            timeout=10,
            message="edge-a enrolled over TLS",
        )
        code, status = await cp.get_json("/edges/edge-a/status")
        assert code == 200 and status["connected"]

        # An Edge that trusts other roots must not enroll.
        other = tmp_path / "other"
        other.mkdir()
        _, other_cert = self_signed(other)
        untrusting = await start_edge(
            write_yaml(
                tmp_path / "edge-b.yaml",
                edge_yaml(f"tls:localhost:{port}:trustRoots={other_cert.parent}", edge_id="edge-b"),
            )
        )
        await eventually(
            lambda: untrusting.link.failed_attempts >= 2,
            timeout=10,
            message="two failed TLS sessions of the untrusting edge",
        )
        assert cp.registry.find("edge-b") is None
        assert untrusting.link.acceptances == 0
    finally:
        await stop(*(s for s in (edge, untrusting) if s is not None))
        await cp.stop()
