#!/usr/bin/env python
"""A restart's enrollment storm: N unpaced edges dial at once, against the echo reference.

What a Control Plane restart looks like to the fleet: every edge dials
again at the same moment. The Control Plane runs at its shipped hello
admission settings (``edge_wire.hello_admission``, printed beside the
figures); its refused edges dial again after the hint with the jitter a
real Edge uses. The reference is ``echo_server.py`` (a bare Twisted server
answering each hello with one constant frame) with the same fake edges,
in the same run.

Figures: seconds until every edge is enrolled (Control Plane: until
``GET /edges`` says N) for both, their ratio, the Control Plane's largest
event-loop lag during the storm (``iop_event_loop_lag_max_seconds``, which
resets at each scrape), the longest any one edge waited from its first
dial to its accepted hello, the longest a hello waited in the Control
Plane's admission queue (``iop_edge_hello_queue_wait_max_seconds``), and
the ``retry_later`` answers by reason. Targets: within 2x echo, no hello
waiting in the queue longer than ``max_queue_wait_ms``; the loop's lag is
reported (on a contended CPU it lags because of the machine).

It runs in two modes (``--mode quiet``, ``--mode hog``, default both, each
``--repeat`` times): quiet, and with a CPU hog beside it (one busy process
per core minus one, :mod:`cpu_hog`), the contended machine a restart meets
at a busy site. Each result is printed with the mode and the load average.

    .venv/bin/python bench/enrollment_storm.py --edges 10000
    .venv/bin/python bench/enrollment_storm.py --edges 10000 --mode hog --repeat 2
    .venv/bin/python bench/enrollment_storm.py --edges 10000 --profile /tmp/storm.prof
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fleet_fanout as ff
from cpu_hog import MODES, CpuHog, hog_count, machine_note
from suite import Reference
from twisted.internet import defer, reactor, task
from twisted.python import failure

from twisted_iop.controlplane.config import config_from_text

#: The Control Plane's config: the shipped admission rule, a deep listen
#: queue (as echo's 4096), no access log (the reference writes none).
CONFIG = "http:\n  access_log: false\n"
LISTEN = f"tcp:0:interface={ff.LOOPBACK}:backlog=4096"


async def storm(fleet: ff.FakeFleet, n: int, count: Any, timeout: float) -> dict[str, Any]:
    """Dial ``n`` edges at once; seconds until ``count()`` is ``n``, and each edge's wait."""
    ids = [f"edge-{i:05d}" for i in range(n)]
    waits: list[float] = []
    started = time.perf_counter()

    def accepted(_: object) -> None:
        waits.append(time.perf_counter() - started)

    dialed = [fleet.connect(edge_id).addCallback(accepted) for edge_id in ids]
    results = defer.DeferredList(dialed, consumeErrors=True)
    deadline = time.monotonic() + timeout
    enrolled = 0
    while time.monotonic() < deadline:
        enrolled = await count()
        if enrolled >= n or results.called:
            if enrolled >= n or (await count()) >= n:
                enrolled = n
            break
        await ff.sleep(0.02)
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "enrolled": enrolled,
        "longest_wait": max(waits) if waits else float("nan"),
        "retried": fleet.retried,
        "dial_failures": dict(fleet.dial_failures),
    }


def metric(text: str, name: str) -> float:
    """One sample of a Prometheus text page (``name`` with its labels, if any)."""
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else float("nan")


async def run(n: int, timeout: float, workdir: Path, profile: Optional[Path] = None) -> dict[str, Any]:
    """Echo, then the Control Plane, each enrolling ``n`` fresh edges."""
    ff.raise_open_file_limit(n + 1000)
    echo = Reference("echo_server.py")
    try:
        http = ff.Http(echo.ports["http_port"])
        fleet = ff.FakeFleet(echo.ports["edge_port"])

        async def echo_count() -> int:
            _, body, _ = await http.get("/count")
            return int(body)

        echo_result = await storm(fleet, n, echo_count, timeout)
        await fleet.close()
    finally:
        echo.stop()
    await ff.sleep(1.0)

    cp = ff.ControlPlaneProcess(workdir, LISTEN, config_text=CONFIG, instrument=profile, cprofile=profile is not None)
    ff.CONTROL_PLANES.append(cp)
    try:
        ports = await ff.eventually(lambda: ff._ports_or_fail(cp, {"edge_wire", "http"}), 30, "the ports")
        http = ff.Http(ports["http"])
        await ff.eventually(lambda: ff._ready(http), 30, "GET /readyz")
        await ff.sleep(0.5)
        await http.get("/metrics")  # resets the loop's largest lag
        fleet = ff.FakeFleet(ports["edge_wire"])

        async def cp_count() -> int:
            _, body, _, _ = await http.get_json("/edges?limit=1")
            return int(body["total"])

        if profile is not None:
            cp.signal(signal.SIGUSR1)
        cp_result = await storm(fleet, n, cp_count, timeout)
        if profile is not None:
            cp.signal(signal.SIGUSR2)
            await ff.eventually(lambda: profile.exists(), 30, "the profile written")
        _, page, _ = await http.get("/metrics")
        cp_result["max_lag"] = metric(page.decode(), "iop_event_loop_lag_max_seconds")
        cp_result["queue_wait"] = metric(page.decode(), "iop_edge_hello_queue_wait_max_seconds")
        cp_result["refused"] = {
            reason: metric(page.decode(), f'iop_edge_hello_admission_refused_total{{reason="{reason}"}}')
            for reason in ("queue_full", "queue_wait")
        }
        await fleet.close()
    finally:
        cp.stop()
    return {"echo": echo_result, "cp": cp_result}


