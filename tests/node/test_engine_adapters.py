"""Engine adapters: errors and stream events from each engine's recorded answers, and bounded parsing."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import pytest_twisted
import treq
from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.node.engines import base
from twisted_iop.node.engines.base import StreamEventKind
from twisted_iop.node.engines.kinds import ADAPTERS, adapter_for
from twisted_iop.node.engines.readings import MAX_REQUESTS, MAX_SAMPLES, fraction, prometheus_samples, request_count
from twisted_iop.testing.engines.engine_fixtures import (
    FIXTURE_USAGE,
    SHAPES,
    STREAM_EMPTY,
    STREAM_ERROR,
    STREAM_OK,
    EngineFixture,
)
from twisted_iop.testing.http import JSON_HEADERS
from twisted_iop.wire import control_pb2 as pb

RECORDED_ERRORS = [(kind, name) for kind, shapes in sorted(SHAPES.items()) for name in sorted(shapes.errors)]
STREAM_ERRORS = sorted(kind for kind, shapes in SHAPES.items() if shapes.stream_error is not None)


async def post_chat(fixture: EngineFixture, base_url: str, **body: Any) -> tuple[int, bytes, Any]:
    """POST a chat completion to the fixture; status, body and headers."""
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    response = await treq.post(
        base_url + "/v1/chat/completions",
        data=json.dumps(payload).encode(),
        headers=JSON_HEADERS,
    )
    return response.code, await response.content(), response.headers


def data_payloads(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of an event stream, as the Node's reader passes them on."""
    return [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]


@pytest.mark.parametrize(("kind", "name"), RECORDED_ERRORS)
@pytest_twisted.ensureDeferred
async def test_recorded_error_maps_to_its_code(kind: str, name: str) -> None:
    """Every engine's recorded error answer becomes its code, a fitting status and the engine's own message."""
    fixture = EngineFixture(kind)
    base_url = fixture.start()
    try:
        fixture.next_chat(name)
        status, body, _ = await post_chat(fixture, base_url)
    finally:
        await fixture.stop()
    recorded = fixture.shapes.errors[name]
    assert status == recorded.status
    error = adapter_for(fixture.node_kind).engine_error(status, body)
    assert error.code == recorded.expected_code
    assert error.message and json.dumps(error.message)[1:-1] in body.decode()
    expected_status = {
        "context_length_exceeded": (400, 422),
        "invalid_request": (400, 422),
        "model_not_found": (404,),
        "overloaded": (429, 503),
        # An engine's 501 (an endpoint it does not serve) stays 501: the client's call.
        "provider_error": (501,) if status == 501 else (502,),
    }[error.code]
    assert error.status in expected_status
    assert error.retryable == (error.code == "overloaded")
    wire = json.loads(error.to_json())
    assert wire["error"]["code"] == error.code and wire["error"]["message"] == error.message


@pytest.mark.parametrize("kind", sorted(SHAPES))
@pytest_twisted.ensureDeferred
async def test_stream_with_usage_chunk_is_classified(kind: str) -> None:
    """A stream asked with include_usage: data chunks, then the usage chunk (choices: []), then [DONE]."""
    fixture = EngineFixture(kind)
    base_url = fixture.start()
    try:
        status, body, _ = await post_chat(fixture, base_url, stream=True, stream_options={"include_usage": True})
    finally:
        await fixture.stop()
    assert status == 200
    adapter = adapter_for(fixture.node_kind)
    events = [adapter.stream_event(payload) for payload in data_payloads(body)]
    assert [e.kind for e in events] == [StreamEventKind.DATA] * 3 + [StreamEventKind.USAGE, StreamEventKind.DONE]
    assert events[3].usage == FIXTURE_USAGE
    assert adapter.stream_usage


@pytest.mark.parametrize("kind", STREAM_ERRORS)
@pytest_twisted.ensureDeferred
async def test_error_event_in_a_200_stream_is_an_error(kind: str) -> None:
    """The engine's error event inside a 200 stream is classified ERROR with the right code and message."""
    fixture = EngineFixture(kind)
    base_url = fixture.start()
    try:
        fixture.next_chat(STREAM_ERROR)
        status, body, _ = await post_chat(fixture, base_url, stream=True)
    finally:
        await fixture.stop()
    assert status == 200
    adapter = adapter_for(fixture.node_kind)
    events = [adapter.stream_event(payload) for payload in data_payloads(body)]
    assert [e.kind for e in events] == [StreamEventKind.DATA, StreamEventKind.DATA, StreamEventKind.ERROR]
    error = events[-1].error
    recorded = fixture.shapes.stream_error
    assert error is not None and recorded is not None
    assert error.code == recorded.expected_code
    assert error.message and json.dumps(error.message)[1:-1] in body.decode()


