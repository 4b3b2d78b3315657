#!/usr/bin/env python
"""Capacity history: what sampling costs a fleet round, and how many bytes a day keeps.

**(1) Sampling cost at N edges** (default 10,000), in process and without
sockets: the real registry, gateway, edge wire protocols on
``StringTransport`` and Klein handler of ``gateway_inprocess.Rig`` run
``GET /fleet/status`` rounds; after each round the real
:class:`~twisted_iop.controlplane.history.service.HistoryService` takes a
sample of the same registry (its slices run through the rig's clock). CPU
of the sample is printed next to CPU of the round, from the same run, for
two fleets:

* **busy**: every round, every edge's answer differs from its last (four
  variants per edge, in turn: in flight, queued, the engines' running and
  waiting, tokens/s and KV cache all move), so every snapshot changed and
  the per-model breakdown is parsed for ``parse_budget`` edges per sample;
* **steady**: the same answer every round (after warm-up rounds until
  every edge's breakdown is cached: nothing is parsed).

Target: a round with sampling costs at most 10% more than without.

**(2) Bytes per edge per day** at the default tiers: E edges (default 20,
4 nodes of 2 providers, 2 models, as the suite's fake edge) answer a
simulated day through the real status path (``checked_snapshot`` and the
registry), sampled every 15 s by the real service on a fake clock, its
chunks written to the real memory store and expired by the tiers' keep
times. What changes, per provider each sample: in flight a random walk
within capacity (8), queued a burst now and then, long-context work
1 of 2 part of the time, tokens/s about 40 per request in flight with
noise, the engine's running and waiting following them, KV cache about
in flight / capacity. At the end of the day: bytes of chunk data and
chunks per edge and per tier, then x 10,000. Target: <= 200 MB per
10,000 edges per day.

Run: ``.venv/bin/python bench/history.py`` (about 3 minutes on 2 cores);
``--edges 1000 --day-edges 5`` for a quick look.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fanout import NODES_4X2, edge_snapshot
from gateway_inprocess import Rig
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Clock

from twisted_iop.controlplane.edge_hello import EdgeHello
from twisted_iop.controlplane.gateway import EdgeGateway
from twisted_iop.controlplane.history import chunks
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.registry import EdgeRegistry
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.testing.peers import AnsweringEdgePeer, keep_status
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import make_envelope
from twisted_iop.wire.status_totals import with_totals

TARGET_ROUND_SHARE = 0.10
TARGET_DAY_BYTES_10K = 200 * 1024 * 1024
VARIANTS = 4


def busy_variant(response: pb.EdgeStatusResponse, variant: int, rng: random.Random) -> pb.EdgeStatusResponse:
    """``response`` with its work moved: variant ``variant`` of four."""
    for node in response.nodes:
        for p in node.providers:
            p.in_flight = (3 + variant + rng.randrange(3)) % (p.capacity + 1)
            p.queued = max(0, variant - 1 + rng.randrange(2))
            p.long_context_in_flight = variant % 2
            p.tokens_per_second = 40.0 * p.in_flight + rng.random() * 20
            p.engine.known = True
            p.engine.running = p.in_flight
            p.engine.waiting = p.queued
            p.engine.kv_cache_usage = min(1.0, p.in_flight / p.capacity + rng.random() * 0.05)
    return with_totals(response)


def sampling_cost(edges: int, rounds: int) -> None:
    """Part (1): CPU of a sample next to CPU of a fleet round."""
    rng = random.Random(1)
    print(f"building {edges} edges ...", flush=True)
    rig = Rig(edges)
    ids = [f"bench-edge-{i:05d}" for i in range(edges)]
    busy = [
        [
            make_envelope(
                "edge_status_response", busy_variant(edge_snapshot(edge_id, NODES_4X2), v, rng)
            ).SerializeToString()
            for edge_id in ids
        ]
        for v in range(VARIANTS)
    ]
    steady = list(rig.tails)
    settings = HistorySettings()
    store = MemoryStore(history_max_bytes=2**40)
    clock = cast(IReactorTime, rig.list_clock)
    history = HistoryService(settings, rig.registry, rig.gateway, store, clock)
    t = [1_800_000_000.0]

    def sample() -> float:
        t[0] += settings.interval_seconds
        started = time.process_time()
        history.sample(t[0])
        while history._sampling is not None:  # the slices, as the reactor would run them
            rig.list_clock.run_due()
        return time.process_time() - started

    print(
        f"\n== history sampling: {edges} edges (4 nodes x 2 providers, 2 models each), "
        f"interval {settings.interval_seconds:g} s, parse_budget {settings.parse_budget}, "
        f"tiers {', '.join(f'{x.step_seconds:g} s/{x.keep_seconds / 3600:g} h' for x in settings.tiers)}; "
        f"CPU, median of {rounds} (collector as the daemon sets it: 10000,20,100)"
    )
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 100)
    print(f"{'fleet':<7} {'round':>9} {'sample':>9} {'share':>7} {'parsed/sample':>14}  target <= 10%")
    for name in ("busy", "steady"):
        round_cpu: list[float] = []
        sample_cpu: list[float] = []
        parsed: list[int] = []
        if name == "steady":
            # Until every edge's breakdown is of the steady answer (parse_budget edges per sample).
            for _ in range(edges // settings.parse_budget + 2):
                rig.tails = steady
                rig.round(1000)
                before = history.breakdowns.parsed
                sample()
                if history.breakdowns.parsed == before:
                    break
        for r in range(rounds + 1):
            rig.tails = busy[r % VARIANTS] if name == "busy" else steady
            took = rig.round(1000)["total"]
            before = history.breakdowns.parsed
            spent = sample()
            if r:  # the first of each fleet is a warm-up (series started, caches filled)
                round_cpu.append(took)
                sample_cpu.append(spent)
                parsed.append(history.breakdowns.parsed - before)
        round_ms = statistics.median(round_cpu) * 1000
        sample_ms = statistics.median(sample_cpu) * 1000
        share = sample_ms / round_ms
        verdict = "PASS" if share <= TARGET_ROUND_SHARE else "MISS"
        print(
            f"{name:<7} {round_ms:>7.0f}ms {sample_ms:>7.1f}ms {share:>6.1%} {statistics.median(parsed):>14.0f}  {verdict}",
            flush=True,
        )
    open_bytes = sum(len(c.data) for s in history.recorder._series.values() for c in s.chunks)
    points, writes = history.recorder.points_written, history.recorder.chunk_writes
    sample()
    print(
        f"series kept {len(history.recorder)}; open chunks in memory {open_bytes / 1e6:.1f} MB of bytes; "
        f"the last sample: {history.recorder.points_written - points} points written (every tier), "
        f"{history.recorder.chunk_writes - writes} chunks handed to the store"
    )


def bytes_per_day(edges: int, seconds: float) -> None:
    """Part (2): one simulated day through the real status path, sampler and store."""
    settings = HistorySettings()
    clock = Clock()
    start = 1_800_000_000.0 - 1_800_000_000.0 % 86400
    clock.advance(start)
    registry = EdgeRegistry(clock)
    gateway = EdgeGateway(registry, clock)
    store = MemoryStore(history_max_bytes=2**40)
    history = HistoryService(settings, registry, gateway, store, clock)
    rng = random.Random(7)
    ids = [f"day-edge-{i:03d}" for i in range(edges)]
    tokens = {}
    base = {}
    for edge_id in ids:
        tokens[edge_id] = registry.connect(edge_id, AnsweringEdgePeer(edge_id), EdgeHello({}, "1", "1.0", ()))
        base[edge_id] = edge_snapshot(edge_id, NODES_4X2)
    state = {edge_id: [[3, 0, 0] for _ in range(sum(len(n.providers) for n in base[edge_id].nodes))] for edge_id in ids}
    samples = int(seconds / settings.interval_seconds)
    started = time.process_time()
    for _ in range(samples):
        clock.advance(settings.interval_seconds)
        for edge_id in ids:
            response = pb.EdgeStatusResponse()
            response.CopyFrom(base[edge_id])
            providers = [p for n in response.nodes for p in n.providers]
            for p, s in zip(providers, state[edge_id], strict=True):
                s[0] = min(p.capacity, max(0, s[0] + rng.choice((-1, 0, 0, 1))))
                s[1] = rng.randrange(4) if rng.random() < 0.1 else max(0, s[1] - 1)
                s[2] = 1 if rng.random() < 0.3 else 0
                p.in_flight, p.queued, p.long_context_in_flight = s
                p.tokens_per_second = 40.0 * s[0] + rng.random() * 10
                p.engine.known = True
                p.engine.running = s[0]
                p.engine.waiting = s[1]
                p.engine.kv_cache_usage = min(1.0, s[0] / p.capacity + rng.random() * 0.03)
            keep_status(registry, edge_id, tokens[edge_id], with_totals(response), clock.seconds())
        history.sample(clock.seconds())
        while history._sampling is not None:
            clock.advance(0)
    cpu = time.process_time() - started
    # What is kept at the end of the day (expired by the tiers' keep times), per tier.
    by_tier: dict[int, list[int]] = {t.key: [0, 0] for t in settings.tiers}
    model_bytes = 0
    history_store = store.history
    for (series, step), kept in history_store._chunks.items():
        if not series.startswith("edge:"):
            continue
        for chunk in kept.values():
            size = len(chunk.data if chunk.data[0] == chunks.CLOSED else chunks.close(chunk.data))
            by_tier[step][0] += size
            by_tier[step][1] += 1
            if "/model:" in series:
                model_bytes += size
    total = sum(b for b, _ in by_tier.values())
    count = sum(c for _, c in by_tier.values())
    per_edge = total / edges
    at_10k = per_edge * 10_000
    verdict = "PASS" if at_10k <= TARGET_DAY_BYTES_10K else "MISS"
    print(
        f"\n== history bytes: {edges} edges x {samples} samples ({seconds / 3600:g} h at "
        f"{settings.interval_seconds:g} s), 8 providers and 2 models each, default tiers "
        f"({', '.join(f'{x.step_seconds:g} s kept {x.keep_seconds / 3600:g} h' for x in settings.tiers)}), "
        f"{chunks.MAX_POINTS} points per chunk, zlib level {chunks.ZLIB_LEVEL}; {cpu:.1f} s CPU"
    )
    for tier in settings.tiers:
        size, n = by_tier[tier.key]
        print(f"  tier {tier.step_seconds:>4g} s: {size / edges / 1024:8.1f} KiB per edge in {n / edges:6.1f} chunks")
    print(
        f"  per edge (its own series and its 2 models' {model_bytes / total:.0%}): {per_edge / 1024:.1f} KiB "
        f"in {count / edges:.1f} chunks; open chunks counted compressed"
    )
    print(f"  x 10,000 edges: {at_10k / 1024 / 1024:.1f} MiB (target <= 200 MiB)  {verdict}")
    if seconds >= 86400:
        steady = (
            by_tier[settings.tiers[0].key][0]
            + by_tier[settings.tiers[1].key][0] * settings.tiers[1].keep_seconds / seconds
            + by_tier[settings.tiers[2].key][0] * settings.tiers[2].keep_seconds / seconds
        ) / edges
        print(
            f"  at full retention (6 h + 48 h + 30 d): about {steady / 1024:.0f} KiB per edge, "
            f"{steady * 10_000 / 1024**3:.2f} GiB per 10,000 edges"
        )


def main() -> None:
    """Run both parts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10_000, help="edges of part (1) (default 10,000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per fleet in part (1)")
    parser.add_argument("--day-edges", type=int, default=20, help="edges of part (2) (default 20)")
    parser.add_argument("--hours", type=float, default=24.0, help="hours simulated in part (2) (default 24)")
    parser.add_argument("--only", choices=("cost", "bytes"), default=None)
    args = parser.parse_args()
    if args.only in (None, "bytes"):
        bytes_per_day(args.day_edges, args.hours * 3600)
    if args.only in (None, "cost"):
        sampling_cost(args.edges, args.rounds)


if __name__ == "__main__":
    main()
