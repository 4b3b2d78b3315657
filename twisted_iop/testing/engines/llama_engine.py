"""llama-cpp-python's OpenAI server as a child process on a loopback port,
and a Control Plane, Edge and Nodes in front of such engines (or of
llama-server, :mod:`twisted_iop.testing.engines.llama_server`) as ``twistd``
processes, for the tests against a real engine and
``bench/engine_throughput.py``.

The engine runs one request at a time (llama-cpp-python has one model
context and no ``--parallel``); :data:`ENGINE_FLAGS` are the flags that make
it behave as an operator should run it behind a Node:
``--interrupt_requests False`` so that a request arriving while another
runs waits for it instead of cutting it off.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, Union

import attrs

from twisted_iop.testing.configs import (
    CONTROL_PLANE_LOOPBACK_ENV,
    FAST_BACKOFF,
    LOOPBACK_ZERO,
    TEST_GRACE,
    gateway_node_yaml,
    write_yaml,
)
from twisted_iop.testing.harness import Daemon, start_daemon

#: The flags every engine started here gets besides model, address and context.
ENGINE_FLAGS: tuple[str, ...] = (
    "--interrupt_requests",
    "False",
    "--n_threads",
    "1",
    "--n_threads_batch",
    "1",
    "--seed",
    "17",
    "--verbose",
    "False",
)
#: How long an engine may take to answer ``GET /v1/models`` after it is started.
START_TIMEOUT_SECONDS = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout: float, message: str, interval: float = 0.1) -> Any:
    """Call ``check`` until it returns a truthy value (blocking, outside the reactor); return that value.

    Raises ``AssertionError`` with ``message`` and the last value after ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}; last value: {last!r}")
        time.sleep(interval)  # a bounded poll of child processes


@attrs.define
class LlamaEngine:
    """A running ``python -m llama_cpp.server`` and where it listens."""

    process: subprocess.Popen[bytes]
    port: int
    model_name: str
    argv: list[str]
    log_path: Path

    @property
    def base_url(self) -> str:
        """Its base URL (without ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def command_line(self) -> str:
        """The command it was started with, for a benchmark's settings."""
        return " ".join(["python", *self.argv[1:]])

    def log(self) -> str:
        """What the engine printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process.poll() is None

    def models(self, timeout: float = 2.0) -> list[str]:
        """The model ids ``GET /v1/models`` lists (raises ``OSError`` when it does not answer)."""
        with urllib.request.urlopen(self.base_url + "/v1/models", timeout=timeout) as response:
            body: Any = json.loads(response.read(65536))
        return [str(m["id"]) for m in body["data"]]

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; return the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return self.process.returncode

    def kill(self) -> int:
        """``kill -9``: the engine crashes, as far as anyone talking to it can tell."""
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait(5)


def llama_server_argv(
    model: Path, model_name: str, port: int, n_ctx: int = 512, extra_flags: tuple[str, ...] = ()
) -> list[str]:
    """The command line of llama-cpp-python's server serving ``model`` as
    ``model_name`` on ``127.0.0.1:port`` (with the suite's engine flags)."""
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        *ENGINE_FLAGS,
        *extra_flags,
    ]


def start_llama_engine(
    model: Path,
    log_dir: Path,
    model_name: str,
    n_ctx: int = 512,
    extra_flags: tuple[str, ...] = (),
    timeout: float = START_TIMEOUT_SECONDS,
) -> LlamaEngine:
    """Start the engine serving ``model`` as ``model_name`` on a free loopback port.

    Waits (bounded by ``timeout``) until ``GET /v1/models`` answers; on a
    timeout or an early exit the engine is stopped and ``AssertionError``
    carries its log.
    """
    port = free_port()
    argv = llama_server_argv(model, model_name, port, n_ctx, extra_flags)
    log_path = log_dir / f"llama-engine-{port}.log"
    with open(log_path, "wb") as handle:
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    engine = LlamaEngine(process, port, model_name, argv, log_path)

    def serving() -> bool:
        if not engine.running():
            raise AssertionError(f"llama engine exited with {process.returncode}:\n{engine.log()}")
        try:
            return model_name in engine.models(timeout=1.0)
        except (OSError, ValueError, KeyError):
            return False

    try:
        wait_until(serving, timeout, "the llama engine to list its model")
    except AssertionError as e:
        engine.stop()
        raise AssertionError(f"{e}\n{engine.log()}") from None
    return engine


