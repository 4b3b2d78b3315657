#!/usr/bin/env python
"""Inference gateway overhead: Edge + Node in front of a zero-latency mock.

Starts ``iop-mock-provider`` (no pacing), an Edge (``twistd -n iop-edge``)
and one Node (``twistd -n iop-node``) whose provider is the mock over HTTP,
all on 127.0.0.1. Then, from this process, with a small HTTP/1.1 client of
its own (persistent connections, one request at a time on each):

* **latency**: an open-loop load of non-streaming chat completions at a
  fixed rate (``--rate`` requests/s, sent on schedule whether or not
  earlier ones have answered), alternating one-second slices straight to
  the mock and through the Edge and the Node, ``--seconds`` of each. A
  request's latency runs from its scheduled send time to the last byte of
  its answer, so a stall is not hidden by sending less. The gateway's
  added latency is the p50 (p99) through Edge + Node minus the p50 (p99)
  direct, in the same run.
* **stream**: ``--streams`` concurrent streamed answers of
  ``--stream-tokens`` tokens through one Edge (and, for reference, from
  the mock directly); chunks per second as the client sees them.

Each figure is printed with its target, the ratio measured/target and
PASS or MISS, plus the CPU the Edge, Node and mock used per request.
Every process is stopped at the end; the whole run has a deadline.

Run: ``.venv/bin/python bench/inference_gateway.py`` (about 45 s), or
``--quick`` (about 25 s, what ``make bench-inference`` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred, gatherResults
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.task import deferLater

BIN = Path(sys.executable).parent
PORT = re.compile(rb"(\w+) listening on \S+ \(port (\d+)\)")
MODEL = "llama-3-8b"
#: The targets (2-core machine): added latency at 200 req/s, chunks/s through one Edge.
TARGET_ADDED_P50_MS = 2.0
TARGET_ADDED_P99_MS = 5.0
TARGET_CHUNKS_PER_S = 20_000.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process with its output in ``log``."""
    handle = open(log, "wb")  # noqa: SIM115 (the child process writes it)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


def wait_port(log: Path, label: str, deadline: float) -> int:
    """The port ``label`` announced in ``log`` (bounded wait)."""
    while time.monotonic() < deadline:
        for name, port in PORT.findall(log.read_bytes()):
            if name.decode() == label:
                return int(port)
        time.sleep(0.05)
    raise SystemExit(f"{label} did not start; see {log}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def run_delay_seconds(pid: int) -> float:
    """Time ``pid``'s threads were runnable but waiting for a CPU (``/proc/PID/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- a small HTTP/1.1 client ------------------------------------------------------


class _Answer(Protocol):
    """One persistent connection; one request at a time; reads Content-Length or chunked bodies."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiting: Optional[Deferred[tuple[int, bytes]]] = None
        self._status = 0
        self._length: Optional[int] = None
        self._chunked = False
        self._headers_done = False
        self._body = bytearray()
        self.lost = False

    def ask(self, request: bytes) -> Deferred[tuple[int, bytes]]:
        """Send ``request``; fires with (status, body)."""
        self._waiting = Deferred()
        self._buffer.clear()
        self._body.clear()
        self._headers_done = False
        assert self.transport is not None
        self.transport.write(request)
        return self._waiting

    def dataReceived(self, data: bytes) -> None:
        self._buffer += data
        if not self._headers_done:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._buffer[:end]).split(b"\r\n")
            del self._buffer[: end + 4]
            self._status = int(head[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in head[1:])}
            self._chunked = headers.get(b"transfer-encoding") == b"chunked"
            length = headers.get(b"content-length")
            self._length = int(length) if length is not None else None
            self._headers_done = True
        if self._chunked:
            while True:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(self._buffer[:end]).split(b";")[0], 16)
                if len(self._buffer) < end + 2 + size + 2:
                    return
                self._body += self._buffer[end + 2 : end + 2 + size]
                del self._buffer[: end + 2 + size + 2]
                if size == 0:
                    self._finish()
                    return
        elif self._length is not None and len(self._buffer) >= self._length:
            self._body += self._buffer[: self._length]
            self._finish()

    def _finish(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.callback((self._status, bytes(self._body)))

    def connectionLost(self, reason: Any = None) -> None:
        self.lost = True
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.errback(ConnectionError("connection lost"))


class Client:
    """Persistent connections to one host:port, opened as needed (bounded)."""

    def __init__(self, port: int, path: str, limit: int = 512) -> None:
        self._endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port)
        self._head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: "
        ).encode()
        self._idle: list[_Answer] = []
        self._open = 0
        self._limit = limit

    async def post(self, body: bytes) -> tuple[int, bytes]:
        """POST ``body``; (status, body)."""
        if self._idle:
            conn = self._idle.pop()
        else:
            if self._open >= self._limit:
                raise RuntimeError("too many connections")
            self._open += 1
            conn = await connectProtocol(self._endpoint, _Answer())
        try:
            result = await conn.ask(self._head + str(len(body)).encode() + b"\r\n\r\n" + body)
        except ConnectionError:
            self._open -= 1
            raise
        self._idle.append(conn)
        return result

    def close(self) -> None:
        """Close every idle connection."""
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.loseConnection()
        self._idle.clear()


