#!/usr/bin/env python
"""Deployments on the Control Plane: what placing, sending, dry-running and reading cost at N edges.

In process, no sockets: a real registry, gateway and
:class:`~twisted_iop.controlplane.deployments.service.DeploymentService`
on a memory store, and ``--edges`` edges (default 10,000) of ``--nodes``
nodes each (default 2) declaring the mock profile
(:class:`~twisted_iop.testing.deployments.SimulatedEdge`: every status ask
and every desired set answered at once, instances ready at once), half
of them ``site=lab``. Timed, wall clock of the process (the edges' own
answers included, which a real fleet pays elsewhere):

* ``apply``: ``PUT`` of a deployment selecting ``site=lab`` (2 replicas a
  edge): a fresh snapshot asked of every selected edge, placement, one
  desired set sent to each;
* ``selector match``: the deployment's edge selector over every edge's labels;
* ``dry run``: a changed parameter, dry-run over every edge (snapshots
  already here, as ``dry_run`` after ``dry_run_fresh``'s asks);
* ``rollup``: ``GET /deployments/{name}``'s figures (every selected edge's state);
* ``reconnect all``: every edge's connection accepted again at once (as
  after a Control Plane restart): each gets its set again; the figure
  beside it is how many instances changed spec hash or node (restarts: must be 0).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock

from twisted_iop.controlplane.deployments.service import DeploymentService
from twisted_iop.controlplane.deployments.spec import parse_spec
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store.memory import MemoryStore
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing.deployments import DEPLOYING_CATALOG, SimulatedEdge

CHAT = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}


def timed(what: str, action: Callable[[], Any]) -> Any:
    """Run ``action``; print how long it took."""
    start = time.perf_counter()
    result = action()
    print(f"{what:<16} {time.perf_counter() - start:8.3f} s")
    return result


def main() -> None:
    """Build the fleet and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2)
    args = parser.parse_args()
    clock = Clock()
    clock.advance(1_700_000_000)
    registry = EdgeRegistry(clock)
    gateway = EdgeGateway(registry, clock)
    service = DeploymentService(registry, gateway, MemoryStore(), registry.event_log.edge_buffer(), clock)
    service.startService()
    peers: dict[str, SimulatedEdge] = {}
    hellos: dict[str, EdgeHello] = {}
    for n in range(args.edges):
        edge_id = f"edge-{n:05d}"
        peers[edge_id] = SimulatedEdge(edge_id, nodes=args.nodes)
        labels = {"site": "lab" if n % 2 == 0 else "other", "region": f"r{n % 10}"}
        hellos[edge_id] = EdgeHello(
            labels=labels, software_version="b", protocol_version="1.0", commands=DEPLOYING_CATALOG
        )
        registry.connect(edge_id, peers[edge_id], hellos[edge_id])
    print(f"edges {args.edges}, nodes per edge {args.nodes}, replicas per edge {args.replicas}, half site=lab")
    spec = parse_spec("chat", {**CHAT, "replicas_per_edge": args.replicas})
    sent = service.desired.sets_sent
    timed("apply", lambda: (service.put(spec, "bench"), clock.advance(0)))  # advance: the store write
    print(f"{'':<16} {service.desired.sets_sent - sent} desired sets sent")
    selector = spec.edge_selector_parsed
    matched = timed("selector match", lambda: sum(1 for r in registry.edges() if selector.matches(r.hello.labels)))
    print(f"{'':<16} {matched} edges matched")
    changed = parse_spec("chat", {**CHAT, "replicas_per_edge": args.replicas, "parameters": {"tokens_per_second": 200}})
    dry = timed("dry run", lambda: service.dry_run(changed))
    print(f"{'':<16} {dry['summary']}")
    counts = timed("rollup", lambda: service.rollup("chat"))
    print(f"{'':<16} {counts}")
    before = {e: [(i.instance_id, i.node_id, i.spec_hash) for i in p.instances] for e, p in peers.items()}
    sent = service.desired.sets_sent

    def reconnect() -> None:
        for edge_id, peer in peers.items():
            registry.connect(edge_id, peer, hellos[edge_id])

    timed("reconnect all", reconnect)
    after = {e: [(i.instance_id, i.node_id, i.spec_hash) for i in p.instances] for e, p in peers.items()}
    moved = sum(len(set(before[e]) ^ set(after[e])) // 2 for e in peers)
    print(f"{'':<16} {service.desired.sets_sent - sent} desired sets sent, {moved} instances changed (restarts)")
    service.stopService()


if __name__ == "__main__":
    main()
