"""Failover and cool-down at the Edge, and what a client sees of an engine's error:
the gateway on a fake clock with two fake Node connections (plain calls)."""

from __future__ import annotations

import itertools
import json
from typing import Any

from twisted.internet.task import Clock

from twisted_iop.edge.config import parse_edge_config
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.edge.status import StatusProvider
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.http import chat
from twisted_iop.testing.wires.peers import RecordingNodePeer
from twisted_iop.wire import control_pb2 as pb

_ORDER = itertools.count()


class FakeNode(RecordingNodePeer):
    """A Node connection that records what the gateway sends it, and in which order across Nodes."""

    def __init__(self) -> None:
        super().__init__()
        #: (global order, inference id) of each inference request sent here.
        self.order: list[tuple[int, int]] = []

    def send(self, body: str, message: Any, request_id: int = 0) -> None:
        """Record one envelope."""
        super().send(body, message, request_id)
        if body == "inference_request":
            self.order.append((next(_ORDER), message.inference_id))

    def requests(self) -> list[int]:
        """Ids of the inference requests sent to this Node."""
        return [m.inference_id for body, m in self.sent if body == "inference_request"]


class Sink:
    """Records how a request ended."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self.completed = False
        self.error: InferenceError | None = None

    def chunks(self, events: list[bytes]) -> None:
        """Keep streamed events."""
        self.events += events

    def complete(self, done: pb.InferenceDone) -> None:
        """Note the end."""
        self.completed = True

    def fail(self, error: InferenceError) -> None:
        """Keep the error."""
        self.error = error


def fleet(
    nodes: int = 2, failover: dict[str, Any] | None = None, capacity: int = 2
) -> tuple[InferenceGateway, list[FakeNode], Clock]:
    """A gateway with ``nodes`` ready Nodes ``n1``.. each with one provider ``p1``.. of ``capacity``."""
    clock = Clock()
    clock.advance(1000)
    config = parse_edge_config(
        {
            "control_plane": {"edge_id": "edge-a"},
            "nodes": [
                {
                    "node_id": f"n{i}",
                    "providers": [{"provider_id": f"p{i}", "kind": "mock", "models": [MODEL], "capacity": capacity}],
                }
                for i in range(1, nodes + 1)
            ],
            "inference": {"failover": failover or {}},
        }
    )
    registry = NodeRegistry(config, clock)
    peers = []
    for i in range(1, nodes + 1):
        peer = FakeNode()
        spec = pb.NodeProviderSpec(provider_id=f"p{i}", models=[MODEL])
        token = registry.node_accepted(pb.NodeHelloRequest(node_id=f"n{i}", providers=[spec]), peer)
        health = pb.ProviderHealthReport(provider_id=f"p{i}", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
        registry.node_ready(token, [health])
        peers.append(peer)
    return InferenceGateway(registry, config.inference, clock), peers, clock


def submit(gateway: InferenceGateway, stream: bool = False) -> tuple[int, Sink]:
    """One chat request; its id and sink."""
    sink = Sink()
    inference_id = gateway.submit(
        pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, MODEL, False, chat(stream=stream), stream, sink
    )
    return inference_id, sink


def holder(peers: list[FakeNode], inference_id: int) -> FakeNode:
    """The Node the request was last sent to."""
    sent = [(order, peer) for peer in peers for order, i in peer.order if i == inference_id]
    assert sent, "never sent"
    return max(sent, key=lambda pair: pair[0])[1]


def answer(gateway: InferenceGateway, peer: FakeNode, done: pb.InferenceDone) -> None:
    """``done`` from ``peer``."""
    gateway.node_message(peer, pb.Envelope(inference_done=done), "inference_done")


def overloaded(inference_id: int, status: int = 429, code: str = "overloaded") -> pb.InferenceDone:
    """An engine's overload, as a Node reports it."""
    body = json.dumps({"error": {"message": "server busy", "type": "server_error", "code": code}}).encode()
    return pb.InferenceDone(
        inference_id=inference_id,
        status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
        http_status=status,
        body=body,
        error="engine answered 429",
        error_code=code,
        retry_after_seconds=7,
    )


def test_unreachable_engine_is_retried_on_the_other_provider_which_cools_down() -> None:
    """Refused before any byte: the request runs on the other provider; the failed one cools down, visibly."""
    gateway, peers, clock = fleet()
    inference_id, sink = submit(gateway)
    first = holder(peers, inference_id)
    answer(gateway, first, pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE))
    second = holder(peers, inference_id)
    assert second is not first and sink.error is None
    answer(gateway, second, pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK))
    assert sink.completed and gateway.retries == {"provider_unavailable": 1}
    assert first.probes, "an early re-probe of the failed provider's Node"
    snapshot = StatusProvider(gateway._registry, clock).snapshot()
    failed = next(p for n in snapshot.nodes for p in n.providers if n.node_id == ("n1" if first is peers[0] else "n2"))
    assert failed.cooling_down and failed.health == pb.PROVIDER_HEALTH_DEGRADED
    assert failed.health_reason.startswith("cooling down: provider_unavailable")
    # New work avoids it until the cool-down ends.
    for _ in range(2):
        other_id, _ = submit(gateway)
        assert holder(peers, other_id) is second
    clock.advance(5.1)
    snapshot = StatusProvider(gateway._registry, clock).snapshot()
    assert not any(p.cooling_down for n in snapshot.nodes for p in n.providers)


