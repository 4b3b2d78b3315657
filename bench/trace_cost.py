#!/usr/bin/env python
"""The cost of a request's trace at the Edge, per request, in this process.

What the Edge does for every inference request, whatever ``tracing:`` says:
parse the client's ``traceparent`` (or make a trace id), make the server
span's id and one attempt's, write the attempt's and the answer's
``traceparent`` and the ``x-iop-route`` header, end the trace. Measured
for a client that sends a ``traceparent`` and one that does not, with no
exporter (``tracing.otlp_endpoint`` unset) and with the export queue
(``add`` only: the export itself runs in its worker thread).

Each figure is microseconds of CPU per request (``time.process_time``
over ``--requests`` requests, best of ``--rounds``), printed next to a
reference: an empty ``dict`` lookup loop of the same count, so a figure
can be read against the machine's speed. Compare with the Edge's CPU per
request of ``bench/inference_gateway.py``.

Run: ``.venv/bin/python bench/trace_cost.py``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from twisted.internet.task import Clock

from twisted_iop.tracing.config import TracingConfig
from twisted_iop.tracing.export import TraceExport
from twisted_iop.tracing.spans import EdgeTracer

CLIENT = [b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"]


def one_request(tracer: EdgeTracer, traceparent: list[bytes] | None) -> None:
    """The trace work of one request that runs once on one provider."""
    trace = tracer.start(traceparent, None, "chat", "llama-3-8b", 1.0)
    trace.traceparent()
    trace.attempt("node-1", "p1", 1.0)
    trace.usage(5, 16)
    trace.route_header()
    trace.finish(2.0, "", 200)


def best_micros(run: Callable[[], None], requests: int, rounds: int) -> float:
    """Best CPU microseconds per call of ``run`` over ``rounds`` rounds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(requests):
            run()
        best = min(best, (time.process_time() - start) / requests * 1e6)
    return best


def main() -> None:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain = EdgeTracer()
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:1/v1/traces", max_queued_traces=10**9)
    export = TraceExport(config, Clock(), lambda _: None)  # type: ignore[arg-type,return-value]
    exporting = EdgeTracer(1.0, export)
    table = {}

    def reference() -> None:
        table.get("x")

    figures = [
        ("reference: one dict lookup", best_micros(reference, args.requests, args.rounds)),
        (
            "no exporter, client traceparent",
            best_micros(lambda: one_request(plain, CLIENT), args.requests, args.rounds),
        ),
        ("no exporter, new trace", best_micros(lambda: one_request(plain, None), args.requests, args.rounds)),
        (
            "export queue, client traceparent",
            best_micros(lambda: one_request(exporting, CLIENT), args.requests, args.rounds),
        ),
    ]
    print(f"trace work per request ({args.requests} requests, best of {args.rounds} rounds, CPU time)")
    for name, micros in figures:
        print(f"  {name:36s} {micros:7.2f} us")
    print(f"  queued in the export test: {export.queued()} traces")


if __name__ == "__main__":
    main()
