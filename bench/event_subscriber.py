#!/usr/bin/env python
"""A ``/client`` live-event subscriber in its own process, for bench/suite.py.

    event_subscriber.py ws://127.0.0.1:PORT/client

Subscribes to the whole fleet with the client library
(``ClientWireClient.subscribe``), prints ``ready`` once subscribed, then
answers one line per command read from stdin: ``reset`` (start counting
again; answers ``ok``) and ``report`` (answers one JSON line: events
received, events the server said it dropped, the latency p50/p99 in seconds
and when the last event arrived). Latency is the arrival time minus the
``sent_ns`` attribute the bench edges stamp on each event; both are
``time.perf_counter_ns()`` (CLOCK_MONOTONIC, shared by every process on the
machine).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from twisted.internet import defer, stdio, task
from twisted.protocols.basic import LineReceiver

from twisted_iop.client.wire import ClientWireClient
from twisted_iop.wire import control_pb2 as pb


class Counts:
    """What arrived since the last reset."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.received = 0
        self.lost = 0
        self.last_ns = 0

    def reset(self) -> None:
        """Start counting again."""
        self.latencies = []
        self.received = self.lost = self.last_ns = 0

    def event(self, event: pb.FleetEvent) -> None:
        """Time one bench event."""
        if event.kind != "bench.tick":
            return
        now = time.perf_counter_ns()
        self.received += 1
        self.last_ns = now
        self.latencies.append((now - int(event.attributes["sent_ns"])) / 1e9)

    def events_lost(self, lost: pb.EventsLost) -> None:
        """Count what the server dropped for this subscriber."""
        self.lost += lost.count

    def report(self) -> dict[str, Any]:
        """The counts as JSON."""
        ordered = sorted(self.latencies)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))] if ordered else -1.0

        return {
            "received": self.received,
            "lost": self.lost,
            "p50": at(0.5),
            "p99": at(0.99),
            "last_ns": self.last_ns,
        }


class Commands(LineReceiver):
    """reset / report from stdin."""

    delimiter = b"\n"

    def __init__(self, counts: Counts, done: defer.Deferred[None]) -> None:
        self.counts = counts
        self.done = done

    def lineReceived(self, line: bytes) -> None:
        command = line.strip()
        if command == b"reset":
            self.counts.reset()
            self.sendLine(b"ok")
        elif command == b"report":
            self.sendLine(json.dumps(self.counts.report()).encode())
        elif command == b"quit":
            self.done.callback(None)

    def connectionLost(self, reason: Any = None) -> None:
        if not self.done.called:
            self.done.callback(None)


async def main(_reactor: Any) -> None:
    """Subscribe, say ready, answer commands until stdin closes."""
    counts = Counts()
    client = ClientWireClient(sys.argv[1])
    await client.subscribe(on_event=counts.event, on_lost=counts.events_lost)
    done: defer.Deferred[None] = defer.Deferred()
    commands = Commands(counts, done)
    stdio.StandardIO(commands)
    commands.sendLine(b"ready")
    await done
    await client.close()


if __name__ == "__main__":
    task.react(lambda r: defer.ensureDeferred(main(r)))
