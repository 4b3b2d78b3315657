#!/usr/bin/env python
"""Streamed tokens against nginx: Edge + Node beside a C hop, per token.

Starts a paced fake engine (``iop-mock-provider --tokens-per-second 50``),
nginx in front of it (``proxy_buffering off``, HTTP/1.1 keep-alive upstream,
one worker, a config written here in a temporary directory, run in the
foreground with its own pid and error-log paths), and an Edge + Node
(``twistd -n iop-edge`` / ``iop-node``, a ``kind: openai`` provider pointing
at the engine), all on 127.0.0.1. For each number of concurrent streams
(64, 256, 1,024 by default; ``--quick``: 64) and each arm (straight to the
engine, through nginx, through Edge + Node), a load generator in its own
process (asyncio, loopback only, bounded in streams and time) opens that
many streamed chat completions of ``--tokens`` tokens at once and reports:

* tokens/s (data events other than ``[DONE]`` over the wall time of the arm),
* TTFT p50/p99 (request sent to first data event),
* inter-token gap p50/p99 (between consecutive reads carrying events),
* failures (a non-200 answer, a stream without ``[DONE]``, a short stream),
* CPU per 1,000 tokens of each gateway process (``/proc/PID/stat`` utime +
  stime: nginx master + worker; the Edge and the Node apart and summed),
  and of the engine and the load generator apart.

Then the Edge + Node ratios against nginx with the targets of issue 27 (CPU
<= 3x nginx, tokens/s >= 0.97x, TTFT p50 <= nginx + 25 ms, gap p99 <= 1.25x)
as PASS/MISS. ``--profile DIR`` runs py-spy against the Edge and the Node
during an extra Edge + Node run at 256 streams (or the largest below it)
and prints the top functions (% of samples, own and inclusive).

Run: ``.venv/bin/python bench/stream_gateway.py [--quick] [--streams 64,256]
[--repeat 2] [--profile DIR]`` (``make bench-stream``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import yaml

BIN = Path(sys.executable).parent
PORT = re.compile(rb"(\w+) listening on \S+ \(port (\d+)\)")
MODEL = "llama-3-8b"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOKENS_PER_SECOND = 50.0
#: Issue 27's targets for Edge + Node against nginx.
TARGET_CPU_RATIO = 3.0
TARGET_RATE_RATIO = 0.97
TARGET_TTFT_ADDED_MS = 25.0
TARGET_GAP_RATIO = 1.25
#: Bounds of the load generator.
MAX_STREAMS = 4096
CLIENT_DEADLINE_SECONDS = 120.0


def client_deadline(streams: int, tokens: int) -> float:
    """The load generator's bound: 120 s plus the run at a slow 2,000 tokens/s."""
    return CLIENT_DEADLINE_SECONDS + streams * tokens / 2000.0


