"""The edge wire over TLS (an ``ssl:`` endpoint) with a real handshake."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import clientFromString, connectProtocol

from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.tap import ControlPlaneService
from twisted_iop.daemon import ConfigurationExit
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, self_signed
from twisted_iop.testing.peers import ScriptedEdge


@pytest_twisted.ensureDeferred
async def test_edge_enrolls_over_tls(tmp_path: Path) -> None:
    """With edge_wire.listen on ssl:, an Edge that trusts the certificate enrolls over TLS."""
    key, cert = self_signed(tmp_path)
    config = attrs.evolve(
        config_from_text(""),
        http_listen="tcp:0:interface=127.0.0.1",
        wire_listen="tcp:0:interface=127.0.0.1",
        edge_wire_listen=f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}",
    )
    service = ControlPlaneService(config, reactor)
    service.privilegedStartService()
    service.startService()
    cp = ControlPlaneHarness(service)
    try:
        await eventually(lambda: service.readiness.ready, message="listeners bound")
        port = service.port("edge_wire")
        endpoint = clientFromString(reactor, f"tls:localhost:{port}:trustRoots={cert.parent}")
        edge = ScriptedEdge("edge-tls")
        await connectProtocol(endpoint, edge)
        response = await edge.hello()
        assert response.accepted
        code, status = await cp.get_json("/edges/edge-tls/status")
        assert code == 200 and status["connected"] and len(status["nodes"]) == 2
        edge.tcp.loseConnection()
        await edge.lost
    finally:
        await cp.stop()


def test_missing_certificate_is_a_config_error(tmp_path: Path) -> None:
    """An ssl: listener naming a missing key file fails option parsing with the field named."""
    config = tmp_path / "cp.yaml"
    config.write_text(f"edge_wire:\n  listen: ssl:7443:privateKey={tmp_path}/nope.pem\n")
    with pytest.raises(ConfigurationExit, match="edge_wire.listen: cannot use"):
        tap.Options().parseOptions(["--config", str(config)])
    config.write_text("http:\n  listen: 'tcp:8080:bogus=1'\n")
    with pytest.raises(ConfigurationExit, match="http.listen"):
        tap.Options().parseOptions(["--config", str(config)])
