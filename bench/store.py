#!/usr/bin/env python
"""What the durable store costs: the same Control Plane with ``store.backend:
memory`` and with ``sqlite`` (the default), side by side.

For each backend, the real daemon (``twistd -n iop-control-plane``, in a
fresh directory) enrolls N edges (default 10,000, the suite's bench edges:
4 nodes x 2 providers), then:

* **fleet rounds**: ``GET /fleet/status`` rounds (max age 0: every round
  asks every edge); wall time p50 and the server's CPU per round;
* **live events at 10k/s**: 1,000 of the edges relay events for a few
  seconds to one ``/client`` subscriber of the whole fleet (its own
  process, ``bench/event_subscriber.py``); latency p50/p99 from each
  event's send time, and the server's CPU per event;
* **live events at 30k/s**: what arrives, how fast, and what was lost;
* **on disk** (sqlite): once ``/readyz`` says nothing is queued, the
  ``bench.tick`` events in the file, against the events sent (nothing may
  be lost), and the file's bytes per event.

The order of the two backends alternates from one repetition to the next
(``--repeat``), so a machine that slows down during a run does not favour
one of them. Targets: the store costs at most 10% of live-event throughput
and of fleet-round time (ratios sqlite / memory: round p50 and CPU per
event <= 1.10, delivered rate at 30k/s >= 0.90), and loses no event.

Run: ``.venv/bin/python bench/store.py`` (about 3 minutes on 2 cores);
``--edges 1000 --event-seconds 1`` for a quick look.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_fanout as ff
import suite
from twisted.internet import defer, task

from twisted_iop.controlplane.store import forms as stored_forms
from twisted_iop.controlplane.store import sqlite_schema

#: The two configurations compared: the suite's Control Plane config plus a store.
BACKENDS = {
    "memory": "store:\n  backend: memory\n",
    "sqlite": "store:\n  backend: sqlite\n  path: state/control-plane.sqlite\n",
}


async def measure(args: Any, backend: str, workdir: Path) -> dict[str, Any]:
    """Enroll, rounds and live events against one backend; its figures."""
    config = ff.BENCH_CONFIG + BACKENDS[backend]
    cp = ff.ControlPlaneProcess(workdir, f"tcp:0:interface={ff.LOOPBACK}", config_text=config)
    ff.CONTROL_PLANES.append(cp)
    figures: dict[str, Any] = {"backend": backend}
    subscriber = None
    fleet = None
    try:
        ports = await ff.eventually(
            lambda: ff._ports_or_fail(cp, {"edge_wire", "http"}), 30, "the Control Plane's ports"
        )
        http = ff.Http(ports["http"])
        await ff.eventually(lambda: ff._ready(http), 30, "GET /readyz")
        fleet = suite.BenchFleet(ports["edge_wire"])

        async def count() -> int:
            _, body, _, _ = await http.get_json("/edges?limit=1")
            return int(body["total"])

        enrolled = await suite.enroll(fleet, args.edges, count, args.enroll_timeout, cp.pid)
        figures["enrolled"] = enrolled["enrolled"]
        await ff.sleep(1.0)
        rounds = await suite.rounds(http, "/fleet/status", fleet, cp.pid, args.rounds)
        figures["round_p50"] = statistics.median(rounds["walls"])
        figures["round_cpu"] = rounds["cpu"] / args.rounds
        url = http.base.replace("http://", "ws://", 1) + "/client"
        subscriber = suite.Subscriber(url)
        sender = suite.EventSender([edge for edge in fleet.edges if edge.transport is not None][:1000])
        _, before_events, _, _ = await http.get_json("/fleet/events?limit=1")
        # The fleet's newest event number before the relayed ones: once it is
        # this plus what was sent, every relayed event was recorded.
        base = int(before_events["last_sequence"])
        for rate in (10_000.0, 30_000.0):
            subscriber.reset()
            before = sender.sent
            started_ns = time.perf_counter_ns()
            cpu = suite._cpu(cp.pid)
            took = await sender.at_rate(rate, args.event_seconds)
            sent = sender.sent - before
            deadline = time.monotonic() + 15.0
            report = subscriber.report()
            while report["received"] + report["lost"] < sent and time.monotonic() < deadline:
                await ff.sleep(0.1)
                report = subscriber.report()
            key = f"{int(rate / 1000)}k"
            figures[f"{key}_sent"] = sent
            figures[f"{key}_received"] = report["received"]
            figures[f"{key}_lost"] = report["lost"]
            figures[f"{key}_p50"] = report["p50"]
            figures[f"{key}_p99"] = report["p99"]
            figures[f"{key}_cpu_per_event"] = (suite._cpu(cp.pid) - cpu) / max(sent, 1)
            span = max((report["last_ns"] - started_ns) / 1e9, took)
            figures[f"{key}_delivered_per_second"] = report["received"] / span if report["received"] else 0.0
        figures["events_sent"] = sender.sent
        # The daemon may still be reading a backlog of relayed events: wait
        # until every one sent is numbered (or nothing more comes for 5 s).
        last_seen = [-1, time.monotonic()]

        async def recorded_all() -> bool:
            _, body, _, _ = await http.get_json("/fleet/events?limit=1")
            newest = int(body["last_sequence"])
            if newest != last_seen[0]:
                last_seen[:] = [newest, time.monotonic()]
            return newest >= base + sender.sent or time.monotonic() - last_seen[1] > 5.0

        await ff.eventually(recorded_all, 120, "the relayed events to be recorded")
        # Every event the fleet numbered since the relayed ones began (edge
        # events among them, if any came): what the store had to keep.
        figures["events_numbered"] = last_seen[0] - base
        if backend == "sqlite":

            async def flushed() -> bool:
                _, ready, _, _ = await http.get_json("/readyz")
                return bool(ready["store"]["pending"] == 0 and ready["store"]["writable"])

            await ff.eventually(flushed, 30, "the store to write what is queued")
            path = workdir / "state" / "control-plane.sqlite"
            connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                events = [
                    event
                    for (body,) in connection.execute("SELECT body FROM events")
                    for event in stored_forms.events_of_block(body)
                ]
                rows = len(events)
                stored = sum(event.kind == "bench.tick" for event in events)
                stored_since = sum(event.fleet_sequence > base for event in events)
            finally:
                connection.close()
            figures["events_stored"] = stored
            figures["events_stored_since"] = stored_since
            figures["file_bytes"] = sqlite_schema.file_bytes(str(path))
            figures["rows"] = rows
            _, ready, _, _ = await http.get_json("/readyz")
            figures["dropped"] = ready["store"]["dropped"]
    finally:
        if subscriber is not None:
            subscriber.stop()
        if fleet is not None:
            await fleet.close()
        cp.stop()
    return figures


def report(runs: list[dict[str, Any]], args: Any) -> suite.Results:
    """The medians of each backend's figures, their ratios, targets and verdicts."""
    results = suite.Results()

    def median(backend: str, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["backend"] == backend)

    print(
        f"\nsettings: {args.edges:,} edges (4 nodes x 2 providers each), {args.rounds} fleet rounds, "
        f"{args.event_seconds:g} s of events at each rate from 1,000 edges, {args.repeat} repetition(s) "
        "(medians), store.flush_interval_seconds 0.5 (default), synchronous normal (default)"
    )
    m, s = median("memory", "round_p50"), median("sqlite", "round_p50")
    results.add("fleet round p50", f"{s * 1000:.0f} ms", f"{m * 1000:.0f} ms (memory)", s / m, "<= 1.10x", s <= 1.1 * m)
    m, s = median("memory", "round_cpu"), median("sqlite", "round_cpu")
    results.add("server CPU per fleet round", f"{s * 1000:.0f} ms", f"{m * 1000:.0f} ms (memory)", s / m, "-", None)
    m, s = median("memory", "10k_cpu_per_event"), median("sqlite", "10k_cpu_per_event")
    results.add(
        "server CPU per live event at 10k/s",
        f"{s * 1e6:.1f} us",
        f"{m * 1e6:.1f} us (memory)",
        s / m,
        "<= 1.10x",
        s <= 1.1 * m,
    )
    m50, m99 = median("memory", "10k_p50"), median("memory", "10k_p99")
    s50, s99 = median("sqlite", "10k_p50"), median("sqlite", "10k_p99")
    results.add(
        "live event latency at 10k/s p50 / p99",
        f"{s50 * 1000:.1f} / {s99 * 1000:.1f} ms",
        f"{m50 * 1000:.1f} / {m99 * 1000:.1f} ms (memory)",
        s99 / m99,
        "p99 <= 5 ms",
        s99 <= 0.005,
    )
    m, s = median("memory", "30k_delivered_per_second"), median("sqlite", "30k_delivered_per_second")
    lost = sum(r["30k_lost"] + r["30k_sent"] - r["30k_received"] for r in runs if r["backend"] == "sqlite")
    results.add(
        "live events delivered at 30k/s",
        f"{s / 1000:.1f}k/s ({lost} not delivered)",
        f"{m / 1000:.1f}k/s (memory)",
        s / m,
        ">= 0.90x",
        s >= 0.9 * m,
    )
    for r in runs:
        if r["backend"] != "sqlite":
            results.add(
                "relayed events numbered (memory)",
                f"{r['events_numbered']:,} of {r['events_sent']:,} sent",
                "-",
                None,
                "-",
                None,
            )
            continue
        results.add(
            "events numbered since the relayed ones began, on disk",
            f"{r['events_stored_since']:,} of {r['events_numbered']:,}",
            "-",
            None,
            "all",
            r["events_stored_since"] == r["events_numbered"],
        )
        results.add(
            "relayed events on disk once flushed",
            f"{r['events_stored']:,} of {r['events_sent']:,} sent ({r['dropped']} dropped by the store)",
            "-",
            None,
            "none lost",
            r["events_stored"] == r["events_sent"] and r["dropped"] == 0,
        )
        results.add(
            "file bytes per event",
            f"{r['file_bytes'] / max(r['rows'], 1):.0f} B ({r['rows']:,} events, {r['file_bytes'] / 2**20:.1f} MiB)",
            "-",
            None,
            "-",
            None,
        )
    return results


