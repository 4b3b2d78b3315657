"""A busy, mostly healthy fleet for the console's pictures: three edges in two regions.

Each edge has a few GPU nodes with one engine each (vLLM, SGLang or
llama.cpp serving real model names). How busy a provider is follows the
time it is asked at (two slow waves, the same at any clock), so an hour
of history sampled on a fake clock (:func:`seed_history`) and the live
answers of scripted edges on the real wire (:func:`connect_busy_fleet`)
draw one continuous picture. One provider is degraded; a node can be
drained (:meth:`BusyEdge.drain`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import attrs

from twisted_iop.controlplane.history.settings import HistorySettings
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.latency.sketch import LatencySketch
from twisted_iop.testing.history import HistoryFleet
from twisted_iop.testing.latency import sketch_message, sketch_of
from twisted_iop.testing.wires.peers import CATALOG, ScriptedEdge, connect_edge, set_engine
from twisted_iop.wire import control_pb2 as pb

#: How far back the seeded history goes, in seconds.
HISTORY_SPAN_SECONDS = 3600.0


@attrs.frozen
class Engine:
    """An engine as a provider runs it: what it serves, on how many GPUs, and how fast."""

    provider_id: str
    kind: str
    model: str
    gpus: int
    capacity: int
    long_context_capacity: int
    #: Seconds to the first token and per token when idle (they grow with load).
    ttft: float
    tpot: float


LLAMA_8B = Engine("vllm-8b", "vllm", "llama-3.1-8b-instruct", 1, 32, 4, 0.18, 0.012)
LLAMA_70B = Engine("vllm-70b", "vllm", "llama-3.1-70b-instruct", 4, 16, 2, 0.43, 0.032)
QWEN_32B = Engine("sglang-qwen", "sglang", "qwen2.5-32b-instruct", 2, 24, 4, 0.3, 0.021)
MISTRAL_7B = Engine("llamacpp-mistral", "llama.cpp", "mistral-7b-instruct-v0.3", 1, 8, 1, 0.21, 0.018)


@attrs.frozen
class GpuNode:
    """One node and the one engine it runs."""

    node_id: str
    engine: Engine
    #: Minutes since the node connected.
    up_minutes: int
    #: Why its provider is degraded ("": it is healthy); a degraded engine is slower.
    degraded: str = ""


@attrs.frozen
class EdgeShape:
    """An edge: its labels and nodes, and where its load waves start."""

    edge_id: str
    labels: dict[str, str]
    nodes: tuple[GpuNode, ...]
    phase: float


def prod(region: str, site: str) -> dict[str, str]:
    """A production edge's labels."""
    return {"region": region, "site": site, "tier": "prod"}


SHAPES = (
    EdgeShape(
        "edge-eu-west-1",
        prod("eu-west", "ams-1"),
        (
            GpuNode("ams-gpu-01", LLAMA_8B, 42),
            GpuNode("ams-gpu-02", LLAMA_70B, 187),
            GpuNode("ams-gpu-03", QWEN_32B, 95),
            GpuNode("ams-gpu-04", MISTRAL_7B, 61),
        ),
        0.0,
    ),
    EdgeShape(
        "edge-eu-west-2",
        prod("eu-west", "fra-2"),
        (
            GpuNode("fra-gpu-01", LLAMA_8B, 260),
            GpuNode("fra-gpu-02", QWEN_32B, 118),
            GpuNode("fra-gpu-03", LLAMA_70B, 73),
        ),
        1.9,
    ),
    EdgeShape(
        "edge-us-east-1",
        prod("us-east", "iad-1"),
        (
            GpuNode("iad-gpu-01", LLAMA_8B, 305),
            GpuNode("iad-gpu-02", LLAMA_70B, 34, degraded="KV cache above 95 % for 4 min"),
            GpuNode("iad-gpu-03", MISTRAL_7B, 152),
        ),
        3.7,
    ),
)
#: How much slower a degraded engine answers.
DEGRADED_SLOWDOWN = 1.4

#: What the first edge relays on connecting: (minutes ago, kind, node, message).
RECENT_EVENTS = (
    (41, "node.ready", "ams-gpu-01", "node ams-gpu-01 ready (1 provider, 1 GPU)"),
    (40, "provider.launch_changed", "ams-gpu-01", "vllm-8b: loading -> ready (llama-3.1-8b-instruct in 74 s)"),
    (17, "provider.health_changed", "ams-gpu-02", "vllm-70b: degraded -> healthy"),
    (6, "provider.health_changed", "ams-gpu-03", "sglang-qwen: healthy, KV cache 78 %"),
)
#: The version the edges say they run.
SOFTWARE_VERSION = "0.1.0"
#: How long a request takes, on average (how many end while others are in flight).
REQUEST_SECONDS = 8.0
#: An Edge's latency window, and how many shapes of request a provider's minute holds.
LAST_MINUTE_SECONDS = 60.0
REQUEST_SHAPES = 10
#: Tokens of an average request's prompt and answer.
PROMPT_TOKENS = 900
COMPLETION_TOKENS = 350
#: Each engine's tokens per second per running request, by kind.
TOKENS_PER_REQUEST = {"vllm": 38.0, "sglang": 41.0, "llama.cpp": 24.0}


