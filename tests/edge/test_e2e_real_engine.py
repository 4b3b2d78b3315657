"""End to end against a real engine: the ``openai`` package through an Edge
and Nodes started with ``twistd -n`` to llama-cpp-python's OpenAI server
running a tiny llama model written by :mod:`twisted_iop.testing.engines.tiny_model`.

The engine runs one request at a time and the Edge is configured with more
(capacity 4), as an operator who does not know the engine's parallelism
would; ``make llama-engine`` installs it (``make test`` does).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from twisted_iop.testing.engines.llama_engine import (
    EngineFleet,
    LlamaEngine,
    start_engine_fleet,
    start_llama_engine,
    wait_until,
)
from twisted_iop.testing.engines.openai_load import Outcome, summary
from twisted_iop.testing.engines.openai_load import ask as ask_model
from twisted_iop.testing.engines.openai_load import load as load_clients
from twisted_iop.testing.engines.tiny_model import tiny_model

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
#: The engine's context, in tokens (the tiny model is written for it).
N_CTX = 512
#: What the Edge is told each engine can run at once (the engine runs one).
CAPACITY = 4
#: The load: 6 clients, one request after another, until this many requests ended (a busy
#: machine takes longer, never fewer requests).
LOAD_CLIENTS = 6
LOAD_REQUESTS = 30
#: A completion long enough that requests queue at the engine (about 0.3 s each here).
LOAD_MAX_TOKENS = 300
#: What llama-cpp-python answers for embeddings on a server started without ``--embedding``.
NO_EMBEDDINGS_MESSAGE = "Llama model must be created with embedding=True"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, written once per session."""
    return tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def one_engine(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineFleet]:
    """One single-slot engine behind one Node, configured at capacity 4 on the Edge."""
    log_dir = tmp_path_factory.mktemp("one-engine")
    engine = start_llama_engine(tiny_llama, log_dir, MODEL, n_ctx=N_CTX)
    try:
        fleet = start_engine_fleet([engine], log_dir, capacity=CAPACITY)
    except BaseException:
        engine.stop()
        raise
    yield fleet
    fleet.stop()
    engine.stop()


@pytest.fixture
def two_engines(tiny_llama: Path, tmp_path: Path) -> Iterator[EngineFleet]:
    """Two single-slot engines for one model, each behind its own Node at capacity 4."""
    engines: list[LlamaEngine] = []
    try:
        while len(engines) < 2:  # one at a time, so a failed start still stops the first
            engines.append(start_llama_engine(tiny_llama, tmp_path, MODEL, n_ctx=N_CTX))
        fleet = start_engine_fleet(engines, tmp_path, capacity=CAPACITY)
    except BaseException:
        for engine in engines:
            engine.stop()
        raise
    yield fleet
    fleet.stop()
    for engine in engines:
        engine.stop()


# -- the client's side ---------------------------------------------------------------


def ask(client: openai.OpenAI, stream: bool, max_tokens: int, prompt: str = "hi") -> Outcome:
    """One chat completion of :data:`MODEL`; every failure is kept in the outcome, never raised."""
    return ask_model(client, MODEL, stream, max_tokens, prompt)


def load(fleet: EngineFleet, clients: int, requests: int, during: Any = None, after_during: int = 0) -> list[Outcome]:
    """``clients`` threads asking :data:`MODEL` (every other request streamed) until ``requests``
    have ended (see :func:`twisted_iop.testing.engines.openai_load.load`)."""
    return load_clients(fleet.client, MODEL, clients, requests, LOAD_MAX_TOKENS, during, after_during)


def counted_tokens(fleet: EngineFleet, metric: str = "iop_tokens_total") -> dict[str, float]:
    """The Edge's ``metric`` (``iop_tokens_total``, or ``iop_tokens_estimated_total``) for
    :data:`MODEL`, summed over providers, by direction."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(fleet.metrics_text()):
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("model") == MODEL:
                direction = sample.labels.get("direction", "")
                totals[direction] = totals.get(direction, 0.0) + sample.value
    return totals


# -- the tests ----------------------------------------------------------------------


def test_streaming_and_not_through_edge_and_node(one_engine: EngineFleet) -> None:
    """A whole answer and a stream from the engine reach the openai client with every token asked for."""
    client = one_engine.client()
    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=24)
    assert whole.choices[0].message.content
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 24

    streamed = ask(client, stream=True, max_tokens=24, prompt="hello")
    assert streamed.ok, streamed
    assert streamed.chunks == 24, streamed


def test_six_clients_on_a_single_slot_engine_at_capacity_4_get_no_503(one_engine: EngineFleet) -> None:
    """6 clients on an engine that runs one request at a time, configured at capacity 4, until
    LOAD_REQUESTS have ended: the busy engine is not taken for a dead one, and every request
    gets its whole answer."""
    outcomes = load(one_engine, LOAD_CLIENTS, LOAD_REQUESTS)
    refused = [o for o in outcomes if o.status == 503]
    failed = [o for o in outcomes if not o.ok]
    assert not refused, summary(outcomes)
    assert not failed, summary(outcomes)
    assert len(outcomes) >= LOAD_REQUESTS


def test_prompt_over_the_context_is_an_error_for_the_client(one_engine: EngineFleet) -> None:
    """A prompt longer than the engine's context: a stream ends in an error (not an empty success),
    a whole answer is 400 ``context_length_exceeded``."""
    client = one_engine.client()
    prompt = "word " * (N_CTX + 100)
    streamed = ask(client, stream=True, max_tokens=8, prompt=prompt)
    assert streamed.error, streamed
    assert streamed.chunks == 0, streamed

    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=8)
    assert raised.value.code == "context_length_exceeded", raised.value.body
    assert "maximum context length" in raised.value.message


def test_an_engine_5xx_reaches_the_client_with_its_message(one_engine: EngineFleet) -> None:
    """Embeddings on an engine started without them: the client gets a 5xx carrying the engine's own reason."""
    client = one_engine.client()
    with pytest.raises(openai.APIStatusError) as raised:
        client.embeddings.create(model=MODEL, input=["a"])
    assert raised.value.status_code >= 500, raised.value
    assert NO_EMBEDDINGS_MESSAGE in raised.value.message, raised.value.message
    assert raised.value.code == "provider_error", raised.value.body