def test_overloaded_429_is_retried_elsewhere_then_waits_and_the_last_one_reaches_the_client() -> None:
    """An engine's 429 goes to the other provider; when that one is overloaded too, the
    request waits for one to cool down (overloaded is "not now") and is sent again; once its
    retries are spent the client gets the engine's 429 + Retry-After."""
    gateway, peers, clock = fleet()
    inference_id, sink = submit(gateway)
    first = holder(peers, inference_id)
    answer(gateway, first, overloaded(inference_id))
    second = holder(peers, inference_id)
    assert second is not first
    answer(gateway, second, overloaded(inference_id))
    for _ in range(gateway.config.max_retries):
        if sink.error is not None:
            break
        assert gateway.lifecycle.queued_total() == 1, "waits in the queue, not failed"
        clock.advance(5.1)  # a cool-down ends: the request is sent again
        answer(gateway, holder(peers, inference_id), overloaded(inference_id))
    assert sink.error is not None
    assert (sink.error.status, sink.error.code, sink.error.retry_after) == (429, "overloaded", 7)
    assert json.loads(sink.error.to_json())["error"]["message"] == "server busy"


def test_no_retry_after_the_first_byte() -> None:
    """A stream that failed after output reached the client ends with the error; it is not completed."""
    gateway, peers, clock = fleet()
    inference_id, sink = submit(gateway, stream=True)
    peer = holder(peers, inference_id)
    gateway.node_message(
        peer, pb.Envelope(inference_chunk=pb.InferenceChunk(inference_id=inference_id, data=b"{}")), "inference_chunk"
    )
    clock.advance(0)
    answer(gateway, peer, pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE))
    assert sink.events == [b"{}"] and sink.error is not None and sink.error.code == "provider_unavailable"
    assert sum(len(p.requests()) for p in peers) == 1
    assert gateway.outcomes.get("completed", 0) == 0 and gateway.outcomes["provider_error"] == 1


def test_the_only_provider_unreachable_makes_the_request_wait_for_it() -> None:
    """No other provider, and the Node still serves it: the request waits in the queue
    (an engine on its way back is "not now") and is sent again when the cool-down ends."""
    gateway, peers, clock = fleet(nodes=1)
    inference_id, sink = submit(gateway)
    unreachable = pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE)
    answer(gateway, peers[0], unreachable)
    assert sink.error is None and gateway.lifecycle.queued_total() == 1
    assert len(peers[0].requests()) == 1
    clock.advance(5.1)
    assert len(peers[0].requests()) == 2
    answer(gateway, peers[0], pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK))
    assert sink.completed and sink.error is None


def test_the_only_provider_failing_every_retry_gives_the_client_its_error() -> None:
    """Once its retries are spent, the client gets 503 provider_unavailable with the reason."""
    gateway, peers, clock = fleet(nodes=1)
    inference_id, sink = submit(gateway)
    for _ in range(gateway.config.max_retries + 1):
        assert sink.error is None
        answer(gateway, peers[0], pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE))
        clock.advance(5.1)
    assert sink.error is not None and (sink.error.status, sink.error.code) == (503, "provider_unavailable")
    assert len(peers[0].requests()) == gateway.config.max_retries + 1


def test_retries_are_bounded_by_max_retries() -> None:
    """With max_retries 1 and three providers failing, the second failure is the client's."""
    gateway, peers, _clock = fleet(nodes=3, failover={"max_retries": 1})
    inference_id, sink = submit(gateway)
    answer(gateway, holder(peers, inference_id), overloaded(inference_id, status=503))
    assert sink.error is None
    answer(gateway, holder(peers, inference_id), overloaded(inference_id, status=503))
    assert sink.error is not None and (sink.error.status, sink.error.code) == (503, "overloaded")
    assert sum(len(p.requests()) for p in peers) == 2


