"""The Node's check of a desired instance, and the engine it would run (pure, no I/O).

:func:`check_instance` takes an instance as the Control Plane asks for it
(profile, model, parameters as text, capacity) and this Node's declared
profiles, and either refuses it with a reason (no such profile, a
parameter the profile does not declare, a value of the wrong type, out of
bounds, not among the choices or not matching the pattern, a required one
missing) or returns the values the engine will get (defaults filled in).
:func:`allocate` picks a free port of the profile's range and free GPU
slots; :func:`render_launch` substitutes the values into the profile's
launch template **element by element**: every argument of the template
stays one argument, whatever a value contains (spaces, quotes, ``;``),
and no shell ever runs it. The executable is the owner's: a value can
never choose it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Union

import attrs

from twisted_iop.deployments.spec import spec_hash
from twisted_iop.ids import id_problem
from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.deployments.parameters import MAX_VALUE_CHARACTERS, check_value
from twisted_iop.node.deployments.profiles import PLACEHOLDER, EngineProfileConfig
from twisted_iop.node.launch.config import LaunchConfig
from twisted_iop.wire import control_pb2 as pb

#: A model name: what engines take as a model id (a Hugging Face repo id, an Ollama
#: tag, a file name), never starting with ``-`` (it would read as an option), ``.``
#: or ``/``, and never holding ``..`` (a template may put it in a path).
MODEL_NAME = re.compile(r"^(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.:/@+=-]{0,255}$")
#: The most parameters one desired instance may carry.
MAX_INSTANCE_PARAMETERS = 64
#: Longest instance id, profile, deployment or parameter name kept from the wire.
MAX_NAME_CHARACTERS = 128
#: Longest model name.
MAX_MODEL_CHARACTERS = 256
#: The largest capacity (leases) an instance may ask for.
MAX_CAPACITY = 100_000
#: Where an instance's engine listens: loopback only, on the port the Node gave it.
INSTANCE_HOST = "127.0.0.1"


@attrs.frozen
class InstanceSpec:
    """One desired instance, its wire values already bounded (see :func:`spec_from_wire`)."""

    instance_id: str
    profile: str
    model: str
    parameters: Mapping[str, str] = attrs.field(factory=dict)
    capacity: int = 0
    deployment: str = ""
    generation: int = 0
    #: The spec hash of what is asked (the Control Plane computes the same), taken once.
    spec_hash: str = attrs.field(init=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "spec_hash", spec_hash(self.profile, self.model, self.parameters, self.capacity))


@attrs.frozen
class Refusal:
    """Why the Node will not run an instance (for people: no command line, no address)."""

    reason: str


@attrs.frozen
class CheckedInstance:
    """An instance the Node's profile allows, with every parameter's value (defaults filled in)."""

    spec: InstanceSpec
    profile: EngineProfileConfig
    values: Mapping[str, str]


@attrs.frozen
class Placement:
    """The port and GPU slots an instance holds."""

    port: int
    gpus: tuple[int, ...] = ()


def spec_from_wire(desired: pb.DesiredInstance) -> InstanceSpec:
    """The wire's desired instance as an :class:`InstanceSpec`, every text cut to a bound.

    A text longer than any valid value is cut, so it still fails its check
    (with a reason) instead of being carried around whole.
    """
    parameters = {
        name[:MAX_NAME_CHARACTERS]: value[: MAX_VALUE_CHARACTERS + 1]
        for name, value in list(desired.parameters.items())[: MAX_INSTANCE_PARAMETERS + 1]
    }
    return InstanceSpec(
        instance_id=desired.instance_id[:MAX_NAME_CHARACTERS],
        profile=desired.profile[:MAX_NAME_CHARACTERS],
        model=desired.model[: MAX_MODEL_CHARACTERS + 1],
        parameters=parameters,
        capacity=desired.capacity,
        deployment=desired.deployment[:MAX_NAME_CHARACTERS],
        generation=desired.generation,
    )


def check_instance(spec: InstanceSpec, profiles: Collection[EngineProfileConfig]) -> Union[CheckedInstance, Refusal]:
    """Check ``spec`` against this Node's profiles: the values to run it with, or why not."""
    problem = id_problem("instance_id", spec.instance_id)
    if problem:
        return Refusal(problem)
    profile = next((p for p in profiles if p.name == spec.profile), None)
    if profile is None:
        return Refusal(f"no engine profile {_shown(spec.profile)} on this node")
    if MODEL_NAME.match(spec.model) is None:
        return Refusal(f"model {_shown(spec.model)} is not a model name (1-256 letters, digits and ._:/@+=-, no '..')")
    if profile.models and spec.model not in profile.models:
        return Refusal(f"model {_shown(spec.model)} is not one profile {profile.name} serves")
    if spec.capacity > MAX_CAPACITY:
        return Refusal(f"capacity {spec.capacity} is more than {MAX_CAPACITY}")
    if len(spec.parameters) > MAX_INSTANCE_PARAMETERS:
        return Refusal(f"more than {MAX_INSTANCE_PARAMETERS} parameters")
    for name in sorted(spec.parameters):
        if profile.parameter(name) is None:
            declared = ", ".join(p.name for p in profile.parameters) or "none"
            return Refusal(f"parameter {_shown(name)} is not declared by profile {profile.name} (declared: {declared})")
    values: dict[str, str] = {}
    for parameter in profile.parameters:
        value = spec.parameters.get(parameter.name, parameter.default)
        if value is None:
            return Refusal(f"parameter {parameter.name} is required by profile {profile.name}")
        problem = check_value(parameter, value)
        if problem is None and parameter.type == "string" and parameter.pattern is None and value.startswith("-"):
            problem = "must not start with '-' (it would read as an option)"
        if problem is not None:
            return Refusal(f"parameter {parameter.name} {problem}")
        values[parameter.name] = value
    return CheckedInstance(spec, profile, values)


