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
  the per-model breakdown is parsed for ``parse_budget`` edges per sample
  of the edges;
* **steady**: the same answer every round (after warm-up rounds until
  every edge's breakdown is cached: nothing is parsed).

Every provider's answer carries a ``ProviderLatency`` as an Edge sends it
once requests ended (``--no-latency``: none, as an idle or older Edge):
recent and cumulative sketches of TTFT, TPOT and duration from a pool of
:data:`LATENCY_LEVELS` x :data:`LATENCY_VARIANTS` made from the load (a
provider with more in flight ended more requests, slower), so the history's
latency series (p95s from merged sketches, requests per second) cost what
they cost at a real Edge's figures.

Both fleets are warmed up first (until every edge was parsed once: each
edge and model on it has its slot), then the time is moved to just before
an hour: the sample that begins the hour (the hourly roll-ups) is
measured apart, and the figure is the mean of the next ``--rounds``
samples (the samples of the edges, the roll-ups below an hour, chunk
closes and store writes in them as often as they come) plus the hour's
excess over that mean / 240. The samples of the edges and the others are
also shown apart.

Target: a round with sampling costs at most 10% more than without.

**(2) Bytes per edge per day** at the default tiers: E edges (default 100,
4 nodes of 2 providers, 2 models, as the suite's fake edge) answer a
simulated day through the real status path (``checked_snapshot`` and the
registry), sampled every 15 s by the real service on a fake clock, its
chunks written to the real memory store and expired by the tiers' keep
times. What changes, per provider each sample: in flight a random walk
within capacity (8), queued a burst now and then, long-context work
1 of 2 part of the time, tokens/s about 40 per request in flight with
noise, the engine's running and waiting following them, KV cache about
in flight / capacity, and the latency figures of the pool above for its
in flight. Every edge is parsed at every sample of the edges
(fewer edges than ``parse_budget``: more often than at 10,000 edges). At
the end of the day (everything written as at a stop): bytes of chunk
data per edge and per tier, then x 10,000. Target: <= 200 MB per 10,000
edges per day.

Run: ``.venv/bin/python bench/history.py`` (about 4 minutes on 2 cores);
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
from typing import Optional, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fanout import NODES_4X2, edge_snapshot
from gateway_inprocess import Rig
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.history import edge_sampler, frames
from twisted_iop.controlplane.history.columns import ZLIB_LEVEL, ZLIB_WBITS
from twisted_iop.controlplane.history.frames import MAX_FRAMES, SEGMENTS, store_key
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.controlplane.history.settings import HistorySettings, Tier
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.latency import LatencyFeed
from twisted_iop.testing.wires.peers import AnsweringEdgePeer, keep_status
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import make_envelope
from twisted_iop.wire.status_totals import with_totals

TARGET_ROUND_SHARE = 0.10
TARGET_DAY_BYTES_10K = 200 * 1024 * 1024
VARIANTS = 4
#: The latency figures' pool: one level per request in flight (0 .. capacity 8), a few variants of each.
LATENCY_LEVELS = 9
LATENCY_VARIANTS = 4


def latency_pool(seed: int = 3) -> list[list[pb.ProviderLatency]]:
    """``ProviderLatency`` s by load level (the requests in flight) and variant: level L ended
    10 L requests in the window, TTFT about 0.15 + 0.03 L s and TPOT about 20 + 2 L ms, spread
    log-normally (level 0 ended none: empty sketches, as an idle provider with figures sends)."""
    rng = random.Random(seed)
    pool: list[list[pb.ProviderLatency]] = []
    for level in range(LATENCY_LEVELS):
        row = []
        for _ in range(LATENCY_VARIANTS):
            feed = LatencyFeed()
            # The cumulative sketches hold a day of such requests (their buckets, not their counts, cost bytes).
            for _ in range(3):
                feed.new_window()
                count = 10 * level
                ttft = [(0.15 + 0.03 * level) * rng.lognormvariate(0, 0.35) for _ in range(count)]
                tpot = [(0.020 + 0.002 * level) * rng.lognormvariate(0, 0.2) for _ in range(count)]
                feed.requests(ttft=ttft, tpot=tpot, duration=[t + 100 * p for t, p in zip(ttft, tpot, strict=True)])
            row.append(feed.message())
        pool.append(row)
    return pool


def with_latency(response: pb.EdgeStatusResponse, pool: list[list[pb.ProviderLatency]], rng: random.Random) -> None:
    """Give each provider of ``response`` the figures of its load level (its in flight), a variant at random."""
    for node in response.nodes:
        for p in node.providers:
            p.latency.CopyFrom(pool[min(p.in_flight, LATENCY_LEVELS - 1)][rng.randrange(LATENCY_VARIANTS)])


def busy_variant(
    response: pb.EdgeStatusResponse,
    variant: int,
    rng: random.Random,
    pool: Optional[list[list[pb.ProviderLatency]]] = None,
) -> pb.EdgeStatusResponse:
    """``response`` with its work moved: variant ``variant`` of four (with latency figures from ``pool``)."""
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
    if pool is not None:
        with_latency(response, pool, rng)
    return with_totals(response)


def _tiers(tier_list: tuple[Tier, ...]) -> str:
    return ", ".join(f"{x.step_seconds:g} s/{_hours(x.keep_seconds)}" for x in tier_list)


def _hours(seconds: float) -> str:
    return f"{seconds / 86400:g} d" if seconds >= 4 * 86400 else f"{seconds / 3600:g} h"


def sampling_cost(edges: int, rounds: int, latency: bool) -> None:
    """Part (1): CPU of a sample next to CPU of a fleet round."""
    rng = random.Random(1)
    pool = latency_pool() if latency else None
    print(f"building {edges} edges ...", flush=True)
    rig = Rig(edges)
    ids = [f"bench-edge-{i:05d}" for i in range(edges)]
    busy = [
        [
            make_envelope(
                "edge_status_response", busy_variant(edge_snapshot(edge_id, NODES_4X2), v, rng, pool)
            ).SerializeToString()
            for edge_id in ids
        ]
        for v in range(VARIANTS)
    ]
    if pool is not None:
        for i, edge_id in enumerate(ids):
            response = edge_snapshot(edge_id)
            with_latency(response, pool, rng)
            rig.tails[i] = make_envelope("edge_status_response", with_totals(response)).SerializeToString()
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

    def to_an_hour() -> None:
        """Move the samples' time so that the next one is the last before an hour begins."""
        hour = 3600.0
        t[0] += hour - (t[0] + 2 * settings.interval_seconds) % hour

    per_hour = round(3600 / settings.interval_seconds)
    per_edge_sample = settings.edge_tiers[0].step_ms // round(settings.interval_seconds * 1000)
    print(
        f"\n== history sampling: {edges} edges, interval {settings.interval_seconds:g} s, "
        f"parse_budget {settings.parse_budget}; latency figures {'in every answer' if latency else 'none'}; "
        f"fleet tiers {_tiers(settings.tiers)}; "
        f"edge tiers {_tiers(settings.edge_tiers)}; {SEGMENTS} segments, chunks of {MAX_FRAMES} frames; "
        f"CPU of the {rounds} samples after an hour begins (their mean: the samples of the edges every "
        f"{per_edge_sample} samples, the roll-ups below an hour, chunk closes and store writes in it as often as "
        f"they come) plus the excess of the sample that begins the hour (the hourly roll-ups) over them / "
        f"{per_hour}; collector as the daemon sets it (10000,20,100)"
    )
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 100)
    print(
        f"{'fleet':<7} {'answers':<32} {'round':>7} {'sample':>8} {'worst':>8} {'hour':>8} {'share':>7} "
        f"{'parsed/sample':>14}  target <= 10%"
    )
    shapes = {
        "busy": "4 nodes x 2 providers, 2 models",
        "steady": "2 nodes, 3 providers, 2 models",
    }
    for name in ("busy", "steady"):
        answers = (lambda r: busy[r % VARIANTS]) if name == "busy" else (lambda r: steady)
        # Warm-up: until every edge's breakdown was made once (parse_budget edges per sample of the
        # edges: every edge and model on it has its slot), or, steady, is of the steady answer
        # (a sample of the edges parsed nothing).
        for w in range(per_edge_sample * (edges // settings.parse_budget + 2)):
            rig.tails = answers(w)
            rig.round(1000)
            before = history.breakdowns.parsed
            edge_samples = history.edge_samples
            sample()
            if name == "steady" and history.edge_samples > edge_samples and history.breakdowns.parsed == before:
                break
        to_an_hour()
        round_cpu: list[float] = []
        sample_cpu: list[float] = []
        parsed: list[int] = []
        of_edges: list[float] = []
        hour_cpu = 0.0
        # A warm-up sample (slots made, caches filled, the time moved), the hour's first, then the measured ones.
        for r in range(rounds + 2):
            rig.tails = answers(r)
            took = rig.round(1000)["total"]
            before = history.breakdowns.parsed
            edge_samples = history.edge_samples
            spent = sample()
            if r == 1:
                hour_cpu = spent
            elif r > 1:
                round_cpu.append(took)
                sample_cpu.append(spent)
                parsed.append(history.breakdowns.parsed - before)
                if history.edge_samples > edge_samples:
                    of_edges.append(spent)
        round_ms = statistics.mean(round_cpu) * 1000
        sample_ms = statistics.mean(sample_cpu) * 1000
        with_hour = sample_ms + max(0.0, hour_cpu * 1000 - sample_ms) / per_hour
        share = with_hour / round_ms
        verdict = "PASS" if share <= TARGET_ROUND_SHARE else "MISS"
        between = [x for x in sample_cpu if x not in of_edges]
        print(
            f"{name:<7} {shapes[name]:<32} {round_ms:>5.0f}ms {with_hour:>6.1f}ms {max(sample_cpu) * 1000:>6.1f}ms "
            f"{hour_cpu * 1000:>6.1f}ms {share:>6.1%} {statistics.mean(parsed):>14.0f}  {verdict}",
            flush=True,
        )
        print(
            f"        (samples of the edges: {len(of_edges)}, mean {statistics.mean(of_edges) * 1000:.1f}ms; "
            f"the others: {len(between)}, mean {statistics.mean(between) * 1000 if between else 0:.1f}ms)",
            flush=True,
        )
    open_bytes = sum(
        len(chunk.data)
        for group in (history.edges.edges, history.edges.models)
        for segment in group.segments
        for chunk in (segment.open_chunk(i) for i in range(len(group.tiers)))
        if chunk is not None
    )
    print(
        f"series kept {history.series_kept} ({history.edges.slots} per-edge keys in {SEGMENTS} segments of 2 "
        f"groups); open chunks {open_bytes / 1e6:.1f} MB (compressed as written); "
        f"{history.chunk_writes} chunks handed to the store in {history.samples} samples"
    )


def bytes_per_day(edges: int, seconds: float, latency: bool) -> None:
    """Part (2): one simulated day through the real status path, sampler and store.

    All the simulated edges are put in one segment (a key's segment is a
    hash of its edge id): a segment's frames and chunks share their own
    bytes (times, column numbers, zlib's) among its edges, so this
    simulates one segment as full as it is at 10,000 edges (312 edges) with
    fewer edges than 10,000 (less full: more bytes an edge, never fewer).
    """
    frames.segment_of = edge_sampler.segment_of = lambda edge_id: 0
    settings = HistorySettings()
    clock = Clock()
    start = 1_800_000_000.0 - 1_800_000_000.0 % 86400
    clock.advance(start)
    registry = EdgeRegistry(clock)
    gateway = EdgeGateway(registry, clock)
    store = MemoryStore(history_max_bytes=2**40)
    history = HistoryService(settings, registry, gateway, store, clock)
    rng = random.Random(7)
    pool = latency_pool() if latency else None
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
            if pool is not None:
                with_latency(response, pool, rng)
            keep_status(registry, edge_id, tokens[edge_id], with_totals(response), clock.seconds())
        history.sample(clock.seconds())
        while history._sampling is not None:
            clock.advance(0)
    cpu = time.process_time() - started
    # What is kept at the end of the day (expired by the tiers' keep times), open chunks and points in
    # progress written as at a stop (closed, as they are kept), per tier of the per-edge groups.
    history.stopService()
    per_tier: dict[int, list[int]] = {store_key(t): [0, 0] for t in settings.edge_tiers}
    model_bytes = fleet_bytes = 0
    for (series, step), kept in store.history._chunks.items():
        size = sum(len(chunk.data) for chunk in kept.values())
        if series.startswith(("edges/", "edge-models/")):
            per_tier[step][0] += size
            per_tier[step][1] += len(kept)
            if series.startswith("edge-models/"):
                model_bytes += size
        else:
            fleet_bytes += size
    total = sum(b for b, _ in per_tier.values())
    count = sum(c for _, c in per_tier.values())
    per_edge = total / edges
    at_10k = per_edge * 10_000
    verdict = "PASS" if at_10k <= TARGET_DAY_BYTES_10K else "MISS"
    print(
        f"\n== history bytes: {edges} edges x {samples} samples ({seconds / 3600:g} h at "
        f"{settings.interval_seconds:g} s), 8 providers and 2 models each, latency figures "
        f"{'in every answer' if latency else 'none'}; edge tiers "
        f"{_tiers(settings.edge_tiers)}; all in one segment (of {SEGMENTS}: "
        f"{10_000 / SEGMENTS:.0f} edges a segment at 10,000 edges), chunks of {MAX_FRAMES} frames, zlib level {ZLIB_LEVEL} "
        f"window 2^{ZLIB_WBITS}; {cpu:.1f} s CPU"
    )
    for tier in settings.edge_tiers:
        size, n = per_tier[store_key(tier)]
        print(
            f"  tier {tier.step_seconds:>5g} s kept {_hours(tier.keep_seconds):>5}: "
            f"{size / edges / 1024:8.2f} KiB per edge ({n} chunks of {edges} edges)"
        )
    print(
        f"  per edge (its own series and its 2 models', {model_bytes / max(total, 1):.0%} the models'): "
        f"{per_edge / 1024:.2f} KiB in {count} chunks; closed as at a stop"
    )
    print(f"  x 10,000 edges: {at_10k / 1024 / 1024:.1f} MiB (target <= 200 MiB)  {verdict}")
    print(
        f"  the fleet's own series (fleet, each model fleet-wide; tiers {_tiers(settings.tiers)}): "
        f"{fleet_bytes / 1024:.0f} KiB in all"
    )
    if seconds >= 86400:
        full = sum(per_tier[store_key(t)][0] * max(1.0, t.keep_seconds / seconds) for t in settings.edge_tiers) / edges
        print(
            f"  at full retention ({', '.join(_hours(t.keep_seconds) for t in settings.edge_tiers)}): about "
            f"{full / 1024:.0f} KiB per edge, {full * 10_000 / 1024**3:.2f} GiB per 10,000 edges"
        )


def main() -> None:
    """Run both parts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10_000, help="edges of part (1) (default 10,000)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds per fleet in part (1) (default 40)")
    parser.add_argument(
        "--day-edges", type=int, default=100, help="edges of part (2), all in one segment (default 100; 625 fill it)"
    )
    parser.add_argument("--hours", type=float, default=24.0, help="hours simulated in part (2) (default 24)")
    parser.add_argument("--only", choices=("cost", "bytes"), default=None)
    parser.add_argument(
        "--no-latency", dest="latency", action="store_false", help="answers without latency figures (an idle Edge's)"
    )
    args = parser.parse_args()
    if args.only in (None, "bytes"):
        bytes_per_day(args.day_edges, args.hours * 3600, args.latency)
    if args.only in (None, "cost"):
        sampling_cost(args.edges, args.rounds, args.latency)


if __name__ == "__main__":
    main()
