"""Identity pieces without sockets: certificate identities, digests, secrets
files, the failed-hello limiter, the hello rate and the dialer's retry hint."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import ILogObserver, LogEvent, formatEvent, globalLogPublisher

from twisted_iop.configuration import ConfigError
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.wires.edge_wire import EdgeCredentials, EdgeWireFactory, EdgeWireProtocol
from twisted_iop.credentials import SecretError, digest_of, matches, token_digest
from twisted_iop.edge.config import parse_edge_config
from twisted_iop.node.config import parse_node_config
from twisted_iop.tls import certificate_identity
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import PERMANENT_CODES, RejectionCode, check_node_hello
from twisted_iop.wire.hello_dialer import DialerLink, HelloDialerProtocol
from twisted_iop.wire.limits import FailedHelloLimiter, FailedHelloLimits, HelloRateLimit, RefusedConnection
from twisted_iop.wire.settings import BackoffConfig, DialConfig, PeerSettings

# -- certificate identity -------------------------------------------------------


def _certificate(common_name: str = "", uris: tuple[str, ...] = ()) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else [])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]), critical=False
        )
    return builder.sign(key, hashes.SHA256())


def test_certificate_identity_prefers_the_iop_uri_then_the_common_name() -> None:
    """The iop:<kind>:<id> URI names the id; without any iop: URI, the CN does; anything ambiguous names none."""
    assert certificate_identity(_certificate("edge-x", ("iop:edge:edge-a",)), "edge") == "edge-a"
    assert certificate_identity(_certificate("edge-c"), "edge") == "edge-c"
    assert certificate_identity(_certificate("node-1", ("iop:node:node-1",)), "edge") is None
    assert certificate_identity(_certificate("node-1", ("iop:node:node-1",)), "node") == "node-1"
    assert certificate_identity(_certificate("", ("iop:edge:a", "iop:edge:b")), "edge") is None
    assert certificate_identity(_certificate("", ("iop:edge:",)), "edge") is None
    assert certificate_identity(_certificate(""), "edge") is None
    assert certificate_identity(_certificate("edge-z", ("https://example.net/",)), "edge") == "edge-z"


# -- digests ----------------------------------------------------------------------


def test_digests_match_the_secret_only() -> None:
    """A secret or its sha256: digest are kept as the same digest; only the secret matches it."""
    digest = digest_of("s3cret-s3cret")
    assert digest == digest_of("sha256:" + token_digest(b"s3cret-s3cret").hex())
    assert matches("s3cret-s3cret", (digest_of("other-secret"), digest))
    assert not matches("sha256:" + digest.hex(), (digest,))
    assert not matches("wrong", (digest,)) and not matches("", ())
    for bad in ("sha256:abc", "sha256:" + "zz" * 32, ""):
        with pytest.raises(SecretError) as info:
            digest_of(bad)
        assert "abc" not in str(info.value) and "zz" not in str(info.value)


def test_edge_credentials_per_edge_and_shared() -> None:
    """An edge with its own entry needs its secret; the others need a shared one."""
    credentials = EdgeCredentials(per_edge={"edge-a": (digest_of("a-secret"), digest_of("a-next"))})
    assert credentials.check("edge-a", "a-secret") and credentials.check("edge-a", "a-next")
    assert not credentials.check("edge-a", "b") and not credentials.check("edge-b", "a-secret")
    shared = EdgeCredentials.from_secrets(per_edge={"edge-a": "a-secret"}, shared="everyone")
    assert shared.check("edge-b", "everyone") and not shared.check("edge-a", "everyone")
    assert "a-secret" not in repr(shared) and digest_of("a-secret").hex() not in repr(shared)


def test_node_credentials_are_checked_as_digests() -> None:
    """check_node_hello compares a Node's secret with its digests; a Node without any needs none."""
    table = {"node-1": (), "node-2": (digest_of("n2-secret"),)}

    def code(node_id: str, credential: str) -> Any:
        rejection = check_node_hello(
            pb.NodeHelloRequest(node_id=node_id, protocol_major=1, credential=credential), table
        )
        return rejection.code if rejection else None

    assert code("node-1", "") is None and code("node-2", "n2-secret") is None
    assert code("node-2", "wrong") is RejectionCode.BAD_CREDENTIAL
    assert code("node-9", "") is RejectionCode.UNKNOWN_NODE
    assert RejectionCode.RETRY_LATER not in PERMANENT_CODES and RejectionCode.IDENTITY_MISMATCH in PERMANENT_CODES


