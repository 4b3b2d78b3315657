""" "Not now" is not "gone": a saturated, cooling or returning provider makes
requests wait in the Edge's queue; only engine-caused failures cool a provider
down; an endpoint an engine does not serve never takes the others out of
rotation. The gateway and registry on a fake clock with fake Node connections
(plain calls)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from test_edge_failover import FakeNode, Sink, answer, fleet, holder, submit
from twisted.logger import ILogObserver, LogLevel, formatEvent, globalLogPublisher

from twisted_iop.edge.inference.errors import MAX_UNSUPPORTED, UNSUPPORTED_MEMORY_SECONDS, UnsupportedEndpoints
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.lifecycle import InferenceError
from twisted_iop.edge.providers.load import EngineLoads, EngineReading, SaturationRule
from twisted_iop.testing.configs import MODEL
from twisted_iop.wire import control_pb2 as pb


def load(provider_id: str, **fields: Any) -> list[pb.ProviderLoadReport]:
    """A one-provider load report (known, KV unknown unless told)."""
    fields.setdefault("known", True)
    fields.setdefault("kv_cache_usage", -1.0)
    return [pb.ProviderLoadReport(provider_id=provider_id, load=pb.EngineLoad(**fields))]


def token_of(gateway: InferenceGateway, node_id: str) -> int:
    """The owner connection token of ``node_id``."""
    token = gateway._registry.ownership.owner(node_id)
    assert token is not None
    return token


def ok(inference_id: int) -> pb.InferenceDone:
    """A request that ended well."""
    return pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_OK)


def engine_error(
    inference_id: int, status: int, kind: str = "invalid_request_error", code: str = ""
) -> pb.InferenceDone:
    """An engine's error answer as a Node reports it."""
    body = json.dumps({"error": {"message": f"engine said {status}", "type": kind}}).encode()
    return pb.InferenceDone(
        inference_id=inference_id,
        status=pb.INFERENCE_STATUS_PROVIDER_ERROR,
        http_status=status,
        body=body,
        error=f"engine said {status}",
        error_code=code,
    )


def embeddings(gateway: InferenceGateway) -> tuple[int, Sink]:
    """One embeddings request; its id and sink."""
    sink = Sink()
    body = json.dumps({"model": MODEL, "input": "hello"}).encode()
    return gateway.submit(pb.INFERENCE_ENDPOINT_EMBEDDINGS, MODEL, False, body, False, sink), sink


def sent_to(peer: FakeNode, inference_id: int) -> int:
    """How many times ``inference_id`` was sent to ``peer``."""
    return int(peer.requests().count(inference_id))


# -- the saturation rule -------------------------------------------------------------


def reading(running: int, waiting: int, kv: float | None = None) -> EngineReading:
    """A fresh reading."""
    return EngineReading(running=running, waiting=waiting, kv_cache_usage=kv, parallel=2, read_at=0.0)


def test_a_saturated_engine_limits_the_edge_to_what_it_holds_at_max_waiting() -> None:
    """The lease limit keeps the engine's waiting at max_waiting, counting the requests the
    Edge sent after the engine was read as already waiting."""
    rule = SaturationRule(max_waiting=5)
    # The engine saw all 10 of the Edge's requests: 2 run, 8 wait; 3 too many.
    assert rule.lease_limit(reading(2, 8), in_flight=10) == 7
    # 12 in flight, the engine saw 8 of them (4 sent since): 2 + 6 waiting, one too many.
    assert rule.lease_limit(reading(2, 6), in_flight=12) == 7
    # Below max_waiting (in the hysteresis band) the limit grows back.
    assert rule.lease_limit(reading(2, 3), in_flight=5) == 7
    # KV cache over its bound: no more than the engine already holds.
    assert rule.lease_limit(reading(2, 0, kv=0.95), in_flight=4) == 2
    assert rule.lease_limit(reading(0, 9), in_flight=0) == 0


def test_saturation_has_hysteresis() -> None:
    """Saturated above max_waiting; it stays saturated until waiting is at most half of it,
    so a steady load does not flip the state at every reading."""
    loads = EngineLoads(SaturationRule(max_waiting=6))
    states = []
    for waiting in (7, 6, 4, 3, 5, 7, 2):
        loads.update("n1", ["p1"], load("p1", running=2, waiting=waiting), now=100.0, in_flight={"p1": 9})
        states.append(loads.saturated("n1", "p1"))
    assert states == [True, True, True, False, False, True, False]
    assert loads.lease_limit("n1", "p1") is None


# -- saturated engines queue, they do not refuse ---------------------------------------