@pytest_twisted.ensureDeferred
async def test_fixture_answers_an_empty_stream_and_a_whole_completion() -> None:
    """The fixture's other answers: an empty 200 stream, and a whole completion with usage."""
    fixture = EngineFixture("llama-cpp-python")
    base_url = fixture.start()
    try:
        fixture.next_chat(STREAM_EMPTY)
        empty = await post_chat(fixture, base_url, stream=True)
        fixture.next_chat(STREAM_OK)
        whole = await post_chat(fixture, base_url)
    finally:
        await fixture.stop()
    assert (empty[0], empty[1]) == (200, b"")
    assert whole[0] == 200 and json.loads(whole[1])["usage"] == FIXTURE_USAGE
    assert fixture.posted[0]["stream"] is True
    with pytest.raises(KeyError):
        fixture.next_chat("no_such_answer")


def test_every_http_kind_has_its_own_adapter() -> None:
    """Each kind of node.yaml has an adapter of that kind; an unknown kind gets the generic one."""
    assert {kind: adapter.kind for kind, adapter in ADAPTERS.items()} == {kind: kind for kind in ADAPTERS}
    assert adapter_for("something-else").kind == "openai"


# -- health answers ------------------------------------------------------------------


def test_llamacpp_no_slot_available_is_busy_not_down() -> None:
    """Older llama.cpp answered /health 503 "no slot available" when every slot was busy: healthy, busy."""
    check = adapter_for("llamacpp").check_health(503, b'{"status": "no slot available", "slots_idle": 0}')
    assert check is not None and check.health == pb.PROVIDER_HEALTH_HEALTHY and check.reason.startswith("busy")


def test_ollama_banner_is_required() -> None:
    """GET / must say "Ollama is running": another server on that port is not Ollama."""
    adapter = adapter_for("ollama")
    ok = adapter.check_health(200, b"Ollama is running")
    other = adapter.check_health(200, b"<html>nginx</html>")
    assert ok is not None and ok.health == pb.PROVIDER_HEALTH_HEALTHY
    assert other is not None and other.health == pb.PROVIDER_HEALTH_UNHEALTHY


def test_tgi_models_from_info_or_a_models_list() -> None:
    """TGI's one model comes from /info's model_id, or from an OpenAI models list."""
    adapter = adapter_for("tgi")
    assert adapter.served_models(b'{"model_id": "bigscience/bloom"}') == {"bigscience/bloom"}
    assert adapter.served_models(b'{"data": [{"id": "x"}]}') == {"x"}
    assert adapter.served_models(b'{"model_id": 7}') is None


# -- load parsing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\xff\xfe garbage",
        b"<html>502 Bad Gateway</html>",
        b'vllm:num_requests_running{model_name="m" 3\n',
        b'{"json": true}',
    ],
)
def test_garbage_metrics_give_no_reading(body: bytes) -> None:
    """A /metrics answer that is not Prometheus text (or not vLLM's) gives no reading, never an error."""
    assert adapter_for("vllm").read_load({"/metrics": body}) is None


def test_a_bad_line_keeps_what_came_before() -> None:
    """Text that stops parsing part way keeps the samples read before the bad line."""
    body = b"sglang:num_running_reqs 2\nsglang:num_queue_reqs{ 9\nsglang:token_usage 0.5\n"
    reading = adapter_for("sglang").read_load({"/metrics": body})
    assert reading is not None and (reading.running, reading.waiting, reading.kv_cache_usage) == (2, 0, None)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-1", "1e300", str(MAX_REQUESTS + 1)])
def test_unbelievable_counts_are_not_said(value: str) -> None:
    """NaN, infinite, negative and absurd counts are treated as not said (not clipped and passed on)."""
    body = f"tgi_queue_size {value}\ntgi_batch_current_size 2\n".encode()
    reading = adapter_for("tgi").read_load({"/metrics": body})
    assert reading is not None and (reading.running, reading.waiting) == (2, 0)


