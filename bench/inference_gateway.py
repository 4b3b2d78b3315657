#!/usr/bin/env python
"""Inference gateway overhead: Edge + Node in front of a zero-latency mock.

Starts ``iop-mock-provider`` (no pacing), an Edge (``twistd -n iop-edge``)
and one Node (``twistd -n iop-node``) whose provider is the mock over HTTP,
all on 127.0.0.1. Then, from this process with treq:

* **direct**: non-streaming chat completions straight to the mock, with
  ``--concurrency`` requests in flight for ``--seconds``;
* **gateway**: the same through the Edge and the Node;
* **stream**: streaming requests of ``--stream-tokens`` tokens through the
  gateway; chunks per second as the client sees them.

Prints requests/s and p50/p99 latency of each, and the latency the gateway
adds. Every process is stopped at the end; the whole run has a deadline.

Run: ``.venv/bin/python bench/inference_gateway.py --seconds 8``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import treq
import yaml
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred, gatherResults
from twisted.internet.task import deferLater
from twisted.web.client import HTTPConnectionPool

BIN = Path(sys.executable).parent
PORT = re.compile(rb"(\w+) listening on \S+ \(port (\d+)\)")
MODEL = "llama-3-8b"


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process with its output in ``log``."""
    handle = open(log, "wb")
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


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def load(url: str, body: bytes, concurrency: int, seconds: float, pool: HTTPConnectionPool) -> dict[str, Any]:
    """Closed-loop load: ``concurrency`` workers for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.monotonic() < end:
            started = time.perf_counter()
            response = await treq.post(url, data=body, headers={b"Content-Type": [b"application/json"]}, pool=pool)
            await response.content()
            if response.code != 200:
                errors += 1
            latencies.append(time.perf_counter() - started)

    began = time.monotonic()
    await gatherResults([ensureDeferred(worker()) for _ in range(concurrency)])
    elapsed = time.monotonic() - began
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "n": len(latencies),
        "errors": errors,
    }


async def stream_rate(url: str, tokens: int, streams: int, pool: HTTPConnectionPool) -> dict[str, float]:
    """Chunks per second over ``streams`` concurrent streamed answers."""
    body = json.dumps(
        {"model": MODEL, "stream": True, "max_tokens": tokens, "messages": [{"role": "user", "content": "go"}]}
    ).encode()

    async def one() -> int:
        response = await treq.post(url, data=body, headers={b"Content-Type": [b"application/json"]}, pool=pool)
        content = await response.content()
        return content.count(b"data: ") - 1

    began = time.monotonic()
    counts = await gatherResults([ensureDeferred(one()) for _ in range(streams)])
    elapsed = time.monotonic() - began
    return {"chunks": float(sum(counts)), "chunks_per_s": sum(counts) / elapsed}


async def run(options: argparse.Namespace, workdir: Path) -> None:
    """Start the processes, measure, print, stop."""
    deadline = time.monotonic() + 30
    procs: list[subprocess.Popen[bytes]] = []
    try:
        mock_log = workdir / "mock.log"
        procs.append(
            start(
                [str(BIN / "iop-mock-provider"), "--listen", "tcp:0:interface=127.0.0.1", "--models", MODEL], mock_log
            )
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
        twistd = str(BIN / "twistd")
        procs.append(start([twistd, "-n", "--pidfile=", "iop-edge", "--config", str(workdir / "edge.yaml")], edge_log))
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
        procs.append(
            start(
                [twistd, "-n", "--pidfile=", "iop-node", "--config", str(workdir / "node.yaml")], workdir / "node.log"
            )
        )
        gateway = f"http://127.0.0.1:{gateway_port}"
        while b"node node-1 is ready" not in edge_log.read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit("the node did not become ready")
            await deferLater(reactor, 0.05, lambda: None)

        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = options.concurrency
        body = json.dumps(
            {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
        ).encode()
        direct_url = f"http://127.0.0.1:{mock_port}/v1/chat/completions"
        gateway_url = gateway + "/v1/chat/completions"
        await load(direct_url, body, options.concurrency, 1.0, pool)  # warm up
        await load(gateway_url, body, options.concurrency, 1.0, pool)
        direct = await load(direct_url, body, options.concurrency, options.seconds, pool)
        through = await load(gateway_url, body, options.concurrency, options.seconds, pool)
        stream_direct = await stream_rate(direct_url, options.stream_tokens, options.concurrency, pool)
        stream_gateway = await stream_rate(gateway_url, options.stream_tokens, options.concurrency, pool)
        await pool.closeCachedConnections()

        print(f"concurrency {options.concurrency}, {options.seconds:g}s per phase, 16-token answers")
        for name, row in (("mock directly", direct), ("edge + node", through)):
            print(
                f"{name:14s} {row['rps']:8.0f} req/s  p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms"
                f"  ({row['n']} requests, {row['errors']} errors)"
            )
        print(
            f"added by the gateway: p50 {through['p50_ms'] - direct['p50_ms']:+.2f} ms, "
            f"p99 {through['p99_ms'] - direct['p99_ms']:+.2f} ms"
        )
        print(
            f"streamed chunks/s ({options.concurrency} streams x {options.stream_tokens} tokens): "
            f"direct {stream_direct['chunks_per_s']:.0f}, through edge + node {stream_gateway['chunks_per_s']:.0f}"
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    """Parse options; run with a hard deadline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--stream-tokens", type=int, default=2000)
    options = parser.parse_args()
    outcome: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        d = ensureDeferred(run(options, Path(tmp)))
        d.addBoth(outcome.append).addBoth(lambda _: reactor.stop())
        reactor.callLater(4 * options.seconds + 60, reactor.stop)
        reactor.run()
    if outcome and hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()


if __name__ == "__main__":
    main()