def test_tokens_counted_equal_the_engines_usage(one_engine: EngineFleet) -> None:
    """The Edge's token counters grow by exactly the usage the engine reported for each answer."""
    client = one_engine.client()
    before = counted_tokens(one_engine)
    prompt_tokens = completion_tokens = 0
    for prompt, max_tokens in (("hi", 5), ("a somewhat longer question than that", 17), ("three", 40)):
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens
        )
        assert answer.usage is not None
        prompt_tokens += answer.usage.prompt_tokens
        completion_tokens += answer.usage.completion_tokens

    def grown() -> dict[str, float]:
        now = counted_tokens(one_engine)
        return {d: now.get(d, 0.0) - before.get(d, 0.0) for d in ("prompt", "completion")}

    wait_until(
        lambda: grown() == {"prompt": prompt_tokens, "completion": completion_tokens},
        timeout=10,
        message=f"iop_tokens_total to grow by {prompt_tokens} prompt and {completion_tokens} completion tokens",
    )


def test_kill_9_of_one_engine_under_load_fails_over_to_the_other(two_engines: EngineFleet) -> None:
    """6 clients on two engines; one engine gets ``kill -9`` halfway: a request fails only if it had
    already received tokens from that engine, every other one gets its whole answer from the other."""
    killed: list[float] = []

    def kill_first_engine() -> None:
        killed.append(time.monotonic())
        two_engines.engines["p1"].kill()

    outcomes = load(two_engines, LOAD_CLIENTS, 24, during=kill_first_engine, after_during=LOAD_CLIENTS)
    kill_time = killed[0]
    failed = [o for o in outcomes if not o.ok]
    not_started = [o for o in failed if o.chunks == 0 or o.started > kill_time]
    assert not not_started, "not yet started on the killed engine, failed: " + summary(not_started)
    # Streams already running on the killed engine when it died: at most one (it runs one at a time).
    assert len(failed) <= 1, summary(failed)
    after = [o for o in outcomes if o.started > kill_time]
    assert len(after) >= LOAD_CLIENTS and all(o.ok for o in after), "after the kill: " + summary(after)


def test_a_stream_without_usage_counts_estimated_tokens(one_engine: EngineFleet) -> None:
    """llama-cpp-python sends no usage in its streams: the Edge counts one completion token per
    content chunk the client received (and an estimated prompt), labelled estimated in /metrics
    and in the Control Plane's status view (``tokens.estimated``)."""
    client = one_engine.client()
    before, estimated_before = counted_tokens(one_engine), counted_tokens(one_engine, "iop_tokens_estimated_total")
    streamed = ask(client, stream=True, max_tokens=12, prompt="count these")
    assert streamed.ok and streamed.chunks > 0, streamed

    def grown() -> dict[str, float]:
        now, estimated = counted_tokens(one_engine), counted_tokens(one_engine, "iop_tokens_estimated_total")
        return {
            "completion": now.get("completion", 0.0) - before.get("completion", 0.0),
            "estimated_completion": estimated.get("completion", 0.0) - estimated_before.get("completion", 0.0),
            "estimated_prompt": estimated.get("prompt", 0.0) - estimated_before.get("prompt", 0.0),
        }

    counted = wait_until(
        lambda: grown()["estimated_completion"] > 0 and grown(), timeout=10, message="estimated tokens"
    )
    assert counted["estimated_completion"] == counted["completion"]
    assert streamed.chunks - 1 <= counted["estimated_completion"] <= streamed.chunks + 1
    assert counted["estimated_prompt"] >= 1

    # The Control Plane's view of the provider says the same part of its tokens is estimated.
    estimated = counted_tokens(one_engine, "iop_tokens_estimated_total")
    expected = {"prompt": estimated["prompt"], "completion": estimated["completion"]}
    wait_until(
        lambda: one_engine.providers()["node-1"]["tokens"]["estimated"] == expected,
        timeout=10,
        message=f"the status view's tokens.estimated to be {expected}",
    )
