"""A throw-away certificate authority for mutual-TLS tests: a CA, listener
certificates for ``localhost`` and client certificates naming an edge or a
node id (``iop:edge:<id>`` URIs or a CN), written as PEM files."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Optional

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@attrs.frozen
class IssuedCertificate:
    """A key and certificate on disk, issued by a :class:`CertificateAuthority`."""

    key: Path
    certificate: Path


class CertificateAuthority:
    """A throw-away certificate authority for mutual-TLS tests.

    ``ca.pem`` in ``directory`` is its certificate (the ``client_ca`` of a
    listener, and a trust root of dialers: ``trust/ca.pem``).
    """

    def __init__(self, directory: Path, name: str = "iop test CA") -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.trust_dir = directory / "trust"
        self.trust_dir.mkdir(exist_ok=True)
        self.ca_path = self.trust_dir / "ca.pem"
        self.ca_path.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(
        self,
        name: str,
        common_name: str = "",
        dns: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
    ) -> IssuedCertificate:
        """Issue a key and certificate, written as ``NAME.key`` and ``NAME.pem``."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)] if common_name else [])
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alt_names += [x509.UniformResourceIdentifier(u) for u in uris]
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        key_path = self.directory / f"{name}.key"
        cert_path = self.directory / f"{name}.pem"
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return IssuedCertificate(key_path, cert_path)

    def server(self, name: str = "server") -> IssuedCertificate:
        """A listener's certificate for ``localhost``."""
        return self.issue(name, common_name="localhost", dns=("localhost",))

    def tls_section(self, server: IssuedCertificate) -> dict[str, str]:
        """A listener's ``tls`` section: ``server``'s certificate, this CA for clients."""
        return {"certificate": str(server.certificate), "private_key": str(server.key), "client_ca": str(self.ca_path)}

    def dial(self, port: int, client: Optional[IssuedCertificate] = None) -> str:
        """A ``tls:`` client endpoint trusting this CA, presenting ``client`` if given."""
        description = f"tls:localhost:{port}:trustRoots={self.trust_dir}"
        if client is not None:
            description += f":certificate={client.certificate}:privateKey={client.key}"
        return description