def busyness(at: float, phase: float) -> float:
    """The share of its capacity a provider has in flight at ``at``: 0.4 to 0.97."""
    slow = math.sin(2 * math.pi * at / 2400 + phase)
    fast = math.sin(2 * math.pi * at / 420 + 2 * phase)
    return min(0.97, max(0.4, 0.72 + 0.18 * slow + 0.07 * fast))


class MinuteLatency:
    """One provider's latency as an Edge reports it: its last minute's requests and its counts since
    ``counting_since_ms``. A minute's requests are a few shapes of request counted many times each
    (observing every one of an hour's requests would make the history slow to seed)."""

    def __init__(self, counting_since_ms: int) -> None:
        self.counting_since_ms = counting_since_ms
        self.totals = (LatencySketch(), LatencySketch(), LatencySketch())
        self.requests_total = 0
        #: Shapes of request that ended but are not counted yet (less than one of each, between answers).
        self.uncounted = 0.0

    def answer(self, per_minute: float, ttft: float, tpot: float, elapsed: float) -> pb.ProviderLatency:
        """The figures after a minute of ``per_minute`` requests around ``ttft`` and ``tpot`` seconds,
        ``elapsed`` seconds of which are new since the last answer."""
        spread = [0.7 + 0.6 * i / (REQUEST_SHAPES - 1) for i in range(REQUEST_SHAPES)]
        shapes = (
            [ttft * f for f in spread],
            [tpot * (0.9 + 0.2 * f) for f in spread],
            [ttft * f + REQUEST_SECONDS for f in spread],
        )
        recent = [counted(values, round(per_minute / REQUEST_SHAPES)) for values in shapes]
        self.uncounted += per_minute * elapsed / LAST_MINUTE_SECONDS / REQUEST_SHAPES
        new = math.floor(self.uncounted)
        self.uncounted -= new
        for total, values in zip(self.totals, shapes, strict=True):
            total.merge(counted(values, new))
        self.requests_total += new * REQUEST_SHAPES
        ttft_total, tpot_total, duration_total = self.totals
        return pb.ProviderLatency(
            ttft_recent=sketch_message(recent[0]),
            tpot_recent=sketch_message(recent[1]),
            duration_recent=sketch_message(recent[2]),
            requests_recent=recent[0].count,
            ttft_total=sketch_message(ttft_total),
            tpot_total=sketch_message(tpot_total),
            duration_total=sketch_message(duration_total),
            requests_total=self.requests_total,
            counting_since_ms=self.counting_since_ms,
            window_seconds=LAST_MINUTE_SECONDS,
        )


def counted(values: list[float], times: int) -> LatencySketch:
    """A sketch of ``values``, each seen ``times`` times."""
    sketch = sketch_of(values)
    indices, counts = sketch.pairs()
    return LatencySketch.from_pairs(indices, [count * times for count in counts], sketch.total * times)


