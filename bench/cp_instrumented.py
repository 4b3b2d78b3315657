#!/usr/bin/env python
"""Run ``twistd`` with a measuring window switched by signals.

    cp_instrumented.py OUT_PREFIX -n --pidfile= iop-control-plane

This is exactly what the ``twistd`` script does (``twisted.scripts.twistd.run``)
plus instruments that the benchmark turns on around the part it measures:

* SIGUSR1 opens the window, SIGUSR2 closes it and writes
  ``OUT_PREFIX.gc.json``: how many collections of each generation ran in
  the window, how long they took and the longest pause (cProfile does not
  show time spent in the garbage collector; it charges it to whichever
  function happened to allocate).
* ``IOP_BENCH_CPROFILE=1``: cProfile runs inside the window; SIGUSR2 writes
  ``OUT_PREFIX`` (pstats format). Windows accumulate.
* ``IOP_BENCH_GC``: what-if experiments on the collector, to test a
  suggested change without editing the Control Plane:
  ``threshold:A,B,C`` calls ``gc.set_threshold(A, B, C)`` before start-up;
  ``freeze`` runs ``gc.collect(); gc.freeze()`` when the window opens (after
  enrollment), so full collections no longer walk the long-lived objects.

bench/fleet_fanout.py drives this with ``--gc-stats``, ``--profile`` and
``--cp-gc``.
"""

from __future__ import annotations

import cProfile
import gc
import json
import os
import signal
import sys
import time
from typing import Any

from twisted.scripts.twistd import run

OUT = sys.argv[1]
sys.argv = ["twistd", *sys.argv[2:]]
PROFILE = os.environ.get("IOP_BENCH_CPROFILE") == "1"
GC_MODE = os.environ.get("IOP_BENCH_GC", "")

profiler = cProfile.Profile() if PROFILE else None
gc_stats: dict[str, Any] = {"collections": [0, 0, 0], "seconds": [0.0, 0.0, 0.0], "max_pause": 0.0, "mode": GC_MODE}
window_open = False
_gc_started = 0.0


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    global _gc_started
    if not window_open:
        return
    if phase == "start":
        _gc_started = time.perf_counter()
        return
    pause = time.perf_counter() - _gc_started
    generation = info["generation"]
    gc_stats["collections"][generation] += 1
    gc_stats["seconds"][generation] += pause
    gc_stats["max_pause"] = max(gc_stats["max_pause"], pause)


def open_window(signum: int, frame: Any) -> None:
    """SIGUSR1: start measuring (and apply ``freeze``)."""
    global window_open
    gc_stats["tracked_objects"] = len(gc.get_objects()) + gc.get_freeze_count()
    if GC_MODE == "freeze":
        gc.collect()
        gc.freeze()
        gc_stats["frozen_objects"] = gc.get_freeze_count()
    window_open = True
    if profiler is not None:
        profiler.enable()


def close_window(signum: int, frame: Any) -> None:
    """SIGUSR2: stop measuring and write what was collected."""
    global window_open
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(OUT)
    window_open = False
    with open(OUT + ".gc.json", "w") as f:
        json.dump(gc_stats, f)


if GC_MODE.startswith("threshold:"):
    gc.set_threshold(*(int(x) for x in GC_MODE.split(":", 1)[1].split(",")))
elif GC_MODE not in ("", "freeze"):
    raise SystemExit(f"IOP_BENCH_GC={GC_MODE!r}: use threshold:A,B,C or freeze")
gc.callbacks.append(_gc_callback)
signal.signal(signal.SIGUSR1, open_window)
signal.signal(signal.SIGUSR2, close_window)
run()
