#!/usr/bin/env python
"""Instructions per ``GET /edges/{id}`` request, counted by callgrind.

The load-independent measure behind the suite's ``GET /edges/{id}``
figure. In one process, without sockets, it builds one of three sites and
drives N requests through one kept-alive connection on a
``StringTransport``:

* ``cp``: the Control Plane's HTTP site as the daemon builds it
  (``ControlPlaneService``: ``GuardedSite``, ``HttpRoot``, the Klein app,
  ``/client``), with 1,000 edges enrolled over the edge wire;
* ``cp-plain``: the same Klein app on a plain Twisted ``Site`` (what the
  site's guards cost);
* ``klein``: ``bench/klein_app.py``'s route on a plain ``Site`` (the
  suite's reference).

Both sites are started (their access log goes to a discarding observer)
and warmed up with one request per edge (as in the suite, whose callers
ask for each edge many times); then the measured requests run inside one
call of ``operator.call``, so callgrind counts only them::

    valgrind --tool=callgrind --collect-atstart=no --toggle-collect=_operator_call \\
        --callgrind-out-file=/tmp/http.cg .venv/bin/python bench/http_instructions.py --app cp
    callgrind_annotate /tmp/http.cg | head -30   # total / --requests; per-function profile

``--callgrind`` does that for each app (about 30 s each) and prints
instructions per request and the ratio to Klein. ``--log-file PATH``
writes the log (each request's access-log line) to a file as ``twistd``
does; by default it is discarded, as the suite's Klein reference, which
starts no logging, effectively does. Without valgrind the
script only checks that every answer was a 200 (quick).
"""

from __future__ import annotations

import argparse
import gc
import operator
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from twisted.internet import reactor
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.logger import globalLogBeginner, textFileLogObserver
from twisted.web.server import Site

EDGES = 1000
APPS = ("cp", "cp-plain", "klein")
#: A request as the suite's treq client sends it on a kept-alive connection.
REQUEST = b"GET /edges/%s HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: bench\r\n\r\n"


def control_plane() -> Any:
    """The Control Plane's service, as ``twistd`` builds it, with EDGES edges enrolled."""
    from twisted_iop.controlplane.config import load_config
    from twisted_iop.controlplane.tap import ControlPlaneService
    from twisted_iop.controlplane.wires.edge_wire import EdgeWireFactory
    from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
    from twisted_iop.wire import control_pb2 as pb
    from twisted_iop.wire.peer import frame, make_envelope
    from twisted_iop.wire.settings import PeerSettings

    service = ControlPlaneService(load_config(None, {}), reactor)
    # An edge factory that never starts (no listener) admits every hello:
    # its loop-lag probe is not running.
    edges = EdgeWireFactory(service.registry, reactor, PeerSettings())
    for i in range(EDGES):
        proto = edges.buildProtocol(None)
        proto.makeConnection(StringTransport())
        hello = pb.EdgeHelloRequest(
            edge_id=f"edge-{i:05d}",
            protocol_major=PROTOCOL_MAJOR,
            protocol_minor=PROTOCOL_MINOR,
            software_version="bench-edge",
            labels={"site": "bench", "region": "r1"},
            commands=[pb.CommandSpec(name="edge.diagnostics")],
        )
        proto.dataReceived(frame(make_envelope("edge_hello_request", hello, 1)))
        assert proto.token is not None, "hello was not accepted"
    return service


def build_site(app: str) -> Any:
    """The site named ``app``."""
    if app == "klein":
        import klein_app

        return Site(klein_app.app.resource())
    service = control_plane()
    if app == "cp":
        return service.http_site
    return Site(service.http.app.resource())


def drive(channel: Any, requests: list[bytes]) -> None:
    """Feed each request to the connection (answered before the next)."""
    received = channel.dataReceived
    for request in requests:
        received(request)


def run(app: str, count: int, log_file: str = "") -> None:
    """Build ``app``, warm it up, drive ``count`` requests, check the answers."""
    # As twistd does: every log event, the access log's too, as a text line in a file.
    observer = textFileLogObserver(open(log_file, "a")) if log_file else lambda event: None  # noqa: SIM115
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)
    site = build_site(app)
    site.doStart()  # as a listening port does: the access log opens
    channel = site.buildProtocol(IPv4Address("TCP", "127.0.0.1", 40000))
    transport = StringTransport(IPv4Address("TCP", "127.0.0.1", 8080), IPv4Address("TCP", "127.0.0.1", 40000))
    channel.makeConnection(transport)
    requests = [REQUEST % b"edge-%05d" % (i % EDGES) for i in range(EDGES + count)]
    drive(channel, requests[:EDGES])
    gc.collect()
    gc.freeze()
    operator.call(drive, channel, requests[EDGES:])  # type: ignore[attr-defined]
    answers = transport.value().split(b"HTTP/1.1 ")[1:]
    ok = sum(answer.startswith(b"200 ") for answer in answers)
    if ok != EDGES + count:
        raise SystemExit(f"{app}: {ok} of {EDGES + count} answers were 200")
    print(f"{app}: {count} requests answered 200")


def count_with_callgrind(apps: list[str], count: int, log_file: str = "") -> None:
    """Run each app under callgrind and print instructions per request."""
    per_request: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for app in apps:
            out = os.path.join(tmp, f"{app}.cg")
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--collect-atstart=no",
                    "--toggle-collect=_operator_call",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    __file__,
                    "--app",
                    app,
                    "--requests",
                    str(count),
                    *(["--log-file", log_file] if log_file else []),
                ],
                check=True,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONHASHSEED": "0"},
            )
            totals = re.search(r"^totals:\s*(\d+)", Path(out).read_text(), re.MULTILINE)
            assert totals is not None, f"no totals in {out}"
            per_request[app] = int(totals.group(1)) / count
    for app, instructions in per_request.items():
        ratio = f"  ({per_request['klein'] / instructions:.3f}x Klein)" if "klein" in per_request else ""
        print(f"{app:9s} {instructions / 1000:8.1f}k instructions per request{ratio}")


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", choices=APPS, default="cp")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument(
        "--callgrind", action="store_true", help="count each app (or --apps) under valgrind and print the figures"
    )
    parser.add_argument("--apps", default=",".join(APPS), help="with --callgrind: the apps, comma-separated")
    parser.add_argument(
        "--log-file", default="", help="write log events (the access log's too) to this file, as twistd does"
    )
    args = parser.parse_args()
    if args.callgrind:
        count_with_callgrind(args.apps.split(","), args.requests, args.log_file)
    else:
        run(args.app, args.requests, args.log_file)


if __name__ == "__main__":
    main()
