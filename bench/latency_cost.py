#!/usr/bin/env python
"""What latency recording costs the Edge: CPU per request with it against without.

Starts ``iop-mock-provider`` (no pacing) and two Edge + Node pairs in front
of it, on 127.0.0.1: one Edge as it ships (``twistd -n iop-edge``), one with
its latency recorder's calls made no-ops (``bench/edge_without_latency.py``,
the reference). Then, from this process, with the small HTTP/1.1 client of
``bench/inference_gateway.py``:

* **at 200 req/s**: an open loop of non-streamed chat completions (16
  tokens) at ``--rate`` requests/s, in alternating one-second slices to the
  two Edges (so both see the same machine), ``--seconds`` of each; each
  Edge's process CPU per request;
* **the token path**: ``--streams`` concurrent streamed answers of
  ``--stream-tokens`` tokens through each Edge in turn, ``--rounds`` times
  alternating; each Edge's process CPU per streamed chunk and per stream.

Printed with the target (recording adds at most 3 % to the Edge's CPU per
request) and the machine's load. Run: ``.venv/bin/python bench/latency_cost.py``
(``--quick`` for a shorter run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import yaml
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.task import deferLater

sys.path.insert(0, str(Path(__file__).resolve().parent))
import inference_gateway as ig

from twisted_iop.edge.inference.latency import OK, LatencyRecorder

#: The target: recording adds at most this share to the Edge's CPU per request.
TARGET_EXTRA = 0.03
WITHOUT = str(Path(__file__).resolve().parent / "edge_without_latency.py")


def edge_config(workdir: Path, name: str) -> Path:
    """An edge.yaml for one Edge of one Node and one provider (capacity 1000)."""
    mapping = {
        "control_plane": {"address": "127.0.0.1:1", "edge_id": f"bench-{name}", "backoff": {"max_seconds": 60}},
        "node_server": {"listen": "tcp:0:interface=127.0.0.1"},
        "inference": {"listen": "tcp:0:interface=127.0.0.1", "max_queued_per_model": 100000},
        "metrics": {"listen": "tcp:0:interface=127.0.0.1"},
        "nodes": [
            {
                "node_id": "node-1",
                "providers": [{"provider_id": "p1", "kind": "openai", "models": [ig.MODEL], "capacity": 1000}],
            }
        ],
    }
    path = workdir / f"edge-{name}.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


async def start_pair(
    workdir: Path, name: str, edge_cmd: list[str], mock_port: int, procs: dict[str, subprocess.Popen[bytes]]
) -> int:
    """Start an Edge (by ``edge_cmd``) and its Node; the Edge's inference port once the Node is ready."""
    deadline = time.monotonic() + 30
    log = workdir / f"edge-{name}.log"
    procs[f"edge {name}"] = ig.start([*edge_cmd, "--config", str(edge_config(workdir, name))], log)
    node_port = ig.wait_port(log, "node_server", deadline)
    gateway_port = ig.wait_port(log, "inference", deadline)
    node_yaml = {
        "node_id": "node-1",
        "edge": {"address": f"127.0.0.1:{node_port}"},
        "metrics": {"listen": "tcp:0:interface=127.0.0.1"},
        "providers": [
            {"provider_id": "p1", "kind": "openai", "models": [ig.MODEL], "base_url": f"http://127.0.0.1:{mock_port}"}
        ],
    }
    node_path = workdir / f"node-{name}.yaml"
    node_path.write_text(yaml.safe_dump(node_yaml))
    twistd = str(ig.BIN / "twistd")
    procs[f"node {name}"] = ig.start(
        [twistd, "-n", "--pidfile=", "iop-node", "--config", str(node_path)], workdir / f"node-{name}.log"
    )
    while b"node node-1 is ready" not in log.read_bytes():
        if time.monotonic() > deadline:
            raise SystemExit(f"the node of edge {name} did not become ready; see {workdir}")
        await deferLater(reactor, 0.05, lambda: None)
    return gateway_port


def recorder_seconds(number: int = 100_000) -> float:
    """The recorder's own CPU per request: a queue wait and a streamed request's end (best of 5)."""
    recorder = LatencyRecorder(0.0)
    clock = [1000.0]

    def one() -> None:
        clock[0] += 0.005  # 200 requests a second
        now = clock[0]
        recorder.queue_waited(ig.MODEL, "node-1", "p1", 0.0001)
        recorder.request_ended(ig.MODEL, "node-1", "p1", OK, now - 0.3, now - 0.25, now, 16)

    return min(timeit.repeat(one, number=number, repeat=5)) / number


def extra(with_: float, without: float) -> str:
    """``with_`` against ``without`` as a share more, and the verdict."""
    share = with_ / without - 1 if without > 0 else float("nan")
    return (
        f"{share * 100:+.1f} % (target <= +{TARGET_EXTRA * 100:.0f} %: {'PASS' if share <= TARGET_EXTRA else 'MISS'})"
    )


