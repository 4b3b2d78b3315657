#!/usr/bin/env python
"""The benchmark suite: every figure of docs/performance.md with its target.

One invocation starts the references (``echo_server.py``, a bare Twisted
length-prefixed echo server, and ``klein_app.py``, a minimal Klein app) and
the real Control Plane (``twistd -n iop-control-plane``), each in its own
process on loopback, drives them with the same fake edges and the same HTTP
client from this process, and prints each figure next to the same run's
reference, the ratio, the target and PASS or MISS.

``--quick`` (``make bench``, about a minute) runs 1,000 edges; the default
(``make bench-full``) runs 1,000, 10,000 and 20,000 edges (20,000 only as far
as this process's open-file limit allows). Each phase has a deadline, and the
processes it started are stopped however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_fanout as ff
from twisted.internet import defer, reactor
from twisted.internet.task import LoopingCall

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import make_envelope

BENCH_DIR = Path(__file__).resolve().parent
#: The phases ``--only`` may name: fleet rounds, CPU and RSS against the echo
#: reference; GET /edges/{id} against Klein; live events; commands.
PHASES = ("fleet", "http", "events", "commands")


# -- the fake edges: a 4-node x 2-provider snapshot, and commands answered ----------


class BenchEdge(ff.FakeEdge):
    """A fake edge that also answers commands at once (succeeded) and relays events."""

    #: The newest ``edge_sequence`` this edge relayed.
    event_sequence = 0

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "edge_command_request":
            answer = pb.EdgeCommandResponse(
                command_id=envelope.edge_command_request.command_id, outcome=pb.COMMAND_OUTCOME_SUCCEEDED
            )
            self.send("edge_command_response", answer, envelope.request_id)
            return
        super().envelope_received(envelope, body)


class EventSender:
    """Relays ``edge_event`` frames from the bench edges, round robin, at a set rate.

    Each event carries its send time (``time.perf_counter_ns()`` of this
    process, attribute ``sent_ns``) so a subscriber in this process can time
    it end to end; each edge numbers its events (``edge_sequence``) as a real
    Edge does.
    """

    def __init__(self, edges: list[BenchEdge]) -> None:
        self.edges = edges
        self.sent = 0
        self._next = 0

    def send(self, count: int) -> None:
        """Relay ``count`` events, one per edge in turn."""
        edges = self.edges
        for _ in range(count):
            edge = edges[self._next % len(edges)]
            self._next += 1
            edge.event_sequence += 1
            event = pb.EdgeEvent(
                kind="bench.tick",
                edge_sequence=edge.event_sequence,
                occurred_at_ms=int(time.time() * 1000),
                attributes={"sent_ns": str(time.perf_counter_ns())},
            )
            edge.send("edge_event", event)
            self.sent += 1

    async def at_rate(self, rate: float, seconds: float, tick: float = 0.005) -> float:
        """Relay ``rate`` events a second for ``seconds``; the seconds it really took."""
        started = time.perf_counter()
        end = started + seconds

        def step() -> None:
            due = int((time.perf_counter() - started) * rate) - (self.sent - first)
            self.send(max(0, min(due, int(rate * seconds) - (self.sent - first))))
            if time.perf_counter() >= end:
                loop.stop()

        first = self.sent
        loop = LoopingCall(step)
        loop.clock = reactor
        await loop.start(tick)
        self.send(int(rate * seconds) - (self.sent - first))
        return time.perf_counter() - started


class Subscriber:
    """``bench/event_subscriber.py`` in its own process: a ``/client`` subscriber
    to the whole fleet, so receiving events does not share this process's
    reactor with sending them."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / "event_subscriber.py"), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        if line != "ready":
            self.stop()
            raise RuntimeError(f"the event subscriber did not start: {line!r}")

    def _ask(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.process.stdout.readline().strip()

    def reset(self) -> None:
        """Start counting again."""
        self._ask("reset")

    def report(self) -> dict[str, Any]:
        """Received, lost, latency p50/p99 (seconds), last arrival (perf_counter_ns)."""
        report: dict[str, Any] = json.loads(self._ask("report"))
        return report

    def stall(self) -> None:
        """Stop the process (SIGSTOP): it reads nothing more, as a stalled
        subscriber does, until :meth:`stop`."""
        self.process.send_signal(signal.SIGSTOP)

    def stop(self) -> None:
        """Close its stdin; kill it if it does not exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(10)
            except (subprocess.TimeoutExpired, OSError):
                self.process.kill()
                self.process.wait(5)


class BenchFleet(ff.FakeFleet):
    """N bench edges; all of them may dial at once."""

    edge_class = BenchEdge

    def status_tail(self, edge_id: str) -> bytes:
        tail = self._tails.get(edge_id)
        if tail is None:
            tail = self._tails[edge_id] = make_envelope(
                "edge_status_response", ff.edge_snapshot(edge_id, ff.NODES_4X2)
            ).SerializeToString()
        return tail


# -- the processes ----------------------------------------------------------------------


class Reference:
    """``python bench/<script>``: prints one line of ``name=port`` pairs, then serves."""

    def __init__(self, script: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH_DIR / script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        self.pid = self.process.pid
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        self.ports = {k: int(v) for k, v in (item.split("=") for item in line[1:])}

    def cpu_seconds(self) -> float:
        """User + system CPU so far."""
        return _cpu(self.pid)

    def rss_bytes(self) -> int:
        """VmRSS."""
        return ff._vmrss(self.pid)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ff.CLOCK_TICKS


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


# -- the results ------------------------------------------------------------------------------


class Results:
    """Figures with their reference, ratio, target and verdict."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def add(
        self, figure: str, ours: str, reference: str, ratio: Optional[float], target: str, passed: Optional[bool]
    ) -> None:
        """One line of the final table (``passed`` None: information only)."""
        verdict = "" if passed is None else ("PASS" if passed else "MISS")
        self.rows.append(
            {
                "figure": figure,
                "ours": ours,
                "reference": reference,
                "ratio": ratio,
                "target": target,
                "verdict": verdict,
            }
        )
        ratio_text = "" if ratio is None else f"{ratio:.2f}"
        print(
            f"  {figure}: {ours} | reference {reference} | ratio {ratio_text} | target {target} | {verdict}", flush=True
        )

    def table(self) -> str:
        """The table as Markdown."""
        lines = ["| figure | twisted-iop | reference | ratio | target | verdict |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
            lines.append(
                f"| {r['figure']} | {r['ours']} | {r['reference']} | {ratio} | {r['target']} | {r['verdict']} |"
            )
        return "\n".join(lines)


# -- phases ------------------------------------------------------------------------------------


async def enroll(fleet: BenchFleet, n: int, count: Any, timeout: float, pid: int) -> dict[str, Any]:
    """Dial ``n`` edges at once; seconds until ``count()`` says ``n``, every
    dial has ended with some refused or failed, or the deadline passed.

    Dials that failed (no descriptor left, refused, timed out) are counted
    by reason in ``dial_failures``, so a short enrollment says why instead
    of waiting out the deadline in silence.
    """
    edge_ids = [f"edge-{i:05d}" for i in range(n)]
    for edge_id in edge_ids:
        # Each edge's status answer is built before the clock starts: the
        # window measures the server taking the burst, not this process
        # building snapshots.
        fleet.status_tail(edge_id)
    overflows = ff.listen_overflows()
    cpu = _cpu(pid)
    started = time.perf_counter()
    dialed = [fleet.connect(edge_id) for edge_id in edge_ids]
    results = defer.DeferredList(dialed, consumeErrors=True)
    deadline = time.monotonic() + timeout
    enrolled = 0
    while time.monotonic() < deadline:
        enrolled = await count()
        if enrolled >= n or (results.called and fleet.accepted < n):
            break
        await ff.sleep(0.05)
    seconds = time.perf_counter() - started
    cpu = _cpu(pid) - cpu
    await results if enrolled >= n else None
    return {
        "seconds": seconds,
        "cpu": cpu,
        "enrolled": enrolled,
        "overflows": ff.listen_overflows() - overflows,
        "dial_failures": dict(fleet.dial_failures),
    }


def enrollment_text(result: dict[str, Any], n: int) -> str:
    """Seconds, edges never enrolled, listen overflows, failed dials by reason and
    connections the server closed for want of a hello in time."""
    text = (
        f"{result['seconds']:.2f} s (server CPU {result['cpu']:.2f} s), "
        f"{n - result['enrolled']} never, {result['overflows']} overflows"
    )
    failures = result["dial_failures"]
    if failures:
        reasons = "; ".join(f"{count} x {reason}" for reason, count in sorted(failures.items(), key=lambda i: -i[1]))
        text += f" (dials failed: {reasons})"
    if result.get("hello_timeouts"):
        text += f" ({result['hello_timeouts']} closed by the hello deadline)"
    return text


async def rounds(http: ff.Http, path: str, fleet: BenchFleet, pid: int, count: int) -> dict[str, Any]:
    """``count`` fleet rounds through ``path``; wall times and the server's CPU."""
    walls = []
    cpu = _cpu(pid)
    asked = fleet.status_requests
    for _ in range(count):
        code, _, seconds = await http.get(path)
        if code != 200:
            raise RuntimeError(f"GET {path} answered {code}")
        walls.append(seconds)
    cpu = _cpu(pid) - cpu
    polls = fleet.status_requests - asked
    return {"walls": walls, "cpu": cpu, "polls": polls}


async def http_rate(http: ff.Http, paths: list[str], seconds: float, concurrency: int = 8) -> float:
    """Requests per second with ``concurrency`` callers in a loop for ``seconds``."""
    done = 0
    end = time.monotonic() + seconds

    async def caller(k: int) -> None:
        nonlocal done
        i = k
        while time.monotonic() < end:
            code, _, _ = await http.get(paths[i % len(paths)])
            if code != 200:
                raise RuntimeError(f"GET {paths[i % len(paths)]} answered {code}")
            done += 1
            i += concurrency

    started = time.monotonic()
    await defer.gatherResults([defer.ensureDeferred(caller(k)) for k in range(concurrency)], consumeErrors=True)
    return done / (time.monotonic() - started)


async def commands(http: ff.Http, edge_ids: list[str], rate: float, seconds: float) -> list[float]:
    """POST a command at ``rate`` per second for ``seconds``; each round trip's seconds."""
    latencies: list[float] = []
    waiting: list[defer.Deferred[None]] = []
    pick = random.Random(3)
    body = json.dumps({"name": "edge.diagnostics", "timeout_seconds": 5}).encode()

    async def one(edge_id: str) -> None:
        started = time.perf_counter()
        response = await http.client.post(
            f"{http.base}/edges/{edge_id}/commands", data=body, headers={b"Content-Type": [b"application/json"]}
        )
        await response.content()
        if response.code != 200:
            raise RuntimeError(f"command answered {response.code}")
        latencies.append(time.perf_counter() - started)

    loop = LoopingCall(lambda: waiting.append(defer.ensureDeferred(one(pick.choice(edge_ids)))))
    loop.clock = reactor
    loop.start(1.0 / rate)
    await ff.sleep(seconds)
    loop.stop()
    await defer.gatherResults(waiting, consumeErrors=True)
    return latencies


async def fleet_phase(args: Any, n: int, results: Results, workdir: Path, phase: int = 0) -> None:
    """Echo, then the Control Plane, at ``n`` edges (of the ``phase`` asked for): enrollment, rounds, CPU, RSS.

    Without ``fleet`` in ``--only``, the echo reference and the fleet
    figures are left out: the Control Plane only enrolls the edges for the
    other phases.
    """
    # The targets "at 20k" judge the 20,000-edge phase, which runs as many
    # edges as the open-file limit allows (19,800 here).
    at_20k = (phase or n) >= 20000
    label = f"{n:,} edges"
    if "fleet" in args.only:
        print(f"\n== {label}: bare echo", flush=True)
        echo = Reference("echo_server.py")
        try:
            http = ff.Http(echo.ports["http_port"])
            rss_idle = echo.rss_bytes()
            fleet = BenchFleet(echo.ports["edge_port"])

            async def echo_count() -> int:
                _, body, _ = await http.get("/count")
                return int(body)

            echo_enroll = await enroll(fleet, n, echo_count, args.enroll_timeout, echo.pid)
            echo_rounds = await rounds(http, "/round", fleet, echo.pid, args.rounds)
            echo_rss = (echo.rss_bytes() - rss_idle) / n
            # Every edge's descriptor closed before the next dials (the
            # load generator holds one per edge, up to its hard limit).
            await fleet.close()
        finally:
            echo.stop()
        await ff.sleep(1.0)

    print(f"== {label}: twisted-iop Control Plane", flush=True)
    cp = ff.ControlPlaneProcess(workdir, f"tcp:0:interface={ff.LOOPBACK}")
    ff.CONTROL_PLANES.append(cp)
    try:
        ports = await ff.eventually(
            lambda: ff._ports_or_fail(cp, {"edge_wire", "http"}), 30, "the Control Plane's ports"
        )
        http = ff.Http(ports["http"])
        await ff.eventually(lambda: ff._ready(http), 30, "GET /readyz")
        rss_idle = cp.rss_bytes()
        fleet = BenchFleet(ports["edge_wire"])

        async def cp_count() -> int:
            _, body, _, _ = await http.get_json("/edges?limit=1")
            return int(body["total"])

        cp_enroll = await enroll(fleet, n, cp_count, args.enroll_timeout, cp.pid)
        cp_enroll["hello_timeouts"] = cp.log().count("HELLO_TIMEOUT")
        if "fleet" in args.only:
            cp_rounds = await rounds(http, "/fleet/status", fleet, cp.pid, args.rounds)
            await ff.sleep(1.0)
            cp_rss = (cp.rss_bytes() - rss_idle) / n
        if args.extras:
            await extras(args, http, fleet, cp.pid, results)
        await fleet.close()
    finally:
        cp.stop()
    if "fleet" not in args.only:
        return

    p50, p99 = statistics.median(cp_rounds["walls"]), percentile(cp_rounds["walls"], 0.99)
    e50, e99 = statistics.median(echo_rounds["walls"]), percentile(echo_rounds["walls"], 0.99)
    # Rounds and RSS over fewer edges than the phase's are no figure for it
    # (polls per CPU-second are per poll and stay comparable).
    short = echo_enroll["enrolled"] < n or cp_enroll["enrolled"] < n
    no_reference = f" (echo held only {echo_enroll['enrolled']:,} edges: no reference)" if short else ""
    if cp_enroll["enrolled"] < n:
        no_reference = f" (the Control Plane held only {cp_enroll['enrolled']:,} edges: no verdict)"
    results.add(
        f"{label}: fleet round p50 / p99 ({args.rounds} rounds)",
        f"{p50 * 1000:.0f} / {p99 * 1000:.0f} ms",
        f"{e50 * 1000:.0f} / {e99 * 1000:.0f} ms{no_reference}",
        p50 / e50,
        "<= 1.5x echo",
        None if short else p50 <= 1.5 * e50,
    )
    ours_rate = cp_rounds["polls"] / max(cp_rounds["cpu"], 1e-9)
    echo_rate = echo_rounds["polls"] / max(echo_rounds["cpu"], 1e-9)
    results.add(
        f"{label}: status polls per server CPU-second",
        f"{ours_rate / 1000:.1f}k",
        f"{echo_rate / 1000:.1f}k",
        ours_rate / echo_rate,
        ">= 0.60x echo",
        ours_rate >= 0.6 * echo_rate,
    )
    results.add(
        f"{label}: RSS per connected edge, last snapshot kept",
        f"{cp_rss / 1024:.1f} KiB",
        f"{echo_rss / 1024:.1f} KiB{no_reference}",
        cp_rss / max(echo_rss, 1.0),
        "<= 4 KiB (at 20k)",
        cp_rss <= 4096 if at_20k and not short else None,
    )
    results.add(
        f"{label}: all dialing at once, until all enrolled",
        enrollment_text(cp_enroll, n),
        enrollment_text(echo_enroll, n),
        cp_enroll["seconds"] / echo_enroll["seconds"],
        "all, <= 1.5x echo (at 20k)",
        # An echo reference that enrolled fewer edges is no reference.
        (
            cp_enroll["enrolled"] == n
            and echo_enroll["enrolled"] == n
            and cp_enroll["seconds"] <= 1.5 * echo_enroll["seconds"]
        )
        if at_20k
        else None,
    )


async def extras(args: Any, http: ff.Http, fleet: BenchFleet, pid: int, results: Results) -> None:
    """Against the running Control Plane: GET /edges/{id} (vs Klein), live
    events and commands (those of them ``--only`` names)."""
    edge_ids = [edge.edge_id for edge in fleet.edges[:1000]]
    if "http" in args.only:
        await edge_detail_rate(args, http, edge_ids, results)
    if "events" in args.only:
        await live_events(args, http, fleet, pid, results)
    if "commands" not in args.only:
        return
    latencies = await commands(http, edge_ids, 100.0, args.command_seconds)
    p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
    results.add(
        f"command round trip at 100/s ({len(latencies)} commands) p50 / p99",
        f"{p50 * 1000:.1f} / {p99 * 1000:.1f} ms",
        "-",
        None,
        "p99 <= 5 ms",
        p99 <= 0.005,
    )


async def edge_detail_rate(args: Any, http: ff.Http, edge_ids: list[str], results: Results) -> None:
    """``GET /edges/{id}`` requests per second, the Control Plane's then Klein's."""
    http.pool.maxPersistentPerHost = 8
    ours = await http_rate(http, [f"/edges/{e}" for e in edge_ids], args.http_seconds)
    klein = Reference("klein_app.py")
    try:
        kh = ff.Http(klein.ports["http_port"])
        kh.pool.maxPersistentPerHost = 8
        theirs = await http_rate(kh, [f"/edges/{e}" for e in edge_ids], args.http_seconds)
    finally:
        klein.stop()
    results.add(
        "GET /edges/{id} req/s (8 callers)",
        f"{ours:.0f}",
        f"{theirs:.0f} (Klein)",
        ours / theirs,
        ">= 0.90x Klein",
        ours >= 0.9 * theirs,
    )


async def live_events(args: Any, http: ff.Http, fleet: BenchFleet, pid: int, results: Results) -> None:
    """A ``/client`` subscriber (its own process) to the whole fleet while edges
    relay events: latency at 10k/s, then whether 30k/s arrive without loss."""
    url = http.base.replace("http://", "ws://", 1) + "/client"
    subscriber = Subscriber(url)
    stalled: Optional[Subscriber] = None
    sender = EventSender([edge for edge in fleet.edges if edge.transport is not None][:1000])
    alone_p99 = 0.0
    try:
        for rate in (10_000.0, 30_000.0, "stalled"):
            if rate == "stalled":
                # 10k/s again, with a second subscriber that stops reading.
                stalled = Subscriber(url)
                stalled.stall()
                rate = 10_000.0
            subscriber.reset()
            before = sender.sent
            started_ns = time.perf_counter_ns()
            cpu = _cpu(pid)
            took = await sender.at_rate(rate, args.event_seconds)
            sent = sender.sent - before
            deadline = time.monotonic() + 10.0
            report = subscriber.report()
            while report["received"] + report["lost"] < sent and time.monotonic() < deadline:
                await ff.sleep(0.1)
                report = subscriber.report()
            per_event = (_cpu(pid) - cpu) / max(sent, 1)
            received, lost = report["received"], report["lost"]
            server = f"server CPU {per_event * 1e6:.0f} us/event"
            if stalled is not None:
                p99 = report["p99"]
                results.add(
                    f"live events at 10k/s with a second subscriber stalled ({sent} sent): p99 of the healthy one",
                    f"{p99 * 1000:.1f} ms (alone: {alone_p99 * 1000:.1f} ms), {received} arrived, {lost} lost; {server}",
                    "-",
                    None,
                    "adds < 10 ms",
                    received == sent and p99 - alone_p99 < 0.010,
                )
            elif rate == 10_000.0:
                alone_p99 = report["p99"]
                p50, p99 = report["p50"], report["p99"]
                results.add(
                    f"live events at 10k/s to a /client subscriber ({sent} sent in {took:.1f} s) p50 / p99",
                    f"{p50 * 1000:.1f} / {p99 * 1000:.1f} ms, {received} arrived, {lost} lost; {server}",
                    "-",
                    None,
                    "p99 <= 5 ms",
                    p99 <= 0.005 and received == sent,
                )
            else:
                # Delivered rate: events that arrived, over the time from the
                # first send to the last arrival.
                span = max((report["last_ns"] - started_ns) / 1e9, took)
                delivered = received / span if received else 0.0
                results.add(
                    f"live events at 30k/s to a /client subscriber ({sent} sent in {took:.1f} s)",
                    f"{received} arrived ({delivered / 1000:.1f}k/s), {lost} lost, "
                    f"{sent - received - lost} missing; {server}",
                    "-",
                    None,
                    ">= 30k/s lossless",
                    received == sent and delivered >= 30_000 * 0.95,
                )
    finally:
        subscriber.stop()
        if stalled is not None:
            stalled.stop()


async def run(args: Any, results: Results, workdir: Path) -> None:
    """Every phase in order."""
    limit = ff.raise_open_file_limit(1000 + ff.SPARE_FDS)
    for n in args.edges:
        fits = min(n, limit - ff.SPARE_FDS)
        if fits < n:
            print(
                f"\n{n:,} edges need {n + ff.SPARE_FDS} descriptors here; the hard limit is {limit}: running {fits:,}"
            )
        args.extras = n == args.edges[0]
        await fleet_phase(args, fits, results, workdir, phase=n)


def main() -> None:
    """Parse arguments, run under a hard deadline, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 edges only (make bench)")
    parser.add_argument("--rounds", type=int, default=0, help="fleet rounds per server (default 10 quick, 5 full)")
    parser.add_argument("--http-seconds", type=float, default=5.0, help="seconds of GET /edges/{id} per server")
    parser.add_argument("--command-seconds", type=float, default=5.0, help="seconds of commands at 100/s")
    parser.add_argument("--event-seconds", type=float, default=2.0, help="seconds of live events at each rate")
    parser.add_argument("--enroll-timeout", type=float, default=60.0, help="deadline for all edges to enroll")
    parser.add_argument("--timeout", type=float, default=280.0, help="overall deadline in seconds")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    parser.add_argument(
        "--edges",
        metavar="N[,N...]",
        help="run only these fleet phases (edge counts); the first also runs the HTTP, event and command figures",
    )
    parser.add_argument(
        "--only",
        default=",".join(PHASES),
        help=f"comma-separated phases to run, of {', '.join(PHASES)} (default: all); "
        "without fleet the Control Plane only enrolls the edges (no echo reference)",
    )
    args = parser.parse_args()
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - set(PHASES)
    if unknown:
        parser.error(f"unknown phases in --only: {', '.join(sorted(unknown))}")
    if args.edges:
        args.edges = [int(n) for n in args.edges.split(",")]
    else:
        args.edges = [1000] if args.quick or "fleet" not in args.only else [1000, 10000, 20000]
    args.rounds = args.rounds or (10 if args.quick else 5)
    print(
        f"python {sys.version.split()[0]}; {os.cpu_count()} cores; load average "
        f"{Path('/proc/loadavg').read_text().split()[0]}; {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    results = Results()
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-suite-"))

    def report(failed: bool) -> None:
        print("\n== twisted-iop benchmark suite" + (" (INCOMPLETE)" if failed else ""))
        print(results.table(), flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results.rows, indent=2) + "\n")
        shutil.rmtree(workdir, ignore_errors=True)

    ff.run_bounded(args.timeout, lambda: run(args, results, workdir), report)


if __name__ == "__main__":
    main()
