"""A model that takes as long to load as a test says: llama-server on a "slow disk".

llama-server binds its port before it loads the model and answers
``/health`` 503 "Loading model" meanwhile; a real model takes minutes to
load, the tests' tiny one milliseconds. To keep the real engine in that
state for as long as a test needs, it is started with a small
``LD_PRELOAD`` library (compiled here with the C compiler that built
llama-server) whose ``fopen`` of a ``.gguf`` file waits until a gate file
exists: the engine is the real one, only its disk is slow.

Use::

    gate = LoadGate.build(tmp_path)           # compiles the library once per directory
    engine = start_llama_server(..., env=gate.env(), wait=False)
    ...                                      # /health answers 503 "Loading model"
    gate.open()                              # the load goes on
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import attrs

#: The library's source: ``fopen``/``fopen64`` of a path ending in ``.gguf`` wait until
#: ``$IOP_LOAD_GATE`` exists (polled every 10 ms), then open as usual.
_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void wait_for_gate(const char *path) {
    const char *gate = getenv("IOP_LOAD_GATE");
    size_t n = path ? strlen(path) : 0;
    if (!gate || n < 5 || strcmp(path + n - 5, ".gguf") != 0) return;
    struct timespec pause = {0, 10 * 1000 * 1000};
    while (access(gate, F_OK) != 0) nanosleep(&pause, NULL);
}

FILE *fopen(const char *path, const char *mode) {
    static FILE *(*real)(const char *, const char *);
    if (!real) real = (FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen");
    wait_for_gate(path);
    return real(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    static FILE *(*real)(const char *, const char *);
    if (!real) real = (FILE *(*)(const char *, const char *))dlsym(RTLD_NEXT, "fopen64");
    wait_for_gate(path);
    return real(path, mode);
}
"""


def compiler() -> str:
    """The C compiler: ``$CC``, else ``cc``; ``FileNotFoundError`` when there is none."""
    name = os.environ.get("CC") or "cc"
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"no C compiler {name!r} to build the load gate (the one that built llama-server)")
    return found


@attrs.frozen
class LoadGate:
    """The compiled library and its gate file (closed until :meth:`open`)."""

    library: Path
    gate: Path

    @classmethod
    def build(cls, directory: Path) -> LoadGate:
        """Compile the library into ``directory`` (once) and name a gate file there, closed."""
        library = directory / "iop-load-gate.so"
        if not library.exists():
            source = directory / "iop-load-gate.c"
            source.write_text(_SOURCE)
            partial = directory / "iop-load-gate.so.partial"
            subprocess.run(
                [compiler(), "-shared", "-fPIC", "-O2", "-o", str(partial), str(source), "-ldl"],
                check=True,
                capture_output=True,
            )
            partial.rename(library)
        gate = directory / "iop-load-gate.open"
        gate.unlink(missing_ok=True)
        return cls(library, gate)

    def env(self) -> dict[str, str]:
        """The environment of an engine whose model waits for the gate."""
        return {"LD_PRELOAD": str(self.library), "IOP_LOAD_GATE": str(self.gate)}

    def open(self) -> None:
        """Let the model load."""
        self.gate.touch()
