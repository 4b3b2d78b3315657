#!/usr/bin/env python
"""Fleet fan-out benchmark: one Control Plane, N fake Edges, one reactor each.

The Control Plane runs as a user starts it (``twistd -n iop-control-plane``)
in a child process, so its reactor is measured alone. This process is the
load generator: it holds N small Edges built on
:class:`twisted_iop.wire.peer.FramedPeerProtocol` (hello, then answer every
``EdgeStatusRequest`` with a 2-node snapshot) and is also the HTTP client.
Every socket is on 127.0.0.1.

Measured, in order:

1. Control Plane RSS with no edges.
2. Enrollment: N edges connect in batches; time until ``GET /edges`` says
   ``total == N``; kernel listen-queue overflows while connecting.
3. RSS with N edges connected (and bytes per edge); idle CPU.
4. ``GET /fleet/status`` rounds with every edge answering (default page of
   1000 rows, and the whole fleet in one page), with the Control Plane's
   CPU per round and how long ``/healthz`` waits while a round runs.
5. ``GET /edges/{id}/status`` for a sample of edges, one at a time.
6. RSS after the fleet rounds.
7. One fleet round with 1% of the edges silent: those rows time out after
   the Control Plane's status timeout (5 s by default), the rest are ok.

Run: ``.venv/bin/python bench/fleet_fanout.py --edges 10000`` (see
bench/README.md). ``--profile out.prof`` runs the Control Plane under
cProfile (bench/cp_instrumented.py) during the all-answering fleet rounds and
prints the hot spots.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, cast

from twisted.internet import epollreactor

if "twisted.internet.reactor" not in sys.modules:
    # The default on Linux, said explicitly (gateway_inprocess.py imports
    # this module after a reactor exists).
    epollreactor.install()

from treq.client import HTTPClient
from twisted.internet import defer, reactor, task
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import ITCPTransport
from twisted.internet.protocol import ClientFactory
from twisted.python.failure import Failure
from twisted.web.client import Agent, HTTPConnectionPool

from twisted_iop.testing.harness import Daemon
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, make_envelope
from twisted_iop.wire.settings import PeerSettings
from twisted_iop.wire.status_totals import with_totals

BENCH_DIR = Path(__file__).resolve().parent
TWISTD = str(Path(sys.executable).parent / "twistd")
LOOPBACK = "127.0.0.1"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: File descriptors this process and the Control Plane need beyond one per edge.
SPARE_FDS = 200

EDGE_SETTINGS = PeerSettings(request_timeout_seconds=120.0)
#: The benchmarks' Control Plane settings (see ControlPlaneProcess): every
#: fleet round asks every edge again, hello admission is lifted, and
#: no access-log line is written per request (the references write none).
BENCH_CONFIG = "status:\n  fleet_max_age_seconds: 0\nedge_wire:\n  hello_admission:\n    max_loop_lag_ms: 1000000\n    max_pending_hellos: 1000000\nhttp:\n  access_log: false\n"
#: Every Control Plane started, so a deadline can kill them all.
CONTROL_PLANES: list[ControlPlaneProcess] = []


# -- the fake edge -----------------------------------------------------------


#: The providers of each node of the default fake snapshot (2 nodes: 1 and 2 providers).
DEFAULT_NODES: tuple[tuple[str, ...], ...] = (("vllm",), ("vllm", "ollama"))
#: The snapshot of docs/performance.md: 4 nodes with 2 providers each.
NODES_4X2: tuple[tuple[str, ...], ...] = (("vllm", "ollama"),) * 4


def edge_snapshot(edge_id: str, nodes: tuple[tuple[str, ...], ...] = DEFAULT_NODES) -> pb.EdgeStatusResponse:
    """The snapshot a fake edge reports: one node per entry of ``nodes``, with those provider kinds,
    and its totals (as a real Edge sends them)."""
    response = pb.EdgeStatusResponse(edge_id=edge_id, generated_at_ms=1_700_000_000_000)
    for n, kinds in enumerate(nodes, start=1):
        node = response.nodes.add(
            node_id=f"node-{n}", connected=True, connected_since_ms=1_700_000_000_000, last_seen_ms=1_700_000_000_000
        )
        for p, kind in enumerate(kinds, start=1):
            node.providers.add(
                provider_id=f"{kind}-{n}-{p}",
                kind=kind,
                models=["llama-3-8b"] if kind == "vllm" else ["llama-3-8b", "qwen2-7b"],
                status=pb.PROVIDER_STATUS_AVAILABLE,
                health=pb.PROVIDER_HEALTH_HEALTHY,
                capacity=8,
                in_flight=3,
                queued=1,
                long_context_capacity=2,
                long_context_in_flight=1,
                long_context_queued=0,
            )
    return with_totals(response)


def request_id_field(request_id: int) -> bytes:
    """Envelope field 1 (``request_id``, varint) encoded on its own."""
    out = bytearray(b"\x08")
    value = request_id
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class RetryLater(Exception):
    """The Control Plane answered the hello with retry_later."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"retry in {seconds:g} s")
        self.seconds = seconds


