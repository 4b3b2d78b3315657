"""Shared test harness: a real Control Plane in this reactor, real daemons as
processes, and small polling helpers with bounds (no bare sleeps)."""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import attrs
import treq
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.tap import ControlPlaneService

ROOT = Path(__file__).resolve().parent.parent
TWISTD = str(Path(sys.executable).parent / "twistd")
IOPCTL = str(Path(sys.executable).parent / "iopctl")


def sleep(seconds: float, reactor: Any = global_reactor) -> Deferred[None]:
    """Let the reactor run for ``seconds`` (only inside polling loops)."""
    return deferLater(reactor, seconds, lambda: None)


async def eventually(
    check: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
    reactor: Any = global_reactor,
) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value.

    Fails the test with ``message`` and the last value after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if isinstance(last, (Deferred,)) or hasattr(last, "__await__"):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")
        await sleep(interval, reactor)


@attrs.define
class ControlPlaneHarness:
    """A real Control Plane running in the test reactor on loopback ports."""

    service: ControlPlaneService

    @property
    def http_url(self) -> str:
        """Base URL of the HTTP views."""
        return f"http://127.0.0.1:{self.service.port('http')}"

    @property
    def edge_wire_port(self) -> int:
        """TCP port of the edge wire."""
        return self.service.port("edge_wire")

    @property
    def edge_wire_address(self) -> str:
        """``127.0.0.1:PORT`` of the edge wire."""
        return f"127.0.0.1:{self.edge_wire_port}"

    @property
    def wire_url(self) -> str:
        """WebSocket URL of the client wire."""
        return f"ws://127.0.0.1:{self.service.port('client_wire')}/client"

    @property
    def registry(self) -> Any:
        """The live EdgeRegistry."""
        return self.service.registry

    async def stop(self) -> None:
        """Stop every listener and connection."""
        if self.service.running:
            await self.service.stopService()

    async def get_json(self, path: str, **kwargs: Any) -> tuple[int, Any]:
        """GET ``path``; return status and parsed JSON body."""
        response = await treq.get(self.http_url + path, **kwargs)
        body = await response.content()
        return response.code, json.loads(body)

    async def post_json(self, path: str, payload: Any, **kwargs: Any) -> tuple[int, Any]:
        """POST JSON to ``path``; return status and parsed JSON body."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        response = await treq.post(
            self.http_url + path, data=data, headers={b"Content-Type": [b"application/json"]}, **kwargs
        )
        body = await response.content()
        return response.code, json.loads(body)


def _listen(port: int) -> str:
    return f"tcp:{port}:interface=127.0.0.1"


async def start_control_plane(
    reactor: Any = global_reactor,
    edge_wire_port: int = 0,
    http_port: int = 0,
    wire_port: int = 0,
    config_text: str = "",
    edge_wire_listen: str = "",
) -> ControlPlaneHarness:
    """Start a Control Plane in this reactor; ports default to free ones.

    ``config_text`` is extra control-plane.yaml; the listen addresses here
    win over it. ``edge_wire_listen`` replaces the edge wire's endpoint
    (for example an ``ssl:`` one).
    """
    config = config_from_text(config_text)
    config = attrs.evolve(
        config,
        http_listen=_listen(http_port),
        wire_listen=_listen(wire_port),
        edge_wire_listen=edge_wire_listen or _listen(edge_wire_port),
    )
    service = ControlPlaneService(config, reactor)
    service.privilegedStartService()
    service.startService()
    harness = ControlPlaneHarness(service)
    await eventually(lambda: service.readiness.ready, timeout=5, message="listeners bound", reactor=reactor)
    return harness


# -- TLS ------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for ``localhost``; return their paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
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


# -- real daemons as processes ------------------------------------------------

_LISTENING = re.compile(r"(\w+) listening on \S+ \(port (\d+)\)")


@attrs.define
class Daemon:
    """A ``twistd -n`` process started as a user would start it."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the daemon logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ports(self) -> dict[str, int]:
        """Listener ports announced in the log (``label -> port``)."""
        return {m.group(1): int(m.group(2)) for m in _LISTENING.finditer(self.log())}

    def running(self) -> bool:
        """Whether the process is still alive."""
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the daemon and wait for it to exit; return its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    def kill(self) -> int:
        """SIGKILL the daemon (a crash, as far as its peers can tell)."""
        return self.stop(signal.SIGKILL)


def start_daemon(args: list[str], log_dir: Path, env: Optional[dict[str, str]] = None, name: str = "daemon") -> Daemon:
    """Start ``twistd -n --pidfile= <args>`` with its log in ``log_dir``."""
    log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    handle = open(log_path, "wb")
    process = subprocess.Popen(
        [TWISTD, "-n", "--pidfile=", *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=full_env,
        cwd=str(log_dir),
    )
    handle.close()
    return Daemon(process, log_path)


async def wait_for_ports(daemon: Daemon, labels: set[str], timeout: float = 20.0) -> dict[str, int]:
    """Wait until ``daemon`` has logged a bound port for every label."""

    def check() -> Optional[dict[str, int]]:
        if not daemon.running():
            raise AssertionError(f"daemon exited with {daemon.process.returncode}:\n{daemon.log()}")
        ports = daemon.ports()
        return ports if labels <= set(ports) else None

    return await eventually(check, timeout=timeout, interval=0.05, message=f"ports {sorted(labels)}")