def test_engine_error_codes_reach_the_client_with_the_engine_message() -> None:
    """Each code has its status; the engine's message is kept; no retry for the client's own mistakes."""
    cases = [
        ("context_length_exceeded", 400, 400),
        ("model_not_found", 404, 404),
        ("invalid_request", 422, 422),
        ("invalid_request", 400, 400),
        ("provider_error", 500, 502),
    ]
    for code, engine_status, client_status in cases:
        gateway, peers, _clock = fleet()
        inference_id, sink = submit(gateway)
        body = json.dumps({"error": {"message": f"engine says {code}", "type": "x", "code": code}}).encode()
        done = pb.InferenceDone(
            inference_id=inference_id,
            status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
            http_status=engine_status,
            body=body,
            error_code=code,
        )
        answer(gateway, holder(peers, inference_id), done)
        assert sink.error is not None, code
        assert (sink.error.status, sink.error.code) == (client_status, code)
        error = json.loads(sink.error.to_json())["error"]
        assert error["message"] == f"engine says {code}" and error["code"] == code
        assert sum(len(p.requests()) for p in peers) == 1


def test_an_older_node_keeps_the_old_mapping() -> None:
    """No error code: a 4xx OpenAI body passes through as provider_error; a 500 is 502 provider_error."""
    gateway, peers, _clock = fleet()
    inference_id, sink = submit(gateway)
    body = b'{"error": {"message": "bad temperature", "type": "invalid_request_error"}}'
    done = pb.InferenceDone(
        inference_id=inference_id, status=pb.INFERENCE_STATUS_PROVIDER_ERROR, http_status=400, body=body
    )
    answer(gateway, holder(peers, inference_id), done)
    assert sink.error is not None and (sink.error.status, sink.error.code) == (400, "provider_error")
    assert sink.error.to_json() == body
    inference_id, sink = submit(gateway)
    done = pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_PROVIDER_ERROR, http_status=500)
    answer(gateway, holder(peers, inference_id), done)
    assert sink.error is not None and (sink.error.status, sink.error.code) == (502, "provider_error")


def test_over_half_failing_in_the_window_starts_a_cool_down() -> None:
    """LiteLLM's rule: at least min_requests in the window and more than half failed."""
    gateway, peers, clock = fleet(nodes=1, failover={"min_requests": 4})
    registry = gateway._registry
    outcomes = [True, False, True, False, True]  # failed?
    for failed in outcomes:
        inference_id, _sink = submit(gateway)
        status = pb.INFERENCE_STATUS_PROVIDER_ERROR if failed else pb.INFERENCE_STATUS_OK
        answer(gateway, peers[0], pb.InferenceDone(inference_id=inference_id, status=status, http_status=500))
        clock.advance(1)
        if failed and registry.providers.cooling_down("n1", "p1"):
            break
    assert registry.providers.cooling_down("n1", "p1") is not None
    assert "3 of its last 5 requests failed" in (registry.providers.cooling_down("n1", "p1") or "")


def test_tokens_are_counted_per_provider_and_model() -> None:
    """Usage of each answer adds up; tokens per second is over the last minute."""
    gateway, peers, clock = fleet(nodes=1)
    for _ in range(3):
        inference_id, _sink = submit(gateway)
        done = pb.InferenceDone(
            inference_id=inference_id,
            status=pb.INFERENCE_STATUS_OK,
            usage=pb.InferenceUsage(prompt_tokens=10, completion_tokens=20, total_tokens=30),
        )
        answer(gateway, peers[0], done)
    provider = StatusProvider(gateway._registry, clock).snapshot().nodes[0].providers[0]
    assert (provider.prompt_tokens, provider.completion_tokens) == (30, 60)
    assert provider.tokens_per_second == 1.0  # 60 tokens over 60 seconds
    clock.advance(61)
    provider = StatusProvider(gateway._registry, clock).snapshot().nodes[0].providers[0]
    assert provider.tokens_per_second == 0.0 and provider.completion_tokens == 60


def test_one_log_line_per_failed_inference_and_none_per_success() -> None:
    """A failure logs model, provider and code (never an address); a success logs nothing; health reads healthy -> offline."""
    from typing import cast

    from twisted.logger import ILogObserver, formatEvent, globalLogPublisher

    lines: list[str] = []

    def observer(event: dict[str, Any]) -> None:
        lines.append(formatEvent(event))

    globalLogPublisher.addObserver(cast(ILogObserver, observer))
    try:
        gateway, peers, _clock = fleet(nodes=1)
        inference_id, _sink = submit(gateway)
        answer(gateway, peers[0], pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK))
        assert not [line for line in lines if "inference" in line]
        inference_id, _sink = submit(gateway)
        done = pb.InferenceDone(
            inference_id=inference_id,
            status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
            http_status=500,
            error_code="provider_error",
        )
        answer(gateway, peers[0], done)
        failed = [line for line in lines if line.startswith(f"inference {inference_id} ")]
        assert len(failed) == 1
        assert f"model {MODEL}" in failed[0] and "node n1 provider p1" in failed[0] and "provider_error" in failed[0]
        assert "127.0.0.1" not in failed[0]
        token = gateway._registry.ownership.owner("n1")
        assert token is not None
        gateway._registry.node_health(
            token, [pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_OFFLINE)]
        )
        assert any("health healthy -> offline" in line for line in lines)
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, observer))
