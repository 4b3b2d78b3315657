"""Record what the real llama-server answers, into :mod:`twisted_iop.testing.engines.llama_server_recorded`.

Run it again after llama.cpp changes (a new llama-cpp-python in the
Makefile): ``make llama-server``, then::

    .venv/bin/python -m twisted_iop.testing.engines.record_llama_server

It starts the llama-server that ``make llama-server`` built on the tests'
tiny model (:mod:`twisted_iop.testing.engines.tiny_model`), first behind the
load gate (:mod:`twisted_iop.testing.engines.load_gate`) so that it is caught
loading, and records: ``/health`` loading and ready, a chat asked while
it loads, ``/v1/models``, ``/slots``, ``/props`` and ``/metrics`` idle and
with both slots busy and one request deferred, the error answers the Node
maps (a prompt over the context, a request without messages, embeddings
of a server started without ``--embeddings``), and ``/slots`` of a server
started with ``--no-slots``. The model's alias becomes ``{model}`` (the
fixtures fill in their model) and the temporary model path a fixed one;
everything else is as the engine sent it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pprint
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from twisted_iop.testing.engines.llama_engine import LlamaEngine, wait_until
from twisted_iop.testing.engines.llama_server import health, llama_server_path, start_llama_server
from twisted_iop.testing.engines.load_gate import LoadGate
from twisted_iop.testing.engines.tiny_model import tiny_model

#: The alias the recording runs under, replaced by ``{model}`` in what is kept.
ALIAS = "iop-recorded-model"
#: The module the recording is written to.
OUTPUT = Path(__file__).with_name("llama_server_recorded.py")
#: Slots of the recorded server, and requests sent at once to catch one deferred.
PARALLEL = 2
BUSY_REQUESTS = 3

Recorded = tuple[int, str, bytes]


def request(base_url: str, path: str, body: Optional[Any] = None, timeout: float = 10.0) -> Recorded:
    """GET (or POST ``body`` as JSON): status, Content-Type and body."""
    data = json.dumps(body).encode() if body is not None else None
    asked = urllib.request.Request(base_url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(asked, timeout=timeout) as response:
            return int(response.status), str(response.headers.get("Content-Type", "")), response.read()
    except urllib.error.HTTPError as e:
        return int(e.code), str(e.headers.get("Content-Type", "")), e.read()


def _chat(max_tokens: int, content: str = "hi", stream: bool = False) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def _metric(text: bytes, name: str) -> Optional[float]:
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def record(work: Path) -> dict[str, Recorded]:
    """Start the servers in ``work`` and record their answers (see the module's docstring)."""
    model = tiny_model(work)
    gate = LoadGate.build(work)
    shapes: dict[str, Recorded] = {}
    engine = start_llama_server(model, work, ALIAS, parallel=PARALLEL, wait=False, env=gate.env())
    try:
        wait_until(lambda: _answers(engine), 30, "llama-server to answer /health while it loads")
        shapes["health_loading"] = request(engine.base_url, "/health")
        shapes["chat_while_loading"] = request(engine.base_url, "/v1/chat/completions", _chat(4))
        gate.open()
        wait_until(lambda: health(engine.base_url)[0] == 200, 60, "llama-server to load the model")
        for name, path in (
            ("health_ok", "/health"),
            ("models", "/v1/models"),
            ("slots_idle", "/slots"),
            ("props", "/props"),
            ("metrics_idle", "/metrics"),
        ):
            shapes[name] = request(engine.base_url, path)
        shapes["context_length_exceeded"] = request(engine.base_url, "/v1/chat/completions", _chat(4, "word " * 600))
        shapes["invalid_request"] = request(engine.base_url, "/v1/chat/completions", {"model": ALIAS})
        shapes["embeddings_not_supported"] = request(
            engine.base_url, "/v1/embeddings", {"model": ALIAS, "input": ["a"]}
        )
        shapes.update(_busy(engine))
    finally:
        engine.stop()
    no_slots = start_llama_server(model, work, ALIAS, parallel=4, extra_flags=("--no-slots",))
    try:
        shapes["slots_disabled"] = request(no_slots.base_url, "/slots")
        shapes["props_no_slots"] = request(no_slots.base_url, "/props")
    finally:
        no_slots.stop()
    return {name: _normalised(answer, model) for name, answer in shapes.items()}


def _answers(engine: LlamaEngine) -> bool:
    if not engine.running():
        raise AssertionError(f"llama-server exited:\n{engine.log()}")
    try:
        return health(engine.base_url, timeout=1.0)[0] == 503
    except (OSError, ValueError):
        return False


def _busy(engine: LlamaEngine) -> dict[str, Recorded]:
    """/metrics and /slots while both slots run a long request and one more is deferred."""

    def long_request() -> None:
        with contextlib.suppress(OSError):  # cut when the server stops
            request(engine.base_url, "/v1/chat/completions", _chat(400), timeout=120)

    threads = [threading.Thread(target=long_request, daemon=True) for _ in range(BUSY_REQUESTS)]
    for thread in threads:
        thread.start()
    caught: dict[str, Recorded] = {}

    def both_busy() -> bool:
        metrics = request(engine.base_url, "/metrics")
        slots = request(engine.base_url, "/slots")
        busy = sum(1 for slot in json.loads(slots[2]) if slot.get("is_processing"))
        processing = _metric(metrics[2], "llamacpp:requests_processing")
        deferred = _metric(metrics[2], "llamacpp:requests_deferred")
        if (processing, deferred, busy) == (PARALLEL, BUSY_REQUESTS - PARALLEL, PARALLEL):
            caught.update(metrics_busy=metrics, slots_busy=slots)
            return True
        time.sleep(0.01)  # a bounded poll of the engine
        return False

    wait_until(both_busy, 60, "both slots busy and one request deferred")
    return caught


def _normalised(answer: Recorded, model: Path) -> Recorded:
    status, content_type, body = answer
    body = body.replace(str(model).encode(), b"/models/tiny.gguf").replace(ALIAS.encode(), b"{model}")
    return status, content_type, body


def write_module(shapes: dict[str, Recorded], build: str, path: Path = OUTPUT) -> None:
    """Write the recording as a Python module (bytes literals, one per answer)."""
    lines = [
        '"""What the real llama-server answered (written by record_llama_server.py: do not edit).',
        "",
        f"llama.cpp build {build}, the one vendored in llama-cpp-python 0.3.36, built by",
        "``make llama-server``; re-record with ``python -m twisted_iop.testing.engines.record_llama_server``.",
        '"""',
        "",
        "#: llama-server's ``build_info`` (``/props``) when these were recorded.",
        f"BUILD = {build!r}",
        "",
        "#: Answer name -> (status, Content-Type, body).",
        "RECORDED: dict[str, tuple[int, str, bytes]] = " + pprint.pformat(shapes, width=110),
        "",
    ]
    path.write_text("\n".join(lines))
    # In the suite's format, so that `ruff format --check` passes on a fresh recording.
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", str(path)], check=False)


def main(argv: Optional[list[str]] = None) -> int:
    """Record into :data:`OUTPUT` (or ``--out``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUTPUT, help="the module to write")
    args = parser.parse_args(argv)
    llama_server_path()  # a clear error first when it is not built
    with tempfile.TemporaryDirectory(prefix="iop-record-") as work:
        shapes = record(Path(work))
    build = json.loads(shapes["props"][2]).get("build_info", "unknown")
    write_module(shapes, str(build), args.out)
    print(f"recorded {len(shapes)} answers of llama-server {build} into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
