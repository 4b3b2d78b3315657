#!/usr/bin/env python
"""A ``node.drain`` rollout over a fleet of scripted edges, against the same
commands sent one by one, and what either does to the views operators watch.

A real Control Plane (``twistd -n iop-control-plane``, as ``fleet_fanout.py``
starts it, with its bench settings) in its own process on loopback, and
``--edges`` scripted edges in this process (the suite's fake edges, which
also announce ``node.drain`` and answer every command at once, succeeded;
hello labels ``site=bench`` and ``region=r0`` .. ``r7`` by id). Then:

1. baseline: for ``--baseline-seconds``, ``GET /edges/{id}`` (random ids)
   and ``GET /fleet/status?selector=...`` polled at their modest rates,
   nothing else running;
2. singles: ``POST /edges/{id}/commands`` of ``node.drain`` to every edge,
   ``--in-flight`` at a time from one client, until all have answered, with
   the same polls running;
3. rollout: one ``POST /rollouts`` of ``node.drain`` to ``site=bench`` (all
   edges, one batch, ``max_in_flight`` = ``--in-flight``), polled with
   ``GET /rollouts/{id}`` every ``--rollout-poll`` seconds until it ends,
   with the same polls running.

Each phase prints its wall time, the Control Plane's CPU seconds (from
/proc) and the p50/p99 of both views; the settings are printed beside the
figures. Targets: the rollout finishes within 2x the singles' time; during
the rollout the views' p99 is at most 1.5x the baseline's.

``--only baseline,singles`` runs without the rollout phase (a Control Plane
without ``/rollouts`` answers 404 there: the phase says so and the run is
marked incomplete).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_fanout as ff
import suite
from twisted.internet import defer, reactor
from twisted.internet.task import LoopingCall

from twisted_iop.wire import control_pb2 as pb

PHASES = ("baseline", "singles", "rollout")
#: The command both ways send (the scripted edges answer it at once).
DRAIN = {"name": "node.drain", "target": "node-1", "arguments": {"reason": "bench"}}
#: Each command's (each execution's) timeout, in seconds.
COMMAND_TIMEOUT_SECONDS = 30
#: The bench settings of fleet_fanout.py, and room for the client's
#: ``--in-flight`` connections from one address (the default allows 128).
CONFIG = ff.BENCH_CONFIG + "  max_connections: 4096\n  max_connections_per_address: 2048\n"
#: The labels of edge number ``i``: one site, eight regions.
REGIONS = 8


def labels_of(edge_id: str) -> dict[str, str]:
    """``site=bench`` and ``region=r<id mod 8>`` (deterministic, unlike the suite's hash)."""
    return {"site": "bench", "region": f"r{int(edge_id.rsplit('-', 1)[1]) % REGIONS}"}


class DrainEdge(suite.BenchEdge):
    """A bench edge (4x2 snapshot, commands answered at once) whose hello also
    announces ``node.drain``, with labels a selector can pick."""

    CATALOG = (
        pb.CommandSpec(name="node.drain", description="Stop new leases on a node", target_kind="node"),
        pb.CommandSpec(name="edge.diagnostics", description="Versions and counters"),
    )

    def hello_labels(self) -> dict[str, str]:
        """Labels a selector can pick: the site and one of the regions."""
        return labels_of(self.edge_id)

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        if body == "edge_command_request":
            fleet: DrainFleet = self.fleet  # type: ignore[assignment]
            fleet.commands_answered += 1
        super().envelope_received(envelope, body)


class DrainFleet(suite.BenchFleet):
    """The scripted edges; counts the commands they answered."""

    edge_class = DrainEdge

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.commands_answered = 0


class ViewProbe:
    """Polls one kind of view at a fixed rate (open loop: a slow answer does
    not delay the next request) on its own connections; keeps each latency."""

    def __init__(self, port: int, paths: list[str], rate: float) -> None:
        self.http = ff.Http(port)
        self.paths = paths
        self.rate = rate
        self.latencies: list[float] = []
        self.errors: dict[object, int] = {}
        self._pick = random.Random(7)
        self._pending: list[defer.Deferred[None]] = []
        self._loop = LoopingCall(self._fire)
        self._loop.clock = reactor

    def _fire(self) -> None:
        self._pending = [d for d in self._pending if not d.called]
        self._pending.append(defer.ensureDeferred(self._one(self._pick.choice(self.paths))))

    async def _one(self, path: str) -> None:
        try:
            code, _, seconds = await self.http.get(path, timeout=60)
        except Exception as e:
            name = type(e).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
            return
        if code == 200:
            self.latencies.append(seconds)
        else:
            self.errors[code] = self.errors.get(code, 0) + 1

    def start(self) -> None:
        """Start polling, and forget earlier latencies."""
        self.latencies = []
        self.errors = {}
        self._loop.start(1.0 / self.rate, now=True)

    async def stop(self) -> list[float]:
        """Stop polling; wait for the requests still out; the latencies."""
        self._loop.stop()
        await defer.DeferredList(self._pending, consumeErrors=True)
        return self.latencies


class Probes:
    """Both views polled together."""

    def __init__(self, port: int, edge_ids: list[str], args: argparse.Namespace) -> None:
        self.detail = ViewProbe(port, [f"/edges/{e}" for e in edge_ids], args.detail_rate)
        self.fleet_path = f"/fleet/status?selector={quote(args.fleet_selector, safe='')}&limit={args.fleet_limit}"
        self.fleet = ViewProbe(port, [self.fleet_path], args.fleet_rate)

    def start(self) -> None:
        """Start both."""
        self.detail.start()
        self.fleet.start()

    async def stop(self) -> dict[str, Any]:
        """Stop both; their latencies and error counts."""
        detail = await self.detail.stop()
        fleet = await self.fleet.stop()
        return {
            "detail": detail,
            "fleet": fleet,
            "errors": {"detail": dict(self.detail.errors), "fleet": dict(self.fleet.errors)},
        }


def p50_p99(values: list[float]) -> tuple[float, float]:
    """Median and 99th percentile (nearest rank); NaN without values."""
    if not values:
        return float("nan"), float("nan")
    return statistics.median(values), suite.percentile(values, 0.99)


def views_text(views: dict[str, Any]) -> str:
    """``GET /edges/{id}`` and the fleet view: p50 / p99 in ms and counts."""
    d50, d99 = p50_p99(views["detail"])
    f50, f99 = p50_p99(views["fleet"])
    text = (
        f"GET /edges/{{id}} p50/p99 {d50 * 1000:.1f}/{d99 * 1000:.1f} ms ({len(views['detail'])}), "
        f"fleet view p50/p99 {f50 * 1000:.1f}/{f99 * 1000:.1f} ms ({len(views['fleet'])})"
    )
    errors = {k: v for k, v in views["errors"].items() if v}
    return text + (f", errors {errors}" if errors else "")


async def baseline(args: argparse.Namespace, probes: Probes, cp: ff.ControlPlaneProcess) -> dict[str, Any]:
    """The views polled for ``--baseline-seconds`` with nothing else running."""
    cpu = cp.cpu_seconds()
    probes.start()
    await ff.sleep(args.baseline_seconds)
    views = await probes.stop()
    return {"seconds": args.baseline_seconds, "cpu": cp.cpu_seconds() - cpu, "views": views}


async def singles(
    args: argparse.Namespace, port: int, edge_ids: list[str], probes: Probes, cp: ff.ControlPlaneProcess
) -> dict[str, Any]:
    """``POST /edges/{id}/commands`` to every edge, ``--in-flight`` at a time; until all answered."""
    http = ff.Http(port)
    http.pool.maxPersistentPerHost = args.in_flight
    body = json.dumps({**DRAIN, "timeout_seconds": COMMAND_TIMEOUT_SECONDS}).encode()
    headers = {b"Content-Type": [b"application/json"]}
    outcomes: dict[str, int] = {}
    queue = iter(edge_ids)

    async def sender() -> None:
        for edge_id in queue:
            response = await http.client.post(
                f"{http.base}/edges/{edge_id}/commands",
                data=body,
                headers=headers,
                timeout=COMMAND_TIMEOUT_SECONDS + 30,
            )
            document = await response.content()
            state = json.loads(document).get("state") if response.code == 200 else f"http {response.code}"
            outcomes[str(state)] = outcomes.get(str(state), 0) + 1

    cpu = cp.cpu_seconds()
    probes.start()
    started = time.perf_counter()
    await defer.gatherResults([defer.ensureDeferred(sender()) for _ in range(args.in_flight)], consumeErrors=True)
    seconds = time.perf_counter() - started
    views = await probes.stop()
    await http.pool.closeCachedConnections()
    return {"seconds": seconds, "cpu": cp.cpu_seconds() - cpu, "views": views, "outcomes": outcomes}


async def rollout(
    args: argparse.Namespace, port: int, n: int, probes: Probes, cp: ff.ControlPlaneProcess
) -> dict[str, Any]:
    """One rollout of ``node.drain`` to every edge; polled until it ends."""
    http = ff.Http(port)
    request = {
        "command": DRAIN,
        "selector": "site=bench",
        "strategy": {"batch_size": n, "max_in_flight": args.in_flight, "pause_seconds": 0},
        "timeout_seconds": COMMAND_TIMEOUT_SECONDS,
    }
    cpu = cp.cpu_seconds()
    probes.start()
    started = time.perf_counter()
    response = await http.client.post(
        f"{http.base}/rollouts", data=json.dumps(request).encode(), headers={b"Content-Type": [b"application/json"]}
    )
    created = await response.content()
    if response.code not in (200, 201):
        await probes.stop()
        raise RolloutUnavailable(f"POST /rollouts answered {response.code}: {created[:200]!r}")
    rollout_id = json.loads(created)["rollout_id"]
    document: dict[str, Any] = {}
    polls = 0
    while True:
        code, document, _, _ = await http.get_json(f"/rollouts/{quote(rollout_id, safe='')}")
        polls += 1
        if code != 200:
            raise RuntimeError(f"GET /rollouts/{rollout_id} answered {code}")
        if document["state"] in ("succeeded", "failed", "aborted", "cancelled"):
            break
        await ff.sleep(args.rollout_poll)
    seconds = time.perf_counter() - started
    views = await probes.stop()
    return {
        "seconds": seconds,
        "cpu": cp.cpu_seconds() - cpu,
        "views": views,
        "state": document["state"],
        "reason": document.get("reason"),
        "counts": document.get("counts", {}),
        "polls": polls,
        "request": request,
    }


class RolloutUnavailable(Exception):
    """The Control Plane does not serve ``POST /rollouts``."""


async def run(args: argparse.Namespace, results: suite.Results, workdir: Path, incomplete: list[str]) -> None:
    """Start the Control Plane, enroll the edges, run the phases."""
    n = args.edges
    ff.raise_open_file_limit(n + ff.SPARE_FDS)
    cp = ff.ControlPlaneProcess(workdir, f"tcp:0:interface={ff.LOOPBACK}", config_text=CONFIG)
    ff.CONTROL_PLANES.append(cp)
    fleet: Optional[DrainFleet] = None
    try:
        ports = await ff.eventually(
            lambda: ff._ports_or_fail(cp, {"edge_wire", "http"}), 30, "the Control Plane's ports"
        )
        http = ff.Http(ports["http"])
        await ff.eventually(lambda: ff._ready(http), 30, "GET /readyz")
        fleet = DrainFleet(ports["edge_wire"])

        async def enrolled() -> int:
            _, body, _, _ = await http.get_json("/edges?limit=1")
            return int(body["total"])

        enrollment = await suite.enroll(fleet, n, enrolled, args.enroll_timeout, cp.pid)
        print(f"  enrolled {enrollment['enrolled']:,} of {n:,} edges in {enrollment['seconds']:.1f} s", flush=True)
        if enrollment["enrolled"] < n:
            raise RuntimeError(f"only {enrollment['enrolled']} of {n} edges enrolled")
        edge_ids = [f"edge-{i:05d}" for i in range(n)]
        probes = Probes(ports["http"], edge_ids, args)
        figures: dict[str, dict[str, Any]] = {}
        if "baseline" in args.only:
            print(f"== baseline: the views alone for {args.baseline_seconds:g} s", flush=True)
            figures["baseline"] = await baseline(args, probes, cp)
            print(f"  {views_text(figures['baseline']['views'])}", flush=True)
        if "singles" in args.only:
            print(f"== singles: {n:,} POST /edges/{{id}}/commands, {args.in_flight} at a time", flush=True)
            before = fleet.commands_answered
            figures["singles"] = await singles(args, ports["http"], edge_ids, probes, cp)
            s = figures["singles"]
            print(
                f"  {s['seconds']:.2f} s, CP CPU {s['cpu']:.2f} s, outcomes {s['outcomes']}, "
                f"edges answered {fleet.commands_answered - before:,}; {views_text(s['views'])}",
                flush=True,
            )
        if "rollout" in args.only:
            print(f"== rollout: node.drain to site=bench ({n:,} edges), max_in_flight {args.in_flight}", flush=True)
            before = fleet.commands_answered
            try:
                figures["rollout"] = await rollout(args, ports["http"], n, probes, cp)
            except RolloutUnavailable as e:
                print(f"  {e}: no rollout figures", flush=True)
                incomplete.append(str(e))
            else:
                r = figures["rollout"]
                print(
                    f"  {r['seconds']:.2f} s, CP CPU {r['cpu']:.2f} s, ended {r['state']}"
                    f"{' (' + r['reason'] + ')' if r['reason'] else ''}, counts {r['counts']}, "
                    f"edges answered {fleet.commands_answered - before:,}, {r['polls']} polls; {views_text(r['views'])}",
                    flush=True,
                )
        judge(args, n, figures, results)
    finally:
        if fleet is not None:
            await fleet.close()
        cp.stop()


def judge(args: argparse.Namespace, n: int, figures: dict[str, dict[str, Any]], results: suite.Results) -> None:
    """The table: each figure with its reference and target."""
    singles_ = figures.get("singles")
    rollout_ = figures.get("rollout")
    base = figures.get("baseline")
    if singles_ is not None:
        results.add(
            f"{n:,} single commands, {args.in_flight} in flight: time / CP CPU",
            f"{singles_['seconds']:.2f} s / {singles_['cpu']:.2f} s {singles_['outcomes']}",
            "-",
            None,
            "(the rollout's reference)",
            None,
        )
    if rollout_ is not None:
        reference = f"{singles_['seconds']:.2f} s singles" if singles_ else "-"
        ratio = rollout_["seconds"] / singles_["seconds"] if singles_ else None
        results.add(
            f"rollout of node.drain to {n:,} edges, max_in_flight {args.in_flight}: time / CP CPU",
            f"{rollout_['seconds']:.2f} s / {rollout_['cpu']:.2f} s ({rollout_['state']})",
            reference,
            ratio,
            "<= 2x singles",
            None if ratio is None else (ratio <= 2.0 and rollout_["state"] == "succeeded"),
        )
    if base is None:
        return
    for phase, loaded in (("singles", singles_), ("rollout", rollout_)):
        if loaded is None:
            continue
        for view, label in (("detail", "GET /edges/{id}"), ("fleet", "GET " + _fleet_label(args))):
            _, ours = p50_p99(loaded["views"][view])
            _, alone = p50_p99(base["views"][view])
            ratio = ours / alone if alone == alone and alone > 0 else None
            results.add(
                f"{label} p99 during the {phase}",
                f"{ours * 1000:.1f} ms ({len(loaded['views'][view])} requests)",
                f"{alone * 1000:.1f} ms with nothing running",
                ratio,
                "<= 1.5x" if phase == "rollout" else "(information)",
                (ratio is not None and ratio <= 1.5) if phase == "rollout" else None,
            )


def _fleet_label(args: argparse.Namespace) -> str:
    return f"/fleet/status?selector={args.fleet_selector}&limit={args.fleet_limit}"


def main() -> None:
    """Parse arguments, run under a hard deadline, print the settings and the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10_000, help="scripted edges (default 10,000)")
    parser.add_argument("--in-flight", type=int, default=500, help="commands at once, both ways (default 500)")
    parser.add_argument("--detail-rate", type=float, default=20.0, help="GET /edges/{id} per second (default 20)")
    parser.add_argument("--fleet-rate", type=float, default=1.0, help="fleet views per second (default 1)")
    parser.add_argument("--fleet-selector", default="region=r3", help="the fleet view's selector (default region=r3)")
    parser.add_argument("--fleet-limit", type=int, default=100, help="the fleet view's page size (default 100)")
    parser.add_argument("--baseline-seconds", type=float, default=15.0, help="seconds of views alone (default 15)")
    parser.add_argument("--rollout-poll", type=float, default=0.1, help="seconds between GET /rollouts/{id}")
    parser.add_argument("--enroll-timeout", type=float, default=120.0, help="deadline for all edges to enroll")
    parser.add_argument("--timeout", type=float, default=600.0, help="overall deadline in seconds")
    parser.add_argument(
        "--only", default=",".join(PHASES), help=f"comma-separated phases of {', '.join(PHASES)} (default: all)"
    )
    args = parser.parse_args()
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - set(PHASES)
    if unknown:
        parser.error(f"unknown phases in --only: {', '.join(sorted(unknown))}")
    print(
        f"python {sys.version.split()[0]}; {os.cpu_count()} cores; load average "
        f"{Path('/proc/loadavg').read_text().split()[0]}; {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    print(
        f"settings: {args.edges:,} edges, {args.in_flight} in flight, command {DRAIN['name']} on {DRAIN['target']} "
        f"(timeout {COMMAND_TIMEOUT_SECONDS} s, answered at once by the scripted edges); views: GET /edges/{{id}} at "
        f"{args.detail_rate:g}/s (random ids), GET {_fleet_label(args)} at {args.fleet_rate:g}/s; "
        f"baseline {args.baseline_seconds:g} s; rollout polled every {args.rollout_poll:g} s; "
        f"Control Plane config: {CONFIG!r}",
        flush=True,
    )
    results = suite.Results()
    workdir = Path(tempfile.mkdtemp(prefix="iop-bench-rollout-"))
    incomplete: list[str] = []

    def report(failed: bool) -> None:
        done = not failed and not incomplete
        print("\n== rollout over a fleet" + ("" if done else " (INCOMPLETE)"))
        print(results.table(), flush=True)
        shutil.rmtree(workdir, ignore_errors=True)

    ff.run_bounded(args.timeout, lambda: run(args, results, workdir, incomplete), report)
    if incomplete:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