# -- secrets in configuration ------------------------------------------------------


def _capture() -> tuple[list[str], Any]:
    lines: list[str] = []

    def observe(event: LogEvent) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(cast(ILogObserver, observe))
    return lines, observe


def test_credentials_file_is_read_hashed_and_its_permissions_checked(tmp_path: Path) -> None:
    """A credentials file's secrets and digests are kept as digests; a group-readable file is warned about."""
    secrets = tmp_path / "edges.yaml"
    secrets.write_text(f"edge-b: file-secret-1\nedge-c: [old-secret, sha256:{token_digest(b'new-secret').hex()}]\n")
    secrets.chmod(0o644)
    lines, observe = _capture()
    try:
        config = config_from_text(f"edge_wire:\n  credentials_file: {secrets}\n  credentials: {{edge-a: inline}}\n")
        secrets.chmod(0o600)
        config_from_text(f"edge_wire:\n  credentials_file: {secrets}\n")
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, observe))
    check = config.credentials.check
    assert check("edge-a", "inline") and check("edge-b", "file-secret-1")
    assert check("edge-c", "old-secret") and check("edge-c", "new-secret") and not check("edge-c", "file-secret-1")
    warnings = [line for line in lines if "readable by group or others" in line]
    assert len(warnings) == 1 and "edge_wire.credentials_file" in warnings[0] and "0o644" in warnings[0]
    assert not [line for line in lines if "secret" in line.replace("credentials_file", "")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("edge-a: sha256:1234\n", r"edge_wire.credentials_file\[.*\].edge-a: a sha256: value must be"),
        ("- a\n- b\n", "must be a mapping of id: secret"),
        ("edge-a: [p1, p2, p3, p4, p5]\n", "at most 4 secrets"),
        ("'bad id': x\n", "edge_wire.credentials: edge_id"),
        ("edge-a: {nested: true}\n", "must be a secret"),
        ("edge-a: 'unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_credentials_files_name_the_field_not_the_secret(tmp_path: Path, content: str, message: str) -> None:
    """Each mistake in a credentials file is a ConfigError naming the field, never quoting a secret."""
    secrets = tmp_path / "edges.yaml"
    secrets.write_text(content)
    secrets.chmod(0o600)
    with pytest.raises(ConfigError, match=message) as info:
        config_from_text(f"edge_wire:\n  credentials_file: {secrets}\n")
    assert "unclosed" not in str(info.value) and "p5" not in str(info.value)


def test_an_id_in_both_places_and_a_missing_file_are_errors(tmp_path: Path) -> None:
    """An edge in both credentials and the file, or an unreadable file, fail naming the field."""
    secrets = tmp_path / "edges.yaml"
    secrets.write_text("edge-a: x\n")
    secrets.chmod(0o600)
    with pytest.raises(
        ConfigError, match=re.escape("edge_wire.credentials.edge-a: also given in edge_wire.credentials_file")
    ):
        config_from_text(f"edge_wire:\n  credentials_file: {secrets}\n  credentials: {{edge-a: y}}\n")
    with pytest.raises(ConfigError, match=re.escape("edge_wire.credentials_file: cannot read")):
        config_from_text(f"edge_wire:\n  credentials_file: {tmp_path / 'missing.yaml'}\n")


def _edge_mapping(**node_server: Any) -> dict[str, Any]:
    return {
        "control_plane": {"edge_id": "edge-a"},
        "node_server": node_server,
        "nodes": [{"node_id": "node-1", "providers": [{"provider_id": "p", "kind": "mock", "models": ["m"]}]}],
    }


def test_edge_node_credentials_file(tmp_path: Path) -> None:
    """node_server.credentials_file gives nodes their digests; a node the Edge does not configure is an error."""
    secrets = tmp_path / "nodes.yaml"
    secrets.write_text("node-1: n1-secret\n")
    secrets.chmod(0o600)
    node = parse_edge_config(_edge_mapping(credentials_file=str(secrets))).node("node-1")
    assert node is not None and matches("n1-secret", node.credentials) and not matches("x", node.credentials)
    secrets.write_text("node-9: x\n")
    with pytest.raises(ConfigError, match=re.escape("node_server.credentials.node-9: no such node")):
        parse_edge_config(_edge_mapping(credentials_file=str(secrets)))


def test_dialers_read_their_secret_from_a_file(tmp_path: Path) -> None:
    """credential_file holds the secret a dialer sends; a digest there, or both settings, are errors."""
    secret_file = tmp_path / "secret"
    secret_file.write_text("the-edge-secret\n")
    secret_file.chmod(0o600)
    edge = parse_edge_config(
        {**_edge_mapping(), "control_plane": {"edge_id": "e", "credential_file": str(secret_file)}}
    )
    assert edge.control_plane.credential == "the-edge-secret"
    assert "the-edge-secret" not in repr(edge)
    node = parse_node_config({"node_id": "node-1", "credential_file": str(secret_file)})
    assert node.credential == "the-edge-secret"
    with pytest.raises(ConfigError, match="credential: give credential or credential_file, not both"):
        parse_node_config({"node_id": "node-1", "credential": "x", "credential_file": str(secret_file)})
    secret_file.write_text("sha256:" + "ab" * 32 + "\n")
    with pytest.raises(ConfigError, match="credential_file: the dialling side must hold the secret itself"):
        parse_node_config({"node_id": "node-1", "credential_file": str(secret_file)})
    secret_file.write_text("\n")
    with pytest.raises(ConfigError, match=r"credential_file: .* is empty"):
        parse_node_config({"node_id": "node-1", "credential_file": str(secret_file)})


# -- the failed-hello limiter ------------------------------------------------------


def test_a_hammering_address_is_blocked_and_recovers_after_the_cool_down() -> None:
    """max_failures failures within the window block an address for the cool-down; then it may connect again."""
    clock = Clock()
    limiter = FailedHelloLimiter(clock, FailedHelloLimits(max_failures=3, window_seconds=10, cooldown_seconds=60), "w")
    lines, observe = _capture()
    try:
        for _ in range(2):
            limiter.failed("10.0.0.1")
            clock.advance(1)
        assert not limiter.is_blocked("10.0.0.1")
        limiter.failed("10.0.0.1")
        assert limiter.is_blocked("10.0.0.1") and limiter.is_blocked("10.0.0.1")
        assert not limiter.is_blocked("10.0.0.2") and not limiter.is_blocked(None)
        clock.advance(59)
        assert limiter.is_blocked("10.0.0.1")
        clock.advance(1)
        assert not limiter.is_blocked("10.0.0.1")
        # Failures further apart than the window never add up.
        for _ in range(5):
            limiter.failed("10.0.0.3")
            clock.advance(6)
        assert not limiter.is_blocked("10.0.0.3")
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, observe))
    blocked = [line for line in lines if "blocked for 60s" in line]
    summaries = [line for line in lines if "closed 3 connections at once" in line]
    assert len(blocked) == 1 and len(summaries) == 1
    assert not [line for line in lines if "10.0.0." in line]
    assert limiter.refused_total == 3 and limiter.blocks_total == 1


