"""The Node's check of a desired instance, its rendering and the convergence plan (pure)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from twisted_iop.node.config import parse_node_config
from twisted_iop.node.deployments.checker import (
    CheckedInstance,
    InstanceSpec,
    Placement,
    Refusal,
    allocate,
    check_instance,
    instance_provider,
    render,
    spec_from_wire,
)
from twisted_iop.node.deployments.parameters import ParameterSpec, check_value
from twisted_iop.node.deployments.plan import plan_convergence
from twisted_iop.node.deployments.profiles import EngineProfileConfig
from twisted_iop.testing.harness import MOCK_PROVIDER
from twisted_iop.wire import control_pb2 as pb


def profile(**parameters: dict[str, Any]) -> EngineProfileConfig:
    """A parsed mock profile with ``parameters`` (and the issue's tokens_per_second), its command naming them all."""
    declared = {"tokens_per_second": {"type": "int", "min": 1, "max": 1000, "default": 50}, **parameters}
    command = [
        "iop-mock-provider",
        "--listen",
        "tcp:{port}:interface=127.0.0.1",
        "--models",
        "{model}",
        *(f"{{{name}}}" for name in declared),
    ]
    data = {
        "node_id": "n",
        "gpus": 2,
        "engines": [
            {
                "name": "mock",
                "kind": "openai",
                "launch": {"command": command, "env": {"GPU": "{gpu}"}},
                "ports": [28200, 28201],
                "parameters": declared,
            }
        ],
    }
    return parse_node_config(data, {"PATH": str(Path(MOCK_PROVIDER).parent)}).engines[0]


def spec(**parameters: str) -> InstanceSpec:
    """A desired instance of the mock profile."""
    return InstanceSpec(instance_id="chat-1", profile="mock", model="m1", parameters=parameters, capacity=4)


def refused(result: Any) -> str:
    """The reason of a refusal (fails if it was accepted)."""
    assert isinstance(result, Refusal), result
    return result.reason


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        (InstanceSpec("chat-1", "vllm", "m1"), "no engine profile 'vllm' on this node"),
        (spec(speed="1"), "parameter 'speed' is not declared by profile mock (declared: tokens_per_second)"),
        (spec(tokens_per_second="fast"), "parameter tokens_per_second must be a whole number, not 'fast'"),
        (spec(tokens_per_second="1001"), "parameter tokens_per_second must be at most 1000, not 1001"),
        (spec(tokens_per_second="0"), "parameter tokens_per_second must be at least 1, not 0"),
        (spec(tokens_per_second=" 5"), "parameter tokens_per_second must be a whole number"),
        (InstanceSpec("chat-1", "mock", "--evil"), "model '--evil' is not a model name"),
        (InstanceSpec("chat-1", "mock", "org/../../etc/passwd"), "is not a model name"),
        (InstanceSpec("chat-1", "mock", "/etc/passwd"), "is not a model name"),
        (InstanceSpec("bad id!", "mock", "m1"), "instance_id 'bad id!' is malformed"),
    ],
)
def test_a_spec_the_profile_does_not_allow_is_refused_with_its_reason(asked: InstanceSpec, reason: str) -> None:
    """Unknown profile, undeclared parameter, wrong type, out of bounds, a bad model or id: refused, saying why."""
    assert reason in refused(check_instance(asked, [profile()]))


def test_a_profile_may_list_the_models_it_serves() -> None:
    """With ``models:``, a model not listed is refused; a listed one is checked as usual."""
    declared = attrs.evolve(profile(), models=("m1", "org/m2"))
    assert "model 'm3' is not one profile mock serves" in refused(
        check_instance(attrs.evolve(spec(), model="m3"), [declared])
    )
    assert isinstance(check_instance(attrs.evolve(spec(), model="org/m2"), [declared]), CheckedInstance)


def test_choices_patterns_and_required_parameters() -> None:
    """An enum takes only its choices, a string must match its pattern, a parameter without default is required."""
    declared = profile(
        dtype={"type": "enum", "choices": ["bf16", "fp8"]},
        name={"type": "string", "pattern": "[a-z]{1,8}", "default": "x"},
        free={"type": "string", "default": "ok"},
    )
    assert "parameter dtype is required by profile mock" in refused(check_instance(spec(), [declared]))
    assert "parameter dtype must be one of bf16, fp8, not 'int4'" in refused(
        check_instance(spec(dtype="int4"), [declared])
    )
    assert "parameter name does not match the pattern" in refused(
        check_instance(spec(dtype="fp8", name="ABC"), [declared])
    )
    assert "must not start with '-'" in refused(check_instance(spec(dtype="fp8", free="--port=1"), [declared]))
    checked = check_instance(spec(dtype="fp8"), [declared])
    assert isinstance(checked, CheckedInstance)
    assert checked.values == {"tokens_per_second": "50", "dtype": "fp8", "name": "x", "free": "ok"}


def test_allocation_takes_the_lowest_free_port_and_gpu_slots_and_refuses_when_none_is_left() -> None:
    """Ports come from the profile's range and GPU slots from the node's; none free is a refusal."""
    declared = attrs.evolve(profile(), gpus_per_instance=1)
    assert allocate(declared, set(), set(), 2) == Placement(28200, (0,))
    assert allocate(declared, {28200}, {0}, 2) == Placement(28201, (1,))
    assert refused(allocate(declared, {28200, 28201}, set(), 2)) == "no free port in 28200-28201 for profile mock"
    assert "needs 1 GPU slots; 0 of 2 are free" in refused(allocate(declared, set(), {0, 1}, 2))


