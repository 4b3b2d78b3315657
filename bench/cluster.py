#!/usr/bin/env python
"""Cluster mode against its targets: replicas sharing one fleet through Redis.

One invocation starts its own ``redis-server`` (``twisted_iop.testing.redis``,
in a temp dir, loopback), R Control Plane replicas as real
``twistd -n iop-control-plane`` processes (``cluster.backend: redis``,
distinct replica ids and ports) and, per replica, one process of simulated
edges (bench/suite.py's bench edges: hello, a 4-node x 2-provider snapshot),
so the edges are spread evenly over the replicas (edge i dials replica
i mod R). It measures:

1. enrollment: every edge dials at once; until every hello is accepted and
   every replica's mirror knows all N edges;
2. steady state: Redis commands per edge per minute over a window with no
   polling (``INFO stats`` and ``INFO commandstats`` deltas), and per edge
   per heartbeat (the edge wire's keepalive interval);
3. ``GET /fleet/status`` rounds (``status.fleet_max_age_seconds: 0``) from
   ONE replica over the whole fleet: p50/p99, each round checked (every
   edge asked once, every row ok), with the CPU of each process and the
   Redis commands per round;
4. the reference: the same enrollment and rounds with a single Control Plane
   (backend memory) at N/R edges.

and prints each figure with its target and PASS/MISS. ``--quick``
(3 replicas x 1,000 edges against one at 333; under 2 minutes); the default
is 30,000 edges over 3 replicas against one at 10,000 (``make bench-cluster``).
Every run has a deadline and stops what it started.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import contextlib

import fleet_fanout as ff
import suite
from twisted.internet import defer, protocol, reactor, stdio
from twisted.protocols.basic import LineReceiver

from twisted_iop.testing.redis import RedisServer
from twisted_iop.wire.settings import PeerSettings

BENCH_SCRIPT = str(Path(__file__).resolve())
#: The edge heartbeat the Redis target is counted against: the edge wire's keepalive interval.
HEARTBEAT_SECONDS = PeerSettings().keepalive_interval_seconds


# -- the edge process: N/R bench edges dialing one replica ------------------------------------


class EdgeCommands(LineReceiver):
    """``connect`` / ``stats`` from the benchmark, on stdin; one line answered each."""

    delimiter = b"\n"

    def __init__(self, fleet: suite.BenchFleet, ids: list[str], done: defer.Deferred[None]) -> None:
        self.fleet = fleet
        self.ids = ids
        self.done = done
        self.failed = 0
        #: Why dials failed, with counts (printed with the enrollment figure).
        self.reasons: dict[str, int] = {}

    def lineReceived(self, line: bytes) -> None:
        command = line.strip()
        if command == b"connect":
            for edge_id in self.ids:
                self.fleet.connect(edge_id).addErrback(self._dial_failed)
            self.sendLine(b"ok")
        elif command == b"stats":
            fleet = self.fleet
            stats = {
                "accepted": fleet.accepted,
                "lost": fleet.lost,
                "failed": self.failed,
                "reasons": dict(sorted(self.reasons.items(), key=lambda kv: -kv[1])[:5]),
                "status_requests": fleet.status_requests,
                "cpu": suite._cpu(os.getpid()),
            }
            self.sendLine(json.dumps(stats).encode())
        elif command == b"quit":
            self._quit()

    def _dial_failed(self, failure: Any) -> None:
        self.failed += 1
        reason = f"{type(failure.value).__name__}: {failure.getErrorMessage()}"[:120]
        self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def _quit(self) -> None:
        if not self.done.called:
            self.fleet.close()
            self.done.callback(None)

    def connectionLost(self, reason: Any = None) -> None:
        self._quit()


def edge_process(port: int, ids: list[str]) -> None:
    """Run bench edges for ``ids`` against ``port`` until stdin closes."""
    ff.raise_open_file_limit(len(ids) + ff.SPARE_FDS)

    async def main(_reactor: Any) -> None:
        done: defer.Deferred[None] = defer.Deferred()
        commands = EdgeCommands(suite.BenchFleet(port), ids, done)
        stdio.StandardIO(commands)
        commands.sendLine(b"ready")
        await done
        await ff.sleep(0.2)

    from twisted.internet import task

    task.react(lambda r: defer.ensureDeferred(main(r)))


class EdgeProcess(protocol.ProcessProtocol):
    """The benchmark's side of one edge process: asks a line, gets a line (no blocking)."""

    def __init__(self, port: int, ids: list[str], workdir: Path, name: str) -> None:
        self._buffer = b""
        self._waiting: list[defer.Deferred[str]] = []
        self.ended: defer.Deferred[None] = defer.Deferred()
        self.count = len(ids)
        ids_path = workdir / f"{name}.ids"
        ids_path.write_text("\n".join(ids))
        self._ready = self._next_line()
        self.transport_: Any = reactor.spawnProcess(
            self,
            sys.executable,
            [sys.executable, BENCH_SCRIPT, "--edge-process", str(port), str(ids_path)],
            env=dict(os.environ),
            childFDs={0: "w", 1: "r", 2: 2},
        )
        self.pid: int = self.transport_.pid
        # The hard deadline of ff.run_bounded kills what is in this list.
        ff.CONTROL_PLANES.append(types.SimpleNamespace(process=types.SimpleNamespace(kill=self.kill)))  # type: ignore[arg-type]

    def _next_line(self) -> defer.Deferred[str]:
        d: defer.Deferred[str] = defer.Deferred()
        self._waiting.append(d)
        return d

    def outReceived(self, data: bytes) -> None:
        self._buffer += data
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            if self._waiting:
                self._waiting.pop(0).callback(line.decode().strip())

    def processEnded(self, reason: Any) -> None:
        for d in self._waiting:
            d.errback(RuntimeError(f"the edge process ended: {reason.getErrorMessage()}"))
        self._waiting = []
        self.ended.callback(None)

    async def ready(self) -> None:
        """Wait for ``ready``."""
        line = await self._ready
        if line != "ready":
            raise RuntimeError(f"the edge process did not start: {line!r}")

    async def ask(self, command: str) -> str:
        """Send ``command``; its one-line answer."""
        d = self._next_line()
        self.transport_.write(command.encode() + b"\n")
        return await d

    async def stats(self) -> dict[str, Any]:
        """Accepted, lost, failed dials, status requests seen, CPU seconds."""
        stats: dict[str, Any] = json.loads(await self.ask("stats"))
        return stats

    def kill(self) -> None:
        """SIGKILL, if still running."""
        with contextlib.suppress(OSError):
            os.kill(self.pid, 9)

    async def stop(self) -> None:
        """Close its stdin (it aborts its connections and exits); kill it after 10 s."""
        if self.ended.called:
            return
        self.transport_.closeStdin()
        timer = reactor.callLater(10, self.kill)
        await self.ended
        if timer.active():
            timer.cancel()


