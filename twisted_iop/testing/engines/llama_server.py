"""llama.cpp's own C++ server (``llama-server``) as a child process on a loopback port, for the tests.

The binary is the one ``make llama-server`` (and so ``make test``) builds once per machine from
the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist:
``$IOP_LLAMA_SERVER``, or :data:`DEFAULT_LLAMA_SERVER`. Unlike
llama-cpp-python's server it binds before it loads the model (``/health``
answers 503 "Loading model" meanwhile), runs ``--parallel`` requests at
once, and sends a usage chunk in its streams when asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from twisted_iop.testing.engines.llama_engine import START_TIMEOUT_SECONDS, LlamaEngine, free_port, wait_until

#: Where ``make llama-server`` installs llama-server unless ``IOP_LLAMA_SERVER`` says otherwise.
DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "twisted-iop" / "llama-server-0.3.36" / "llama-server"
#: Flags every llama-server started here gets besides model, alias, address and slots.
SERVER_FLAGS: tuple[str, ...] = ("--threads", "1", "--threads-batch", "1", "--seed", "17", "--metrics")


def llama_server_path() -> Path:
    """The llama-server binary: ``$IOP_LLAMA_SERVER`` or :data:`DEFAULT_LLAMA_SERVER`."""
    path = Path(os.environ.get("IOP_LLAMA_SERVER") or DEFAULT_LLAMA_SERVER)
    if not path.is_file():
        raise FileNotFoundError(f"llama-server {path} is missing: `make llama-server` builds it")
    return path


def llama_cpp_server_argv(
    model: Path, model_name: str, port: int, parallel: int = 1, n_ctx: int = 512, extra_flags: tuple[str, ...] = ()
) -> list[str]:
    """llama-server serving ``model`` as ``model_name`` on ``127.0.0.1:port`` with ``parallel`` slots."""
    return [
        str(llama_server_path()),
        "--model",
        str(model),
        "--alias",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(n_ctx * parallel),
        "--parallel",
        str(parallel),
        *SERVER_FLAGS,
        *extra_flags,
    ]


def health(base_url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """``GET /health``: status and parsed body (raises ``OSError`` when it does not answer)."""
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout) as response:
            return int(response.status), json.loads(response.read(65536))
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read(65536) or b"null")


def start_llama_server(
    model: Path,
    log_dir: Path,
    model_name: str,
    parallel: int = 1,
    n_ctx: int = 512,
    extra_flags: tuple[str, ...] = (),
    port: int = 0,
    wait: bool = True,
    timeout: float = START_TIMEOUT_SECONDS,
    env: Optional[Mapping[str, str]] = None,
) -> LlamaEngine:
    """Start llama-server on ``port`` (a free one if 0); unless ``wait`` is false, until ``/health`` is 200.

    ``env`` is added to this process's environment for the server. On a
    timeout or an early exit the server is stopped and ``AssertionError``
    carries its log.
    """
    port = port or free_port()
    argv = llama_cpp_server_argv(model, model_name, port, parallel, n_ctx, extra_flags)
    log_path = log_dir / f"llama-server-{port}.log"
    with open(log_path, "ab") as handle:
        process = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **env} if env else None,
        )
    engine = LlamaEngine(process, port, model_name, argv, log_path)
    if not wait:
        return engine

    def healthy() -> bool:
        if not engine.running():
            raise AssertionError(f"llama-server exited with {process.returncode}:\n{engine.log()}")
        try:
            return health(engine.base_url, timeout=1.0)[0] == 200
        except (OSError, ValueError):
            return False

    try:
        wait_until(healthy, timeout, "llama-server to answer /health 200")
    except AssertionError as e:
        engine.stop()
        raise AssertionError(f"{e}\n{engine.log()}") from None
    return engine