# -- the loads ------------------------------------------------------------------


async def open_loop(
    clients: list[Client], body: bytes, rate: float, seconds: float, slice_seconds: float = 1.0
) -> list[dict[str, Any]]:
    """Send at ``rate`` req/s for ``seconds`` to each client, in alternating slices.

    Returns one record per client: latencies (s), errors, requests sent.
    """
    records: list[dict[str, Any]] = [{"latencies": [], "errors": 0, "sent": 0} for _ in clients]
    per_slice = max(1, int(rate * slice_seconds))
    schedule: list[tuple[float, int]] = []
    slices = max(1, int(seconds / slice_seconds))
    t = 0.0
    for _ in range(slices):
        for index in range(len(clients)):
            for _ in range(per_slice):
                schedule.append((t, index))
                t += 1.0 / rate
    outstanding: list[Deferred[None]] = []
    began = time.perf_counter()
    done: Deferred[None] = Deferred()

    async def one(index: int, due: float) -> None:
        record = records[index]
        record["sent"] += 1
        try:
            status, _ = await clients[index].post(body)
        except Exception:
            record["errors"] += 1
            return
        if status != 200:
            record["errors"] += 1
            return
        record["latencies"].append(time.perf_counter() - due)

    position = 0

    def tick() -> None:
        nonlocal position
        now = time.perf_counter()
        while position < len(schedule) and began + schedule[position][0] <= now:
            offset, index = schedule[position]
            outstanding.append(ensureDeferred(one(index, began + offset)))
            position += 1
        if position < len(schedule):
            reactor.callLater(max(0.0, began + schedule[position][0] - time.perf_counter()), tick)
        else:
            done.callback(None)

    tick()
    await done
    await gatherResults(outstanding)
    return records


async def stream_rate(client: Client, tokens: int, streams: int) -> dict[str, float]:
    """Chunks per second over ``streams`` concurrent streamed answers."""
    body = json.dumps(
        {"model": MODEL, "stream": True, "max_tokens": tokens, "messages": [{"role": "user", "content": "go"}]}
    ).encode()

    async def one() -> int:
        status, content = await client.post(body)
        if status != 200 or not content.endswith(b"data: [DONE]\n\n"):
            raise RuntimeError(f"stream answered {status}: {content[-200:]!r}")
        return content.count(b"data: ") - 1

    began = time.perf_counter()
    counts = await gatherResults([ensureDeferred(one()) for _ in range(streams)])
    elapsed = time.perf_counter() - began
    return {"chunks": float(sum(counts)), "chunks_per_s": sum(counts) / elapsed}


def verdict(name: str, measured: float, target: float, unit: str, at_most: bool) -> str:
    """One figure with its target, the ratio measured/target and PASS/MISS."""
    ratio = measured / target
    ok = measured <= target if at_most else measured >= target
    bound = "<=" if at_most else ">="
    return (
        f"{name:34s} {measured:10.2f} {unit:9s} target {bound} {target:g} {unit:9s}"
        f" ratio {ratio:5.2f}  {'PASS' if ok else 'MISS'}"
    )