async def run(args: Any) -> None:
    """Each repetition: memory and sqlite, in alternating order."""
    ff.raise_open_file_limit(args.edges + ff.SPARE_FDS)
    runs = []
    for repetition in range(args.repeat):
        order = ["memory", "sqlite"] if repetition % 2 == 0 else ["sqlite", "memory"]
        for backend in order:
            print(f"== {backend} (repetition {repetition + 1})", flush=True)
            if args.keep:
                directory = Path(tempfile.mkdtemp(prefix=f"iop-store-bench-{backend}-"))
                print(f"   kept in {directory}", flush=True)
                runs.append(await measure(args, backend, directory))
            else:
                with tempfile.TemporaryDirectory(prefix=f"iop-store-bench-{backend}-") as name:
                    runs.append(await measure(args, backend, Path(name)))
            r = runs[-1]
            print(
                f"   round p50 {r['round_p50'] * 1000:.0f} ms, CPU per event at 10k/s "
                f"{r['10k_cpu_per_event'] * 1e6:.1f} us, p99 {r['10k_p99'] * 1000:.1f} ms, "
                f"delivered at 30k/s {r['30k_delivered_per_second'] / 1000:.1f}k/s",
                flush=True,
            )
            await ff.sleep(1.0)
    print()
    print(report(runs, args).table())


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10_000, help="edges enrolled (default 10,000)")
    parser.add_argument("--rounds", type=int, default=5, help="fleet rounds per backend")
    parser.add_argument("--event-seconds", type=float, default=2.0, help="seconds of live events at each rate")
    parser.add_argument("--repeat", type=int, default=4, help="repetitions, the order alternating")
    parser.add_argument("--enroll-timeout", type=float, default=60.0, help="deadline for all edges to enroll")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (config, log, store)")
    args = parser.parse_args()
    task.react(lambda _: defer.ensureDeferred(run(args)))


if __name__ == "__main__":
    main()
