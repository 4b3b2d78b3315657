#!/usr/bin/env python
"""Tokens per second through Edge + Node against the same real engine called directly.

Writes the tiny llama model of ``twisted_iop.testing.engines.tiny_model`` (random
weights, llama.cpp's SPM vocabulary; ``make llama-engine`` installs the
engine and extracts the vocabulary), starts llama-cpp-python's OpenAI
server on it (one request at a time: llama-cpp-python has no
``--parallel``), then a Control Plane, an Edge and one Node of kind
``llamacpp`` in front of it as ``twistd`` processes, all on 127.0.0.1.

Each run sends ``--requests`` streamed chat completions of
``--max-tokens`` tokens with 1, then 4, concurrent streams (4 streams on a
single-slot engine queue there: the figure is the engine's throughput and
what the gateway takes from it), alternating runs straight to the engine
and through the Edge, ``--runs`` pairs (each pair one run each way, the
order alternating from pair to pair). Tokens are the content chunks the
client receives (the engine sends one per token). Each path's tokens per
second are its tokens over its wall time; the figure judged is the median
of the pairs' ratios (the engine's own speed drifts by 20% or more
between runs on a shared machine, far more than the gateway takes); the
target is a ratio of at least 0.97.

Run: ``.venv/bin/python bench/engine_throughput.py`` (about 3 minutes), or
``make bench-engine``; ``--quick`` for one pair (about 40 s).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import openai

from twisted_iop.testing.engines.llama_engine import (
    EngineFleet,
    LlamaEngine,
    start_engine_fleet,
    start_llama_engine,
)
from twisted_iop.testing.engines.tiny_model import TinyModelShape, tiny_model

MODEL = "tiny-llama"
#: Through Edge + Node, at least this share of the engine's own tokens per second.
TARGET_RATIO = 0.97
#: The Edge's capacity for the engine: above its parallelism, as an operator would guess.
CAPACITY = 4
CONCURRENCIES = (1, 4)


def one_stream(client: openai.OpenAI, max_tokens: int) -> tuple[int, int]:
    """One streamed chat completion; the content chunks received and 1 if it failed (else 0)."""
    chunks = 0
    try:
        for chunk in client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=True
        ):
            chunks += sum(1 for choice in chunk.choices if choice.delta.content)
    except openai.APIError:
        return chunks, 1
    return chunks, 0


#: Tokens received, wall seconds and failed streams of some runs.
Totals = tuple[int, float, int]


def run(base_url: str, api_key: str, concurrency: int, requests: int, max_tokens: int) -> Totals:
    """``requests`` streams, ``concurrency`` at a time; the tokens received, the wall time taken, the failures."""
    clients = [
        openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=120)
        for _ in range(concurrency)
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        streams = list(pool.map(lambda i: one_stream(clients[i % concurrency], max_tokens), range(requests)))
    return sum(t for t, _ in streams), time.monotonic() - started, sum(f for _, f in streams)


def measure(engine: LlamaEngine, fleet: EngineFleet, options: argparse.Namespace) -> dict[int, dict[str, Any]]:
    """Per concurrency: each path's totals and the ratio of every pair of runs.

    The pairs alternate their order (direct first, then through the Edge
    first) so that a drift of the machine's speed during the run weighs on
    both paths alike; the figure is the median of the pairs' ratios.
    """
    paths = {"direct": (engine.base_url, "unused"), "edge+node": (fleet.gateway, "k-test")}
    figures: dict[int, dict[str, Any]] = {}
    for concurrency in CONCURRENCIES:
        totals: dict[str, Totals] = {name: (0, 0.0, 0) for name in paths}
        ratios: list[float] = []
        for pair in range(options.runs):
            order = list(paths) if pair % 2 == 0 else list(reversed(paths))
            rates: dict[str, float] = {}
            for name in order:
                url, key = paths[name]
                one = run(url, key, concurrency, options.requests, options.max_tokens)
                totals[name] = (totals[name][0] + one[0], totals[name][1] + one[1], totals[name][2] + one[2])
                rates[name] = one[0] / one[1]
            ratios.append(rates["edge+node"] / rates["direct"])
        figures[concurrency] = {"totals": totals, "ratios": ratios}
    return figures


def report(engine: LlamaEngine, shape: TinyModelShape, model: Path, options: argparse.Namespace, figures: Any) -> bool:
    """Print the settings and each figure with its ratio to direct and PASS/MISS; True when all pass."""
    print("engine throughput: tokens/s through Edge + Node against the engine directly")
    print(f"  model      {model.name}: {shape.describe()}, {model.stat().st_size / 1e6:.1f} MB (F32)")
    print(f"  engine     llama-cpp-python, one request at a time; {engine.command_line()}")
    print(f"  load       {options.requests} streams of max_tokens {options.max_tokens} per run, {options.runs} pairs")
    print(f"             of runs (order alternating), Edge capacity {CAPACITY}, provider kind llamacpp; target ratio")
    print(f"             >= {TARGET_RATIO:.2f}; Node probes: node.yaml defaults (every 10 s, 3 s timeout)")
    passed = True
    for concurrency, figure in figures.items():
        totals = figure["totals"]
        rates = {name: tokens / seconds for name, (tokens, seconds, _) in totals.items()}
        failed = {name: f for name, (_, _, f) in totals.items()}
        ratio = statistics.median(figure["ratios"])
        ok = ratio >= TARGET_RATIO and not any(failed.values())
        passed = passed and ok
        print(
            f"  {concurrency} stream{'s' if concurrency > 1 else ' '}  direct {rates['direct']:8.1f} tok/s"
            f"  edge+node {rates['edge+node']:8.1f} tok/s  median pair ratio {ratio:5.3f}  {'PASS' if ok else 'MISS'}"
            f"  (pairs {', '.join(f'{r:.3f}' for r in figure['ratios'])}; {totals['direct'][0]} / "
            f"{totals['edge+node'][0]} tokens; failed streams {failed['direct']} / {failed['edge+node']})"
        )
    return passed


def main(argv: Optional[list[str]] = None) -> int:
    """Parse options, start the engine and the fleet, measure, print, stop everything."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of each")
    parser.add_argument("--runs", type=int, default=6, help="pairs of runs (one each way) at each concurrency")
    parser.add_argument("--requests", type=int, default=4, help="streams per run")
    parser.add_argument("--max-tokens", type=int, default=900, help="max_tokens of each stream")
    parser.add_argument("--n-ctx", type=int, default=1024, help="the engine's context")
    parser.add_argument("--layers", type=int, default=TinyModelShape().layers, help="layers of the model")
    parser.add_argument("--embedding", type=int, default=TinyModelShape().embedding, help="embedding length")
    options = parser.parse_args(argv)
    if options.quick:
        options.runs = 1
    shape = TinyModelShape(layers=options.layers, embedding=options.embedding, context=options.n_ctx)
    with tempfile.TemporaryDirectory(prefix="iop-engine-bench-") as scratch:
        workdir = Path(scratch)
        model = tiny_model(workdir, shape)
        engine = start_llama_engine(model, workdir, MODEL, n_ctx=options.n_ctx)
        try:
            fleet = start_engine_fleet([engine], workdir, capacity=CAPACITY, probes=None)
            try:
                run(fleet.gateway, "k-test", 1, 1, 16)  # warm both paths' connections and the engine
                run(engine.base_url, "unused", 1, 1, 16)
                figures = measure(engine, fleet, options)
            finally:
                fleet.stop()
        finally:
            engine.stop()
        passed = report(engine, shape, model, options, figures)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