def test_requests_for_a_saturated_engine_wait_and_go_as_leases_end() -> None:
    """12 clients on an engine that runs 2 at capacity 10: none is refused; the Edge holds
    what the engine can take and sends the next request each time one ends."""
    gateway, peers, _clock = fleet(nodes=1, capacity=10)
    registry = gateway._registry
    node = peers[0]
    everyone = [submit(gateway) for _ in range(12)]
    assert gateway.lifecycle.queued_total() == 2
    # The engine runs 2 and queues 8 of the Edge's 10: 3 over max_waiting (5).
    registry.node_load(token_of(gateway, "n1"), load("p1", running=2, waiting=8, parallel=2))
    assert registry.providers.saturated("n1", "p1")
    assert registry.providers.engine_loads.lease_limit("n1", "p1") == 7
    for i, _ in everyone[:4]:  # three end: the Edge now holds 7, at the limit; the fourth frees one
        answer(gateway, node, ok(i))
    assert gateway.lifecycle.queued_total() == 1
    done = 0
    for _ in range(200):
        running = [i for i, sink in everyone if not sink.completed and sent_to(node, i)]
        if not running:
            break
        answer(gateway, node, ok(running[0]))
        done += 1
    assert all(sink.completed and sink.error is None for _, sink in everyone)
    assert done == 8


def test_a_saturated_engine_is_still_listed_and_admitted() -> None:
    """/v1/models keeps a saturated or cooling model; check_model admits it."""
    gateway, _peers, _clock = fleet(nodes=1)
    registry = gateway._registry
    registry.node_load(token_of(gateway, "n1"), load("p1", running=9, waiting=9))
    registry.providers.request_failed("n1", "p1", "provider_unavailable", cool_down_now=True)
    assert registry.providers.cooling_down("n1", "p1") and registry.providers.saturated("n1", "p1")
    assert gateway.available_models() == [MODEL]
    gateway.check_model(MODEL, False)


def test_a_drained_node_is_gone_503_with_retry_after() -> None:
    """No provider can come back by itself (drained): 503 model_unavailable with Retry-After."""
    gateway, _peers, _clock = fleet(nodes=1)
    gateway._registry.set_drained("n1", True)
    with pytest.raises(InferenceError) as refused:
        submit(gateway)
    assert (refused.value.status, refused.value.code) == (503, "model_unavailable")
    assert refused.value.retry_after == gateway.config.retry_after_seconds


# -- a returning engine ----------------------------------------------------------------


def test_a_provider_that_answers_again_ends_its_cool_down_at_once() -> None:
    """An engine refused a request (cool-down), the Node says it is offline, then healthy:
    the waiting request goes to it at that report, not at the cool-down's end."""
    gateway, peers, clock = fleet(nodes=1)
    registry = gateway._registry
    inference_id, sink = submit(gateway)
    answer(gateway, peers[0], pb.InferenceDone(inference_id=inference_id, status=pb.INFERENCE_STATUS_UNAVAILABLE))
    assert registry.providers.cooling_down("n1", "p1") and gateway.lifecycle.queued_total() == 1
    token = token_of(gateway, "n1")
    offline = pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_OFFLINE, reason="refused")
    registry.node_health(token, [offline])
    clock.advance(1.0)
    assert sent_to(peers[0], inference_id) == 1
    healthy = pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
    registry.node_health(token, [healthy])
    assert registry.providers.cooling_down("n1", "p1") is None
    assert sent_to(peers[0], inference_id) == 2
    answer(gateway, peers[0], ok(inference_id))
    assert sink.completed


def test_requests_wait_for_a_provider_that_is_re_probing() -> None:
    """The Node reports its only provider offline (engine down, Node up): a new request
    waits in the queue and is sent when the provider is healthy again."""
    gateway, peers, _clock = fleet(nodes=1)
    registry = gateway._registry
    token = token_of(gateway, "n1")
    registry.node_health(token, [pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_OFFLINE)])
    inference_id, sink = submit(gateway)
    assert gateway.lifecycle.queued_total() == 1 and not peers[0].requests()
    healthy = pb.ProviderHealthReport(provider_id="p1", health=pb.PROVIDER_HEALTH_HEALTHY, models=[MODEL])
    registry.node_health(token, [healthy])
    assert sent_to(peers[0], inference_id) == 1
    answer(gateway, peers[0], ok(inference_id))
    assert sink.completed


# -- who caused an error ----------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 404, 405, 413, 422])
def test_client_caused_answers_never_cool_a_provider(status: int) -> None:
    """Twenty client-caused answers in a row (an older Node's, without a code) leave the
    provider in rotation; the client gets the engine's status. (501, an endpoint not
    served, has its own tests below.)"""
    gateway, peers, _clock = fleet(nodes=1)
    for _ in range(20):
        inference_id, sink = submit(gateway)
        answer(gateway, holder(peers, inference_id), engine_error(inference_id, status))
        assert sink.error is not None and sink.error.status == status
    assert gateway._registry.providers.cooling_down("n1", "p1") is None
    inference_id, sink = submit(gateway)
    answer(gateway, peers[0], ok(inference_id))
    assert sink.completed