# -- processes ------------------------------------------------------------------


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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wakeups(pid: int) -> int:
    """Times ``pid``'s threads have slept and been woken so far (voluntary context switches; 0 if gone)."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return 0
    for task in tasks:
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def children(pid: int) -> list[int]:
    """The direct children of ``pid``."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{
        server 127.0.0.1:{engine};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """Where nginx is (installed by ``make bench-stream`` when missing)."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise SystemExit("nginx is not installed: `apt-get install nginx-light` (make bench-stream does it)")
    return found


# -- the load generator (its own process) ---------------------------------------------


async def _one_stream(port: int, body: bytes, result: dict[str, Any], timeout: float) -> None:
    """One streamed chat completion; appends its TTFT, gaps and tokens to ``result``."""
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        sent = time.perf_counter()
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            result["failures"] += 1
            result["statuses"][status] = result["statuses"].get(status, 0) + 1
            return
        tokens = 0
        last: Optional[float] = None
        tail = b""
        done = False
        while not done:
            data = await asyncio.wait_for(reader.read(65536), timeout)
            if not data:
                break
            now = time.perf_counter()
            scan = tail + data
            events = scan.count(b"data: ")
            if b"[DONE]" in scan:
                done = True
                events -= 1
            tail = scan[-8:]
            if events <= 0:
                continue
            tokens += events
            if last is None:
                result["ttft"].append(now - sent)
            else:
                result["gaps"].append(now - last)
            last = now
        result["tokens"] += tokens
        if not done:
            result["failures"] += 1
            result["statuses"]["no [DONE]"] = result["statuses"].get("no [DONE]", 0) + 1
    finally:
        writer.close()


async def _load(port: int, streams: int, tokens: int) -> dict[str, Any]:
    """``streams`` concurrent streams to ``port``; the figures as one JSON-ready dict."""
    body = json.dumps(
        {"model": MODEL, "stream": True, "max_tokens": tokens, "messages": [{"role": "user", "content": "go"}]}
    ).encode()
    result: dict[str, Any] = {"ttft": [], "gaps": [], "tokens": 0, "failures": 0, "statuses": {}}
    timeout = tokens / TOKENS_PER_SECOND + 60

    async def guarded() -> None:
        try:
            await _one_stream(port, body, result, timeout)
        except Exception as exc:  # a stream's failure is a figure, not a crash
            result["failures"] += 1
            name = type(exc).__name__
            result["statuses"][name] = result["statuses"].get(name, 0) + 1

    cpu_before = time.process_time()
    began = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(guarded() for _ in range(streams))), client_deadline(streams, tokens))
    wall = time.perf_counter() - began
    return {
        "wall": wall,
        "tokens": result["tokens"],
        "failures": result["failures"],
        "statuses": {str(k): v for k, v in result["statuses"].items()},
        "cpu": time.process_time() - cpu_before,
        "ttft_p50": percentile(result["ttft"], 50),
        "ttft_p99": percentile(result["ttft"], 99),
        "gap_p50": percentile(result["gaps"], 50),
        "gap_p99": percentile(result["gaps"], 99),
    }


def client_main(port: int, streams: int, tokens: int) -> None:
    """The load generator's process: run, print one JSON line."""
    if not 1 <= streams <= MAX_STREAMS:
        raise SystemExit(f"--streams must be 1..{MAX_STREAMS}")
    print(json.dumps(asyncio.run(_load(port, streams, tokens))))


# -- the arms ---------------------------------------------------------------------------