def test_a_blocked_address_gets_a_connection_closed_at_once() -> None:
    """The edge wire factory hands a blocked address a protocol that aborts; after the cool-down a real one."""
    clock = Clock()
    factory = EdgeWireFactory(
        EdgeRegistry(clock),
        clock,
        PeerSettings(),
        EdgeCredentials.from_secrets(shared="right-secret"),
        failed_hellos=FailedHelloLimits(max_failures=2, cooldown_seconds=30),
    )
    address = IPv4Address("TCP", "192.0.2.7", 40000)
    for _ in range(2):
        protocol = factory.buildProtocol(address)
        assert isinstance(protocol, EdgeWireProtocol)
        transport = StringTransport(peerAddress=address)
        protocol.makeConnection(transport)
        hello = pb.EdgeHelloRequest(edge_id="edge-a", protocol_major=1, credential="guess")
        protocol.dataReceived(_frame(pb.Envelope(request_id=1, edge_hello_request=hello)))
        assert transport.disconnecting
    refused = factory.buildProtocol(address)
    assert isinstance(refused, RefusedConnection)
    transport = StringTransport(peerAddress=address)
    refused.makeConnection(transport)
    assert transport.disconnecting and transport.value() == b""
    assert isinstance(factory.buildProtocol(IPv4Address("TCP", "192.0.2.8", 1)), EdgeWireProtocol)
    clock.advance(30)
    assert isinstance(factory.buildProtocol(address), EdgeWireProtocol)
    factory.stopFactory()


