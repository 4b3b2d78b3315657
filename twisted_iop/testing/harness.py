"""Harnesses: a real Control Plane, Edge and Node in this reactor, the
daemons as ``twistd`` processes started as a user would, a Control Plane fed
by scripted edges for the client tests, and bounded polling (no bare sleeps).

The client is tested against the server it talks to, never against a copy
of it: :func:`start_fleet` runs a real Control Plane on loopback with
scripted edges connected, and :func:`stub_repository` puts a repository on
the real Klein app through ``treq.testing.StubTreq`` where no edge is needed.
"""

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
from importlib import resources
from pathlib import Path
from typing import Any, Optional, cast

import attrs
from treq.testing import StubTreq
from twisted.internet import reactor as global_reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Clock, deferLater

from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.controlplane.config import config_from_text
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.settings import MEMORY, SQLITE
from twisted_iop.controlplane.tap import ControlPlaneService
from twisted_iop.edge.tap import EdgeService
from twisted_iop.edge.tap import Options as EdgeOptions
from twisted_iop.edge.tap import makeService as make_edge
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.node.tap import NodeService
from twisted_iop.node.tap import Options as NodeOptions
from twisted_iop.node.tap import makeService as make_node
from twisted_iop.testing.configs import loopback_listen
from twisted_iop.testing.http import get_json, post_json
from twisted_iop.testing.wires.peers import ScriptedEdge, connect_edge

_BIN = Path(sys.executable).parent
TWISTD = str(_BIN / "twistd")
IOPCTL = str(_BIN / "iopctl")
MOCK_PROVIDER = str(_BIN / "iop-mock-provider")


def sleep(seconds: float, reactor: IReactorTime = global_reactor) -> Deferred[None]:
    """Let the reactor run for ``seconds`` (only inside polling loops)."""
    return deferLater(reactor, seconds, lambda: None)


#: Every bounded wait of the tests is this many times its stated timeout
#: (``IOP_TEST_WAIT_SCALE``, default 3): a timeout says "this should never take
#: so long", and a busy machine (another suite beside this one) is slow, not
#: broken. Nothing is asserted about how long a wait took.
WAIT_SCALE = max(1.0, float(os.environ.get("IOP_TEST_WAIT_SCALE", "3") or 3))


async def eventually(
    check: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
    reactor: Reactor = global_reactor,
) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value.

    Fails the test with ``message`` and the last value after ``timeout``
    (times :data:`WAIT_SCALE`).
    """
    timeout *= WAIT_SCALE
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
        return await get_json(self.http_url + path, **kwargs)

    async def post_json(self, path: str, payload: Any, **kwargs: Any) -> tuple[int, Any]:
        """POST JSON to ``path``; return status and parsed JSON body."""
        return await post_json(self.http_url + path, payload, **kwargs)


async def start_control_plane(
    reactor: Reactor = global_reactor,
    edge_wire_port: int = 0,
    http_port: int = 0,
    wire_port: int = 0,
    config_text: str = "",
    edge_wire_listen: str = "",
) -> ControlPlaneHarness:
    """Start a Control Plane in this reactor; ports default to free ones.

    ``config_text`` is extra control-plane.yaml; the listen addresses here
    win over it. ``edge_wire_listen`` replaces the edge wire's endpoint
    (for example an ``ssl:`` one). Unless it has a ``store`` section, the
    store is ``memory`` (tests in one process leave no file behind).
    """
    config = config_from_text(config_text)
    if "store:" not in config_text and config.store.backend == SQLITE:
        config = attrs.evolve(config, store=attrs.evolve(config.store, backend=MEMORY))
    config = attrs.evolve(
        config,
        http_listen=loopback_listen(http_port),
        wire_listen=loopback_listen(wire_port),
        edge_wire_listen=edge_wire_listen or loopback_listen(edge_wire_port),
    )
    service = ControlPlaneService(config, reactor)
    service.privilegedStartService()
    service.startService()
    harness = ControlPlaneHarness(service)
    await eventually(lambda: service.readiness.ready, timeout=5, message="listeners bound", reactor=reactor)
    return harness


# -- TLS ------------------------------------------------------------------------


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for ``localhost``; return their paths.

    Needs ``cryptography`` (a test extra), imported here.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

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


def _spawn(argv: list[str], log_dir: Path, name: str, env: Optional[dict[str, str]] = None) -> Daemon:
    """Start ``argv`` in ``log_dir`` with stdout and stderr in a new log file there."""
    log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "wb") as handle:
        process = subprocess.Popen(
            argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env, cwd=str(log_dir)
        )
    return Daemon(process, log_path)


def start_daemon(args: list[str], log_dir: Path, env: Optional[dict[str, str]] = None, name: str = "daemon") -> Daemon:
    """Start ``twistd -n --pidfile= <args>`` with its log in ``log_dir``."""
    return _spawn([TWISTD, "-n", "--pidfile=", *args], log_dir, name, env)


async def wait_for_ports(daemon: Daemon, labels: set[str], timeout: float = 20.0) -> dict[str, int]:
    """Wait until ``daemon`` has logged a bound port for every label."""

    def check() -> Optional[dict[str, int]]:
        if not daemon.running():
            raise AssertionError(f"daemon exited with {daemon.process.returncode}:\n{daemon.log()}")
        ports = daemon.ports()
        return ports if labels <= set(ports) else None

    return cast(
        "dict[str, int]", await eventually(check, timeout=timeout, interval=0.05, message=f"ports {sorted(labels)}")
    )


# -- an Edge and Nodes in this reactor ---------------------------------------------


async def start_edge(config_path: str) -> EdgeService:
    """Start an Edge in this reactor from ``config_path``; wait for its node port."""
    options = EdgeOptions()
    options.parseOptions(["--config", config_path])
    service = make_edge(options, reactor=global_reactor)
    service.privilegedStartService()
    service.startService()
    await service.node_listening_port()
    return service


def start_node(config_path: str) -> NodeService:
    """Start a Node runtime in this reactor from ``config_path``."""
    options = NodeOptions()
    options.parseOptions(["--config", config_path])
    service = make_node(options, reactor=global_reactor)
    service.privilegedStartService()
    service.startService()
    return service


async def stop(*services: Any) -> None:
    """Stop services (ignoring ones already stopped) and let closes settle."""
    for service in services:
        if service is not None and service.running:
            await service.stopService()
    await deferLater(global_reactor, 0.01, lambda: None)


# -- iop-mock-provider as a process -------------------------------------------------


_MOCK_LISTENING = re.compile(r"mock_provider listening on \S+ \(port (\d+)\)")


@attrs.define
class MockProviderProcess:
    """``iop-mock-provider`` as a process on a free loopback port."""

    daemon: Daemon
    port: int

    @property
    def base_url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate it."""
        self.daemon.stop()


