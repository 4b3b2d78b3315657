#!/usr/bin/env python
"""Fleet status fan-out without sockets: the Control Plane's own code alone.

Builds the real registry, gateway, edge wire protocols and HTTP view in
this process, connects N :class:`EdgeWireProtocol` instances to
``StringTransport``s (no kernel, no reactor), enrolls them with real hello
frames, then runs ``GET /fleet/status`` rounds through the Klein handler:

* **issue**: the handler runs until every status request is written (the
  synchronous fan-out loop in ``EdgeGateway.fleet_status``);
* **answers**: every edge's answer frame is fed to its protocol
  (``dataReceived`` -> parse -> resolve Deferreds -> ``record_status``),
  except the last one;
* **render**: the last answer, which completes the round and renders the
  JSON (totals over every row, the page of items, ``json.dumps``).

CPU time of each phase is divided by N. The same rounds run under a few
garbage-collector settings (default thresholds; ``gc.set_threshold`` raised;
collector disabled) to show how much of a round is the collector. Because
there is no I/O, the figures do not depend on the kernel or on other load on
the machine as much as bench/fleet_fanout.py does; what they miss is the
reactor and socket cost (one read and one write per edge per round).

Run: ``.venv/bin/python bench/gateway_inprocess.py --edges 10000``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fleet_fanout import edge_snapshot, request_id_field
from twisted.internet.base import DelayedCall
from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.testing import StringTransport
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


class ListClock:
    """A clock whose timers cost what the reactor's do: a DelayedCall each.

    ``task.Clock`` keeps its calls sorted (O(n) per call), which is not what
    the real reactor does; this one appends, like ``ReactorBase.callLater``,
    and never fires anything (no round here reaches a timeout).
    """

    def __init__(self) -> None:
        self.calls: list[DelayedCall] = []

    def seconds(self) -> float:
        return time.time()

    def callLater(self, delay: float, f: Callable[..., Any], *args: Any, **kw: Any) -> DelayedCall:
        call = DelayedCall(self.seconds() + delay, f, args, kw, lambda c: None, lambda c: None, seconds=self.seconds)
        self.calls.append(call)
        return call

    def run_due(self) -> None:
        """Run the calls that are due now (the fan-out's next slices)."""
        while True:
            now = self.seconds()
            due = [c for c in self.calls if not c.cancelled and not c.called and c.getTime() <= now]
            if not due:
                return
            for call in due:
                call.called = 1
                call.func(*call.args, **call.kw)

    def drop_cancelled(self) -> None:
        self.calls = [c for c in self.calls if not c.cancelled and not c.called]


def decode_request_ids(data: bytes) -> list[int]:
    """Request ids of the envelopes written to one transport."""
    ids = []
    while len(data) >= 4:
        length = int.from_bytes(data[:4], "big")
        envelope = pb.Envelope()
        envelope.ParseFromString(data[4 : 4 + length])
        if envelope.WhichOneof("body") == "edge_status_request":
            ids.append(envelope.request_id)
        data = data[4 + length :]
    return ids


def transport_of(proto: EdgeWireProtocol) -> StringTransport:
    """The in-memory transport a protocol of the rig writes to."""
    return cast(StringTransport, proto.transport)


class Rig:
    """A Control Plane's registry, gateway, HTTP view and N edge protocols."""

    def __init__(self, n: int) -> None:
        self.list_clock = ListClock()
        clock = cast(IReactorTime, self.list_clock)
        self.registry = EdgeRegistry(clock)
        # Max age 0: every round of the benchmark asks every edge again.
        self.gateway = EdgeGateway(self.registry, clock, 5.0, fleet_max_age_seconds=0.0)
        self.http = ControlPlaneHttp(self.registry, self.gateway, clock, ListenerReadiness())
        # Every edge says hello at once here: no hello rate limit.
        self.factory = EdgeWireFactory(self.registry, clock, PeerSettings())
        self.protocols: list[EdgeWireProtocol] = []
        self.tails: list[bytes] = []
        for i in range(n):
            edge_id = f"bench-edge-{i:05d}"
            proto = self.factory.buildProtocol(None)
            proto.makeConnection(StringTransport())
            hello = pb.EdgeHelloRequest(
                edge_id=edge_id,
                protocol_major=PROTOCOL_MAJOR,
                protocol_minor=PROTOCOL_MINOR,
                software_version="bench-edge",
                labels={"site": "bench"},
                commands=[pb.CommandSpec(name="edge.diagnostics")],
            )
            proto.dataReceived(frame(make_envelope("edge_hello_request", hello, 1)))
            if proto.token is None:
                # Hello admission works in slices: the rest of this burst waits for the next turn.
                self.list_clock.run_due()
            assert proto.token is not None, "hello was not accepted"
            transport_of(proto).clear()
            self.protocols.append(proto)
            self.tails.append(make_envelope("edge_status_response", edge_snapshot(edge_id)).SerializeToString())
        self.list_clock.drop_cancelled()

    def round(self, limit: int) -> dict[str, float]:
        """One fleet status round; CPU seconds of each phase."""
        request = DummyRequest([b"fleet", b"status"])
        request.args = {b"limit": [str(limit).encode()]}
        t0 = time.process_time()
        d = ensureDeferred(self.http.fleet_status(cast(IRequest, request)))
        self.list_clock.run_due()
        t1 = time.process_time()
        answers: list[bytes] = []
        for proto in self.protocols:
            transport = transport_of(proto)
            ids = decode_request_ids(transport.value())
            transport.clear()
            assert len(ids) == 1, ids
            body = request_id_field(ids[0]) + self.tails[len(answers)]
            answers.append(len(body).to_bytes(4, "big") + body)
        t2 = time.process_time()
        for proto, data in zip(self.protocols[:-1], answers[:-1], strict=True):
            proto.dataReceived(data)
        t3 = time.process_time()
        self.protocols[-1].dataReceived(answers[-1])
        t4 = time.process_time()
        result: list[bytes] = []
        d.addCallback(result.append)
        assert result and b'"total":' in result[0], "the round did not complete"
        self.list_clock.drop_cancelled()
        return {"issue": t1 - t0, "answers": t3 - t2, "render": t4 - t3, "total": (t1 - t0) + (t4 - t2)}


def main() -> None:
    """Run rounds under each collector setting and print per-edge costs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=int, default=1000, help="page size of GET /fleet/status (default 1000)")
    args = parser.parse_args()

    default_threshold = gc.get_threshold()
    started = time.process_time()
    rig = Rig(args.edges)
    print(
        f"enrolled {args.edges} edge protocols in {time.process_time() - started:.2f} s CPU; "
        f"{len(gc.get_objects())} objects tracked by the collector",
        flush=True,
    )
    full = {"n": 0, "seconds": 0.0, "t": 0.0}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            full["t"] = time.perf_counter()
        else:
            full["n"] += 1
            full["seconds"] += time.perf_counter() - full["t"]

    gc.callbacks.append(on_gc)
    settings = [
        ("gc default " + ",".join(map(str, default_threshold)), lambda: gc.set_threshold(*default_threshold)),
        ("gc threshold 50000,20,100", lambda: gc.set_threshold(50000, 20, 100)),
        ("gc disabled", gc.disable),
    ]
    print(
        f"\n== gateway_inprocess: GET /fleet/status?limit={args.limit}, {args.edges} edges, "
        f"CPU per edge per round (median of {args.rounds})"
    )
    print(f"{'collector':<28} {'issue':>8} {'answers':>8} {'render':>8} {'total':>8} {'round':>9} {'full GCs':>9}")
    for name, apply in settings:
        gc.enable()
        apply()
        rig.round(args.limit)  # warm-up
        full.update(n=0, seconds=0.0)
        rounds = [rig.round(args.limit) for _ in range(args.rounds)]
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        us = {k: v / args.edges * 1e6 for k, v in med.items()}
        print(
            f"{name:<28} {us['issue']:>6.1f}us {us['answers']:>6.1f}us {us['render']:>6.1f}us {us['total']:>6.1f}us "
            f"{med['total'] * 1000:>7.0f}ms {full['n'] / args.rounds:>5.1f} ({full['seconds'] / args.rounds * 1000:.0f} ms)",
            flush=True,
        )
    gc.enable()
    gc.set_threshold(*default_threshold)


if __name__ == "__main__":
    main()
