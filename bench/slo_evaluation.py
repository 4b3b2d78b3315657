#!/usr/bin/env python
"""SLOs: what one evaluation costs at N edges, next to parsing their snapshots alone.

In process, no sockets: a real registry with N edges (default 2,000, each
4 nodes of one provider serving ``llama-3-8b``, half of them
``region=eu``) whose kept snapshots carry ``ProviderLatency`` made by
:class:`~twisted_iop.testing.latency.LatencyFeed` (each round, 20 new
requests per provider at a random TTFT), and the real
:class:`~twisted_iop.controlplane.slo.service.SloService` with ``--slos``
SLOs (default 10: ttft, tpot, duration and error_ratio, on every edge or on
``region=eu``). Each round every edge gets a new snapshot; the figure is
the CPU of one evaluation (all snapshots new) over ``--rounds`` rounds,
printed beside the reference: parsing the same snapshots once
(``StatusSnapshot.parse``, what any view that reads them pays), and per
edge. The settings the figures depend on are printed with them.
"""

from __future__ import annotations

import argparse
import random
import time

from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import checked_snapshot
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.slo.service import SloService
from twisted_iop.controlplane.slo.settings import SloSettings
from twisted_iop.controlplane.slo.spec import parse_spec
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.latency import LatencyFeed, latency_snapshot
from twisted_iop.testing.wires.peers import CATALOG, AnsweringEdgePeer

SPECS = [
    {"metric": "ttft", "percentile": 95, "objective_seconds": 0.5},
    {"metric": "tpot", "percentile": 99, "objective_seconds": 0.05},
    {"metric": "duration", "percentile": 95, "objective_seconds": 2.0},
    {"metric": "error_ratio", "objective_ratio": 0.01},
]


def main() -> None:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=2000)
    parser.add_argument("--slos", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(31)
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    gateway = EdgeGateway(registry, clock)
    slos = SloService(SloSettings(), registry, gateway, MemoryStore(), registry.event_log.edge_buffer(), clock)
    slos.startService()
    for n in range(args.slos):
        body = dict(SPECS[n % len(SPECS)], model="llama-3-8b", edge_selector="region=eu" if n % 2 else "")
        slos.put(parse_spec(f"slo-{n}", body))
    feeds: dict[str, dict[str, LatencyFeed]] = {}
    labels = {"eu": {"region": "eu"}, "us": {"region": "us"}}
    for e in range(args.edges):
        edge_id = f"edge-{e:05d}"
        hello = EdgeHello(
            labels=labels["eu" if e % 2 else "us"],
            software_version="b",
            protocol_version="1.0",
            commands=tuple(CATALOG),
        )
        registry.connect(edge_id, AnsweringEdgePeer(edge_id), hello)
        feeds[edge_id] = {f"mock-{p}": LatencyFeed() for p in range(4)}

    def new_snapshots() -> None:
        for edge_id, providers in feeds.items():
            for feed in providers.values():
                feed.new_window()
                feed.requests(ttft=[rng.lognormvariate(-1.5, 0.6) for _ in range(20)], errors=rng.random() < 0.1)
            record = registry.get(edge_id)
            snapshot = checked_snapshot(latency_snapshot(edge_id, providers), clock.seconds())
            registry.record_status(edge_id, record.token or 0, snapshot)

    new_snapshots()
    slos.evaluate(clock.seconds())  # the baselines
    evaluation = parsing = 0.0
    for _ in range(args.rounds):
        clock.advance(10)
        new_snapshots()
        started = time.process_time()
        for record in registry.edges():
            assert record.snapshot is not None
            record.snapshot.parse()
        parsing += time.process_time() - started
        started = time.process_time()
        slos.evaluate(clock.seconds())
        evaluation += time.process_time() - started
    size = len(registry.get("edge-00000").snapshot.data)  # type: ignore[union-attr]
    print(f"edges {args.edges} x 4 providers, SLOs {args.slos}, rounds {args.rounds}, snapshot {size} bytes")
    print(
        f"evaluation (all snapshots new): {evaluation / args.rounds * 1000:8.1f} ms CPU per round, "
        f"{evaluation / args.rounds / args.edges * 1e6:6.1f} us per edge"
    )
    print(
        f"reference: parsing them once:   {parsing / args.rounds * 1000:8.1f} ms CPU per round, "
        f"{parsing / args.rounds / args.edges * 1e6:6.1f} us per edge"
    )
    state = slos.get("slo-0")
    print(
        f"slo-0: {state.figures(clock.seconds()).total} requests counted, "
        f"{len(state.fine) + len(state.coarse)} count buckets, {len(slos.readings)} streams kept"
    )


if __name__ == "__main__":
    main()
