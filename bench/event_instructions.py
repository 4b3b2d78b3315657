#!/usr/bin/env python
"""Instructions per live event, from the edge wire to one ``/client`` subscriber.

Builds, in this process and without sockets, what the Control Plane runs
for a relayed event: the real registry and gateway, the edge wire factory
with ``--edges`` enrolled :class:`EdgeWireProtocol` instances on
``StringTransport``s, and one ``/client`` subscriber of the whole fleet
(a real Autobahn handshake over a ``StringTransport``). Then it feeds
``--events`` ``edge_event`` frames shaped like ``bench/suite.py``'s (kind
``bench.tick``, an edge sequence, a time, one ``sent_ns`` attribute):
``--per-turn`` events per reactor turn, each as one read on the next edge
in turn (the suite's shape), then the turn's write to the subscriber.

Every frame is built before the events are fed, in every run, so a run
that builds them and feeds none (``--feed 0``) holds everything but the
path itself. With ``--callgrind`` the script runs itself twice under
``valgrind --tool=callgrind`` (feeding none, then all) and prints the
difference per event: an instruction count, which does not depend on the
machine's load. Without it, it feeds the events once and prints the CPU
time per event (load-dependent; for a quick look).

``--store sqlite`` gives the registry the SQLite store (the daemon's
default; a file in a temporary directory): every event is also queued,
then written by the store's writer thread in one batch after the feed,
whose instructions count too (callgrind counts every thread).
``--compare-stores`` runs ``--callgrind`` for ``memory`` and ``sqlite``
and prints the ratio: what the store costs per live event.

``.venv/bin/python bench/event_instructions.py --callgrind`` (about two
minutes under valgrind for the default 5,000 events).
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogBeginner

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.settings import StoreSettings
from twisted_iop.controlplane.store.sqlite import SqliteStore
from twisted_iop.controlplane.wires.client_wire import ClientWireFactory, ClientWireSettings
from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory, EdgeWireProtocol
from twisted_iop.testing.wires.wire import ClientConnection
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import frame, make_envelope
from twisted_iop.wire.settings import PeerSettings


class TurnClock(Clock):
    """A test clock whose time is the wall clock's (events carry real times)
    and whose due calls run when a turn ends (:meth:`end_turn`)."""

    def seconds(self) -> float:
        return time.time()

    def end_turn(self) -> None:
        """Run the calls due now (the subscriber's write of this turn)."""
        now = self.seconds()
        while self.calls and self.calls[0].getTime() <= now:
            call = self.calls.pop(0)
            call.called = 1
            call.func(*call.args, **call.kw)


class ThreadCalls:
    """``callFromThread`` for the store's writer: its calls wait in a queue
    until :meth:`run` (the bench has no running reactor)."""

    def __init__(self, clock: TurnClock) -> None:
        self.clock = clock
        self.calls: queue.SimpleQueue[tuple[Any, tuple[Any, ...]]] = queue.SimpleQueue()

    def seconds(self) -> float:
        return self.clock.seconds()

    def callLater(self, delay: float, f: Any, *args: Any, **kw: Any) -> Any:
        return self.clock.callLater(delay, f, *args, **kw)

    def callFromThread(self, f: Any, *args: Any) -> None:
        self.calls.put((f, args))

    def run(self, timeout: float = 60.0) -> None:
        """Run one call from the writer, waiting for it."""
        f, args = self.calls.get(timeout=timeout)
        f(*args)


class EventPath:
    """The registry, ``edges`` enrolled edge connections and one fleet subscriber."""

    def __init__(self, edges: int, store: str = "memory", directory: str = "") -> None:
        self.clock = TurnClock()
        self.registry = EdgeRegistry(self.clock)
        self.threads = ThreadCalls(self.clock)
        self.store: Any = None
        if store == "sqlite":
            settings = StoreSettings(path=os.path.join(directory, "cp.sqlite"))
            self.store = SqliteStore(settings, self.threads)
            self.store.open()
            self.registry.store = self.store
        self.gateway = EdgeGateway(self.registry, self.clock, 5.0, fleet_max_age_seconds=0.0)
        self.edge_factory = EdgeWireFactory(self.registry, self.clock, PeerSettings())
        self.edges: list[EdgeWireProtocol] = []
        for i in range(edges):
            proto = self.edge_factory.buildProtocol(None)
            transport = StringTransport()
            proto.makeConnection(transport)
            hello = pb.EdgeHelloRequest(
                edge_id=f"edge-{i:05d}",
                protocol_major=PROTOCOL_MAJOR,
                protocol_minor=PROTOCOL_MINOR,
                software_version="bench",
                labels={"site": "bench", "region": f"r{i % 8}"},
                commands=[pb.CommandSpec(name="edge.diagnostics")],
            )
            proto.dataReceived(frame(make_envelope("edge_hello_request", hello, 1)))
            for _ in range(100):
                if proto.token is not None:
                    break
                # The hello admission works its queue off in slices of loop turns.
                self.clock.end_turn()
            assert proto.token is not None, "hello was not accepted"
            transport.clear()
            self.edges.append(proto)
        # No Autobahn auto-ping: its timers would run on the global reactor.
        self.client_factory = ClientWireFactory(
            self.registry, ClientWireSettings(auto_ping_interval_seconds=0.0), self.clock
        )
        self.subscriber = ClientConnection(self.client_factory.buildProtocol(None))
        hello_request = pb.ClientHelloRequest(client_name="bench", protocol_major=PROTOCOL_MAJOR)
        self.subscriber.send("client_hello_request", hello_request, 1)
        self.subscriber.send("subscribe_request", pb.SubscribeRequest(), 2)
        self.clock.end_turn()
        self.subscriber.transport.clear()
        self.written = 0

    def event_frames(self, count: int) -> list[bytes]:
        """``count`` ``edge_event`` frames as the suite's edges send them, for
        the edges in turn (each edge numbers its own)."""
        frames = []
        sequences = [0] * len(self.edges)
        for i in range(count):
            edge = i % len(self.edges)
            sequences[edge] += 1
            event = pb.EdgeEvent(
                kind="bench.tick",
                edge_sequence=sequences[edge],
                occurred_at_ms=int(time.time() * 1000),
                attributes={"sent_ns": str(time.perf_counter_ns())},
            )
            frames.append(frame(make_envelope("edge_event", event)))
        return frames

    def feed(self, frames: list[bytes], per_turn: int) -> None:
        """Each frame as one read on the next edge; a turn ends every ``per_turn`` reads."""
        edges = self.edges
        count = len(edges)
        subscriber = self.subscriber.transport
        end_turn = self.clock.end_turn
        for i, data in enumerate(frames):
            edges[i % count].dataReceived(data)
            if (i + 1) % per_turn == 0:
                end_turn()
                self.written += len(subscriber.value())
                subscriber.clear()
        end_turn()
        self.written += len(subscriber.value())
        subscriber.clear()

    def write_store(self) -> None:
        """Hand what the store queued to its writer and wait for the commit."""
        store = self.store
        if store is None:
            return
        store.flush()
        while store.health().pending:
            self.threads.run()
        store.close()
        self.threads.run()


def callgrind_total(args: argparse.Namespace, feed: int, directory: str) -> int:
    """Instructions of one run of this script under callgrind (``feed`` 0 or 1)."""
    out = os.path.join(directory, f"callgrind.{feed}.out")
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--edges",
        str(args.edges),
        "--events",
        str(args.events),
        "--per-turn",
        str(args.per_turn),
        "--feed",
        str(feed),
        "--store",
        args.store,
    ]
    # The same hash seed in both runs: dict and set layouts match.
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    match = re.search(r"^(?:summary|totals): (\d+)", Path(out).read_text(), re.MULTILINE)
    assert match is not None, f"no totals in {out}"
    return int(match.group(1))