def report(n: int, figures: dict[str, Any], note: str) -> bool:
    """Print the figures with the settings and the machine they depend on; True if the targets are met."""
    settings = config_from_text(CONFIG).hello_admission
    echo, cp = figures["echo"], figures["cp"]
    ratio = cp["seconds"] / echo["seconds"]
    print(f"\n== enrollment storm: {n:,} unpaced edges over {ff.LOOPBACK}")
    print(note)
    print(
        f"settings: edge_wire.hello_admission max_pending_hellos={settings.max_pending_hellos} "
        f"slice_ms={settings.slice_ms:g} max_queue_wait_ms={settings.max_queue_wait_ms:g} "
        f"max_loop_lag_ms={settings.max_loop_lag_ms:g} lag_grace_ms={settings.lag_grace_ms:g} "
        f"lagging_slice_ms={settings.lagging_slice_ms:g} "
        f"max_per_second={settings.max_per_second:g}; edge listen backlog 4096"
    )
    for name, result in (("echo", echo), ("control plane", cp)):
        print(
            f"{name:>14}: {result['enrolled']:,}/{n:,} enrolled in {result['seconds']:.2f} s, "
            f"longest wait {result['longest_wait']:.2f} s, retry_later answers {result['retried']:,}"
            + (f", dial failures {result['dial_failures']}" if result["dial_failures"] else "")
        )
    print(f"  ratio {ratio:.2f}x echo (target <= 2x); loop's largest lag {cp['max_lag'] * 1000:.0f} ms (reported)")
    print(
        f"  longest a hello waited in the Control Plane's admission queue: {cp['queue_wait'] * 1000:.0f} ms; "
        "refused by reason: " + ", ".join(f"{reason} {count:.0f}" for reason, count in cp["refused"].items())
    )
    ok = (
        cp["enrolled"] == n
        and echo["enrolled"] == n
        and ratio <= 2.0
        and cp["queue_wait"] * 1000 <= settings.max_queue_wait_ms
    )
    print("  verdict:", "ok" if ok else "MISSED")
    return ok


def main() -> None:
    """Run once at ``--edges`` and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", type=int, default=10000)
    parser.add_argument("--timeout", type=float, default=120.0, help="give up enrolling after this many seconds")
    parser.add_argument(
        "--profile", type=Path, help="cProfile the Control Plane during its storm into this file (slows it)"
    )
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both", help="quiet, with a CPU hog, or both")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each mode")
    args = parser.parse_args()
    outcome: dict[str, Any] = {"ok": True}
    modes = MODES if args.mode == "both" else (args.mode,)

    async def body() -> None:
        for _ in range(args.repeat):
            for mode in modes:
                with CpuHog(hog_count() if mode == "hog" else 0):
                    with tempfile.TemporaryDirectory(prefix="enrollment-storm-") as workdir:
                        figures = await run(args.edges, args.timeout, Path(workdir), args.profile)
                    note = machine_note(mode)
                outcome["ok"] = report(args.edges, figures, note) and outcome["ok"]
                sys.stdout.flush()

    def done(result: object) -> None:
        if isinstance(result, failure.Failure):
            # A run that could not be made (too few file descriptors, a port that would not
            # bind) is said, and the bench fails: a silent exit 0 would read as "nothing to say".
            print(f"the storm could not be run: {result.getTraceback()}", file=sys.stderr)
            outcome["ok"] = False
        if reactor.running:
            reactor.stop()

    task.deferLater(reactor, 0, lambda: defer.ensureDeferred(body())).addBoth(done)
    reactor.run()
    sys.exit(0 if outcome.get("ok") else 1)


if __name__ == "__main__":
    main()