def _frame(envelope: pb.Envelope) -> bytes:
    data = envelope.SerializeToString()
    return len(data).to_bytes(4, "big") + data


@given(
    steps=st.lists(st.tuples(st.integers(min_value=0, max_value=40), st.floats(min_value=0, max_value=5)), max_size=200)
)
def test_limiter_table_is_bounded_and_blocks_only_after_enough_failures(steps: list[tuple[int, float]]) -> None:
    """However failures arrive, the table never exceeds max_addresses and an address is blocked only
    once it failed max_failures times within the window."""
    clock = Clock()
    limits = FailedHelloLimits(max_failures=3, window_seconds=10, cooldown_seconds=20, max_addresses=8)
    limiter = FailedHelloLimiter(clock, limits, "w")
    history: dict[str, list[float]] = {}
    for source_index, advance in steps:
        clock.advance(advance)
        source = f"198.51.100.{source_index}"
        if limiter.is_blocked(source):
            recent = [t for t in history.get(source, []) if t > clock.seconds() - limits.cooldown_seconds - 10]
            assert len(recent) >= limits.max_failures
            continue
        limiter.failed(source)
        history.setdefault(source, []).append(clock.seconds())
        assert len(limiter) <= limits.max_addresses
    limiter.stop()


# -- the hello rate and the dialer's hint ----------------------------------------------


def test_hello_rate_allows_a_burst_then_hands_out_spread_hints() -> None:
    """Twice the rate passes at once; then each refusal's hint is one slot later than the last."""
    clock = Clock()
    rate = HelloRateLimit(clock, 10)
    assert [rate.take() for _ in range(20)] == [None] * 20
    hints = [rate.take() for _ in range(3)]
    assert all(h is not None for h in hints)
    assert hints[0] == pytest.approx(0.2) and hints[1] == pytest.approx(0.3) and hints[2] == pytest.approx(0.4)
    clock.advance(0.1)
    assert rate.take() is None and rate.take() is not None
    assert rate.refused_total == 4


class _Link(DialerLink[Any]):
    protocol_class = HelloDialerProtocol
    peer_name = "the peer"

    def own_name(self) -> str:
        return "this end"


def test_the_dialer_waits_at_least_the_hint_once() -> None:
    """After retry_later with retry_after_ms the next delay is at least the hint; the one after is normal again."""
    link = _Link(DialConfig(address="tcp:host=127.0.0.1:port=1", backoff=BackoffConfig(0.5, 30)), Clock(), lambda: 0.0)
    link.rejected(pb.EdgeHelloResponse(accepted=False, reason_code="retry_later", permanent=False, retry_after_ms=7250))
    assert link.permanent_rejection is None
    assert link.retry_delay(1) == 7.25
    assert link.retry_delay(1) == 0.0  # full jitter, drawn at its low end here
    # A hint longer than the hold-off still wins over a permanent rejection's delay.
    link.rejected(pb.EdgeHelloResponse(accepted=False, reason_code="x", permanent=True, retry_after_ms=45000))
    assert link.retry_delay(1) == 45.0 and link.retry_delay(1) == 15.0
    link.rejected(pb.NodeHelloResponse(accepted=False, reason_code="unknown_node", permanent=True))
    assert link.retry_delay(1) == 15.0
