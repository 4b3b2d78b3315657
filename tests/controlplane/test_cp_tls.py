"""The edge wire over TLS (an ``ssl:`` endpoint) with a real handshake."""

from __future__ import annotations

import datetime
from pathlib import Path

import attrs
import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor
from twisted.internet.endpoints import clientFromString, connectProtocol
from twisted.python import usage

from scripted_edge import ScriptedEdge
from support import ControlPlaneHarness, eventually
from twisted_iop.controlplane import tap
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.tap import ControlPlaneService


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for ``localhost``; return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path = directory / "key.pem"
    cert_path = directory / "trust" / "cert.pem"
    cert_path.parent.mkdir()
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


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
        endpoint = clientFromString(
            reactor, f"tls:localhost:{port}:trustRoots={cert.parent}"
        )
        edge = ScriptedEdge("edge-tls")
        await connectProtocol(endpoint, edge)
        response = await edge.hello()
        assert response.accepted
        code, status = await cp.get_json("/edges/edge-tls/status")
        assert code == 200 and status["connected"] and len(status["nodes"]) == 2
        edge.transport.loseConnection()
        await edge.lost
    finally:
        await cp.stop()


def test_missing_certificate_is_a_config_error(tmp_path: Path) -> None:
    """An ssl: listener naming a missing key file fails option parsing with the field named."""
    config = tmp_path / "cp.yaml"
    config.write_text(f"edge_wire:\n  listen: ssl:7443:privateKey={tmp_path}/nope.pem\n")
    with pytest.raises(usage.UsageError, match="edge_wire.listen: cannot use"):
        tap.Options().parseOptions(["--config", str(config)])
    config.write_text("http:\n  listen: 'tcp:8080:bogus=1'\n")
    with pytest.raises(usage.UsageError, match="http.listen"):
        tap.Options().parseOptions(["--config", str(config)])