def main() -> None:
    """Feed the events once (CPU time per event), or count instructions per event under callgrind."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", type=int, default=100, help="enrolled edges (events go to them in turn)")
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--per-turn", type=int, default=50, help="events (reads) per reactor turn")
    parser.add_argument("--feed", type=int, choices=(0, 1), default=1, help="0: build the frames, feed none")
    parser.add_argument("--callgrind", action="store_true", help="count instructions per event (two valgrind runs)")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory", help="the registry's store")
    parser.add_argument("--compare-stores", action="store_true", help="--callgrind with memory, then sqlite")
    args = parser.parse_args()
    if args.compare_stores:
        counts = {}
        for store in ("memory", "sqlite"):
            args.store = store
            with tempfile.TemporaryDirectory(prefix="iop-event-instructions-") as directory:
                counts[store] = (
                    callgrind_total(args, 1, directory) - callgrind_total(args, 0, directory)
                ) / args.events
        print(
            f"{args.events} events, {args.per_turn} per turn, {args.edges} edges: "
            f"{counts['memory'] / 1000:.1f}k instructions per event with store.backend memory, "
            f"{counts['sqlite'] / 1000:.1f}k with sqlite (ratio {counts['sqlite'] / counts['memory']:.2f}; "
            "the writer thread's work included)"
        )
        return
    if args.callgrind:
        with tempfile.TemporaryDirectory(prefix="iop-event-instructions-") as directory:
            base = callgrind_total(args, 0, directory)
            fed = callgrind_total(args, 1, directory)
        print(
            f"{args.events} events, {args.per_turn} per turn, {args.edges} edges: "
            f"{(fed - base) / args.events / 1000:.1f}k instructions per event "
            f"(runs: {base:,} without the events, {fed:,} with)"
        )
        return
    # As in the daemon, log events go to an observer (here: none kept).
    observe: Callable[[Any], None] = lambda event: None  # noqa: E731
    globalLogBeginner.beginLoggingTo([observe], redirectStandardIO=False)
    directory = tempfile.mkdtemp(prefix="iop-event-store-")
    path = EventPath(args.edges, args.store, directory)
    frames = path.event_frames(args.events)
    if not args.feed:
        path.write_store()
        return
    started = time.process_time()
    path.feed(frames, args.per_turn)
    path.write_store()
    took = time.process_time() - started
    fleet = path.registry.fleet_events
    assert fleet.last_sequence >= args.events, "not every event was recorded"
    print(
        f"{args.events} events, {args.per_turn} per turn, {args.edges} edges: "
        f"{took / args.events * 1e6:.1f} us CPU per event; {path.written / args.events:.0f} bytes written per event"
    )


if __name__ == "__main__":
    main()