class Rig:
    """The engine, nginx and Edge + Node, started once for the whole run."""

    def __init__(self, workdir: Path, tokens: int, pairs: Optional[dict[str, Path]] = None) -> None:
        self.workdir = workdir
        self.tokens = tokens
        #: Each Edge + Node pair: its arm's suffix and the folder of the ``twistd`` that runs it.
        self.pairs = pairs if pairs is not None else {"": BIN}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.pids: dict[str, list[int]] = {}

    def start(self) -> None:
        """Start every process and wait until each serves."""
        deadline = time.monotonic() + 60
        w = self.workdir
        self.procs["engine"] = start(
            [
                str(BIN / "iop-mock-provider"),
                "--listen",
                "tcp:0:interface=127.0.0.1",
                "--models",
                MODEL,
                "--tokens-per-second",
                f"{TOKENS_PER_SECOND:g}",
            ],
            w / "engine.log",
        )
        engine = wait_port(w / "engine.log", "mock_provider", deadline)
        self.ports["straight"] = engine
        self.pids["engine"] = [self.procs["engine"].pid]

        nginx_port = free_port()
        (w / "nginx.conf").write_text(NGINX_CONF.format(tmp=w, engine=engine, port=nginx_port))
        self.procs["nginx"] = start([nginx_binary(), "-p", str(w), "-c", str(w / "nginx.conf")], w / "nginx.log")
        self.ports["nginx"] = nginx_port
        while not children(self.procs["nginx"].pid):
            if time.monotonic() > deadline or self.procs["nginx"].poll() is not None:
                raise SystemExit(f"nginx did not start; see {w}/nginx-error.log")
            time.sleep(0.05)
        self.pids["nginx"] = [self.procs["nginx"].pid, *children(self.procs["nginx"].pid)]

        for suffix, bin_dir in self.pairs.items():
            self.start_pair(suffix, bin_dir, deadline)

    def start_pair(self, suffix: str, bin_dir: Path, deadline: float) -> None:
        """One Edge + Node (arm ``edge+node`` + ``suffix``), run by ``bin_dir``'s ``twistd``."""
        w = self.workdir
        engine = self.ports["straight"]
        edge_yaml = {
            "control_plane": {"address": "127.0.0.1:1", "edge_id": "bench-edge", "backoff": {"max_seconds": 60}},
            "node_server": {"listen": "tcp:0:interface=127.0.0.1"},
            "inference": {
                "listen": "tcp:0:interface=127.0.0.1",
                "max_queued_per_model": 100000,
                "max_connections": 2 * MAX_STREAMS,
                "max_connections_per_address": 2 * MAX_STREAMS,
            },
            "nodes": [
                {
                    "node_id": "node-1",
                    "providers": [{"provider_id": "p1", "kind": "openai", "models": [MODEL], "capacity": MAX_STREAMS}],
                }
            ],
            # A second pair leaves the metrics port to the first.
            **({"metrics": {"listen": ""}} if suffix else {}),
        }
        (w / f"edge{suffix}.yaml").write_text(yaml.safe_dump(edge_yaml))
        edge_log = w / f"edge{suffix}.log"
        self.procs["edge" + suffix] = start(
            [str(bin_dir / "twistd"), "-n", "--pidfile=", "iop-edge", "--config", str(w / f"edge{suffix}.yaml")],
            edge_log,
        )
        node_port = wait_port(edge_log, "node_server", deadline)
        self.ports["edge+node" + suffix] = wait_port(edge_log, "inference", deadline)
        node_yaml = {
            "node_id": "node-1",
            "edge": {"address": f"127.0.0.1:{node_port}"},
            "providers": [
                {"provider_id": "p1", "kind": "openai", "models": [MODEL], "base_url": f"http://127.0.0.1:{engine}"}
            ],
            **({"metrics": {"listen": ""}} if suffix else {}),
        }
        (w / f"node{suffix}.yaml").write_text(yaml.safe_dump(node_yaml))
        self.procs["node" + suffix] = start(
            [str(bin_dir / "twistd"), "-n", "--pidfile=", "iop-node", "--config", str(w / f"node{suffix}.yaml")],
            w / f"node{suffix}.log",
        )
        while b"node node-1 is ready" not in edge_log.read_bytes():
            if time.monotonic() > deadline:
                raise SystemExit(f"the node did not become ready; see {w}")
            time.sleep(0.05)
        self.pids["edge" + suffix] = [self.procs["edge" + suffix].pid]
        self.pids["node" + suffix] = [self.procs["node" + suffix].pid]

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL after a bound)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGQUIT if proc is self.procs.get("nginx") else signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process group we measure."""
        return {name: sum(cpu_seconds(pid) for pid in pids) for name, pids in self.pids.items()}

    def wakeups(self) -> dict[str, int]:
        """Wake-ups so far of each process group we measure."""
        return {name: sum(wakeups(pid) for pid in pids) for name, pids in self.pids.items()}

    def run_arm(self, arm: str, streams: int, profile: Optional[Path] = None) -> dict[str, Any]:
        """One arm at ``streams`` concurrent streams: the client's figures and each process's CPU."""
        spies: list[subprocess.Popen[bytes]] = []
        duration = int(self.tokens / TOKENS_PER_SECOND + 6)
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            spy_cmd = [str(BIN / "py-spy"), "record", "--rate", "200", "--nonblocking", "--duration", str(duration)]
            spies = [
                start(
                    [
                        *spy_cmd,
                        "--pid",
                        str(self.pids[name][0]),
                        "--format",
                        "raw",
                        "-o",
                        str(profile / f"{name}-{streams}.txt"),
                    ],
                    profile / f"py-spy-{name}.log",
                )
                for name in ("edge", "node")
            ]
            time.sleep(1.0)  # py-spy attaches before the load begins
        before = self.cpu()
        woken_before = self.wakeups()
        client = subprocess.run(
            [
                sys.executable,
                __file__,
                "--client-port",
                str(self.ports[arm]),
                "--streams",
                str(streams),
                "--tokens",
                str(self.tokens),
            ],
            capture_output=True,
            timeout=client_deadline(streams, self.tokens) + 30,
            check=False,
        )
        after = self.cpu()
        woken_after = self.wakeups()
        for spy in spies:
            try:
                spy.wait(duration + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
        if client.returncode != 0:
            raise SystemExit(f"the load generator failed: {client.stderr.decode(errors='replace')[-2000:]}")
        figures: dict[str, Any] = json.loads(client.stdout.decode().strip().splitlines()[-1])
        figures["proc_cpu"] = {name: after[name] - before[name] for name in after}
        figures["proc_wakeups"] = {name: woken_after[name] - woken_before[name] for name in woken_after}
        figures["tokens_per_s"] = figures["tokens"] / figures["wall"]
        return figures


def per_1k(cpu: float, tokens: int) -> float:
    """Milliseconds of CPU per 1,000 tokens."""
    return cpu / max(1, tokens) * 1e6


def woken_per_1k(woken: dict[str, int], name: str, tokens: int) -> str:
    """Wake-ups of one process per 1,000 tokens, as printed."""
    return f"{woken.get(name, 0) * 1000 / max(1, tokens):.0f}"


def print_row(arm: str, run: int, f: dict[str, Any]) -> None:
    """One arm's figures on one line."""
    cpu = f["proc_cpu"]
    tokens = f["tokens"]
    woken = f.get("proc_wakeups", {})
    if arm == "straight":
        gateway = "gateway -"
    elif arm == "nginx":
        gateway = f"gateway nginx {per_1k(cpu['nginx'], tokens):6.1f} (wake-ups {woken_per_1k(woken, 'nginx', tokens)})"
    else:
        suffix = arm.removeprefix("edge+node")
        edge, node = cpu["edge" + suffix], cpu["node" + suffix]
        gateway = (
            f"gateway edge {per_1k(edge, tokens):6.1f} + node {per_1k(node, tokens):6.1f}"
            f" = {per_1k(edge + node, tokens):6.1f}"
            f" (wake-ups {woken_per_1k(woken, 'edge' + suffix, tokens)}"
            f" + {woken_per_1k(woken, 'node' + suffix, tokens)})"
        )
    print(
        f"  {arm:13s} #{run}  {f['tokens_per_s']:8.0f} tok/s  TTFT p50 {f['ttft_p50'] * 1000:6.1f} p99"
        f" {f['ttft_p99'] * 1000:6.1f} ms  gap p50 {f['gap_p50'] * 1000:5.1f} p99 {f['gap_p99'] * 1000:6.1f} ms"
        f"  failures {f['failures']}{' ' + json.dumps(f['statuses']) if f['statuses'] else ''}"
        f"  CPU ms/1k tokens: {gateway}; engine {per_1k(cpu['engine'], tokens):6.1f},"
        f" client {per_1k(f['cpu'], tokens):6.1f}"
    )