# -- Redis figures --------------------------------------------------------------------------


def redis_info(port: int, section: str) -> dict[str, str]:
    """``INFO section`` as a dict (a short blocking call on loopback)."""
    with socket.create_connection((ff.LOOPBACK, port), timeout=5) as s:
        s.sendall(f"*2\r\n$4\r\nINFO\r\n${len(section)}\r\n{section}\r\n".encode())
        data = b""
        while b"\r\n" not in data:
            data += s.recv(65536)
        header, rest = data.split(b"\r\n", 1)
        size = int(header[1:])
        while len(rest) < size + 2:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
    info = {}
    for line in rest[:size].decode().splitlines():
        if ":" in line and not line.startswith("#"):
            key, value = line.split(":", 1)
            info[key] = value
    return info


class RedisCounter:
    """Commands Redis processed between two readings (our own INFO calls left out)."""

    def __init__(self, redis: RedisServer) -> None:
        self.redis = redis

    def reading(self) -> dict[str, Any]:
        """total_commands_processed and the calls of each command, now."""
        total = int(redis_info(self.redis.port, "stats")["total_commands_processed"])
        calls: dict[str, int] = {}
        for key, value in redis_info(self.redis.port, "commandstats").items():
            if key.startswith("cmdstat_"):
                fields = dict(item.split("=", 1) for item in value.split(","))
                calls[key[len("cmdstat_") :]] = int(fields["calls"])
        assert self.redis.process is not None
        return {"total": total, "calls": calls, "cpu": suite._cpu(self.redis.process.pid)}

    @staticmethod
    def delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """Client commands, commands by name (scripts' inner calls included), Redis CPU."""
        calls = {
            name: after["calls"][name] - before["calls"].get(name, 0)
            for name in after["calls"]
            if name != "info" and after["calls"][name] != before["calls"].get(name, 0)
        }
        # The two INFO calls of the first reading and the first of the second
        # happened after the first total was read.
        return {"total": after["total"] - before["total"] - 2, "calls": calls, "cpu": after["cpu"] - before["cpu"]}


