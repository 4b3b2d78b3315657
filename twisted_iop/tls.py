"""Mutual TLS on the TCP wires: the listener's options and the peer's identity.

A listener with a ``tls`` section (``certificate``, ``private_key``,
``client_ca``) speaks TLS and *requires* a client certificate signed by
one of the ``client_ca`` certificates; a peer without one never completes
the handshake. Twisted's ``ssl:`` endpoint string cannot require client
certificates, so the listener wraps its plain ``tcp:`` endpoint in
:class:`TLSServerEndpoint` with options built by :func:`server_tls_options`.

The peer's **certificate identity** is bound to its hello: an Edge's
``edge_id`` (a Node's ``node_id``) must equal it. The identity is the
certificate's subjectAltName URI ``iop:edge:<id>`` (``iop:node:<id>``);
a certificate with no ``iop:`` URI at all is identified by its Subject
common name (CN). A certificate whose ``iop:`` URIs name another kind, or
several ids of this kind, has no identity and can enroll as nobody.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID
from OpenSSL import SSL, crypto
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IListeningPort, IProtocolFactory, IReactorTime, IStreamServerEndpoint
from twisted.internet.ssl import CertificateOptions, TLSVersion
from twisted.protocols.tls import TLSMemoryBIOFactory
from zope.interface import implementer

#: The kinds of peer whose identity a certificate can carry.
EDGE = "edge"
NODE = "node"


class TLSConfigError(ValueError):
    """A ``tls`` setting that cannot be used; ``field`` names the key."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@attrs.frozen
class TLSListenConfig:
    """Section ``tls`` of a listener: its own certificate and key, and the CA its peers' certificates must chain to."""

    certificate: str
    private_key: str
    client_ca: str


def _read(field: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise TLSConfigError(field, f"cannot read {path}: {e.strerror or e}") from None


def _certificates(field: str, path: str) -> list[x509.Certificate]:
    data = _read(field, path)
    try:
        certificates = x509.load_pem_x509_certificates(data)
    except ValueError:
        certificates = []
    if not certificates:
        raise TLSConfigError(field, f"{path} holds no PEM certificate")
    return certificates


def server_tls_options(config: TLSListenConfig) -> CertificateOptions:
    """TLS options of a listener that requires a client certificate from ``client_ca``.

    The certificate file may hold the chain (the listener's certificate
    first). Every file is read and the key is checked against the
    certificate now, so a mistake fails start-up as a :class:`TLSConfigError`.
    """
    chain = _certificates("certificate", config.certificate)
    authorities = _certificates("client_ca", config.client_ca)
    key_data = _read("private_key", config.private_key)
    try:
        key = serialization.load_pem_private_key(key_data, password=None)
    except (ValueError, TypeError) as e:
        # The message names the problem (encrypted, not PEM), never the key.
        raise TLSConfigError("private_key", f"{config.private_key}: not an unencrypted PEM private key ({e})") from None
    options = CertificateOptions(
        privateKey=key,  # type: ignore[arg-type]  # CertificateOptions takes cryptography's key too; its stubs say PKey
        certificate=chain[0],  # type: ignore[arg-type]  # CertificateOptions takes cryptography's certificate too; its stubs say X509
        extraCertChain=chain[1:],  # type: ignore[arg-type]  # CertificateOptions takes cryptography's certificates too; its stubs say X509
        verify=True,
        requireCertificate=True,
        caCerts=[crypto.X509.from_cryptography(authority) for authority in authorities],
        raiseMinimumTo=TLSVersion.TLSv1_2,
    )
    try:
        options.getContext()
    except SSL.Error as e:
        raise TLSConfigError("private_key", f"does not match the certificate {config.certificate} ({e})") from None
    return options


@implementer(IStreamServerEndpoint)
class TLSServerEndpoint:
    """A server endpoint that speaks TLS over another (a ``tcp:`` one, usually).

    Wrapping keeps every option of the inner endpoint string (interface,
    backlog, IPv6, systemd sockets) and adds client-certificate checks that
    the ``ssl:`` endpoint string cannot express.
    """

    def __init__(self, inner: IStreamServerEndpoint, options: CertificateOptions, clock: IReactorTime) -> None:
        self._inner = inner
        self._options = options
        self._clock = clock

    def listen(self, protocolFactory: IProtocolFactory) -> Deferred[IListeningPort]:
        """Listen on the inner endpoint; every connection is TLS first."""
        factory = TLSMemoryBIOFactory(self._options, False, protocolFactory, self._clock)
        factory.noisy = False
        return self._inner.listen(factory)


def certificate_identity(certificate: x509.Certificate, kind: str) -> Optional[str]:
    """The ``kind`` id (``edge``, ``node``) a certificate proves, or None.

    The subjectAltName URI ``iop:<kind>:<id>`` if the certificate has
    exactly one; none at all if it has ``iop:`` URIs but not exactly one of
    this kind; otherwise its single Subject common name.
    """
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    ours = [uri for uri in uris if uri.startswith("iop:")]
    if ours:
        prefix = f"iop:{kind}:"
        ids = [uri[len(prefix) :] for uri in ours if uri.startswith(prefix)]
        return ids[0] if len(ids) == 1 and ids[0] else None
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(common_names) != 1:
        return None
    value = common_names[0].value
    return value if isinstance(value, str) and value else None


def peer_identity(transport: Any, kind: str) -> Optional[str]:
    """The ``kind`` id proven by the certificate of the peer on ``transport``, or None."""
    get_certificate = getattr(transport, "getPeerCertificate", None)
    if get_certificate is None:
        return None
    certificate = get_certificate()
    if certificate is None:
        return None
    return certificate_identity(certificate.to_cryptography(), kind)
