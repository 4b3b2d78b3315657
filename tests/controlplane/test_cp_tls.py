"""The edge wire over TLS (an ``ssl:`` endpoint) with a real handshake."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, clientFromString, connectProtocol
from twisted.internet.ssl import Certificate, optionsForClientTLS
from twisted.internet.task import deferLater

from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.tap import ControlPlaneService
from twisted_iop.daemon import ConfigurationExit
from twisted_iop.testing.harness import ControlPlaneHarness, eventually, self_signed
from twisted_iop.testing.wires.peers import ScriptedEdge
from twisted_iop.wire import control_pb2 as pb


@pytest_twisted.ensureDeferred
async def test_edge_enrolls_over_tls(tmp_path: Path) -> None:
    """With edge_wire.listen on ssl:, an Edge that trusts the certificate enrolls over TLS."""
    key, cert = self_signed(tmp_path)
    config = attrs.evolve(
        config_from_text("store: {backend: memory}"),
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
    with pytest.raises(ConfigurationExit, match=re.escape("edge_wire.listen: cannot use")):
        tap.Options().parseOptions(["--config", str(config)])
    config.write_text("http:\n  listen: 'tcp:8080:bogus=1'\n")
    with pytest.raises(ConfigurationExit, match=re.escape("http.listen")):
        tap.Options().parseOptions(["--config", str(config)])


async def _tls_control_plane(tmp_path: Path, hello: float, handshake: float) -> tuple[ControlPlaneHarness, Path]:
    """A Control Plane with its edge wire on ssl: and the given deadlines."""
    key, cert = self_signed(tmp_path)
    base = config_from_text("store: {backend: memory}")
    config = attrs.evolve(
        base,
        http_listen="tcp:0:interface=127.0.0.1",
        wire_listen="tcp:0:interface=127.0.0.1",
        edge_wire_listen=f"ssl:0:interface=127.0.0.1:privateKey={key}:certKey={cert}",
        edge_wire=attrs.evolve(base.edge_wire, hello_timeout_seconds=hello, tls_handshake_timeout_seconds=handshake),
    )
    service = ControlPlaneService(config, reactor)
    service.privilegedStartService()
    service.startService()
    await eventually(lambda: service.readiness.ready, message="listeners bound")
    return ControlPlaneHarness(service), cert


@pytest_twisted.ensureDeferred
async def test_the_hello_deadline_starts_when_the_tls_handshake_is_done(tmp_path: Path) -> None:
    """An Edge whose handshake starts later than the hello deadline (as in a
    reconnect herd, where handshakes wait for the CPU) still enrolls: the
    hello deadline counts from the finished handshake."""
    cp, cert = await _tls_control_plane(tmp_path, hello=0.3, handshake=10.0)
    try:
        edge = ScriptedEdge("edge-slow-tls")
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port), edge)
        # Past the hello deadline before the handshake even starts.
        await deferLater(reactor, 0.8, lambda: None)
        assert not edge.lost.called
        trust = Certificate.loadPEM(cert.read_bytes())
        edge.tcp.startTLS(optionsForClientTLS("localhost", trustRoot=trust))
        response = await edge.hello()
        assert response.accepted
        edge.tcp.loseConnection()
        await edge.lost
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_a_tls_handshake_that_never_finishes_is_closed(tmp_path: Path) -> None:
    """A peer that connects and never starts its handshake is closed at the
    handshake deadline, and one that finishes it but never says hello at
    the hello deadline after it."""
    cp, cert = await _tls_control_plane(tmp_path, hello=0.3, handshake=0.5)
    try:
        silent = ScriptedEdge("edge-no-handshake")
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port), silent)
        await eventually(lambda: silent.lost.called, timeout=5, message="closed at the handshake deadline")
        assert silent.errors == []  # nothing can be said before the handshake

        mute = ScriptedEdge("edge-no-hello")
        endpoint = clientFromString(reactor, f"tls:localhost:{cp.edge_wire_port}:trustRoots={cert.parent}")
        await connectProtocol(endpoint, mute)
        await eventually(lambda: mute.lost.called, timeout=5, message="closed at the hello deadline")
        assert [error.code for error in mute.errors] == [pb.ERROR_CODE_HELLO_TIMEOUT]
    finally:
        await cp.stop()