# -- one fleet: replicas, their edges, the phases --------------------------------------------


class Fleet:
    """R Control Plane processes and one edge process per replica."""

    def __init__(self, label: str, n: int, replicas: int, redis: Optional[RedisServer], workdir: Path) -> None:
        self.label = label
        self.n = n
        self.redis = redis
        self.workdir = workdir
        self.cps: list[ff.ControlPlaneProcess] = []
        self.https: list[ff.Http] = []
        self.edges: list[EdgeProcess] = []
        for k in range(replicas):
            directory = workdir / f"{label}-replica-{k + 1}"
            directory.mkdir(parents=True)
            # Hello admission lifted (no retry_later): enrollment measures
            # what the replicas can take, and the bench edges do not retry.
            config = "status:\n  fleet_max_age_seconds: 0\nedge_wire:\n  hello_admission:\n    max_loop_lag_ms: 1000000\n    max_pending_hellos: 1000000\n"
            if redis is not None:
                config += f"cluster:\n  backend: redis\n  redis_url: {redis.url}\n  replica_id: replica-{k + 1}\n"
            cp = ff.ControlPlaneProcess(directory, f"tcp:0:interface={ff.LOOPBACK}", config_text=config)
            ff.CONTROL_PLANES.append(cp)
            self.cps.append(cp)

    async def start(self) -> None:
        """Wait for every replica's ports and /readyz; start the edge processes."""
        ids = [f"edge-{i:05d}" for i in range(self.n)]
        for k, cp in enumerate(self.cps):
            ports = await ff.eventually(
                lambda cp=cp: ff._ports_or_fail(cp, {"edge_wire", "http"}), 60, "the Control Plane's ports"
            )
            http = ff.Http(ports["http"])
            await ff.eventually(lambda http=http: ff._ready(http), 60, f"GET /readyz of replica {k + 1}")
            self.https.append(http)
            self.edges.append(
                EdgeProcess(ports["edge_wire"], ids[k :: len(self.cps)], self.workdir, f"{self.label}-{k}")
            )
        for edge in self.edges:
            await edge.ready()

    async def stats(self) -> list[dict[str, Any]]:
        """Every edge process's counters."""
        return list(await defer.gatherResults([defer.ensureDeferred(e.stats()) for e in self.edges]))

    def cpu(self) -> list[float]:
        """CPU seconds of each replica."""
        return [cp.cpu_seconds() for cp in self.cps]

    async def known(self, http: ff.Http) -> int:
        """How many edges one replica knows."""
        try:
            code, body, _, _ = await http.get_json("/edges?limit=1", timeout=10)
        except Exception:
            return -1
        # 503 cluster_unavailable while a replica has lost Redis: it knows nothing for now.
        return int(body["total"]) if code == 200 else -1

    async def enroll(self, timeout: float) -> dict[str, Any]:
        """Every edge dials at once: until all hellos are accepted, and until every replica knows all N."""
        overflows = ff.listen_overflows()
        cpu = self.cpu()
        started = time.perf_counter()
        for edge in self.edges:
            await edge.ask("connect")
        deadline = time.monotonic() + timeout
        accepted_at: Optional[float] = None
        known_at: Optional[float] = None
        accepted = 0
        known: list[int] = []
        while time.monotonic() < deadline:
            if accepted_at is None:
                stats = await self.stats()
                accepted = sum(s["accepted"] for s in stats)
                if accepted >= self.n:
                    accepted_at = time.perf_counter() - started
            known = [await self.known(http) for http in self.https]
            if known_at is None and accepted_at is not None and min(known) >= self.n:
                known_at = time.perf_counter() - started
                break
            await ff.sleep(0.1)
        stats = await self.stats()
        return {
            "accepted_seconds": accepted_at,
            "known_seconds": known_at,
            "accepted": sum(s["accepted"] for s in stats),
            "failed": sum(s["failed"] for s in stats),
            "failure_reasons": [s.get("reasons", {}) for s in stats],
            "known": known,
            "overflows": ff.listen_overflows() - overflows,
            "cpu": [after - before for before, after in zip(cpu, self.cpu(), strict=True)],
        }

    async def rounds(self, count: int, counter: Optional[RedisCounter]) -> dict[str, Any]:
        """``count`` rounds of GET /fleet/status from the first replica, each checked."""
        http = self.https[0]
        walls: list[float] = []
        cpu = self.cpu()
        edges_cpu = sum(s["cpu"] for s in await self.stats())
        before = counter.reading() if counter is not None else None
        for i in range(count):
            asked = sum(s["status_requests"] for s in await self.stats())
            code, body, seconds, size = await http.get_json("/fleet/status")
            asked = sum(s["status_requests"] for s in await self.stats()) - asked
            if code != 200:
                raise RuntimeError(f"GET /fleet/status answered {code}: {str(body)[:300]}")
            totals = body["totals"]
            states: dict[str, int] = {}
            for item in body["items"]:
                states[item["state"]] = states.get(item["state"], 0) + 1
            problems = []
            if body["total"] != self.n or totals["edges_connected"] != self.n:
                problems.append(f"total {body['total']}, connected {totals['edges_connected']}")
            if totals["providers"] != 8 * self.n:
                problems.append(f"providers in ok rows {totals['providers']} != {8 * self.n}")
            if states.get("ok", 0) != len(body["items"]):
                problems.append(f"rows of the first page {states}")
            if asked != self.n:
                problems.append(f"{asked} status requests reached the edges, not {self.n}")
            if problems:
                raise RuntimeError(f"{self.label}: fleet round {i + 1} not all ok: " + "; ".join(problems))
            walls.append(seconds)
            print(f"    round {i + 1}: {seconds * 1000:.0f} ms, {size / 1024:.0f} KiB first page", flush=True)
        delta = RedisCounter.delta(before, counter.reading()) if counter is not None and before else None
        cpu = [after - before for before, after in zip(cpu, self.cpu(), strict=True)]
        edges_cpu = sum(s["cpu"] for s in await self.stats()) - edges_cpu
        return {"walls": walls, "cpu": cpu, "edges_cpu": edges_cpu, "redis": delta}

    async def edge_status(self, samples: int) -> dict[str, list[float]]:
        """GET /edges/{id}/status from the first replica, one at a time: its own edges and routed ones."""
        http, replicas = self.https[0], len(self.cps)
        timings: dict[str, list[float]] = {"local": [], "routed": []}
        for i in range(min(samples, self.n)):
            index = (i * 7919) % self.n
            code, body, seconds, _ = await http.get_json(f"/edges/edge-{index:05d}/status")
            if code != 200 or len(body.get("nodes", [])) != 4:
                raise RuntimeError(f"GET /edges/edge-{index:05d}/status answered {code}: {str(body)[:300]}")
            timings["local" if index % replicas == 0 else "routed"].append(seconds)
        return timings

    async def stop(self) -> None:
        """Edges first (their connections aborted), then the replicas."""
        for edge in self.edges:
            await edge.stop()
        for cp in self.cps:
            if not cp.running():
                print(f"{self.label}: a Control Plane exited early; log tail:\n{cp.log()[-2000:]}", flush=True)
            cp.stop()


