#!/usr/bin/env python
"""How long a Control Plane takes to come back on a full store: the time a
restart keeps operators (and Edges) waiting.

A SQLite store is written as a Control Plane would have left it (through
the store's own writer: ``--edges`` edges, each with ``--events-per-edge``
events in blocks of ``--block`` events, realistic texts and attributes),
then the real daemon (``twistd -n iop-control-plane``) is started on it,
and timed until ``GET /readyz`` answers 200; its RSS then, and what it
restored (edges known, the fleet's numbering). The same daemon on an empty
store is the reference (``--repeat`` times each, medians).

Run: ``.venv/bin/python bench/store_restart.py`` (1,000,000 events, the
default ``store.retention.fleet_events``; about 2 minutes);
``--edges 1000 --events-per-edge 100`` for a quick look.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fleet_fanout as ff
import suite
from twisted.internet import defer, reactor, task

from twisted_iop.controlplane.fleet.event_record import EventRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.store import sqlite_schema
from twisted_iop.controlplane.store.settings import Retention
from twisted_iop.controlplane.store.sqlite import _edge_row
from twisted_iop.controlplane.store.sqlite_writer import Batch, SqliteWriter
from twisted_iop.controlplane.wires.edge_hello import EdgeHello

STORE_CONFIG = "store:\n  backend: sqlite\n  path: state/control-plane.sqlite\n"
HELLO = EdgeHello(labels={"site": "lab", "region": "eu"}, software_version="1.0", protocol_version="1.0", commands=())


def fill(path: Path, edges: int, per_edge: int, block: int) -> int:
    """Write the store a Control Plane with this history would leave; its event count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite_schema.connect(str(path))
    writer = SqliteWriter(connection, Retention(), 2**30, lambda f, *a: f(*a), lambda: 0.0)
    registry = EdgeRegistry(reactor)
    now = time.time() - 3600
    batch = Batch()
    for e in range(edges):
        record = registry.known(f"edge-{e:05d}", HELLO)
        record.last_seen = now
        batch.edges.append((*_edge_row(record)[:7], per_edge, 0))
    writer.write(batch)
    fleet = 0
    for start in range(0, per_edge, block):
        batch = Batch()
        for e in range(edges):
            for sequence in range(start + 1, min(start + block, per_edge) + 1):
                fleet += 1
                batch.events.append(
                    EventRecord(
                        sequence,
                        fleet,
                        f"edge-{e:05d}",
                        "provider.health",
                        now + fleet * 1e-3,
                        now + fleet * 1e-3,
                        node_id="gpu-01",
                        provider_id="vllm-a",
                        message="provider vllm-a on gpu-01 became degraded: p95 latency above 2 s",
                        attributes={"from": "healthy", "to": "degraded"},
                    )
                )
        batch.meta["fleet_sequence"] = fleet
        writer.write(batch)
    connection.close()
    return fleet


async def start(workdir: Path) -> dict[str, Any]:
    """Start the daemon on ``workdir``'s store; until /readyz, RSS, what it restored."""
    started = time.monotonic()
    cp = ff.ControlPlaneProcess(workdir, f"tcp:0:interface={ff.LOOPBACK}", config_text=ff.BENCH_CONFIG + STORE_CONFIG)
    ff.CONTROL_PLANES.append(cp)
    try:
        ports = await ff.eventually(lambda: ff._ports_or_fail(cp, {"http"}), 600, "the Control Plane's ports")
        http = ff.Http(ports["http"])
        await ff.eventually(lambda: ff._ready(http), 600, "GET /readyz", interval=0.02)
        ready = time.monotonic() - started
        rss = ff._vmrss(cp.pid)
        _, edges, _, _ = await http.get_json("/edges?limit=1")
        _, fleet, _, _ = await http.get_json("/fleet/events?limit=1")
        return {"ready": ready, "rss": rss, "edges": edges["total"], "fleet_sequence": fleet["last_sequence"]}
    finally:
        cp.stop()


async def run(args: Any) -> None:
    """Fill once, then start on it and on an empty store, ``--repeat`` times each."""
    with tempfile.TemporaryDirectory(prefix="iop-store-restart-") as name:
        full, empty = Path(name) / "full", Path(name) / "empty"
        path = full / "state" / "control-plane.sqlite"
        filled = time.monotonic()
        events = fill(path, args.edges, args.events_per_edge, args.block)
        print(
            f"settings: {args.edges:,} edges x {args.events_per_edge} events ({events:,}) in blocks of "
            f"{args.block}, {sqlite_schema.file_bytes(str(path)) / 2**20:.0f} MiB on disk "
            f"(written in {time.monotonic() - filled:.0f} s); the registry's defaults "
            "(registry.events_per_edge 1000, disconnected_bytes 256 MiB); "
            f"{args.repeat} start(s) each, medians",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"full": [], "empty": []}
        for repetition in range(args.repeat):
            for kind, workdir in (("full", full), ("empty", empty)):
                workdir.mkdir(exist_ok=True)
                figures = await start(workdir)
                runs[kind].append(figures)
                print(
                    f"== {kind} store (start {repetition + 1}): ready after {figures['ready']:.2f} s, "
                    f"RSS {figures['rss'] / 2**20:.0f} MiB, {figures['edges']:,} edges known, "
                    f"fleet numbering at {figures['fleet_sequence']:,}",
                    flush=True,
                )
    results = suite.Results()

    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    full_ready, empty_ready = median("full", "ready"), median("empty", "ready")
    results.add(
        "start until /readyz answers 200",
        f"{full_ready:.2f} s ({events:,} events kept)",
        f"{empty_ready:.2f} s (an empty store)",
        full_ready / empty_ready,
        "-",
        None,
    )
    results.add(
        "RSS once ready",
        f"{median('full', 'rss') / 2**20:.0f} MiB",
        f"{median('empty', 'rss') / 2**20:.0f} MiB",
        None,
        "-",
        None,
    )
    numbered = min(r["fleet_sequence"] for r in runs["full"])
    results.add(
        "the fleet's numbering continues after the kept events",
        f"at {numbered:,}",
        f"{events:,} kept",
        None,
        "none reused",
        numbered >= events,
    )
    print()
    print(results.table())


def main() -> None:
    """Parse arguments and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10_000, help="edges kept (default 10,000)")
    parser.add_argument("--events-per-edge", type=int, default=100, help="events kept of each edge (default 100)")
    parser.add_argument("--block", type=int, default=10, help="events per block (one flush of one edge)")
    parser.add_argument("--repeat", type=int, default=2, help="starts on each store")
    args = parser.parse_args()
    task.react(lambda _: defer.ensureDeferred(run(args)))


if __name__ == "__main__":
    main()