def allocate(
    profile: EngineProfileConfig, taken_ports: Collection[int], taken_gpus: Collection[int], gpus: int
) -> Union[Placement, Refusal]:
    """The lowest free port of the profile's range and its lowest free GPU slots, or why none."""
    first, last = profile.ports
    port = next((p for p in range(first, last + 1) if p not in taken_ports), None)
    if port is None:
        return Refusal(f"no free port in {first}-{last} for profile {profile.name}")
    free = [slot for slot in range(gpus) if slot not in taken_gpus]
    if len(free) < profile.gpus_per_instance:
        return Refusal(
            f"profile {profile.name} needs {profile.gpus_per_instance} GPU slots; {len(free)} of {gpus} are free"
        )
    return Placement(port, tuple(free[: profile.gpus_per_instance]))


def render(template: str, values: Mapping[str, str]) -> str:
    """One template element with every ``{name}`` replaced by its value (one pass: a value is never re-read)."""
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def template_values(checked: CheckedInstance, placement: Placement) -> dict[str, str]:
    """What a profile's templates may name: its parameters, ``model``, ``port`` and ``gpu``."""
    return {
        **checked.values,
        "model": checked.spec.model,
        "port": str(placement.port),
        "gpu": ",".join(str(slot) for slot in placement.gpus),
    }


def render_launch(checked: CheckedInstance, placement: Placement) -> LaunchConfig:
    """The profile's launch block with its command and env rendered, element by element."""
    launch = checked.profile.launch
    values = template_values(checked, placement)
    command = (launch.command[0], *(render(argument, values) for argument in launch.command[1:]))
    env = {name: render(value, values) for name, value in launch.env.items()}
    return attrs.evolve(launch, command=command, env=env)


def instance_provider(checked: CheckedInstance, placement: Placement) -> NodeProviderConfig:
    """The provider an instance runs as: launched like a configured ``launch:`` provider, on loopback."""
    return NodeProviderConfig(
        provider_id=checked.spec.instance_id,
        kind=checked.profile.kind,
        models=(checked.spec.model,),
        base_url=f"http://{INSTANCE_HOST}:{placement.port}",
        launch=render_launch(checked, placement),
    )


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 64 else repr(value[:61] + "...")
