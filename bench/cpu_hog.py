"""A CPU hog beside a bench: one busy process per core minus one (at least one).

The storm benches run in two modes, ``quiet`` and ``hog``: the second is
the contended machine a Control Plane restart meets at a busy site. The
hogs are plain busy loops in child processes, started before the storm and
stopped after it; :func:`machine_note` says what else was running, so the
figures are read beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import TracebackType
from typing import Optional

#: The modes a storm bench runs in.
MODES = ("quiet", "hog")


def hog_count() -> int:
    """Busy processes for the hog mode: one per core minus one, at least one."""
    return max(1, (os.cpu_count() or 1) - 1)


class CpuHog:
    """``with CpuHog(n):`` runs ``n`` busy processes for the block (0: none)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuHog:
        for _ in range(self.count):
            # A fresh interpreter, not a fork of the bench's running reactor.
            self._processes.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        return self

    def __exit__(
        self, kind: Optional[type[BaseException]], value: Optional[BaseException], trace: Optional[TracebackType]
    ) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            process.wait(5)
        self._processes.clear()


def machine_note(mode: str) -> str:
    """The mode, the hogs, the cores and the load average: what the figures were measured beside."""
    hogs = hog_count() if mode == "hog" else 0
    one, five, _ = os.getloadavg()
    return (
        f"mode {mode}: {hogs} CPU hog process(es) beside the bench; {os.cpu_count()} cores; "
        f"load average {one:.2f} (1 min) {five:.2f} (5 min), other work on the machine included"
    )
