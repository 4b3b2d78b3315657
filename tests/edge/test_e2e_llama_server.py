"""End to end against llama.cpp's own C++ server (``llama-server``, built by ``make llama-server``
from the llama.cpp vendored in llama-cpp-python 0.3.36) on the tiny random-weight model: a
Control Plane, an Edge and a Node as ``twistd`` processes in front of it, under the loads that
once broke the gateway: saturation, an embedder beside chats, ``kill -9`` and a restart,
``--no-slots`` with ``capacity: auto``, a slow-loading engine, and exact token counts.

Every test runs until a number of requests have ended and asserts on each outcome; none counts
what fits in a time. Each prints what it measured (``pytest -s`` shows it): the share of 503s,
chats failed, seconds to traffic.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from twisted_iop.testing.engines.llama_engine import EngineFleet, LlamaEngine, start_engine_fleet, wait_until
from twisted_iop.testing.engines.llama_server import health, start_llama_server
from twisted_iop.testing.engines.llama_server_recorded import RECORDED
from twisted_iop.testing.engines.load_gate import LoadGate
from twisted_iop.testing.engines.openai_load import Outcome, ask, embed, load, summary
from twisted_iop.testing.engines.record_llama_server import request
from twisted_iop.testing.engines.tiny_model import tiny_model

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
#: Each slot's context, in tokens (the tiny model is written for it).
N_CTX = 512
#: The engine's slots (``-np``) and what the Edge is told it takes at once.
SLOTS = 2
CAPACITY = 10
#: Requests wait in the Edge's queue up to this long (a generous bound for a busy machine).
INFERENCE = {"queue_timeout_seconds": 120}
#: node.yaml's default probe interval: a returning engine is found by the Node's re-probe, not
#: by a periodic probe that happens to come soon. The engine's load is read every second (5 by
#: default), so that a saturation run of some seconds sees several readings.
PROBES: dict[str, float] = {"interval_seconds": 10, "timeout_seconds": 2, "load_interval_seconds": 1}
#: Tokens per request of the saturation and embedder runs: long enough that the engine holds
#: requests waiting inside it across several load readings.
LONG_MAX_TOKENS = 96


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once for this module."""
    return tiny_model(tmp_path_factory.mktemp("tiny-llama"))


def fleet_of(engine: LlamaEngine, log_dir: Path, capacity: Any, healthy: bool = True) -> EngineFleet:
    """A Control Plane, an Edge and a Node in front of ``engine`` (the engine stopped if that fails)."""
    try:
        return start_engine_fleet(
            [engine], log_dir, capacity=capacity, probes=PROBES, inference=INFERENCE, healthy=healthy
        )
    except BaseException:
        engine.stop()
        raise


def stop_fleet(fleet: EngineFleet) -> None:
    """Stop the daemons, then the engines."""
    fleet.stop()
    for engine in fleet.engines.values():
        engine.stop()