def test_an_embedder_on_an_engine_without_embeddings_never_stops_chat() -> None:
    """One client's embeddings get 501 not_supported (the engine's message); after the first,
    they are answered at once without reaching the engine; every chat beside them succeeds."""
    gateway, peers, clock = fleet(nodes=1)
    node = peers[0]
    first_id, first = embeddings(gateway)
    answer(gateway, node, engine_error(first_id, 501, kind="not_supported_error"))
    assert first.error is not None
    assert (first.error.status, first.error.code) == (501, "not_supported")
    assert json.loads(first.error.to_json())["error"]["message"] == "engine said 501"
    chats: list[Sink] = []
    for _ in range(30):
        embed_id, embed = embeddings(gateway)
        assert embed.error is not None and embed.error.status == 501
        assert sent_to(node, embed_id) == 0
        chat_id, chat_sink = submit(gateway)
        answer(gateway, node, ok(chat_id))
        chats.append(chat_sink)
        clock.advance(0.1)
    assert all(c.completed and c.error is None for c in chats)
    assert gateway._registry.providers.cooling_down("n1", "p1") is None
    # Remembered for a while only: an engine restarted with embeddings is found again.
    clock.advance(UNSUPPORTED_MEMORY_SECONDS)
    embed_id, _ = embeddings(gateway)
    assert sent_to(node, embed_id) == 1


def test_a_client_repeating_its_mistake_makes_no_log_line_per_request() -> None:
    """An embedder on an engine without embeddings, and a client sending 400s: the Edge says once
    at info that the provider does not serve embeddings; each request's failure is at debug
    only, so a misbehaving client fills no log."""
    gateway, peers, clock = fleet(nodes=1)
    node = peers[0]
    events: list[dict[str, Any]] = []
    globalLogPublisher.addObserver(cast(ILogObserver, events.append))
    try:
        first_id, _ = embeddings(gateway)
        answer(gateway, node, engine_error(first_id, 501, kind="not_supported_error"))
        for _ in range(20):
            embeddings(gateway)
            bad_id, bad = submit(gateway)
            answer(gateway, holder(peers, bad_id), engine_error(bad_id, 400))
            assert bad.error is not None and bad.error.status == 400
            clock.advance(0.1)
    finally:
        globalLogPublisher.removeObserver(cast(ILogObserver, events.append))
    ours = [e for e in events if str(e.get("log_namespace", "")).startswith("twisted_iop.edge")]
    said = [formatEvent(e) for e in ours if e["log_level"] >= LogLevel.info]
    assert len(said) == 1 and "does not serve embeddings" in said[0], said
    assert len([e for e in ours if e["log_level"] == LogLevel.debug]) >= 40


def test_an_unsupported_endpoint_goes_to_a_provider_that_serves_it() -> None:
    """With two providers, the one without embeddings sends the request on to the other."""
    gateway, peers, _clock = fleet(nodes=2)
    embed_id, sink = embeddings(gateway)
    first = holder(peers, embed_id)
    answer(gateway, first, engine_error(embed_id, 501, kind="not_supported_error"))
    second = holder(peers, embed_id)
    assert second is not first
    answer(gateway, second, ok(embed_id))
    assert sink.completed and sink.error is None


def test_engine_caused_failures_still_cool_a_provider() -> None:
    """A 500 from the engine counts: over half of at least five failing cools it down."""
    gateway, peers, _clock = fleet(nodes=1)
    for _ in range(6):
        inference_id, _sink = submit(gateway)
        answer(gateway, peers[0], engine_error(inference_id, 500, kind="server_error", code="provider_error"))
    assert gateway._registry.providers.cooling_down("n1", "p1")


def test_unsupported_endpoints_are_bounded_and_expire() -> None:
    """At most MAX_UNSUPPORTED answers are kept (the oldest goes first), each for
    UNSUPPORTED_MEMORY_SECONDS, per provider and endpoint."""
    kept = UnsupportedEndpoints()
    error = InferenceError(501, "not_supported", "no embeddings")
    chat_endpoint, embeddings_endpoint = pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS, pb.INFERENCE_ENDPOINT_EMBEDDINGS
    for i in range(MAX_UNSUPPORTED + 10):
        kept.remember("n1", f"p{i}", embeddings_endpoint, error, now=0.0)
    assert len(kept) == MAX_UNSUPPORTED
    assert kept.known("n1", "p0", embeddings_endpoint, now=1.0) is None  # the oldest went first
    newest = f"p{MAX_UNSUPPORTED + 9}"
    assert kept.known("n1", newest, embeddings_endpoint, now=1.0) is error
    assert kept.known("n1", newest, chat_endpoint, now=1.0) is None
    assert kept.known("n1", newest, embeddings_endpoint, now=UNSUPPORTED_MEMORY_SECONDS) is None