def verdicts(nginx: dict[str, Any], gateway: dict[str, Any], suffix: str = "") -> list[str]:
    """Edge + Node (the pair of arm ``edge+node`` + ``suffix``) against nginx, with the issue's targets."""
    ng_cpu = per_1k(nginx["proc_cpu"]["nginx"], nginx["tokens"])
    gw_cpu = per_1k(gateway["proc_cpu"]["edge" + suffix] + gateway["proc_cpu"]["node" + suffix], gateway["tokens"])
    rows = [
        ("CPU per token, edge+node / nginx", gw_cpu / max(ng_cpu, 1e-9), TARGET_CPU_RATIO, "x", True),
        ("tokens/s, edge+node / nginx", gateway["tokens_per_s"] / nginx["tokens_per_s"], TARGET_RATE_RATIO, "x", False),
        (
            "TTFT p50, edge+node - nginx",
            (gateway["ttft_p50"] - nginx["ttft_p50"]) * 1000,
            TARGET_TTFT_ADDED_MS,
            "ms",
            True,
        ),
        ("gap p99, edge+node / nginx", gateway["gap_p99"] / nginx["gap_p99"], TARGET_GAP_RATIO, "x", True),
    ]
    out = []
    for name, measured, target, unit, at_most in rows:
        ok = measured <= target if at_most else measured >= target
        bound = "<=" if at_most else ">="
        out.append(
            f"    {name:34s} {measured:8.2f} {unit:2s}  target {bound} {target:g} {unit}  {'PASS' if ok else 'MISS'}"
        )
    return out