def test_the_instance_provider_is_a_launched_provider_on_loopback_with_its_values_substituted() -> None:
    """The rendered provider listens on its port, runs the owner's executable, and carries the values as arguments."""
    checked = check_instance(spec(tokens_per_second="100"), [profile()])
    assert isinstance(checked, CheckedInstance)
    provider = instance_provider(checked, Placement(28201, (1,)))
    assert provider.provider_id == "chat-1" and provider.kind == "openai" and provider.models == ("m1",)
    assert provider.base_url == "http://127.0.0.1:28201"
    assert provider.launch is not None
    assert provider.launch.command[0] == profile().launch.command[0]
    assert provider.launch.command[1:] == ("--listen", "tcp:28201:interface=127.0.0.1", "--models", "m1", "100")
    assert provider.launch.env == {"GPU": "1"}


# -- properties --------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=30)


@st.composite
def parameter_and_value(draw: st.DrawFn) -> tuple[ParameterSpec, str]:
    """A parameter spec of any type and a value that may or may not fit it."""
    kind = draw(st.sampled_from(["int", "number", "string", "enum", "bool"]))
    minimum = maximum = None
    choices: tuple[str, ...] = ()
    pattern = None
    if kind in ("int", "number"):
        minimum = draw(st.none() | st.integers(-100, 100).map(float))
        maximum = draw(st.none() | st.integers(-100, 100).map(float))
        assume(minimum is None or maximum is None or minimum <= maximum)
        value = draw(st.integers(-200, 200).map(str) | st.floats(-200, 200).map(repr) | TEXT)
    elif kind == "enum":
        choices = tuple(draw(st.lists(TEXT, min_size=1, max_size=4, unique=True)))
        value = draw(st.sampled_from(choices) | TEXT)
    elif kind == "string":
        pattern = draw(st.none() | st.just("[a-z]{1,5}"))
        value = draw(TEXT)
    else:
        value = draw(st.sampled_from(["true", "false"]) | TEXT)
    return ParameterSpec("p", kind, minimum, maximum, choices, pattern), value


def oracle(parameter: ParameterSpec, value: str) -> bool:
    """Whether ``value`` fits ``parameter``, written the obvious way."""
    if parameter.type == "bool":
        return value in ("true", "false")
    if parameter.type == "enum":
        return value in parameter.choices
    if parameter.type == "string":
        return parameter.pattern is None or re.fullmatch(parameter.pattern, value) is not None
    number: Optional[float]
    if parameter.type == "int":
        number = float(value) if re.fullmatch(r"-?[0-9]+", value) else None
    else:
        number = float(value) if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", value) else None
    if number is None:
        return False
    return (parameter.minimum is None or number >= parameter.minimum) and (
        parameter.maximum is None or number <= parameter.maximum
    )


@given(parameter_and_value())
def test_a_value_is_accepted_exactly_when_it_fits_its_declaration(case: tuple[ParameterSpec, str]) -> None:
    """check_value accepts a value iff the declared type, bounds, choices and pattern allow it."""
    parameter, value = case
    assert (check_value(parameter, value) is None) == oracle(parameter, value)


@given(st.lists(TEXT, min_size=1, max_size=6), st.dictionaries(st.sampled_from(["a", "b", "model"]), TEXT))
def test_rendering_keeps_one_argument_per_template_element(templates: list[str], values: dict[str, str]) -> None:
    """Whatever a value holds (spaces, quotes, ;, braces), each template element renders to exactly one argument."""
    values = {"a": "", "b": "", "model": "", **values}
    elements = [t + "{a}" for t in templates]
    rendered = [render(element, values) for element in elements]
    assert len(rendered) == len(elements)
    for template, out in zip(templates, rendered, strict=True):
        assert out == render(template, values) + values["a"]


@given(st.text(max_size=40))
def test_a_value_is_substituted_once_and_never_re_read(value: str) -> None:
    """A value that itself looks like a placeholder stays literal text."""
    assert render("x={a}", {"a": value, "b": "SECRET"}) == "x=" + value


@given(
    st.dictionaries(st.sampled_from(list("abcdef")), st.sampled_from(["h1", "h2"])),
    st.dictionaries(st.sampled_from(list("abcdef")), st.sampled_from(["h1", "h2"])),
)
def test_the_plan_starts_stops_restarts_and_keeps_exactly_what_it_must(
    desired: dict[str, str], running: dict[str, str]
) -> None:
    """Every id lands in one step; a matching hash is kept, never restarted; applying the plan twice changes nothing."""
    plan = plan_convergence(desired, running)
    steps = [*plan.start, *plan.stop, *plan.restart, *plan.keep]
    assert sorted(steps) == sorted(set(desired) | set(running))
    assert all(running[i] == desired[i] for i in plan.keep)
    assert all(running[i] != desired[i] for i in plan.restart)
    assert plan_convergence(desired, dict(desired)).changes_nothing


def test_wire_values_are_bounded_before_they_are_checked() -> None:
    """A huge model name or parameter from the wire is cut to a bound, then refused with a reason."""
    desired = pb.DesiredInstance(
        instance_id="chat-1", profile="mock", model="m" * 100_000, parameters={"tokens_per_second": "9" * 100_000}
    )
    asked = spec_from_wire(desired)
    assert len(asked.model) <= 257 and len(asked.parameters["tokens_per_second"]) <= 1025
    assert "is not a model name" in refused(check_instance(asked, [profile()]))
