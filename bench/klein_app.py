#!/usr/bin/env python
"""The reference for ``GET /edges/{id}``: a minimal Klein app.

One route answering a JSON body of the same shape and size as the Control
Plane's edge detail, from a dict kept in memory. Run as a script, it
prints ``klein http_port=N`` once listening (loopback only);
``bench/http_instructions.py`` imports its ``app``.
"""

from __future__ import annotations

import json

from klein import Klein
from twisted.web.server import Site

app = Klein()
EDGES = {
    f"edge-{i:05d}": {
        "edge_id": f"edge-{i:05d}",
        "connected": True,
        "labels": {"site": "bench", "region": "r1"},
        "software_version": "bench-edge",
        "protocol_version": "1.0",
        "connected_at": "2026-11-29T10:00:00.000Z",
        "last_seen": "2026-11-29T10:00:01.000Z",
        "disconnected_at": None,
        "enrollments": 1,
        "commands": ["edge.diagnostics"],
        "status": {"available": True, "stale": False, "received_at": "2026-11-29T10:00:01.000Z"},
        "events": {"capacity": 1000, "kept": 1, "dropped": 0, "last_sequence": 1},
        "operations": {"capacity": 1000, "kept": 0, "dropped": 0},
    }
    for i in range(1000)
}


@app.route("/edges/<edge_id>", methods=["GET"])
def edge(request, edge_id):  # type: ignore[no-untyped-def]
    """The edge's JSON, or 404."""
    request.setHeader(b"Content-Type", b"application/json")
    found = EDGES.get(edge_id)
    if found is None:
        request.setResponseCode(404)
        return b'{"error": {"code": "unknown_edge"}}'
    return json.dumps(found).encode()


if __name__ == "__main__":
    from twisted.internet import reactor

    port = reactor.listenTCP(0, Site(app.resource()), interface="127.0.0.1")
    print(f"klein http_port={port.getHost().port}", flush=True)
    reactor.run()