class BusyEdge:
    """One edge's answers at any time (see the module docstring)."""

    def __init__(self, shape: EdgeShape, started_at: float) -> None:
        self.shape = shape
        self.latency = {node.node_id: MinuteLatency(round(started_at * 1000)) for node in shape.nodes}
        self.drained: set[str] = set()
        #: When it last answered (the requests that ended since then are in its answer).
        self.answered_at = started_at

    def drain(self, node_id: str) -> None:
        """The node takes no new work from now on (as after ``node.drain``)."""
        self.drained.add(node_id)

    def hello(self) -> EdgeHello:
        """What the edge says of itself when it enrolls."""
        return EdgeHello(dict(self.shape.labels), SOFTWARE_VERSION, "1.0", tuple(CATALOG))

    def status_at(self, seconds: Callable[[], float]) -> Callable[[], pb.EdgeStatusResponse]:
        """A status function answering what the edge holds at ``seconds()``."""
        return lambda: self.status(seconds())

    def status(self, at: float) -> pb.EdgeStatusResponse:
        """The edge's status answer at ``at`` (with the requests that ended since its last answer)."""
        now_ms = round(at * 1000)
        elapsed = min(LAST_MINUTE_SECONDS, max(0.0, at - self.answered_at))
        self.answered_at = at
        response = pb.EdgeStatusResponse(edge_id=self.shape.edge_id, generated_at_ms=now_ms)
        for index, gpu in enumerate(self.shape.nodes):
            engine = gpu.engine
            drained = gpu.node_id in self.drained
            load = busyness(at, self.shape.phase + index * 0.8)
            in_flight = min(engine.capacity, round(engine.capacity * load * (0.15 if drained else 1)))
            queued = 0 if drained else max(0, round((load - 0.72) * engine.capacity * 0.6))
            long_in_flight = min(engine.long_context_capacity, round(engine.long_context_capacity * load))
            node = response.nodes.add(
                node_id=gpu.node_id,
                connected=True,
                drained=drained,
                connected_since_ms=now_ms - gpu.up_minutes * 60_000,
                gpus=engine.gpus,
                labels={"gpu": "h100" if engine.gpus > 1 else "l40s"},
            )
            provider = node.providers.add(
                provider_id=engine.provider_id,
                kind=engine.kind,
                models=[engine.model],
                status=pb.PROVIDER_STATUS_DRAINED if drained else pb.PROVIDER_STATUS_AVAILABLE,
                health=pb.PROVIDER_HEALTH_DEGRADED if gpu.degraded else pb.PROVIDER_HEALTH_HEALTHY,
                health_reason=gpu.degraded,
                capacity=engine.capacity,
                in_flight=in_flight,
                queued=queued,
                long_context_capacity=engine.long_context_capacity,
                long_context_in_flight=long_in_flight,
                long_context_queued=1 if load > 0.88 and not drained else 0,
            )
            slowdown = DEGRADED_SLOWDOWN if gpu.degraded else 1.0
            latency = self.latency[gpu.node_id]
            provider.latency.CopyFrom(
                latency.answer(
                    per_minute=(in_flight + long_in_flight) * LAST_MINUTE_SECONDS / REQUEST_SECONDS,
                    ttft=engine.ttft * slowdown * (0.8 + load),
                    tpot=engine.tpot * slowdown * (0.85 + 0.4 * load),
                    elapsed=elapsed,
                )
            )
            set_engine(
                provider,
                running=in_flight + long_in_flight,
                waiting=queued,
                kv_cache_usage=min(0.97, 0.25 + 0.7 * load),
                parallel=engine.capacity,
                tokens_per_second=TOKENS_PER_REQUEST[engine.kind] * (in_flight + long_in_flight) / slowdown,
                prompt_tokens=latency.requests_total * PROMPT_TOKENS,
                completion_tokens=latency.requests_total * COMPLETION_TOKENS,
                saturated=queued > 0 and load > 0.9,
            )
        return response


def busy_edges(started_at: float) -> dict[str, BusyEdge]:
    """Every edge of :data:`SHAPES`, by id."""
    return {shape.edge_id: BusyEdge(shape, started_at) for shape in SHAPES}


def seed_history(store: Any, settings: HistorySettings, edges: dict[str, BusyEdge], now: float) -> int:
    """Sample ``edges`` on a fake clock over the :data:`HISTORY_SPAN_SECONDS` before ``now``, as a
    Control Plane with ``settings`` and ``store`` would have; the number of samples kept."""
    fleet = HistoryFleet(settings, now - HISTORY_SPAN_SECONDS, store)
    for edge_id, edge in edges.items():
        fleet.enroll(edge_id, edge.hello(), edge.status_at(fleet.clock.seconds))
    while fleet.clock.seconds() < now - settings.interval_seconds:
        fleet.clock.advance(settings.interval_seconds)
    fleet.history.stopService()
    return fleet.history.samples


async def connect_busy_fleet(port: int, edges: dict[str, BusyEdge], seconds: Callable[[], float]) -> list[ScriptedEdge]:
    """Connect a scripted edge for each of ``edges`` to the edge wire on ``port``, answering their status."""
    connected = []
    for edge_id, edge in edges.items():
        scripted, hello = await connect_edge(
            port,
            edge_id,
            labels=dict(edge.shape.labels),
            software_version=SOFTWARE_VERSION,
            status=edge.status_at(seconds),
            event_time_ms=lambda: round(seconds() * 1000),
        )
        assert hello is not None and hello.accepted, hello
        connected.append(scripted)
    return connected


def relay_recent_events(edge: ScriptedEdge, now: float) -> None:
    """Relay :data:`RECENT_EVENTS`, each stamped its minutes before ``now``, then go back to ``edge``'s clock."""
    clock = edge.event_time_ms
    for minutes, kind, node_id, message in RECENT_EVENTS:
        edge.event_time_ms = functools.partial(round, (now - minutes * 60) * 1000)
        edge.event(kind, node_id=node_id, message=message)
    edge.event_time_ms = clock
