"""The deployment spec: parsed once, defaults filled, every error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from twisted_iop.controlplane.deployments.spec import MAX_REPLICAS, SpecError, parse_spec
from twisted_iop.deployments.spec import spec_hash

CHAT = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}


def test_a_minimal_spec_takes_the_defaults() -> None:
    """Model and profile alone: one replica per edge, capacity auto, offline wait, every edge and node."""
    spec = parse_spec("chat", {"model": "m1", "profile": "mock"})
    assert (spec.replicas_per_edge, spec.capacity, spec.offline, spec.edge_selector, spec.node_selector) == (
        1,
        0,
        "wait",
        "",
        "",
    )
    assert spec.as_json()["capacity"] == "auto"
    assert "rollout" not in spec.as_json()


def test_the_spec_reads_back_as_it_was_given() -> None:
    """as_json is what PUT takes: parsing it again gives the same spec."""
    body = {**CHAT, "replicas_per_edge": 2, "capacity": 4, "offline": "skip", "rollout": {"max_in_flight": 3}}
    spec = parse_spec("chat", body)
    assert parse_spec("chat", spec.as_json()) == spec
    assert spec.as_json()["rollout"] == {"max_in_flight": 3}


def test_the_instance_hash_is_the_shared_one_of_the_values_as_text() -> None:
    """The Control Plane's hash is the Node's: spec_hash of profile, model, parameters as text, capacity."""
    spec = parse_spec("chat", {**CHAT, "capacity": 4, "parameters": {"tokens_per_second": 100, "fast": True}})
    assert spec.parameters_text() == {"tokens_per_second": "100", "fast": "true"}
    assert spec.spec_hash == spec_hash("mock", "m1", {"tokens_per_second": "100", "fast": "true"}, 4)


def test_a_whole_number_written_with_a_point_is_an_integer() -> None:
    """capacity 4.0 and replicas_per_edge 2.0 are the integers 4 and 2 (JSON does not tell them apart)."""
    spec = parse_spec("chat", {**CHAT, "capacity": 4.0, "replicas_per_edge": 2.0})
    assert (spec.capacity, spec.replicas_per_edge) == (4, 2)
    assert spec == parse_spec("chat", {**CHAT, "capacity": 4, "replicas_per_edge": 2})


def test_parameters_in_any_order_are_the_same_spec() -> None:
    """Two bodies that differ only in their parameters' order give equal specs and hashes."""
    one = parse_spec("chat", {**CHAT, "parameters": {"a": 1, "b": "x"}})
    two = parse_spec("chat", {**CHAT, "parameters": {"b": "x", "a": 1}})
    assert one == two and one.spec_hash == two.spec_hash


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": "../etc/passwd"}, "model"),
        ({"model": None}, "model"),
        ({"profile": "bad profile"}, "profile"),
        ({"parameters": [1]}, "parameters"),
        ({"parameters": {"Bad": 1}}, "parameters.Bad"),
        ({"parameters": {"port": 1}}, "parameters.port"),
        ({"parameters": {"x": [1]}}, "parameters.x"),
        ({"parameters": {"x": float("nan")}}, "parameters.x"),
        ({"parameters": {"x": "y" * 1025}}, "parameters.x"),
        ({"edge_selector": "site in (lab"}, "edge_selector"),
        ({"node_selector": 5}, "node_selector"),
        ({"replicas_per_edge": 0}, "replicas_per_edge"),
        ({"replicas_per_edge": MAX_REPLICAS + 1}, "replicas_per_edge"),
        ({"replicas_per_edge": True}, "replicas_per_edge"),
        ({"capacity": "many"}, "capacity"),
        ({"capacity": 0}, "capacity"),
        ({"capacity": 4.5}, "capacity"),
        ({"offline": "later"}, "offline"),
        ({"rollout": 3}, "rollout"),
        ({"rollout": None}, "rollout"),
        ({"parameters": None}, "parameters"),
        ({"edge_selector": None}, "edge_selector"),
        ({"rollout": {"batch": 1}}, "rollout.batch"),
        ({"rollout": {"max_in_flight": 0}}, "rollout.max_in_flight"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_every_error_names_its_field(change: dict[str, Any], field: str) -> None:
    """A bad value is refused with SpecError naming the field (and the message says it)."""
    with pytest.raises(SpecError) as caught:
        parse_spec("chat", {**CHAT, **change})
    assert caught.value.field == field
    assert repr(field) in str(caught.value)


@pytest.mark.parametrize("name", ["", "-chat", "a" * 49, "chat space", "chat/x"])
def test_a_malformed_name_is_refused(name: str) -> None:
    """A name that could not make an instance id is refused, naming the field 'name'."""
    with pytest.raises(SpecError) as caught:
        parse_spec(name, CHAT)
    assert caught.value.field == "name"