def test_counts_sum_over_label_sets_and_kv_takes_the_largest() -> None:
    """Several models or engines on one /metrics: requests add up, the KV-cache figure is the fullest one."""
    body = (
        b'vllm:num_requests_running{model_name="a"} 2\nvllm:num_requests_running{model_name="b"} 5\n'
        b'vllm:gpu_cache_usage_perc{model_name="a"} 0.9\nvllm:gpu_cache_usage_perc{model_name="b"} 0.2\n'
    )
    reading = adapter_for("vllm").read_load({"/metrics": body})
    assert reading is not None and (reading.running, reading.waiting, reading.kv_cache_usage) == (7, 0, 0.9)


def test_kv_fraction_bounds() -> None:
    """A fraction just over 1 (rounding) is 1; one far over 1, negative or NaN is not said."""
    assert fraction([1.005]) == 1.0
    assert fraction([1.5]) is None
    assert fraction([-0.1]) is None
    assert fraction([math.nan]) is None
    assert fraction([]) is None


def test_sums_past_the_bound_are_not_said() -> None:
    """Label sets each believable but adding up past the bound are not a reading."""
    assert request_count([MAX_REQUESTS, 1]) is None
    assert request_count([True]) is None
    assert request_count([1.6, 1.6]) == 3


def test_samples_looked_at_are_bounded() -> None:
    """Only the first MAX_SAMPLES samples of an answer are looked at."""
    body = b"".join(b"x_%d 1\n" % i for i in range(MAX_SAMPLES)) + b"tgi_queue_size 3\n"
    assert prometheus_samples(body, ["tgi_queue_size"]) == {}


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        (b"[]", None),
        (b'{"slots": []}', None),
        (b'[{"id": 0, "is_processing": true}, 3]', None),
        (b'[{"id": 0, "is_processing": "yes"}, {"id": 1, "state": 1}]', (1, 2)),
        (b"[" + b",".join([b'{"is_processing": false}'] * 64) + b"]", (0, 64)),
    ],
)
def test_llamacpp_slots_edge_cases(slots: bytes, expected: Any) -> None:
    """/slots must be a non-empty list of objects; ``is_processing`` true (or the older ``state`` 1) is busy."""
    reading = adapter_for("llamacpp").read_load({"/slots": slots})
    if expected is None:
        assert reading is None
    else:
        assert reading is not None and (reading.running, reading.parallel) == expected


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        (b'{"total_slots": 4, "default_generation_settings": {"n_ctx": 512}}', 4),
        (b'{"total_slots": 0}', None),
        (b'{"total_slots": true}', None),
        (b'{"total_slots": "4"}', None),
        (b"[4]", None),
    ],
)
def test_llamacpp_parallel_from_props_when_slots_are_off(props: bytes, expected: Any) -> None:
    """With ``--no-slots`` (/slots 501), ``/props`` ``total_slots`` is the parallelism; /slots still wins."""
    adapter = adapter_for("llamacpp")
    metrics = b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n"
    reading = adapter.read_load({"/props": props, "/metrics": metrics})
    assert reading is not None and reading.parallel == expected
    both = adapter.read_load({"/slots": b'[{"id": 0, "is_processing": false}]', "/props": props})
    assert both is not None and both.parallel == 1


def test_wire_form_of_a_reading() -> None:
    """A reading on the wire: known, unknown KV cache negative, unknown parallelism 0, the age bounded."""
    reading = base.LoadReading(running=2, waiting=1)
    wire = reading.to_wire(age_ms=250)
    assert (wire.known, wire.running, wire.waiting, wire.kv_cache_usage, wire.parallel, wire.age_ms) == (
        True,
        2,
        1,
        -1.0,
        0,
        250,
    )
    assert base.LoadReading.of() is None


@given(st.binary(max_size=2048))
def test_any_bytes_are_safe_for_every_adapter(body: bytes) -> None:
    """No bytes from an engine make an adapter raise: load, models, health, errors and stream events."""
    for adapter in ADAPTERS.values():
        adapter.read_load({path: body for path in adapter.load_paths})
        adapter.served_models(body)
        adapter.check_health(200, body)
        adapter.check_health(503, body)
        error = adapter.engine_error(500, body)
        assert error.code in base.ERROR_CODES
        adapter.stream_event(body)