# -- an Edge and Nodes in front of engines, as processes ---------------------------

#: The API key the fleet's Edge accepts.
API_KEY = "k-test"
#: How patiently the fleet's Nodes probe their engines: a probe queues behind
#: every generation llama-cpp-python has accepted, so a busy engine keeps a
#: probe waiting longer than this.
FLEET_PROBES = {"interval_seconds": 0.5, "timeout_seconds": 1.0}
#: Every daemon listener of the fleet on a free loopback port.
_FLEET_ENV = {
    "IOP_EDGE_METRICS_LISTEN": LOOPBACK_ZERO,
    "IOP_NODE_METRICS_LISTEN": LOOPBACK_ZERO,
    "IOP_EDGE_INFERENCE_LISTEN": LOOPBACK_ZERO,
    **CONTROL_PLANE_LOOPBACK_ENV,
}


@attrs.define
class EngineFleet:
    """A Control Plane, an Edge and one Node per engine, as ``twistd`` processes.

    Provider ``p<i>`` on ``node-<i>`` is engine ``i`` (from 1), all serving
    one model.
    """

    cp_http: str
    gateway: str
    edge_metrics: str
    daemons: list[Daemon]
    engines: dict[str, LlamaEngine]

    def client(self, timeout: float = 60.0) -> Any:
        """An ``openai.OpenAI`` client of the Edge (no retries of its own)."""
        import openai  # a test extra

        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=API_KEY, max_retries=0, timeout=timeout)

    def providers(self) -> dict[str, Any]:
        """The Control Plane's status view of the Edge: each connected Node's first provider by node id."""
        body = _get_json(self.cp_http + "/edges/edge-a/status")
        return {n["node_id"]: n["providers"][0] for n in body.get("nodes", []) if n.get("connected")}

    def metrics_text(self) -> str:
        """The Edge's ``GET /metrics``."""
        with urllib.request.urlopen(self.edge_metrics, timeout=5) as response:
            return str(response.read(4 * 1024 * 1024).decode())

    def metric_sum(self, name: str, **labels: str) -> float:
        """The sum of the Edge's samples ``name`` whose labels include ``labels`` (0 when none)."""
        from prometheus_client.parser import text_string_to_metric_families  # a test extra

        total = 0.0
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def stop(self) -> None:
        """Stop the daemons (Nodes first); the engines are their owners' to stop."""
        for daemon in reversed(self.daemons):
            daemon.stop()


