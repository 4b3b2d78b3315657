"""What the Control Plane shows of a provider's engine: its load, tokens,
saturation and cool-down, with every figure from the wire checked."""

from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twisted_iop.testing.provider_views import edge_status_body
from twisted_iop.testing.provider_views import shown_provider as _shown
from twisted_iop.testing.wires.peers import set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb


def _provider(**engine: Any) -> pb.ProviderSnapshot:
    provider = pb.ProviderSnapshot(provider_id="p1", kind="vllm", capacity=4, in_flight=1)
    return set_engine(provider, **engine)


def test_an_engine_reading_is_shown_beside_the_capacity_counters() -> None:
    """The engine's running, waiting, KV cache, parallelism and age, the tokens
    counted, tokens per second and both flags are members of the provider."""
    shown = _shown(_provider(saturated=True))
    assert shown["engine"] == {
        "running": 1,
        "waiting": 3,
        "kv_cache_usage": 0.42,
        "parallel": 1,
        "age_seconds": 1.2,
    }
    assert shown["tokens"] == {"prompt": 1200, "completion": 3400, "estimated": {"prompt": 0, "completion": 0}}
    assert shown["tokens_per_second"] == 37.5
    assert (shown["saturated"], shown["cooling_down"]) == (True, False)
    assert shown["general"] == {"capacity": 4, "in_flight": 1, "queued": 0}


def test_the_estimated_part_of_the_tokens_is_shown_beside_the_totals() -> None:
    """Tokens the Node estimated (a stream without usage) are the
    ``estimated`` part of the provider's tokens, in the view that renders
    bytes and in the reference alike."""
    provider = _provider(prompt_tokens=1200, completion_tokens=3400)
    provider.estimated_prompt_tokens = 300
    provider.estimated_completion_tokens = 900
    shown = _shown(provider)
    assert shown["tokens"] == {"prompt": 1200, "completion": 3400, "estimated": {"prompt": 300, "completion": 900}}
    response = snapshot("edge-1", nodes=1)
    set_engine(response.nodes[0].providers[0], estimated_prompt_tokens=7, estimated_completion_tokens=11)
    rendered = json.loads(edge_status_body(response, {"site": "a"}))
    assert rendered["nodes"][0]["providers"][0]["tokens"]["estimated"] == {"prompt": 7, "completion": 11}


def test_what_the_engine_does_not_say_is_null() -> None:
    """No reading (an older Edge, an engine without load signals) is a null
    engine; a KV cache or parallelism the engine does not say is null."""
    old = _shown(pb.ProviderSnapshot(provider_id="p1"))
    assert old["engine"] is None
    assert old["tokens"] == {"prompt": 0, "completion": 0, "estimated": {"prompt": 0, "completion": 0}}
    assert old["tokens_per_second"] == 0.0
    assert (old["saturated"], old["cooling_down"]) == (False, False)
    partial = _shown(_provider(kv_cache_usage=-1.0, parallel=0))
    assert partial["engine"]["kv_cache_usage"] is None and partial["engine"]["parallel"] is None


def test_figures_out_of_range_are_bounded_or_null() -> None:
    """NaN, infinities and negative figures never reach the JSON: a KV cache
    over 1 is 1, a rate that is no rate is null; huge counts stay exact."""
    for nonsense in (math.nan, -math.inf, -0.5):
        shown = _shown(_provider(kv_cache_usage=nonsense, tokens_per_second=nonsense))
        assert shown["engine"]["kv_cache_usage"] is None and shown["tokens_per_second"] is None
    over = _shown(_provider(kv_cache_usage=math.inf, tokens_per_second=math.inf))
    assert over["engine"]["kv_cache_usage"] == 1.0 and over["tokens_per_second"] is None
    huge = _shown(_provider(prompt_tokens=2**64 - 1, running=2**32 - 1, age_ms=2**32 - 1))
    assert huge["tokens"]["prompt"] == 2**64 - 1 and huge["engine"]["running"] == 2**32 - 1
    assert huge["engine"]["age_seconds"] == (2**32 - 1) / 1000


@given(
    kv=st.floats(allow_nan=True, allow_infinity=True),
    rate=st.floats(allow_nan=True, allow_infinity=True),
    counts=st.tuples(*(st.integers(0, 2**32 - 1) for _ in range(4))),
    tokens=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    flags=st.tuples(st.booleans(), st.booleans()),
)
def test_any_figures_from_the_wire_give_valid_json(
    kv: float, rate: float, counts: tuple[int, ...], tokens: tuple[int, int], flags: tuple[bool, bool]
) -> None:
    """Whatever floats and counts an Edge sends, the provider is strict JSON
    that the document describes, with a KV cache in 0..1 and a rate >= 0."""
    running, waiting, parallel, age_ms = counts
    shown = _shown(
        _provider(
            kv_cache_usage=kv,
            tokens_per_second=rate,
            running=running,
            waiting=waiting,
            parallel=parallel,
            age_ms=age_ms,
            prompt_tokens=tokens[0],
            completion_tokens=tokens[1],
            estimated_prompt_tokens=tokens[0],
            estimated_completion_tokens=tokens[1],
            saturated=flags[0],
            cooling_down=flags[1],
        )
    )
    usage = shown["engine"]["kv_cache_usage"]
    assert usage is None or 0.0 <= usage <= 1.0
    assert shown["tokens_per_second"] is None or shown["tokens_per_second"] >= 0.0


@settings(max_examples=50)
@given(kv=st.floats(), rate=st.floats(), waiting=st.integers(0, 2**32 - 1), cooling=st.booleans())
def test_the_status_view_shows_the_engine_as_the_reference_does(
    kv: float, rate: float, waiting: int, cooling: bool
) -> None:
    """GET /edges/{id}/status with an engine reading on one provider is byte
    for byte the compact JSON of the reference, strict JSON, and carries the
    reading on that provider alone."""
    response = snapshot("edge-1", nodes=2)
    set_engine(
        response.nodes[0].providers[0], kv_cache_usage=kv, tokens_per_second=rate, waiting=waiting, cooling_down=cooling
    )
    body = edge_status_body(response, {"site": "a"})
    rendered = json.loads(body, parse_constant=_refuse)
    first, second = (node["providers"][0] for node in rendered["nodes"])
    assert first["cooling_down"] is cooling and first["engine"]["waiting"] == waiting
    assert second["engine"] is None and second["cooling_down"] is False


def _refuse(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")