#: At most this many retry_later answers per edge before it gives up.
MAX_HELLO_RETRIES = 20


class FakeEdge(FramedPeerProtocol):
    """One fake Edge: says hello, answers status requests from a cached frame.

    The answer is serialized once per edge (an envelope without
    ``request_id``); each reply prepends the request id field, so the load
    generator spends as little CPU per request as it can.
    """

    def __init__(self, fleet: FakeFleet, edge_id: str) -> None:
        super().__init__(reactor, EDGE_SETTINGS)
        self.fleet = fleet
        self.edge_id = edge_id
        self.silent = False
        self.accepted: Deferred[None] = Deferred()
        #: Set when the hello was accepted.
        self.enrolled = False

    #: The command catalog its hello announces.
    CATALOG: tuple[pb.CommandSpec, ...] = (
        pb.CommandSpec(name="edge.diagnostics", description="Versions and counters"),
    )

    def hello_labels(self) -> dict[str, str]:
        """The labels its hello announces."""
        return {"site": "bench", "region": f"r{hash(self.edge_id) % 8}"}

    def peer_connected(self) -> None:
        self.fleet.open_connections += 1
        hello = pb.EdgeHelloRequest(
            edge_id=self.edge_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version="bench-edge",
            labels=self.hello_labels(),
            commands=list(self.CATALOG),
        )
        self.request("edge_hello_request", hello, EDGE_SETTINGS.request_timeout_seconds).addCallbacks(
            self._hello_answered, self._hello_failed
        )

    def _hello_answered(self, envelope: pb.Envelope) -> None:
        answer = envelope.edge_hello_response
        if answer.accepted:
            self.enrolled = True
            self.fleet.accepted += 1
            self.accepted.callback(None)
        elif answer.retry_after_ms and not answer.permanent:
            # As a real Edge does: dial again after the hint (connect() does).
            self.accepted.errback(RetryLater(answer.retry_after_ms / 1000.0))
        else:
            self.accepted.errback(RuntimeError(f"hello of {self.edge_id} rejected: {answer.reason}"))

    def _hello_failed(self, failure: Failure) -> None:
        if not self.accepted.called:
            self.accepted.errback(failure)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "edge_status_request":
            fleet = self.fleet
            fleet.status_requests += 1
            now = time.perf_counter()
            if fleet.first_request_at is None:
                fleet.first_request_at = now
            fleet.last_request_at = now
            if self.silent:
                return
            self.sendString(request_id_field(envelope.request_id) + self.fleet.status_tail(self.edge_id))

    def peer_disconnected(self, reason: Failure) -> None:
        self.fleet.open_connections -= 1
        if self.enrolled:
            self.fleet.lost += 1  # a refused hello (retry_later) is not a lost edge
        if not self.accepted.called:
            self.accepted.errback(reason)