# -- the run -----------------------------------------------------------------------------------


def ms(seconds: Optional[float]) -> str:
    """Seconds as milliseconds, or 'never'."""
    return "never" if seconds is None else f"{seconds * 1000:.0f} ms"


async def cluster_phase(args: Any, results: suite.Results, workdir: Path, figures: dict[str, Any]) -> None:
    """R replicas sharing N edges through Redis."""
    n, replicas = args.edges, args.replicas
    print(f"\n== cluster: {replicas} replicas (backend redis), {n:,} edges", flush=True)
    redis = RedisServer(workdir / "redis").start()
    ff.CONTROL_PLANES.append(types.SimpleNamespace(process=redis.process))  # type: ignore[arg-type]
    counter = RedisCounter(redis)
    fleet = Fleet("cluster", n, replicas, redis, workdir)
    try:
        await fleet.start()
        enrolled = await fleet.enroll(args.enroll_timeout)
        figures["cluster_enroll"] = enrolled
        print(f"  enrollment: {enrolled}", flush=True)
        if enrolled["known_seconds"] is None:
            for k, cp in enumerate(fleet.cps):
                log = cp.log()
                print(
                    f"  replica-{k + 1}: {log.count('writes lost so far')} 'could not write' warnings, "
                    f"{log.count(' is gone; ')} replicas reaped, {log.count('reachable again')} reconciles",
                    flush=True,
                )
            raise RuntimeError(f"not every replica knows all {n} edges after {args.enroll_timeout:g} s: {enrolled}")
        await ff.sleep(args.settle_seconds)

        print(f"  steady state: {args.steady_seconds:g} s, no polling", flush=True)
        cpu = fleet.cpu()
        before = counter.reading()
        await ff.sleep(args.steady_seconds)
        steady = RedisCounter.delta(before, counter.reading())
        idle_cpu = [(after - b) / args.steady_seconds for b, after in zip(cpu, fleet.cpu(), strict=True)]
        figures["cluster_steady"] = steady
        print(f"  steady-state Redis commands: {steady}", flush=True)

        print(f"  {args.rounds} fleet rounds from replica-1", flush=True)
        rounds = await fleet.rounds(args.rounds, counter)
        figures["cluster_rounds"] = rounds
        figures["cluster_edge_status"] = await fleet.edge_status(args.samples)
        stats = await fleet.stats()
        lost = sum(s["lost"] for s in stats)
        rss = [cp.rss_bytes() for cp in fleet.cps]
    finally:
        await fleet.stop()
        redis.stop()

    # total_commands_processed counts a script call and each command inside it.
    per_minute = steady["total"] / n / (args.steady_seconds / 60)
    per_heartbeat = per_minute * HEARTBEAT_SECONDS / 60
    top = ", ".join(f"{k} {v}" for k, v in sorted(steady["calls"].items(), key=lambda kv: -kv[1])[:6])
    results.add(
        f"cluster {n:,} edges: Redis commands per edge per minute at steady state ({args.steady_seconds:g} s)",
        f"{per_minute:.4f} ({steady['total']} in all: {top})",
        "-",
        None,
        "-",
        None,
    )
    results.add(
        f"cluster {n:,} edges: Redis commands per edge per heartbeat ({HEARTBEAT_SECONDS:g} s keepalive)",
        f"{per_heartbeat:.5f}",
        "-",
        None,
        "< 1",
        per_heartbeat < 1,
    )
    results.add(
        f"cluster {n:,} edges: replica CPU while idle",
        " / ".join(f"{c * 100:.1f} %" for c in idle_cpu) + f"; RSS {' / '.join(f'{r / 2**20:.0f}' for r in rss)} MiB",
        "-",
        None,
        "-",
        None,
    )
    figures["cluster_summary"] = {"per_minute": per_minute, "per_heartbeat": per_heartbeat, "lost": lost}
    print(f"  edges dropped during the run: {lost}", flush=True)