@pytest.fixture(scope="module")
def two_slots(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    """llama-server with 2 slots (``-np 2``) behind one Node, at capacity 10 on the Edge."""
    log_dir = tmp_path_factory.mktemp("two-slots")
    engine = start_llama_server(tiny_llama, log_dir, MODEL, parallel=SLOTS, n_ctx=N_CTX)
    fleet = fleet_of(engine, log_dir, CAPACITY)
    yield fleet
    stop_fleet(fleet)


class ViewWatch:
    """Reads the Control Plane's view of the provider every 0.2 s in a thread, keeping what it saw."""

    def __init__(self, fleet: EngineFleet) -> None:
        self.fleet = fleet
        self.views: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            provider = self.fleet.providers().get("node-1")
            if provider is not None:
                self.views.append(provider)
            self._stop.wait(0.2)  # the watch's pace, not a wait for a condition

    def __enter__(self) -> ViewWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def count(self, key: str) -> int:
        """Views in which the provider's ``key`` was true."""
        return sum(1 for view in self.views if view.get(key))

    def not_healthy(self) -> list[str]:
        """The health and reason of every view that was not healthy."""
        return [f"{v['health']}: {v['health_reason']}" for v in self.views if v.get("health") != "healthy"]

    def max_queued(self) -> int:
        """The most requests the Edge queued for the provider in any view."""
        return max((view["general"]["queued"] for view in self.views), default=0)


def queued_at_edge(fleet: EngineFleet) -> float:
    """Requests waiting in the Edge's admission queues now."""
    return fleet.metric_sum("iop_edge_queued_requests", **{"class": "general"})


def ask_in_threads(fleet: EngineFleet, count: int, max_tokens: int = 8) -> tuple[ThreadPoolExecutor, list[Any]]:
    """``count`` clients sending one chat each at once (every other one streamed); the futures."""
    pool = ThreadPoolExecutor(count)
    futures = [
        pool.submit(ask, fleet.client(timeout=180), MODEL, bool(i % 2), max_tokens, "are you there")
        for i in range(count)
    ]
    return pool, futures


# -- the recorded shapes are this engine's ------------------------------------------------


def _as_recorded(body: bytes) -> bytes:
    return body.replace(MODEL.encode(), b"{model}")


def _metric_names(body: bytes) -> set[str]:
    return {line.split()[0] for line in body.decode().splitlines() if line and not line.startswith("#")}


def test_the_recorded_shapes_are_what_this_llama_server_answers(two_slots: EngineFleet) -> None:
    """The fixtures' llama.cpp answers (twisted_iop/testing/engines/llama_server_recorded.py) are this
    llama-server's: health, idle slots and error bodies byte for byte, the same metrics (no
    KV-cache metric among them), the same members in /props and the models list."""
    base = two_slots.engines["p1"].base_url
    for name, path in (("health_ok", "/health"), ("slots_idle", "/slots")):
        status, _, body = request(base, path)
        assert (status, _as_recorded(body)) == (RECORDED[name][0], RECORDED[name][2]), name
    asked = {
        "embeddings_not_supported": ("/v1/embeddings", {"model": MODEL, "input": ["a"]}),
        "invalid_request": ("/v1/chat/completions", {"model": MODEL}),
    }
    for name, (path, payload) in asked.items():
        status, _, body = request(base, path, payload)
        assert (status, _as_recorded(body)) == (RECORDED[name][0], RECORDED[name][2]), name
    metrics = _metric_names(request(base, "/metrics")[2])
    assert metrics == _metric_names(RECORDED["metrics_idle"][2])
    assert not [name for name in metrics if "kv" in name]
    props = json.loads(request(base, "/props")[2])
    assert set(props) == set(json.loads(RECORDED["props"][2])) and props["total_slots"] == SLOTS
    models = json.loads(request(base, "/v1/models")[2])
    assert set(models["data"][0]) == set(json.loads(RECORDED["models"][2])["data"][0])


# -- saturation: not now is not gone ---------------------------------------------------------


def test_twelve_clients_on_two_slots_at_capacity_10_are_never_refused(two_slots: EngineFleet) -> None:
    """12 clients on an engine with 2 slots that the Edge is told takes 10, until 60 requests have
    ended: the engine saturates (8 waiting inside it) and the rest wait in the Edge's queue; every
    request ends 200 with its whole answer, none is refused with 503."""
    with ViewWatch(two_slots) as watch:
        outcomes = load(two_slots.client, MODEL, clients=12, requests=60, max_tokens=LONG_MAX_TOKENS)
    refused = [o for o in outcomes if o.status == 503]
    failed = [o for o in outcomes if not o.ok]
    print(
        f"\nsaturation: {len(outcomes)} requests of 12 clients on -np {SLOTS} at capacity {CAPACITY}: "
        f"{len(refused)} 503 ({len(refused) / len(outcomes):.0%}), {len(failed)} failed; the provider was "
        f"saturated in {watch.count('saturated')} of {len(watch.views)} views, up to {watch.max_queued()} "
        "queued at the Edge"
    )
    assert not refused, summary(outcomes)
    assert not failed, summary(outcomes)


# -- a client's mistake is the client's --------------------------------------------------------


def test_an_embedder_beside_chats_never_cools_the_engine_down(two_slots: EngineFleet) -> None:
    """One client asks embeddings (this engine has no ``--embeddings``: 501) 20 times a second,
    20 times before the chats start and on while 4 clients chat until 30 chats have ended: every embeddings request is 501
    ``not_supported``, every chat gets its whole answer, and the provider is never cooling down
    nor anything but healthy."""
    stop = threading.Event()
    embeddings: list[Outcome] = []

    def embedder() -> None:
        client = two_slots.client()
        while not stop.is_set():
            embeddings.append(embed(client, MODEL))
            stop.wait(0.05)  # the embedder's pace: 20 requests a second

    thread = threading.Thread(target=embedder, daemon=True)
    with ViewWatch(two_slots) as watch:
        thread.start()
        try:
            # The embedder first, as in a cool-down's window: 20 failures before any chat.
            wait_until(lambda: len(embeddings) >= 20, 30, "20 embeddings requests ended")
            chats = load(two_slots.client, MODEL, clients=4, requests=30, max_tokens=LONG_MAX_TOKENS)
        finally:
            stop.set()
            thread.join(30)
    failed = [o for o in chats if not o.ok]
    print(
        f"\nembedder: {len(embeddings)} embeddings requests (501 each) beside {len(chats)} chats: "
        f"{len(failed)} chats failed; cooling down in {watch.count('cooling_down')} of {len(watch.views)} views"
    )
    assert embeddings and all((o.status, o.code) == (501, "not_supported") for o in embeddings), summary(embeddings)
    assert not failed, summary(chats)
    assert watch.views and watch.count("cooling_down") == 0 and watch.not_healthy() == []


# -- tokens: exact from llama-server's usage --------------------------------------------------


def test_streamed_tokens_through_llama_server_are_counted_exactly(two_slots: EngineFleet) -> None:
    """A stream that asks for its usage chunk and one that does not (the Node asks for it and
    keeps it from that client), and a whole answer: the Edge's iop_tokens_total grows by exactly
    the usage llama-server reported, nothing of it estimated (in /metrics and in the view)."""
    client = two_slots.client()
    before = {d: two_slots.metric_sum("iop_tokens_total", model=MODEL, direction=d) for d in ("prompt", "completion")}
    estimated_before = two_slots.metric_sum("iop_tokens_estimated_total", model=MODEL)
    with_usage = ask(client, MODEL, True, 20, "count the tokens of this prompt", include_usage=True)
    without = ask(client, MODEL, True, 20, "count the tokens of this prompt")
    whole = ask(client, MODEL, False, 7, "and of this one")
    for outcome in (with_usage, without, whole):
        assert outcome.ok, outcome
    assert with_usage.usage is not None and without.usage is None and whole.usage is not None
    assert with_usage.usage["completion"] == 20 and whole.usage["completion"] == 7
    expected = {
        "prompt": 2 * with_usage.usage["prompt"] + whole.usage["prompt"],
        "completion": 2 * with_usage.usage["completion"] + whole.usage["completion"],
    }

    def grown() -> dict[str, float]:
        now = {d: two_slots.metric_sum("iop_tokens_total", model=MODEL, direction=d) for d in expected}
        return {d: now[d] - before[d] for d in expected}

    wait_until(lambda: grown() == expected, timeout=10, message=f"iop_tokens_total to grow by {expected}")
    print(f"\ntokens through llama-server: counted {grown()}, the engine's usage {expected}")
    assert two_slots.metric_sum("iop_tokens_estimated_total", model=MODEL) == estimated_before == 0
    assert two_slots.providers()["node-1"]["tokens"]["estimated"] == {"prompt": 0, "completion": 0}


# -- a returning engine takes traffic at once ------------------------------------------------


def test_requests_sent_while_the_engine_is_down_wait_and_succeed_after_its_restart(
    two_slots: EngineFleet, tiny_llama: Path
) -> None:
    """``kill -9`` of the only engine, then 6 requests: they wait in the Edge's queue (none is
    refused); llama-server is started again on its port, and every one of them gets its whole
    answer, the first soon after the engine's /health passes (the Node re-probes an engine found
    down from 0.5 s, and tells the Edge the moment it answers)."""
    engine = two_slots.engines["p1"]
    killed_at = time.monotonic()
    engine.kill()
    pool, futures = ask_in_threads(two_slots, 6)
    try:
        wait_until(lambda: queued_at_edge(two_slots) == 6, 60, "the 6 requests waiting in the Edge's queue")
        waited = [f for f in futures if f.done()]
        assert waited == [], [f.result() for f in waited]
        back = start_llama_server(
            tiny_llama, engine.log_path.parent, MODEL, parallel=SLOTS, n_ctx=N_CTX, port=engine.port, wait=False
        )
        two_slots.engines["p1"] = back
        healthy_at = wait_until(lambda: _healthy_at(back), 60, "llama-server back and healthy", interval=0.01)
        outcomes = [f.result(timeout=180) for f in futures]
    finally:
        pool.shutdown(wait=True)
    failed = [o for o in outcomes if not o.ok]
    first = min(o.first_content for o in outcomes if o.first_content)
    print(
        f"\nkill -9 and restart: down {healthy_at - killed_at:.2f}s; traffic (the first token of a waiting "
        f"request) {first - healthy_at:.2f}s after /health passed, the last request ended "
        f"{max(o.ended for o in outcomes) - healthy_at:.2f}s after; {len(failed)} of {len(outcomes)} failed; "
        f"{two_slots.metric_sum('iop_inference_retries_total'):.0f} retries at the Edge"
    )
    assert not failed, summary(outcomes)


def _healthy_at(engine: LlamaEngine) -> float:
    """When ``engine``'s /health answered 200 (monotonic), or 0 if it does not yet."""
    try:
        return time.monotonic() if health(engine.base_url, timeout=1.0)[0] == 200 else 0.0
    except (OSError, ValueError):
        return 0.0


# -- the engine's slots when /slots is off ------------------------------------------------------


def test_no_slots_with_capacity_auto_takes_the_parallelism_from_props(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """llama-server ``-np 4 --no-slots`` (so /slots answers 501) behind ``capacity: auto``: the
    provider's capacity becomes 4, from /props ``total_slots``, and 8 clients' requests all end
    with their whole answer."""
    log_dir = tmp_path_factory.mktemp("no-slots")
    engine = start_llama_server(tiny_llama, log_dir, MODEL, parallel=4, n_ctx=N_CTX, extra_flags=("--no-slots",))
    fleet = fleet_of(engine, log_dir, "auto")
    try:
        assert request(engine.base_url, "/slots")[0] == 501
        view = wait_until(
            lambda: (p := fleet.providers().get("node-1")) and p["general"]["capacity"] == 4 and p,
            30,
            "capacity 4 from the engine's reading",
        )
        assert view["engine"]["parallel"] == 4
        outcomes = load(fleet.client, MODEL, clients=8, requests=16, max_tokens=16)
        print(f"\n--no-slots with capacity auto: capacity {view['general']['capacity']}; {summary(outcomes)}")
        assert all(o.ok for o in outcomes), summary(outcomes)
    finally:
        stop_fleet(fleet)


# -- an engine that binds before it loads ------------------------------------------------------


def test_requests_for_a_loading_engine_wait_for_it_and_none_is_sent_to_it(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """llama-server answering /health 503 "Loading model" (its model on a slow disk: the load
    gate): the provider is unhealthy "loading model", 4 requests wait in the Edge's queue and none
    is sent to it (no retry at the Edge, the engine still loading); once the model has loaded every
    one gets its whole answer."""
    log_dir = tmp_path_factory.mktemp("loading")
    gate = LoadGate.build(log_dir)
    engine = start_llama_server(tiny_llama, log_dir, MODEL, parallel=SLOTS, n_ctx=N_CTX, wait=False, env=gate.env())
    wait_until(lambda: _answers(engine) == 503, 30, "llama-server to answer /health 503 while it loads")
    fleet = fleet_of(engine, log_dir, CAPACITY, healthy=False)
    pool = None
    try:
        wait_until(
            lambda: fleet.providers()["node-1"]["health_reason"] == "loading model",
            30,
            "the provider unhealthy: loading model",
        )
        pool, futures = ask_in_threads(fleet, 4)
        wait_until(lambda: queued_at_edge(fleet) == 4, 60, "the 4 requests waiting in the Edge's queue")
        assert [f for f in futures if f.done()] == []
        assert _answers(engine) == 503  # still loading: they waited for it
        assert fleet.metric_sum("iop_inference_retries_total") == 0  # none was sent to it and refused
        opened_at = time.monotonic()
        gate.open()
        outcomes = [f.result(timeout=180) for f in futures]
        first = min(o.first_content for o in outcomes if o.first_content)
        print(
            f"\nloading engine: 4 requests waited while it loaded; the first token {first - opened_at:.2f}s "
            f"after the load went on; {summary(outcomes)}; "
            f"{fleet.metric_sum('iop_inference_retries_total'):.0f} retries"
        )
        assert all(o.ok for o in outcomes), summary(outcomes)
        assert fleet.metric_sum("iop_inference_retries_total") == 0
    finally:
        if pool is not None:
            pool.shutdown(wait=True)
        gate.open()
        stop_fleet(fleet)


def _answers(engine: LlamaEngine) -> int:
    """The status of ``engine``'s /health, 0 while it does not answer (it fails if the engine exited)."""
    if not engine.running():
        raise AssertionError(f"llama-server exited:\n{engine.log()}")
    try:
        return health(engine.base_url, timeout=1.0)[0]
    except (OSError, ValueError):
        return 0