class FakeFleet:
    """N fake edges on this process's reactor."""

    #: The protocol of each edge (the suite's bench edges answer a 4x2 snapshot).
    edge_class: type[FakeEdge] = FakeEdge

    def __init__(self, port: int, tls: Optional[Any] = None, redial_after_failure: bool = False) -> None:
        self.port = port
        #: Client TLS options (a context factory): the edges dial with TLS.
        self.tls = tls
        #: Whether an edge whose connection or hello failed dials again
        #: (after a jittered second or two, as a real Edge's backoff does).
        self.redial_after_failure = redial_after_failure
        self.edges: list[FakeEdge] = []
        self.accepted = 0
        #: Hellos dialed again after a retry_later answer.
        self.retried = 0
        #: Edges dialed again after a failed connection or hello.
        self.redials = 0
        self.lost = 0
        #: Edges whose connection is up (their descriptor is open).
        self.open_connections = 0
        #: Dials that failed before a connection was made, by reason.
        self.dial_failures: dict[str, int] = {}
        self.status_requests = 0
        #: When the first and the last status request of a round arrived.
        self.first_request_at: Optional[float] = None
        self.last_request_at: Optional[float] = None
        self._tails: dict[str, bytes] = {}

    def status_tail(self, edge_id: str) -> bytes:
        """The serialized status envelope of ``edge_id`` without a request id."""
        tail = self._tails.get(edge_id)
        if tail is None:
            envelope = make_envelope("edge_status_response", edge_snapshot(edge_id))
            tail = self._tails[edge_id] = envelope.SerializeToString()
        return tail

    def connect(self, edge_id: str, attempt: int = 0) -> Deferred[None]:
        """Connect one edge; fire once its hello is accepted (dialing again,
        with jitter, after a retry_later answer, as a real Edge does, and
        after any failure with ``redial_after_failure``)."""
        accepted = self._dial(edge_id)

        def retry(failure: Failure) -> Any:
            if attempt >= MAX_HELLO_RETRIES:
                return failure
            if failure.check(RetryLater):
                self.retried += 1
                delay = cast(RetryLater, failure.value).seconds * (0.5 + random.random())
            elif self.redial_after_failure:
                self.redials += 1
                delay = 1.0 + random.random()
            else:
                return failure
            return task.deferLater(reactor, delay, self.connect, edge_id, attempt + 1)

        return accepted.addErrback(retry)

    def _dial(self, edge_id: str) -> Deferred[None]:
        edge = self.edge_class(self, edge_id)
        self.edges.append(edge)
        self.status_tail(edge_id)
        # connectTCP with one small factory per edge: an endpoint's
        # connectProtocol defines a factory class per call, and each such
        # factory logs its start and stop (about 100 us an edge here).
        if self.tls is None:
            reactor.connectTCP(LOOPBACK, self.port, _EdgeDialer(self, edge), timeout=60)
        else:
            reactor.connectSSL(LOOPBACK, self.port, _EdgeDialer(self, edge), self.tls, timeout=60)
        return edge.accepted

    def _dial_failed(self, failure: Failure, edge: FakeEdge) -> None:
        reason = f"{type(failure.value).__name__}: {failure.getErrorMessage()}"[:120]
        self.dial_failures[reason] = self.dial_failures.get(reason, 0) + 1
        if not edge.accepted.called:
            edge.accepted.errback(failure)

    def close(self, timeout: float = 60.0) -> Deferred[None]:
        """Drop every edge's connection; fires once every descriptor is closed.

        ``abortConnection`` closes the socket on a later reactor turn, so
        until this fires the edges still hold their descriptors: a caller
        that dials again at once (the suite's next phase) may run out of
        them.
        """
        for edge in self.edges:
            if edge.transport is not None:
                cast(ITCPTransport, edge.transport).abortConnection()
        return defer.ensureDeferred(eventually(lambda: self.open_connections <= 0, timeout, "the edges to close"))


class _EdgeDialer(ClientFactory):
    """Hands one dial's connection to its fake edge, or tells the fleet the dial failed."""

    noisy = False

    def __init__(self, fleet: FakeFleet, edge: FakeEdge) -> None:
        self.fleet = fleet
        self.edge = edge

    def buildProtocol(self, addr: Any) -> FakeEdge:
        return self.edge

    def clientConnectionFailed(self, connector: Any, reason: Failure) -> None:
        self.fleet._dial_failed(reason, self.edge)


# -- the Control Plane process ------------------------------------------------