async def reference_phase(args: Any, workdir: Path, figures: dict[str, Any]) -> None:
    """One Control Plane (backend memory) at N/R edges."""
    n = args.reference_edges
    print(f"\n== reference: 1 Control Plane (backend memory), {n:,} edges", flush=True)
    fleet = Fleet("single", n, 1, None, workdir)
    try:
        await fleet.start()
        enrolled = await fleet.enroll(args.enroll_timeout)
        figures["single_enroll"] = enrolled
        print(f"  enrollment: {enrolled}", flush=True)
        if enrolled["known_seconds"] is None:
            raise RuntimeError(f"the single Control Plane does not know all {n} edges: {enrolled}")
        await ff.sleep(args.settle_seconds)
        print(f"  {args.rounds} fleet rounds", flush=True)
        figures["single_rounds"] = await fleet.rounds(args.rounds, None)
        figures["single_edge_status"] = await fleet.edge_status(args.samples)
    finally:
        await fleet.stop()


def compare(args: Any, results: suite.Results, figures: dict[str, Any]) -> None:
    """The cluster's figures next to the single replica's."""
    n, ref = args.edges, args.reference_edges
    ct, st = figures.get("cluster_edge_status"), figures.get("single_edge_status")
    if ct and st and ct["routed"] and ct["local"]:
        single = statistics.median(st["local"])
        for kind in ("local", "routed"):
            median = statistics.median(ct[kind])
            results.add(
                f"GET /edges/{{id}}/status from replica-1, one at a time, {kind} edges ({len(ct[kind])}): median / max",
                f"{median * 1000:.1f} / {max(ct[kind]) * 1000:.1f} ms",
                f"{single * 1000:.1f} ms (1 replica)",
                median / single,
                "-",
                None,
            )
    ce, se = figures.get("cluster_enroll"), figures.get("single_enroll")
    if ce and se and ce["known_seconds"] and se["known_seconds"]:
        results.add(
            f"enroll {n:,} edges on {args.replicas} replicas, all dialing at once: all hellos accepted / every "
            "replica knows all",
            f"{ms(ce['accepted_seconds'])} / {ms(ce['known_seconds'])}, {ce['overflows']} overflows, "
            f"replica CPU {' / '.join(f'{c:.1f}' for c in ce['cpu'])} s",
            f"{ms(se['known_seconds'])} at {ref:,} on 1",
            ce["known_seconds"] / se["known_seconds"],
            "-",
            None,
        )
    cr, sr = figures.get("cluster_rounds"), figures.get("single_rounds")
    if cr and sr:
        p50, p99 = statistics.median(cr["walls"]), suite.percentile(cr["walls"], 0.99)
        r50, r99 = statistics.median(sr["walls"]), suite.percentile(sr["walls"], 0.99)
        results.add(
            f"GET /fleet/status from one replica: {n:,} edges on {args.replicas} replicas, p50 / p99 "
            f"({args.rounds} rounds)",
            f"{p50 * 1000:.0f} / {p99 * 1000:.0f} ms",
            f"{r50 * 1000:.0f} / {r99 * 1000:.0f} ms ({ref:,} on 1)",
            p50 / r50,
            "p50 <= 2x single",
            p50 <= 2 * r50,
        )
        per_round = len(cr["walls"])
        redis = cr["redis"]
        results.add(
            "  CPU per round: replicas (asking first) / edge processes / Redis",
            f"{' / '.join(f'{c / per_round:.2f}' for c in cr['cpu'])} s / {cr['edges_cpu'] / per_round:.2f} s / "
            f"{redis['cpu'] / per_round:.2f} s",
            f"{sr['cpu'][0] / per_round:.2f} s / {sr['edges_cpu'] / per_round:.2f} s / -",
            None,
            "-",
            None,
        )
        top = ", ".join(
            f"{k} {v / per_round:.0f}" for k, v in sorted(redis["calls"].items(), key=lambda kv: -kv[1])[:6]
        )
        results.add(
            "  Redis commands per round (a script and the commands inside it each count)",
            f"{redis['total'] / per_round:.0f} ({redis['total'] / per_round / n:.2f} per edge); {top}",
            "-",
            None,
            "-",
            None,
        )