# -- the run -----------------------------------------------------------------------


async def run(options: argparse.Namespace, workdir: Path) -> None:
    """Start the processes, measure, print, stop."""
    deadline = time.monotonic() + 30
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        mock_log = workdir / "mock.log"
        procs["mock"] = start(
            [str(BIN / "iop-mock-provider"), "--listen", "tcp:0:interface=127.0.0.1", "--models", MODEL], mock_log
        )
        mock_port = wait_port(mock_log, "mock_provider", deadline)
        edge_yaml = {
            "control_plane": {"address": "127.0.0.1:1", "edge_id": "bench-edge", "backoff": {"max_seconds": 60}},
            "node_server": {"listen": "tcp:0:interface=127.0.0.1"},
            "inference": {"listen": "tcp:0:interface=127.0.0.1", "max_queued_per_model": 100000},
            "nodes": [
                {
                    "node_id": "node-1",
                    "providers": [{"provider_id": "p1", "kind": "openai", "models": [MODEL], "capacity": 1000}],
                }
            ],
        }
        (workdir / "edge.yaml").write_text(yaml.safe_dump(edge_yaml))
        edge_log = workdir / "edge.log"
        edge_cmd = [str(BIN / "twistd"), "-n", "--pidfile=", "iop-edge", "--config", str(workdir / "edge.yaml")]
        node_cmd = [str(BIN / "twistd"), "-n", "--pidfile=", "iop-node", "--config", str(workdir / "node.yaml")]
        if options.profile:
            spy = [str(BIN / "py-spy"), "record", "--nonblocking", "--rate", "200", "--format", "raw", "-o"]
            edge_cmd = [*spy, f"{options.profile}-edge.txt", "--", *edge_cmd]
            node_cmd = [*spy, f"{options.profile}-node.txt", "--", *node_cmd]
        procs["edge"] = start(edge_cmd, edge_log)
        node_port = wait_port(edge_log, "node_server", deadline)
        gateway_port = wait_port(edge_log, "inference", deadline)
        node_yaml = {
            "node_id": "node-1",
            "edge": {"address": f"127.0.0.1:{node_port}"},
            "providers": [
                {"provider_id": "p1", "kind": "openai", "models": [MODEL], "base_url": f"http://127.0.0.1:{mock_port}"}
            ],
        }
        (workdir / "node.yaml").write_text(yaml.safe_dump(node_yaml))
        procs["node"] = start(node_cmd, workdir / "node.log")
        while b"node node-1 is ready" not in edge_log.read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit("the node did not become ready")
            await deferLater(reactor, 0.05, lambda: None)
        pids = {name: _target_pid(proc) for name, proc in procs.items()}

        path = "/v1/chat/completions"
        direct = Client(mock_port, path)
        gateway = Client(gateway_port, path)
        body = json.dumps(
            {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
        ).encode()
        await open_loop([direct, gateway], body, options.rate, 1.0)  # warm up: connections, caches

        pids["load generator"] = os.getpid()
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        wait_before = {name: run_delay_seconds(pid) for name, pid in pids.items()}
        me_before = time.process_time()
        wall_before = time.perf_counter()
        seconds = options.seconds if options.phase != "stream" else 1.0
        records = await open_loop([direct, gateway], body, options.rate, seconds)
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        wait = {name: run_delay_seconds(pid) - wait_before[name] for name, pid in pids.items()}
        wall = time.perf_counter() - wall_before
        me = time.process_time() - me_before
        load = os.getloadavg()[0]

        tokens = options.stream_tokens if options.phase != "latency" else 10
        stream_direct = await stream_rate(direct, tokens, options.streams)
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        stream_gateway = await stream_rate(gateway, tokens, options.streams)
        stream_cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        direct.close()
        gateway.close()

        row_direct, row_gateway = records
        print(
            f"open loop at {options.rate:g} req/s, {options.seconds:g} s each way in 1 s slices, 16-token answers"
            f" ({'quick' if options.quick else 'full'} run)"
        )
        for name, row in (("mock directly", row_direct), ("edge + node", row_gateway)):
            lat = row["latencies"] or [float("nan")]
            print(
                f"  {name:14s} p50 {percentile(lat, 50) * 1000:6.2f} ms  p99 {percentile(lat, 99) * 1000:6.2f} ms"
                f"  max {max(lat) * 1000:6.2f} ms  ({row['sent']} sent, {row['errors']} errors)"
            )
        n = max(1, row_gateway["sent"])
        print(
            f"  CPU per gateway request (both phases' process CPU / gateway requests): edge"
            f" {cpu['edge'] / n * 1e6:.0f} us, node {cpu['node'] / n * 1e6:.0f} us,"
            f" mock {cpu['mock'] / (2 * n) * 1e6:.0f} us per request, load generator {me / (2 * n) * 1e6:.0f} us"
        )
        print(
            f"  machine: load average {load:.1f} on {os.cpu_count()} cores; time runnable but waiting for a CPU: "
            + ", ".join(f"{name} {wait[name] / wall * 100:.0f}%" for name in wait)
            + " of the wall time"
        )
        added_p50 = (percentile(row_gateway["latencies"], 50) - percentile(row_direct["latencies"], 50)) * 1000
        added_p99 = (percentile(row_gateway["latencies"], 99) - percentile(row_direct["latencies"], 99)) * 1000
        chunks = stream_gateway["chunks"] or 1.0
        print(
            f"streams: {options.streams} x {options.stream_tokens} tokens; direct"
            f" {stream_direct['chunks_per_s']:.0f} chunks/s; through edge + node CPU per chunk: edge"
            f" {stream_cpu['edge'] / chunks * 1e6:.1f} us, node {stream_cpu['node'] / chunks * 1e6:.1f} us,"
            f" mock {stream_cpu['mock'] / chunks * 1e6:.1f} us"
        )
        print(verdict("added latency p50 (edge+node)", added_p50, TARGET_ADDED_P50_MS, "ms", True))
        print(verdict("added latency p99 (edge+node)", added_p99, TARGET_ADDED_P99_MS, "ms", True))
        print(
            verdict(
                "streamed chunks/s through one edge",
                stream_gateway["chunks_per_s"],
                TARGET_CHUNKS_PER_S,
                "chunks/s",
                False,
            )
        )
        errors = row_direct["errors"] + row_gateway["errors"]
        if errors:
            print(f"  {errors} requests failed; see the logs in {workdir}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if options.profile else signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _target_pid(proc: subprocess.Popen[bytes]) -> int:
    """The daemon's pid (the child of py-spy when profiling)."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    for _ in range(100):
        if "py-spy" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace"):
            return proc.pid
        found = children.read_text().split()
        if found:
            return int(found[0])
        time.sleep(0.05)
    return proc.pid


def main(argv: Optional[list[str]] = None, stop: Callable[[], Any] = reactor.stop) -> None:
    """Parse options; run with a hard deadline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run (under a minute), for make bench")
    parser.add_argument("--rate", type=float, default=200.0, help="offered requests/s (open loop)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of load each way (default 10, quick 4)")
    parser.add_argument("--streams", type=int, default=None, help="concurrent streams (default 16, quick 8)")
    parser.add_argument("--stream-tokens", type=int, default=None, help="tokens per stream (default 4000, quick 2000)")
    parser.add_argument(
        "--profile",
        default="",
        help="run the Edge and Node under py-spy; collapsed stacks in PREFIX-edge.txt, PREFIX-node.txt",
    )
    parser.add_argument(
        "--phase", choices=("both", "latency", "stream"), default="both", help="run one phase at full length only"
    )
    options = parser.parse_args(argv)
    if options.seconds is None:
        options.seconds = 4.0 if options.quick else 10.0
    if options.streams is None:
        options.streams = 8 if options.quick else 16
    if options.stream_tokens is None:
        options.stream_tokens = 2000 if options.quick else 4000
    outcome: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = ensureDeferred(run(options, Path(tmp)))
        d.addBoth(outcome.append).addBoth(lambda _: stop())
        reactor.callLater(4 * options.seconds + 90, stop)
        reactor.run()
    if not outcome:
        raise SystemExit("the benchmark ran past its deadline")
    if hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()


if __name__ == "__main__":
    main()