class ControlPlaneProcess:
    """``twistd -n --pidfile= iop-control-plane`` on loopback port 0."""

    def __init__(
        self,
        workdir: Path,
        edge_listen: str,
        instrument: Optional[Path] = None,
        cprofile: bool = False,
        gc_mode: str = "",
        config_text: str = "",
    ) -> None:
        self.log_path = workdir / "control-plane.log"
        #: Output prefix of bench/cp_instrumented.py (None: plain twistd).
        self.instrument = instrument
        env = dict(os.environ)
        env.update(
            IOP_EDGE_WIRE_LISTEN=edge_listen,
            IOP_HTTP_LISTEN=f"tcp:0:interface={LOOPBACK}",
            IOP_WIRE_LISTEN=f"tcp:0:interface={LOOPBACK}",
            PYTHONUNBUFFERED="1",
            IOP_BENCH_CPROFILE="1" if cprofile else "0",
            IOP_BENCH_GC=gc_mode,
        )
        # BENCH_CONFIG unless told otherwise. Max age 0: every fleet round
        # of the benchmark asks every edge again instead of reusing the
        # previous round's rows. Hello admission is lifted (no
        # retry_later): the enrollment figure measures how fast the
        # Control Plane takes a burst; bench/enrollment_storm.py measures
        # the shipped admission rule. No access
        # log: the references (echo, Klein) write none, and a line per
        # request costs about as much as serving a small view.
        config_path = workdir / "control-plane.yaml"
        config_path.write_text(config_text or BENCH_CONFIG)
        twistd_args = ["-n", "--pidfile=", "iop-control-plane", "--config", str(config_path)]
        if instrument is not None:
            command = [sys.executable, str(BENCH_DIR / "cp_instrumented.py"), str(instrument), *twistd_args]
        else:
            command = [TWISTD, *twistd_args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(workdir)
            )
        self.pid = self.process.pid
        # The test harness's view of a daemon: its log and announced ports.
        self.daemon = Daemon(self.process, self.log_path)
        self.log = self.daemon.log
        self.ports = self.daemon.ports
        self.running = self.daemon.running

    def rss_bytes(self) -> int:
        """Resident set size (VmRSS) of the Control Plane."""
        return _vmrss(self.pid)

    def cpu_seconds(self) -> float:
        """User + system CPU the Control Plane has used so far."""
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the Control Plane."""
        if self.running():
            self.process.send_signal(signum)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 20 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _vmrss(pid: int | str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_busy_seconds() -> float:
    """CPU time every process on the machine has used (from /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / CLOCK_TICKS


def listen_overflows() -> int:
    """The kernel's TcpExt ListenOverflows counter (this network namespace)."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return -1
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(table.get("ListenOverflows", -1))
    return -1


def raise_open_file_limit(needed: int) -> int:
    """Raise RLIMIT_NOFILE to the hard limit; fail early if that is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        raise SystemExit(f"need {needed} open files for this many edges, the hard limit is {hard}")
    return target


# -- HTTP ----------------------------------------------------------------------


class Http:
    """A tiny JSON client on one persistent connection pool."""

    def __init__(self, port: int) -> None:
        self.base = f"http://{LOOPBACK}:{port}"
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 4
        self.client = HTTPClient(Agent(reactor, pool=self.pool))

    async def get(self, path: str, timeout: float = 120.0) -> tuple[int, bytes, float]:
        """GET ``path``; return status, body and seconds until the body was read."""
        started = time.perf_counter()
        response = await self.client.get(self.base + path, timeout=timeout)
        body = await response.content()
        return response.code, body, time.perf_counter() - started

    async def get_json(self, path: str, timeout: float = 120.0) -> tuple[int, Any, float, int]:
        """GET ``path``; return status, parsed JSON, seconds and body size."""
        code, body, seconds = await self.get(path, timeout)
        return code, json.loads(body), seconds, len(body)


def sleep(seconds: float) -> Deferred[None]:
    """Let the reactor run for ``seconds``."""
    return task.deferLater(reactor, seconds, lambda: None)


async def eventually(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll ``check`` (sync or async) until truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if hasattr(value, "__await__") or isinstance(value, Deferred):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await sleep(interval)


# -- figures --------------------------------------------------------------------


class Figures:
    """Named results, printed as a table at the end and optionally as JSON."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []
        self.data: dict[str, Any] = {}

    def add(self, key: str, label: str, value: Any, shown: str) -> None:
        """Record ``value`` under ``key`` and a table row ``label | shown``."""
        self.data[key] = value
        self.rows.append((key, label, shown))
        print(f"  {label}: {shown}", flush=True)

    def section(self, title: str) -> None:
        """Start a section of the table."""
        self.rows.append(("", title, ""))
        print(f"-- {title}", flush=True)

    def table(self) -> str:
        """All figures as a text table."""
        width = max((len(label) for key, label, _ in self.rows if key), default=20)
        lines = []
        for key, label, shown in self.rows:
            if not key:
                lines.append(f"\n{label}")
                lines.append("-" * (width + 30))
            else:
                lines.append(f"  {label:<{width}}  {shown}")
        return "\n".join(lines)


def ms(seconds: float) -> str:
    """Seconds as milliseconds for people."""
    return f"{seconds * 1000:.1f} ms"


def mib(size: float) -> str:
    """Bytes as MiB for people."""
    return f"{size / 2**20:.1f} MiB"


def spread(values: list[float]) -> dict[str, float]:
    """min / median / p95 / max of ``values``."""
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"min": ordered[0], "median": statistics.median(ordered), "p95": p95, "max": ordered[-1]}


def spread_text(values: list[float]) -> str:
    """min / median / max in milliseconds."""
    s = spread(values)
    return f"min {ms(s['min'])} / median {ms(s['median'])} / max {ms(s['max'])}  (n={len(values)})"


# -- the benchmark ------------------------------------------------------------------


async def fleet_round(
    http: Http, cp: ControlPlaneProcess, fleet: FakeFleet, limit: int, probe_healthz: bool = False
) -> dict[str, Any]:
    """One ``GET /fleet/status?limit=...`` with CPU accounting and row counts."""
    asked_before = fleet.status_requests
    busy = machine_busy_seconds()
    cp_cpu = cp.cpu_seconds()
    lg_cpu = time.process_time()
    probes: list[float] = []
    done = False

    async def probe() -> None:
        # The first probe waits for the round's own request to reach the CP.
        await sleep(0.005)
        while not done:
            _, _, seconds = await http.get("/healthz")
            probes.append(seconds)
            await sleep(0.01)

    prober = defer.ensureDeferred(probe()) if probe_healthz else None
    fleet.first_request_at = fleet.last_request_at = None
    started = time.perf_counter()
    code, body, seconds, size = await http.get_json(f"/fleet/status?limit={limit}")
    done = True
    if prober is not None:
        await prober
    if code != 200:
        raise RuntimeError(f"GET /fleet/status answered {code}: {body}")
    cp_cpu = cp.cpu_seconds() - cp_cpu
    lg_cpu = time.process_time() - lg_cpu
    # Whatever else ran on the machine meanwhile (other test runs share
    # these 2 cores): it stretches wall times, so it is reported with them.
    others = max(0.0, machine_busy_seconds() - busy - cp_cpu - lg_cpu)
    states: dict[str, int] = {}
    for item in body["items"]:
        states[item["state"]] = states.get(item["state"], 0) + 1
    return {
        "seconds": seconds,
        # Phases seen from the edges: until the first and the last status
        # request arrived; the rest is answers coming back plus rendering.
        "first_request": (fleet.first_request_at or started) - started,
        "last_request": (fleet.last_request_at or started) - started,
        "cp_cpu": cp_cpu,
        "loadgen_cpu": lg_cpu,
        "others_cores": others / seconds,
        "bytes": size,
        "total": body["total"],
        "items": len(body["items"]),
        "states": states,
        "edges_connected": body["totals"]["edges_connected"],
        "fresh_nodes": body["totals"]["nodes_configured"],
        "asked": fleet.status_requests - asked_before,
        "healthz_max": max(probes) if probes else None,
        "healthz_n": len(probes),
        "timeout_rows": sorted(i["edge_id"] for i in body["items"] if i["state"] == "timeout"),
    }


async def run(args: argparse.Namespace, workdir: Path, figures: Figures) -> None:
    """The whole benchmark against one Control Plane process."""
    n = args.edges
    profile = Path(args.profile).resolve() if args.profile else None
    instrument = profile or (workdir / "cp-window" if args.gc_stats or args.cp_gc else None)
    cp = ControlPlaneProcess(workdir, args.edge_listen, instrument, profile is not None, args.cp_gc)
    CONTROL_PLANES.append(cp)
    atexit.register(cp.stop)
    print(f"control plane pid {cp.pid}, log {cp.log_path}", flush=True)
    try:
        ports = await eventually(
            lambda: _ports_or_fail(cp, {"edge_wire", "http"}), timeout=30, what="the Control Plane's ports"
        )
        http = Http(ports["http"])
        await eventually(lambda: _ready(http), timeout=30, what="GET /readyz")
        await sleep(0.5)

        variant = []
        if args.cp_gc:
            variant.append(f"what-if IOP_BENCH_GC={args.cp_gc}")
        if profile is not None:
            variant.append("UNDER cProfile: times inflated")
        figures.section(
            f"Control Plane, {n} edges over 127.0.0.1 (pid {cp.pid})" + (f" [{'; '.join(variant)}]" if variant else "")
        )
        rss_idle = cp.rss_bytes()
        figures.add("rss_before", "RSS before edges", rss_idle, mib(rss_idle))

        # -- enrollment
        fleet = FakeFleet(ports["edge_wire"])
        ids = [f"bench-edge-{i:05d}" for i in range(n)]
        overflows = listen_overflows()
        cp_cpu = cp.cpu_seconds()
        started = time.perf_counter()
        for first in range(0, n, args.batch):
            batch = [fleet.connect(edge_id) for edge_id in ids[first : first + args.batch]]
            try:
                await defer.DeferredList(batch, fireOnOneErrback=True, consumeErrors=True)
            except defer.FirstError as e:
                e.subFailure.raiseException()
        all_accepted = time.perf_counter() - started

        async def total_is_n() -> bool:
            code, body, _, _ = await http.get_json("/edges?limit=1")
            return code == 200 and body["total"] == n

        await eventually(total_is_n, timeout=60, what=f"GET /edges total == {n}")
        enrolled = time.perf_counter() - started
        enroll_cpu = cp.cpu_seconds() - cp_cpu
        overflows = listen_overflows() - overflows
        figures.add(
            "enroll_seconds",
            f"enroll {n} edges (until /edges total == N)",
            enrolled,
            f"{enrolled:.2f} s  ({n / enrolled:.0f} edges/s, batches of {args.batch})",
        )
        figures.add(
            "enroll_hello_seconds", "  of which until every hello was accepted", all_accepted, f"{all_accepted:.2f} s"
        )
        figures.add(
            "enroll_cp_cpu",
            "  CP CPU during enrollment",
            enroll_cpu,
            f"{enroll_cpu:.2f} s  ({enroll_cpu / n * 1e6:.0f} us/edge)",
        )
        figures.add(
            "listen_overflows",
            "  kernel listen-queue overflows",
            overflows,
            f"{overflows}  (machine-wide counter; a dropped SYN is retried after 1 s)",
        )

        # Keep the load generator's own garbage collector out of the figures.
        gc.collect()
        gc.freeze()
        await sleep(1.0)
        rss_connected = cp.rss_bytes()
        per_edge = (rss_connected - rss_idle) / n
        figures.add("rss_connected", "RSS with N edges connected", rss_connected, mib(rss_connected))
        figures.add("bytes_per_edge", "  bytes per connected edge", per_edge, f"{per_edge / 1024:.1f} KiB")

        cp_cpu = cp.cpu_seconds()
        await sleep(args.idle_seconds)
        idle = (cp.cpu_seconds() - cp_cpu) / args.idle_seconds
        figures.add("idle_cpu", f"  CP CPU while idle ({args.idle_seconds:g} s window)", idle, f"{idle * 100:.1f} %")

        timings = []
        for _ in range(3):
            _, _, seconds, _ = await http.get_json("/edges?limit=1")
            timings.append(seconds)
        figures.add("edges_list_seconds", "GET /edges?limit=1 latency", spread(timings), spread_text(timings))

        # -- fleet status, every edge answering
        if instrument is not None:
            cp.signal(signal.SIGUSR1)
            await sleep(1.0)
        for limit, title in ((1000, "default page, 1000 rows"), (10000, "whole fleet in one page")):
            rounds = []
            for i in range(args.rounds):
                result = await fleet_round(http, cp, fleet, limit, probe_healthz=(i == args.rounds - 1))
                _check_all_ok(result, n, limit)
                rounds.append(result)
                print(
                    f"    round {i + 1}: {ms(result['seconds'])} (requests reached edges "
                    f"{ms(result['first_request'])} .. {ms(result['last_request'])}), CP CPU {result['cp_cpu']:.2f} s, "
                    f"load-gen CPU {result['loadgen_cpu']:.2f} s, other processes {result['others_cores']:.2f} cores, "
                    f"{result['bytes']} bytes",
                    flush=True,
                )
            walls = [r["seconds"] for r in rounds]
            key = f"fleet_{limit}"
            figures.add(key, f"GET /fleet/status ({title})", spread(walls), spread_text(walls))
            first = statistics.median(r["first_request"] for r in rounds)
            last_request = statistics.median(r["last_request"] for r in rounds)
            figures.add(
                key + "_phases",
                "  status requests reached the edges (median)",
                [first, last_request],
                f"first after {ms(first)}, last after {ms(last_request)}",
            )
            cpu = [r["cp_cpu"] for r in rounds]
            figures.add(
                key + "_cp_cpu",
                "  CP CPU per round (median)",
                statistics.median(cpu),
                f"{statistics.median(cpu):.2f} s  ({statistics.median(cpu) / n * 1e6:.0f} us/edge)",
            )
            lg = [r["loadgen_cpu"] for r in rounds]
            figures.add(
                key + "_loadgen_cpu",
                "  load-generator CPU per round (median)",
                statistics.median(lg),
                f"{statistics.median(lg):.2f} s",
            )
            others = statistics.median(r["others_cores"] for r in rounds)
            figures.add(
                key + "_others",
                "  other processes on the machine (median)",
                others,
                f"{others:.2f} of {os.cpu_count()} cores busy with work outside this benchmark",
            )
            figures.add(key + "_bytes", "  response size", rounds[0]["bytes"], f"{rounds[0]['bytes'] / 1024:.0f} KiB")
            last = rounds[-1]
            figures.add(
                key + "_healthz",
                "  GET /healthz worst wait during a round",
                last["healthz_max"],
                ms(last["healthz_max"]) + f"  ({last['healthz_n']} probes)" if last["healthz_max"] else "n/a",
            )
        if instrument is not None:
            cp.signal(signal.SIGUSR2)
            gc_stats = await eventually(lambda: _read_json(Path(str(instrument) + ".gc.json")), 30, "GC figures")
            collections, seconds = gc_stats["collections"], gc_stats["seconds"]
            per_round = 2 * args.rounds
            figures.add(
                "cp_gc",
                "CP garbage collector in those rounds (per round)",
                gc_stats,
                f"{collections[2] / per_round:.1f} full collections, {seconds[2] / per_round * 1000:.0f} ms full"
                f" + {(seconds[0] + seconds[1]) / per_round * 1000:.0f} ms young; longest pause"
                f" {gc_stats['max_pause'] * 1000:.0f} ms; {gc_stats['tracked_objects']} tracked objects",
            )

        # -- per-edge status
        sample = random.Random(7).sample(ids, min(args.samples, n))
        timings = []
        for edge_id in sample:
            code, body, seconds, _ = await http.get_json(f"/edges/{edge_id}/status")
            if code != 200 or body["edge_id"] != edge_id or len(body["nodes"]) != 2:
                raise RuntimeError(f"GET /edges/{edge_id}/status answered {code}: {body}")
            timings.append(seconds)
        figures.add("edge_status", "GET /edges/{id}/status, one at a time", spread(timings), spread_text(timings))

        await sleep(1.0)
        rss_after = cp.rss_bytes()
        figures.add("rss_after", "RSS after fleet rounds", rss_after, mib(rss_after))
        figures.add(
            "bytes_per_edge_after",
            "  bytes per edge (with its snapshot kept)",
            (rss_after - rss_idle) / n,
            f"{(rss_after - rss_idle) / n / 1024:.1f} KiB",
        )

        # -- 1% silent
        silent = fleet.edges[:: max(1, round(100 / args.silent_percent))] if args.silent_percent > 0 else []
        for edge in silent:
            edge.silent = True
        result = await fleet_round(http, cp, fleet, 10000, probe_healthz=True)
        for edge in silent:
            edge.silent = False
        states = result["states"]
        expected_timeouts = sorted(e.edge_id for e in silent)
        exact = result["timeout_rows"] == expected_timeouts
        figures.add(
            "silent_seconds",
            f"GET /fleet/status with {len(silent)} edges silent ({args.silent_percent:g}%)",
            result["seconds"],
            f"{result['seconds']:.2f} s",
        )
        figures.add(
            "silent_states",
            "  rows by state",
            states,
            ", ".join(f"{k} {v}" for k, v in sorted(states.items()))
            + ("  (timeouts are exactly the silent edges)" if exact else "  (TIMEOUT ROWS DIFFER!)"),
        )
        figures.add(
            "silent_healthz",
            "  GET /healthz worst wait during the round",
            result["healthz_max"],
            ms(result["healthz_max"]) if result["healthz_max"] else "n/a",
        )
        if states.get("ok", 0) != n - len(silent) or not exact:
            raise RuntimeError(f"unexpected rows with {len(silent)} silent edges: {states}")

        lost = fleet.lost
        figures.add("edges_lost", "edges dropped during the run", lost, str(lost))
        lg_rss = _vmrss("self")
        figures.add("loadgen_rss", "load generator RSS", lg_rss, mib(lg_rss))
    finally:
        if not cp.running():
            print(f"the Control Plane exited with {cp.process.returncode}; log tail:\n{cp.log()[-3000:]}", flush=True)
        cp.stop()
    if profile is not None:
        _print_profile(profile, args.profile_top)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ports_or_fail(cp: ControlPlaneProcess, labels: set[str]) -> Optional[dict[str, int]]:
    if not cp.running():
        raise RuntimeError(f"the Control Plane exited with {cp.process.returncode}:\n{cp.log()[-3000:]}")
    ports = cp.ports()
    return ports if labels <= set(ports) else None


async def _ready(http: Http) -> bool:
    try:
        code, _, _ = await http.get("/readyz", timeout=5)
    except Exception:
        return False
    return code == 200


def _check_all_ok(result: dict[str, Any], n: int, limit: int) -> None:
    expected_items = min(n, limit)
    problems = []
    if result["total"] != n or result["edges_connected"] != n:
        problems.append(f"total {result['total']}, connected {result['edges_connected']}")
    if result["items"] != expected_items or result["states"].get("ok", 0) != expected_items:
        problems.append(f"rows {result['states']}")
    if result["fresh_nodes"] != 2 * n:
        problems.append(f"fresh nodes {result['fresh_nodes']} != {2 * n}")
    if result["asked"] != n:
        problems.append(f"{result['asked']} status requests reached the edges, not {n}")
    if problems:
        raise RuntimeError("fleet round not all ok: " + "; ".join(problems))


def _print_profile(path: Path, top: int) -> None:
    import pstats

    if not path.exists():
        print(f"no profile was written to {path}", flush=True)
        return
    print(f"\n== Control Plane profile of the all-answering fleet rounds ({path})")
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def run_bounded(timeout: float, work: Callable[[], Any], report: Callable[[bool], None]) -> None:
    """Run the coroutine ``work()`` on the reactor within ``timeout`` seconds, then ``report(failed)``.

    A SIGALRM a minute past the deadline is the backstop in case the reactor
    itself is stuck: a benchmark never outlives its deadline and never leaves
    a Control Plane behind. Exits 1 when the run failed or timed out.
    """

    def hard_deadline(signum: int, frame: Any) -> None:
        print(f"hard deadline of {timeout + 60:g} s passed; killing everything", flush=True)
        for cp in CONTROL_PLANES:
            cp.process.kill()
        os._exit(3)

    signal.signal(signal.SIGALRM, hard_deadline)
    signal.alarm(int(timeout + 60))

    async def body(_reactor: Any) -> None:
        d = defer.ensureDeferred(work())
        d.addTimeout(timeout, reactor)
        failed = False
        try:
            await d
        except defer.CancelledError:
            print(f"the benchmark did not finish within {timeout:g} s", flush=True)
            failed = True
        except Exception:
            Failure().printTraceback()
            failed = True
        report(failed)
        if failed:
            raise SystemExit(1)

    task.react(lambda r: defer.ensureDeferred(body(r)))


def main() -> None:
    """Parse arguments, run the benchmark under a hard deadline, print figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10000, help="fake edges to connect (default 10000)")
    parser.add_argument("--batch", type=int, default=200, help="edges connecting at once (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="fleet status rounds per page size (default 5)")
    parser.add_argument("--samples", type=int, default=200, help="edges asked one at a time (default 200)")
    parser.add_argument("--silent-percent", type=float, default=1.0, help="edges silent in the last round (default 1)")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="window for the idle CPU figure")
    parser.add_argument("--timeout", type=float, default=300.0, help="overall deadline in seconds (default 300)")
    parser.add_argument(
        "--edge-listen",
        default=f"tcp:0:interface={LOOPBACK}",
        help="IOP_EDGE_WIRE_LISTEN for the Control Plane (loopback only; e.g. add :backlog=1024)",
    )
    parser.add_argument("--gc-stats", action="store_true", help="report the CP's garbage collector in the fleet rounds")
    parser.add_argument(
        "--cp-gc",
        default="",
        metavar="MODE",
        help="what-if on the CP's collector: threshold:A,B,C or freeze (see cp_instrumented.py)",
    )
    parser.add_argument("--profile", metavar="OUT.prof", help="cProfile the CP during the fleet rounds")
    parser.add_argument("--profile-top", type=int, default=30, help="profile lines to print")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the Control Plane's log after a good run")
    args = parser.parse_args()
    if "interface=127.0.0.1" not in args.edge_listen:
        parser.error("--edge-listen must bind interface=127.0.0.1")

    limit = raise_open_file_limit(args.edges + SPARE_FDS)
    print(
        f"open-file limit {limit}; python {sys.version.split()[0]}; {os.cpu_count()} cores; "
        f"load average {Path('/proc/loadavg').read_text().split()[0]}",
        flush=True,
    )
    figures = Figures()
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-"))

    def report(failed: bool) -> None:
        print("\n== fleet_fanout figures" + (" (INCOMPLETE)" if failed else ""))
        print(figures.table(), flush=True)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "edges": args.edges,
                        "batch": args.batch,
                        "profiled": bool(args.profile),
                        "cp_gc": args.cp_gc,
                        "complete": not failed,
                        "figures": figures.data,
                    },
                    indent=2,
                    default=str,
                )
                + "\n"
            )
        if failed or args.keep_logs:
            print(f"Control Plane log kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    run_bounded(args.timeout, lambda: run(args, workdir, figures), report)


if __name__ == "__main__":
    main()