async def run(args: Any, results: suite.Results, workdir: Path, figures: dict[str, Any]) -> None:
    """The reference, then the cluster, then the comparison."""
    per_process = max(args.reference_edges, -(-args.edges // args.replicas))
    limit = ff.raise_open_file_limit(1000)
    if per_process + ff.SPARE_FDS > limit:
        raise RuntimeError(
            f"{per_process:,} edges per process need {per_process + ff.SPARE_FDS} descriptors; the hard limit is "
            f"{limit}: this machine cannot hold this size"
        )
    try:
        await reference_phase(args, workdir, figures)
        await ff.sleep(1.0)
        await cluster_phase(args, results, workdir, figures)
    except Exception as e:
        print(f"\nFAILED: {type(e).__name__}: {e}", flush=True)
        raise
    finally:
        compare(args, results, figures)


def main() -> None:
    """Parse arguments, run under a hard deadline, print the table."""
    if len(sys.argv) == 4 and sys.argv[1] == "--edge-process":
        edge_process(int(sys.argv[2]), Path(sys.argv[3]).read_text().split("\n"))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 replicas x 1,000 edges against 1 at 333")
    parser.add_argument("--replicas", type=int, default=3, help="Control Plane replicas (default 3)")
    parser.add_argument("--edges", type=int, default=0, help="edges over all replicas (default 30000; quick 1000)")
    parser.add_argument("--reference-edges", type=int, default=0, help="edges on the single replica (default N/R)")
    parser.add_argument("--rounds", type=int, default=0, help="fleet rounds (default 10 quick, 5 full)")
    parser.add_argument("--steady-seconds", type=float, default=0, help="steady-state window (default 10 quick, 20)")
    parser.add_argument("--samples", type=int, default=60, help="GET /edges/{id}/status asked one at a time")
    parser.add_argument("--settle-seconds", type=float, default=3.0, help="pause after enrollment")
    parser.add_argument("--enroll-timeout", type=float, default=180.0, help="deadline for all edges to enroll")
    parser.add_argument("--timeout", type=float, default=0, help="overall deadline (default 110 quick, 540 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the table and the raw figures as JSON")
    parser.add_argument("--keep-logs", action="store_true", help="keep the Control Planes' logs")
    args = parser.parse_args()
    args.edges = args.edges or (1000 if args.quick else 30000)
    args.reference_edges = args.reference_edges or round(args.edges / args.replicas)
    args.rounds = args.rounds or (10 if args.quick else 5)
    args.steady_seconds = args.steady_seconds or (10.0 if args.quick else 20.0)
    args.timeout = args.timeout or (110.0 if args.quick else 540.0)
    print(
        f"python {sys.version.split()[0]}; {os.cpu_count()} cores; load average "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True,
    )
    results = suite.Results()
    figures: dict[str, Any] = {}
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-cluster-"))

    def report(failed: bool) -> None:
        print("\n== twisted-iop cluster benchmark" + (" (INCOMPLETE)" if failed else ""))
        print(results.table(), flush=True)
        print(f"load average at the end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"table": results.rows, "figures": figures}, indent=2) + "\n")
        if failed or args.keep_logs:
            print(f"logs kept in {workdir}", flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    ff.run_bounded(args.timeout, lambda: run(args, results, workdir, figures), report)


if __name__ == "__main__":
    main()
