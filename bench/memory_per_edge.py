#!/usr/bin/env python
"""Bytes the Control Plane keeps per connected edge, without sockets.

Builds the real registry, gateway and edge wire factory in this process,
connects N :class:`EdgeWireProtocol` instances to ``StringTransport``s,
enrolls them with the hello of ``bench/suite.py``'s edges (two labels, one
command), runs one fleet round through ``GET /fleet/status`` whose answers
are the suite's 4-node x 2-provider snapshot, and reports, per edge:

* ``tracemalloc`` bytes after enrollment and after the round (the last
  snapshot and the last round's row kept), without the in-memory
  transports (a real connection's socket and transport are the kernel's
  and Twisted's, about what the echo server's edges cost);
* the largest allocation sites per edge (``--top``);
* with ``--rss``, the process's RSS growth per edge instead (allocator
  slack included; tracemalloc would add its own).

Deterministic (no timing): run it before and after a change to the kept
records. ``.venv/bin/python bench/memory_per_edge.py --edges 10000``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fanout import NODES_4X2, edge_snapshot, request_id_field
from gateway_inprocess import ListClock, decode_request_ids, transport_of
from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogBeginner
from twisted.web.iweb import IRequest
from twisted.web.test.requesthelper import DummyRequest

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.routes import ControlPlaneHttp, ListenerReadiness
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory, EdgeWireProtocol
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame, make_envelope
from twisted_iop.wire.settings import PeerSettings


def rss_bytes() -> int:
    """This process's VmRSS."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    """Enroll, run one round, print bytes per edge."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10000)
    parser.add_argument("--top", type=int, default=12, help="allocation sites to list")
    parser.add_argument("--depth", type=int, default=1, help="frames per allocation site")
    parser.add_argument("--rss", action="store_true", help="RSS growth only, without tracemalloc (which adds its own)")
    args = parser.parse_args()
    n = args.edges
    # As in the daemon, log events go to an observer (here: none kept), not
    # to the buffer kept before logging begins.
    globalLogBeginner.beginLoggingTo([lambda event: None], redirectStandardIO=False)

    list_clock = ListClock()
    clock = cast(IReactorTime, list_clock)
    registry = EdgeRegistry(clock)
    gateway = EdgeGateway(registry, clock, 5.0, fleet_max_age_seconds=0.0)
    http = ControlPlaneHttp(registry, gateway, clock, ListenerReadiness())
    factory = EdgeWireFactory(registry, clock, PeerSettings())
    # The transports first: they stand in for Twisted's, and are not counted.
    transports = [StringTransport() for _ in range(n)]
    tails = [make_envelope("edge_status_response", edge_snapshot(f"edge-{i:05d}", NODES_4X2)) for i in range(n)]
    answers = [t.SerializeToString() for t in tails]
    del tails
    gc.collect()
    rss_before = rss_bytes()
    if not args.rss:
        tracemalloc.start(args.depth)
    base = tracemalloc.take_snapshot() if not args.rss else None
    protocols: list[EdgeWireProtocol] = []
    for i, transport in enumerate(transports):
        edge_id = f"edge-{i:05d}"
        proto = factory.buildProtocol(None)
        proto.makeConnection(transport)
        hello = pb.EdgeHelloRequest(
            edge_id=edge_id,
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version="bench",
            labels={"site": "bench", "region": f"r{i % 8}"},
            commands=[pb.CommandSpec(name="edge.diagnostics")],
        )
        proto.dataReceived(frame(make_envelope("edge_hello_request", hello, 1)))
        assert proto.token is not None, "hello was not accepted"
        transport.clear()
        protocols.append(proto)
    list_clock.drop_cancelled()
    gc.collect()
    enrolled = tracemalloc.take_snapshot() if not args.rss else None
    rss_enrolled = rss_bytes()

    request = DummyRequest([b"fleet", b"status"])
    request.args = {b"limit": [b"1000"]}
    d = ensureDeferred(http.fleet_status(cast(IRequest, request)))
    list_clock.run_due()
    for i, proto in enumerate(protocols):
        transport = transport_of(proto)
        [request_id] = decode_request_ids(transport.value())
        transport.clear()
        body = request_id_field(request_id) + answers[i]
        proto.dataReceived(len(body).to_bytes(4, "big") + body)
    page: list[bytes] = []
    d.addCallback(page.append)
    assert page and b'"total":' in page[0], "the round did not complete"
    del page, d, request
    list_clock.drop_cancelled()
    gc.collect()
    after = tracemalloc.take_snapshot() if not args.rss else None
    rss_after = rss_bytes()
    if base is None or enrolled is None or after is None:
        print(
            f"{n} edges; RSS growth per edge: enrolled {(rss_enrolled - rss_before) / n:.0f}, "
            f"after a round (snapshot kept) {(rss_after - rss_before) / n:.0f}"
        )
        return

    def per_edge(snapshot: tracemalloc.Snapshot) -> float:
        return sum(s.size_diff for s in snapshot.compare_to(base, "filename")) / n

    print(f"{n} edges; tracemalloc bytes per edge (transports not counted):")
    print(f"  enrolled:                       {per_edge(enrolled):8.0f}")
    print(f"  after a round (snapshot kept):  {per_edge(after):8.0f}")
    print("largest sites after the round, bytes per edge:")
    for stat in after.compare_to(base, "traceback" if args.depth > 1 else "lineno")[: args.top]:
        where = " <- ".join(
            f"{f.filename.split('site-packages/')[-1].split('perf-memory-counts/')[-1]}:{f.lineno}"
            for f in reversed(stat.traceback)
        )
        print(f"  {stat.size_diff / n:8.1f}  {where}")


if __name__ == "__main__":
    main()
