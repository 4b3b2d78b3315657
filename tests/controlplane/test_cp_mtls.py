"""The edge wire with mutual TLS, hashed secrets and hello limits, over real sockets.

Every test runs a real Control Plane on 127.0.0.1 and real TLS handshakes
with certificates made here by a throw-away CA.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_twisted
import yaml
from twisted.internet import reactor
from twisted.internet.endpoints import TCP4ClientEndpoint, clientFromString, connectProtocol
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher

from twisted_iop.controlplane import tap
from twisted_iop.credentials import token_digest
from twisted_iop.daemon import ConfigurationExit
from twisted_iop.testing.harness import ControlPlaneHarness, start_control_plane
from twisted_iop.testing.pki import CertificateAuthority
from twisted_iop.testing.wires.peers import ScriptedEdge
from twisted_iop.wire.hello import RejectionCode
from twisted_iop.wire.peer import PeerDisconnected

SECRET = "edge-a-secret-0123456789"


async def _tls_control_plane(tmp_path: Path, ca: CertificateAuthority, extra: str = "") -> ControlPlaneHarness:
    server = ca.server()
    tls = ca.tls_section(server)
    text = "edge_wire:\n  tls: " + yaml.safe_dump(tls, default_flow_style=True) + extra
    return await start_control_plane(config_text=text)


async def _hello_over(description: str, edge_id: str, credential: str = "") -> tuple[ScriptedEdge, Any]:
    """Connect with ``description``, say hello as ``edge_id``; the edge and its answer or failure."""
    edge = ScriptedEdge(edge_id)
    edge.credential = credential
    await connectProtocol(clientFromString(reactor, description), edge)
    try:
        return edge, await edge.hello()
    except Exception as e:
        return edge, e


@pytest_twisted.ensureDeferred
async def test_a_certificate_for_edge_a_enrolls_as_edge_a_only(tmp_path: Path) -> None:
    """A client certificate for iop:edge:edge-a enrolls as edge-a; the same certificate claiming edge-b is refused."""
    ca = CertificateAuthority(tmp_path / "ca")
    cp = await _tls_control_plane(tmp_path, ca)
    edges: list[ScriptedEdge] = []
    try:
        edge_a = ca.issue("edge-a", uris=("iop:edge:edge-a",))
        edge, answer = await _hello_over(ca.dial(cp.edge_wire_port, edge_a), "edge-a")
        edges.append(edge)
        assert answer.accepted
        assert cp.registry.get("edge-a").connected

        impostor, answer = await _hello_over(ca.dial(cp.edge_wire_port, edge_a), "edge-b")
        edges.append(impostor)
        assert not answer.accepted and answer.permanent
        assert answer.reason_code == RejectionCode.IDENTITY_MISMATCH.value == "identity_mismatch"
        await impostor.lost
        assert cp.registry.find("edge-b") is None
        assert cp.registry.get("edge-a").connected

        # Identified by CN when the certificate has no iop: URI.
        by_name = ca.issue("edge-c", common_name="edge-c")
        edge, answer = await _hello_over(ca.dial(cp.edge_wire_port, by_name), "edge-c")
        edges.append(edge)
        assert answer.accepted
        # A node certificate is no edge certificate, whatever its CN says.
        node_cert = ca.issue("node-as-edge", common_name="edge-d", uris=("iop:node:edge-d",))
        edge, answer = await _hello_over(ca.dial(cp.edge_wire_port, node_cert), "edge-d")
        edges.append(edge)
        assert answer.reason_code == "identity_mismatch"
    finally:
        for edge in edges:
            if edge.transport is not None:
                edge.transport.loseConnection()
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_an_edge_without_a_client_certificate_never_enrolls(tmp_path: Path) -> None:
    """Without a client certificate (or with one from another CA) the handshake fails and hello is never answered."""
    ca = CertificateAuthority(tmp_path / "ca")
    other = CertificateAuthority(tmp_path / "other", name="another CA")
    cp = await _tls_control_plane(tmp_path, ca)
    try:
        for client in (None, other.issue("edge-a", uris=("iop:edge:edge-a",))):
            edge = ScriptedEdge("edge-a")
            await connectProtocol(clientFromString(reactor, ca.dial(cp.edge_wire_port, client)), edge)
            with pytest.raises(PeerDisconnected):
                await edge.hello()
            await edge.lost
            assert cp.registry.find("edge-a") is None

        # Plain TCP to a TLS listener gets nowhere either.
        plain = ScriptedEdge("edge-a")
        await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port), plain)
        plain.tcp.write(b"\x00\x00\x00\x05hello")
        await plain.lost
        assert cp.registry.find("edge-a") is None
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_hashed_and_file_secrets_and_no_secret_in_any_log_line(tmp_path: Path) -> None:
    """sha256: digests and a credentials file accept the right secret and refuse a wrong one; no secret is logged."""
    events: list[LogEvent] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    secrets = tmp_path / "edge-secrets.yaml"
    secrets.write_text(f"edge-b: file-secret-0123456789\nedge-c: sha256:{token_digest(b'edge-c-0123456789').hex()}\n")
    secrets.chmod(0o600)
    digest = token_digest(SECRET.encode()).hex()
    text = f"edge_wire:\n  credentials:\n    edge-a: sha256:{digest}\n  credentials_file: {secrets}\n"
    cp = await start_control_plane(config_text=text)
    edges = []
    try:
        for edge_id, right, wrong in (
            ("edge-a", SECRET, "edge-a-wrong-guess"),
            ("edge-b", "file-secret-0123456789", "file-secret-wrong"),
            ("edge-c", "edge-c-0123456789", "edge-c-wrong"),
        ):
            endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port)
            refused = ScriptedEdge(edge_id)
            refused.credential = wrong
            await connectProtocol(endpoint, refused)
            answer = await refused.hello()
            assert not answer.accepted and answer.reason_code == "bad_credential"
            await refused.lost
            edge = ScriptedEdge(edge_id)
            edge.credential = right
            await connectProtocol(endpoint, edge)
            edges.append(edge)
            assert (await edge.hello()).accepted
    finally:
        for edge in edges:
            edge.tcp.loseConnection()
        await cp.stop()
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
    lines = [formatEvent(event) for event in events]
    assert any("bad_credential" in line or "wrong or missing credential" in line for line in lines)
    for secret in (SECRET, "edge-a-wrong-guess", "file-secret", "edge-c-0123456789", "edge-c-wrong", digest):
        assert not [line for line in lines if secret in line], secret


@pytest_twisted.ensureDeferred
async def test_a_hammering_address_is_closed_at_once(tmp_path: Path) -> None:
    """After max_failures bad hellos from 127.0.0.1, its next connection is closed before any hello is answered."""
    text = "edge_wire:\n  shared_credential: right-secret-0123456789\n  failed_hellos: {max_failures: 3, cooldown_seconds: 600}\n"
    cp = await start_control_plane(config_text=text)
    try:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port)
        for _ in range(3):
            edge = ScriptedEdge("edge-a")
            edge.credential = "a-wrong-guess"
            await connectProtocol(endpoint, edge)
            assert (await edge.hello()).reason_code == "bad_credential"
            await edge.lost
        blocked = ScriptedEdge("edge-a")
        blocked.credential = "right-secret-0123456789"
        await connectProtocol(endpoint, blocked)
        with pytest.raises(PeerDisconnected):
            await blocked.hello()
        await blocked.lost
        assert cp.registry.find("edge-a") is None
        assert cp.service.edge_factory.failed_hellos.refused_total >= 1
    finally:
        await cp.stop()


@pytest_twisted.ensureDeferred
async def test_over_the_hello_rate_an_edge_is_told_to_retry_later(tmp_path: Path) -> None:
    """With max_hellos_per_second 1 (burst 2) and no room to queue, the third quick hello gets retry_later,
    not permanent, with a hint."""
    cp = await start_control_plane(
        config_text="edge_wire:\n  max_hellos_per_second: 1\n  hello_admission:\n    max_queue_wait_ms: 1\n"
    )
    edges = []
    try:
        endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", cp.edge_wire_port)
        answers = []
        for i in range(4):
            edge = ScriptedEdge(f"edge-{i}")
            await connectProtocol(endpoint, edge)
            edges.append(edge)
            answers.append(await edge.hello())
        assert [a.accepted for a in answers[:2]] == [True, True]
        late = answers[2:]
        assert all(not a.accepted and a.reason_code == "retry_later" and not a.permanent for a in late)
        # The hints point at successive slots, so refused edges come back spread out.
        assert 0 < late[0].retry_after_ms < late[1].retry_after_ms
        assert cp.registry.find("edge-2") is None
    finally:
        for edge in edges:
            if edge.transport is not None:
                edge.transport.loseConnection()
        await cp.stop()


def test_tls_section_errors_name_the_field(tmp_path: Path) -> None:
    """A missing file, a key for another certificate or an ssl: listen fail option parsing naming the field."""
    ca = CertificateAuthority(tmp_path / "ca")
    server, other = ca.server(), ca.server("other")
    config = tmp_path / "cp.yaml"
    cases = [
        ({**ca.tls_section(server), "client_ca": str(tmp_path / "nope.pem")}, "edge_wire.tls.client_ca: cannot read"),
        ({**ca.tls_section(server), "private_key": str(other.key)}, "edge_wire.tls.private_key: does not match"),
        ({"certificate": str(server.certificate)}, "edge_wire.tls.private_key: required"),
    ]
    for section, message in cases:
        config.write_text(yaml.safe_dump({"edge_wire": {"tls": section}}))
        with pytest.raises(ConfigurationExit, match=message):
            tap.Options().parseOptions(["--config", str(config)])
    config.write_text(
        yaml.safe_dump(
            {
                "edge_wire": {
                    "listen": f"ssl:0:privateKey={server.key}:certKey={server.certificate}",
                    "tls": ca.tls_section(server),
                }
            }
        )
    )
    with pytest.raises(ConfigurationExit, match=re.escape("edge_wire.tls: needs a tcp: listen address")):
        tap.Options().parseOptions(["--config", str(config)])


def test_mutual_tls_counts_as_authentication(tmp_path: Path) -> None:
    """An edge wire on every interface with mTLS and no credential logs no security warning for it."""
    from twisted_iop.controlplane.config import config_from_text, unauthenticated_exposures

    ca = CertificateAuthority(tmp_path / "ca")
    tls = yaml.safe_dump(ca.tls_section(ca.server()), default_flow_style=True)
    exposed = config_from_text("edge_wire:\n  listen: tcp:7443:interface=0.0.0.0\n")
    assert any("edge_wire.listen" in line for line in unauthenticated_exposures(exposed))
    guarded = config_from_text(f"edge_wire:\n  listen: tcp:7443:interface=0.0.0.0\n  tls: {tls}")
    assert not any("edge_wire.listen" in line for line in unauthenticated_exposures(guarded))