def summarize_profile(path: Path, top: int = 12) -> list[str]:
    """Top functions of a py-spy raw (collapsed) profile: % of samples, own and inclusive."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            re.sub(r" \(.*?/((?:twisted_iop|twisted|klein|treq|google|attr)/[^:)]*)[^)]*\)", r" (\1)", f)
            for f in stack.split(";")
        ]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return [f"    {path.name}: no samples"]
    lines = [f"    {path.name}: {total} samples; own time:"]
    lines += [f"      {n / total * 100:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines.append("    inclusive (our code and Twisted's, not the reactor's loop):")
    ours = [
        (f, n)
        for f, n in inclusive.most_common()
        if "twisted_iop/" in f or "twisted/web" in f or "protocols/basic" in f
    ]
    lines += [f"      {n / total * 100:5.1f}%  {frame}" for frame, n in ours[:top]]
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    """Parse options; start the rig; run every arm; print; stop."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 streams only, each arm once")
    parser.add_argument("--streams", default="", help="comma-separated concurrent streams (default 64,256,1024)")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    parser.add_argument("--repeat", type=int, default=None, help="runs of each arm (default 2, quick 1)")
    parser.add_argument("--profile", default="", help="py-spy the Edge and Node at 256 streams into this folder")
    parser.add_argument(
        "--compare-bin",
        default="",
        help="also run an Edge + Node with the twistd of this folder (another checkout's .venv/bin), side by side"
        " (arm edge+node@B)",
    )
    parser.add_argument("--client-port", type=int, default=0, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.client_port:
        client_main(options.client_port, int(options.streams or 64), options.tokens)
        return
    streams = [int(s) for s in options.streams.split(",") if s] or ([64] if options.quick else [64, 256, 1024])
    if any(not 1 <= s <= MAX_STREAMS for s in streams):
        raise SystemExit(f"--streams must each be 1..{MAX_STREAMS}")
    repeat = options.repeat or (1 if options.quick else 2)
    profile_at = max((s for s in streams if s <= 256), default=streams[0])
    with tempfile.TemporaryDirectory() as tmp:
        pairs = {"": BIN}
        if options.compare_bin:
            pairs["@B"] = Path(options.compare_bin).resolve()
        compared = f" (edge+node@B: {pairs['@B']}/twistd)" if options.compare_bin else ""
        arms = ("straight", "nginx", *("edge+node" + suffix for suffix in pairs))
        rig = Rig(Path(tmp), options.tokens, pairs)
        try:
            rig.start()
            print(
                f"streamed chat completions, {options.tokens} tokens a stream, engine iop-mock-provider"
                f" --tokens-per-second {TOKENS_PER_SECOND:g}; nginx {nginx_version()} (1 worker, proxy_buffering off,"
                f" keep-alive upstream); Edge + Node kind: openai"
                f"{compared}; load generator: asyncio, own process, a connection"
                f" per stream; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"
                f" (the machine is shared: other processes run beside the bench)"
            )
            for arm in arms:  # warm up every path once
                rig.run_arm(arm, min(64, *streams))
            for count in streams:
                print(f"{count} concurrent streams (load average {os.getloadavg()[0]:.1f}):")
                for run in range(1, repeat + 1):
                    results = {}
                    for arm in arms:
                        results[arm] = rig.run_arm(arm, count)
                        print_row(arm, run, results[arm])
                    for suffix in pairs:
                        if len(pairs) > 1:
                            print(f"    edge+node{suffix}:")
                        print("\n".join(verdicts(results["nginx"], results["edge+node" + suffix], suffix)))
            if options.profile:
                # An extra run, so py-spy's sampling does not touch the figures above.
                rig.run_arm("edge+node", profile_at, Path(options.profile))
                print(f"profile of the Edge and the Node at {profile_at} streams (py-spy, 200 Hz, an extra run):")
                for name in ("edge", "node"):
                    path = Path(options.profile) / f"{name}-{profile_at}.txt"
                    print("\n".join(summarize_profile(path)) if path.exists() else f"    {path}: missing")
        finally:
            rig.stop()


def nginx_version() -> str:
    """nginx's version, as ``nginx -v`` says it."""
    out = subprocess.run([nginx_binary(), "-v"], capture_output=True, check=False)
    return out.stderr.decode().strip().rpartition("/")[2] or "?"


if __name__ == "__main__":
    main()