def _get_json(url: str) -> Any:
    """GET ``url`` and parse its JSON body (``{}`` on an HTTP error status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read(4 * 1024 * 1024))
    except urllib.error.HTTPError:
        return {}


def _ports(daemon: Daemon, labels: set[str], timeout: float = 30.0) -> dict[str, int]:
    """Wait (bounded, blocking) until ``daemon`` has logged a bound port for every label."""

    def bound() -> Optional[dict[str, int]]:
        if not daemon.running():
            raise AssertionError(f"daemon exited with {daemon.process.returncode}:\n{daemon.log()}")
        ports = daemon.ports()
        return ports if labels <= set(ports) else None

    result: dict[str, int] = wait_until(bound, timeout, f"ports {sorted(labels)}", interval=0.05)
    return result


def engine_fleet_yaml(
    cp_address: str,
    models: list[str],
    capacity: Union[int, str],
    kind: str,
    count: int,
    inference: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """edge.yaml for ``count`` Nodes with one provider each of ``kind`` and ``capacity`` (a number or
    ``"auto"``); ``inference`` is more of its ``inference`` section."""
    return {
        "control_plane": {"address": cp_address, "edge_id": "edge-a", "backoff": FAST_BACKOFF},
        "node_server": {"listen": LOOPBACK_ZERO, "probe_timeout_seconds": 2},
        "inference": {"listen": LOOPBACK_ZERO, "api_keys": [API_KEY], **(inference or {})},
        "nodes": [
            {
                "node_id": f"node-{i}",
                "providers": [{"provider_id": f"p{i}", "kind": kind, "models": models, "capacity": capacity}],
            }
            for i in range(1, count + 1)
        ],
        "shutdown": TEST_GRACE,
    }


def start_engine_fleet(
    engines: list[LlamaEngine],
    log_dir: Path,
    capacity: Union[int, str],
    kind: str = "llamacpp",
    timeout: float = 60.0,
    probes: Optional[dict[str, float]] = FLEET_PROBES,
    inference: Optional[dict[str, Any]] = None,
    healthy: bool = True,
) -> EngineFleet:
    """Start a Control Plane, an Edge and a Node per engine; wait until every provider is healthy
    (with ``healthy`` false: until every Node is connected, whatever its engine says).

    ``probes`` is the Nodes' ``probes`` section (``None``: node.yaml's
    defaults); ``inference`` is more of the Edge's ``inference`` section.

    Blocking, bounded by ``timeout``; on failure every daemon started is
    stopped and ``AssertionError`` says what was missing.
    """
    models = sorted({engine.model_name for engine in engines})
    daemons: list[Daemon] = []
    try:
        cp = start_daemon(["iop-control-plane"], log_dir, env=_FLEET_ENV, name="cp")
        daemons.append(cp)
        cp_ports = _ports(cp, {"http", "edge_wire"})
        edge_config = engine_fleet_yaml(
            f"127.0.0.1:{cp_ports['edge_wire']}", models, capacity, kind, len(engines), inference
        )
        edge = start_daemon(
            ["iop-edge", "--config", write_yaml(log_dir / "edge.yaml", edge_config)],
            log_dir,
            env=_FLEET_ENV,
            name="edge",
        )
        daemons.append(edge)
        edge_ports = _ports(edge, {"node_server", "inference", "metrics"})
        by_provider: dict[str, LlamaEngine] = {}
        for i, engine in enumerate(engines, start=1):
            provider = {"provider_id": f"p{i}", "kind": kind, "models": models, "base_url": engine.base_url}
            config = gateway_node_yaml(
                f"node-{i}",
                edge_ports["node_server"],
                provider,
                keepalive={"interval_seconds": 1, "deadline_seconds": 3},
            )
            if probes is not None:
                config["probes"] = dict(probes)
            path = write_yaml(log_dir / f"node-{i}.yaml", config)
            daemons.append(start_daemon(["iop-node", "--config", path], log_dir, env=_FLEET_ENV, name=f"node-{i}"))
            by_provider[f"p{i}"] = engine
        fleet = EngineFleet(
            f"http://127.0.0.1:{cp_ports['http']}",
            f"http://127.0.0.1:{edge_ports['inference']}",
            f"http://127.0.0.1:{edge_ports['metrics']}/metrics",
            daemons,
            by_provider,
        )
        wanted = {f"node-{i}" for i in range(1, len(engines) + 1)}

        def all_healthy() -> bool:
            providers = fleet.providers()
            if set(providers) != wanted:
                return False
            return not healthy or all(p.get("health") == "healthy" for p in providers.values())

        wait_until(all_healthy, timeout, "every provider connected (and healthy) in the Control Plane's view")
        return fleet
    except BaseException:
        for daemon in reversed(daemons):
            daemon.stop()
        raise