async def run(options: argparse.Namespace, workdir: Path) -> None:
    """Start the processes, measure, print, stop."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        mock_log = workdir / "mock.log"
        procs["mock"] = ig.start(
            [str(ig.BIN / "iop-mock-provider"), "--listen", "tcp:0:interface=127.0.0.1", "--models", ig.MODEL], mock_log
        )
        mock_port = ig.wait_port(mock_log, "mock_provider", time.monotonic() + 30)
        twistd = [str(ig.BIN / "twistd"), "-n", "--pidfile=", "iop-edge"]
        without_cmd = [sys.executable, WITHOUT, "-n", "--pidfile=", "iop-edge"]
        ports = {
            "with": await start_pair(workdir, "with", twistd, mock_port, procs),
            "without": await start_pair(workdir, "without", without_cmd, mock_port, procs),
        }
        pids = {name: proc.pid for name, proc in procs.items()}
        path = "/v1/chat/completions"
        clients = {name: ig.Client(port, path) for name, port in ports.items()}
        body = json.dumps(
            {"model": ig.MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
        ).encode()
        order = ["with", "without"]
        await ig.open_loop([clients[n] for n in order], body, options.rate, 1.0)  # warm up

        def edge_cpu() -> dict[str, float]:
            return {name: ig.cpu_seconds(pids[f"edge {name}"]) for name in order}

        before = edge_cpu()
        records = await ig.open_loop([clients[n] for n in order], body, options.rate, options.seconds)
        after = edge_cpu()
        load = os.getloadavg()[0]
        per_request = {}
        print(
            f"open loop at {options.rate:g} req/s, {options.seconds:g} s to each Edge in alternating 1 s slices,"
            f" 16-token answers; load average {load:.1f} on {os.cpu_count()} cores"
        )
        for name, record in zip(order, records, strict=True):
            sent = max(1, record["sent"])
            per_request[name] = (after[name] - before[name]) / sent
            lat = record["latencies"] or [float("nan")]
            print(
                f"  edge {name:7s} latency recording: CPU {per_request[name] * 1e6:6.1f} us/request,"
                f" p50 {ig.percentile(lat, 50) * 1000:.2f} ms ({record['sent']} sent, {record['errors']} errors)"
            )
        print(f"  recording adds {extra(per_request['with'], per_request['without'])}")
        alone = recorder_seconds()
        print(
            f"  the recorder alone (timeit in this process, queue wait + end of a streamed request):"
            f" {alone * 1e6:.1f} us/request, {alone / per_request['without'] * 100:.1f} % of the reference's"
            f" CPU per request"
        )

        chunks = {name: 0.0 for name in order}
        cpu = {name: 0.0 for name in order}
        for _ in range(options.rounds):
            for name in order:
                start = ig.cpu_seconds(pids[f"edge {name}"])
                result = await ig.stream_rate(clients[name], options.stream_tokens, options.streams)
                cpu[name] += ig.cpu_seconds(pids[f"edge {name}"]) - start
                chunks[name] += result["chunks"]
        streams = options.rounds * options.streams
        print(
            f"token path: {options.rounds} x {options.streams} concurrent streams of {options.stream_tokens}"
            f" tokens through each Edge, alternating"
        )
        for name in order:
            print(
                f"  edge {name:7s} latency recording: CPU {cpu[name] / max(chunks[name], 1) * 1e6:6.2f} us/chunk,"
                f" {cpu[name] / streams * 1e3:.1f} ms/stream"
            )
        per_chunk = {name: cpu[name] / max(chunks[name], 1) for name in order}
        print(f"  recording adds {extra(per_chunk['with'], per_chunk['without'])}")
        for client in clients.values():
            client.close()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: Optional[list[str]] = None, stop: Callable[[], Any] = reactor.stop) -> None:
    """Parse options; run with a hard deadline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run")
    parser.add_argument("--rate", type=float, default=200.0, help="offered requests/s to each Edge (open loop)")
    parser.add_argument(
        "--seconds", type=float, default=None, help="seconds of load to each Edge (default 20, quick 6)"
    )
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams")
    parser.add_argument("--stream-tokens", type=int, default=None, help="tokens per stream (default 2000, quick 1000)")
    parser.add_argument("--rounds", type=int, default=None, help="stream rounds per Edge (default 4, quick 2)")
    parser.add_argument("--workdir", default="", help="keep the configs and logs here (default: a temporary directory)")
    options = parser.parse_args(argv)
    if options.seconds is None:
        options.seconds = 6.0 if options.quick else 20.0
    if options.stream_tokens is None:
        options.stream_tokens = 1000 if options.quick else 2000
    if options.rounds is None:
        options.rounds = 2 if options.quick else 4
    outcome: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(options.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        d = ensureDeferred(run(options, workdir))
        d.addBoth(outcome.append).addBoth(lambda _: stop())
        reactor.callLater(4 * options.seconds + 180, stop)
        reactor.run()
    if not outcome:
        raise SystemExit("the benchmark ran past its deadline")
    if hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()


if __name__ == "__main__":
    main()