def start_mock_provider(log_dir: Path, *args: str) -> MockProviderProcess:
    """Start ``iop-mock-provider --listen tcp:0`` and wait (bounded) for its port."""
    daemon = _spawn([MOCK_PROVIDER, "--listen", loopback_listen(0), *args], log_dir, "mock-provider")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        match = _MOCK_LISTENING.search(daemon.log())
        if match:
            return MockProviderProcess(daemon, int(match.group(1)))
        if not daemon.running():
            break
        time.sleep(0.05)  # a bounded wait for a child process, outside the reactor
    daemon.stop()
    raise AssertionError(f"iop-mock-provider did not start:\n{daemon.log()}")


# -- a Control Plane fed by scripted edges (the client tests' producer) ------------

#: How long the Control Plane waits for a status answer in these tests.
STATUS_TIMEOUT_SECONDS = 0.5


@attrs.define
class Fleet:
    """A running Control Plane and the scripted edges connected to it."""

    cp: ControlPlaneHarness
    edges: dict[str, ScriptedEdge]

    def repository(self, token: Optional[str] = None) -> ControlPlaneStatusRepository:
        """A repository on the real HTTP listener."""
        return ControlPlaneStatusRepository(self.cp.http_url, api_token=token, timeout=10)

    def freeze(self, edge_id: str) -> None:
        """The edge stays connected but never answers a status request again."""
        self.edges[edge_id].status = lambda: None

    async def disconnect(self, edge_id: str) -> None:
        """Close the edge's connection and wait until the Control Plane knows."""
        edge = self.edges[edge_id]
        edge.tcp.loseConnection()
        await edge.lost
        await eventually(
            lambda: not self.cp.registry.get(edge_id).connected, timeout=5, message=f"{edge_id} disconnected"
        )

    async def stop(self) -> None:
        """Stop the Control Plane (its edges' connections close with it)."""
        await self.cp.stop()


async def start_fleet(*edge_ids: str, config_text: str = "", api_token: str = "") -> Fleet:
    """A real Control Plane with a scripted edge connected for each of ``edge_ids``.

    ``config_text`` is more control-plane.yaml (not an ``http`` section:
    that one is written here).
    """
    text = f"http:\n  status_timeout_seconds: {STATUS_TIMEOUT_SECONDS}\n"
    if api_token:
        text += f"  api_token: {api_token}\n"
    text += config_text
    cp = await start_control_plane(config_text=text)
    edges: dict[str, ScriptedEdge] = {}
    try:
        for edge_id in edge_ids:
            edge, hello = await connect_edge(cp.edge_wire_port, edge_id)
            assert hello is not None and hello.accepted, hello
            edges[edge_id] = edge
    except BaseException:
        await cp.stop()
        raise
    return Fleet(cp, edges)


def stub_repository(
    token: Optional[str] = None, api_token: str = "", base_url: str = "http://cp.test:8080/"
) -> ControlPlaneStatusRepository:
    """A repository on the real Klein app (no sockets, no edges, no bound listener)."""
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    # Settings come through the config parser, as the daemon's do.
    settings = config_from_text(f"http:\n  api_token: {api_token}\n" if api_token else "").http
    api = ControlPlaneHttp(registry, EdgeGateway(registry, clock), clock, ListenerReadiness([]), settings)
    return ControlPlaneStatusRepository(base_url, api_token=token, http_client=StubTreq(api.app.resource()))


def contract_validator(schema_name: str) -> Any:
    """A validator for one component schema of the packaged OpenAPI document.

    Needs ``jsonschema`` (a test extra), imported here.
    """
    from jsonschema import Draft202012Validator
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    document = json.loads(resources.files("twisted_iop.controlplane").joinpath("openapi.json").read_text())
    registry: Registry[Any] = Registry().with_resource("urn:iop:openapi", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:iop:openapi#/components/schemas/{schema_name}"}, registry=registry)
