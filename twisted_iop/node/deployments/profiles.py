"""node.yaml ``engines:``: the engine profiles a deployment may start on this Node.

A profile is a name, an engine ``kind``, a ``launch`` block whose command
and environment values are templates (``{model}``, ``{port}``, ``{gpu}`` and
the profile's own parameters), the ``ports`` its instances may listen on,
the GPU slots one instance takes, and the parameters a deployment may set,
each with a type and bounds. The executable (``command[0]``) is fixed: no
value a deployment sends can choose what runs. A template naming a
parameter the profile does not declare is a config error, so what a
deployment can change is exactly what the owner wrote down.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Optional

import attrs

from twisted_iop.configuration import HTTP_PROVIDER_KINDS, ConfigError, Section, parse_unique_list
from twisted_iop.ids import id_problem
from twisted_iop.node.deployments.parameters import (
    PARAMETER_TYPES,
    ParameterSpec,
    check_value,
)
from twisted_iop.node.launch.config import LaunchConfig, parse_launch

#: Names every template may use besides the profile's parameters.
BUILTIN_NAMES = ("model", "port", "gpu")
#: A parameter's name: a lower-case identifier.
PARAMETER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: ``{name}`` in a template.
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Bounds on what one profile declares.
MAX_PARAMETERS = 64
MAX_CHOICES = 256
#: GPU slots a Node may declare.
MAX_GPUS = 1024
#: The most profiles one node.yaml may declare.
MAX_PROFILES = 128


@attrs.frozen
class EngineProfileConfig:
    """One entry of ``engines:``."""

    name: str
    kind: str
    #: The launch block; its command and env values are templates (see the module docstring).
    launch: LaunchConfig
    ports: tuple[int, int]
    gpus_per_instance: int = 0
    parameters: tuple[ParameterSpec, ...] = ()
    #: The models an instance may serve (``models``); empty: any model name.
    models: tuple[str, ...] = ()

    def parameter(self, name: str) -> Optional[ParameterSpec]:
        """The parameter ``name``, if declared."""
        return next((p for p in self.parameters if p.name == name), None)


def parse_engines(raw: Any, environ: Mapping[str, str]) -> tuple[EngineProfileConfig, ...]:
    """Read the ``engines`` list."""
    if isinstance(raw, list) and len(raw) > MAX_PROFILES:
        raise ConfigError(f"engines: at most {MAX_PROFILES} profiles")
    return parse_unique_list(raw, "engines", "engine profiles", "name", lambda s: _profile(s, environ))


def parse_gpus(section: Section) -> int:
    """Read the node-level ``gpus`` (GPU slots; 0 by default)."""
    return section.integer("gpus", 0, minimum=0, maximum=MAX_GPUS)


def check_gpu_needs(profiles: Iterable[EngineProfileConfig], gpus: int) -> None:
    """Fail if a profile needs more GPU slots per instance than the Node has."""
    for index, profile in enumerate(profiles):
        if profile.gpus_per_instance > gpus:
            raise ConfigError(
                f"engines[{index}].gpus_per_instance: {profile.gpus_per_instance} is more than the node's gpus ({gpus})"
            )


def _profile(section: Section, environ: Mapping[str, str]) -> EngineProfileConfig:
    section.reject_unknown({"name", "kind", "launch", "ports", "gpus_per_instance", "parameters", "models"})
    name = section.string("name", required=True)
    problem = id_problem("name", name)
    if problem:
        raise ConfigError(f"{section.field_path('name')}: {problem}")
    kind = section.string("kind", required=True)
    if kind not in HTTP_PROVIDER_KINDS:
        raise ConfigError(
            f"{section.field_path('kind')}: must be one of {', '.join(HTTP_PROVIDER_KINDS)}, not {kind[:40]!r}"
        )
    if not section.has("launch"):
        raise ConfigError(f"{section.field_path('launch')}: required (how an instance's engine is started)")
    parameters = _parameters(section.section("parameters"))
    raw_command = section.section("launch").raw("command")
    if isinstance(raw_command, list) and raw_command and template_names(str(raw_command[0])):
        raise ConfigError(
            f"{section.field_path('launch')}.command[0]: the executable is fixed: it may not be a template"
        )
    launch = parse_launch(section.section("launch"), environ)
    _check_templates(section.section("launch"), launch, {p.name for p in parameters})
    return EngineProfileConfig(
        name=name,
        kind=kind,
        launch=launch,
        ports=_ports(section),
        gpus_per_instance=section.integer("gpus_per_instance", 0, minimum=0, maximum=MAX_GPUS),
        parameters=parameters,
        models=tuple(section.string_list("models")),
    )


def _ports(section: Section) -> tuple[int, int]:
    field = section.field_path("ports")
    raw = section.raw("ports")
    if raw is None:
        raise ConfigError(f"{field}: required: [first, last], the ports its instances may listen on")
    if (
        not isinstance(raw, list)
        or len(raw) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in raw)
        or not 1 <= raw[0] <= raw[1] <= 65535
    ):
        raise ConfigError(f"{field}: must be [first, last] with 1 <= first <= last <= 65535, not {raw!r}"[:200])
    return (raw[0], raw[1])


def template_names(text: str) -> list[str]:
    """The ``{name}`` placeholders of one template value."""
    return PLACEHOLDER.findall(text)


def _check_templates(section: Section, launch: LaunchConfig, parameters: set[str]) -> None:
    """Every placeholder names a declared parameter or a built-in; the executable has none."""
    known = parameters | set(BUILTIN_NAMES)
    for index, argument in enumerate(launch.command):
        for name in template_names(argument):
            if name not in known:
                raise ConfigError(
                    f"{section.field_path('command')}[{index}]: {{{name}}} names no declared parameter "
                    f"(known: {', '.join(sorted(known))})"
                )
    for variable, value in launch.env.items():
        for name in template_names(value):
            if name not in known:
                raise ConfigError(
                    f"{section.field_path('env')}.{variable}: {{{name}}} names no declared parameter "
                    f"(known: {', '.join(sorted(known))})"
                )


def _parameters(section: Section) -> tuple[ParameterSpec, ...]:
    names = section.present_keys()
    if len(names) > MAX_PARAMETERS:
        raise ConfigError(f"{section.path}: at most {MAX_PARAMETERS} parameters")
    specs = []
    for name in names:
        if PARAMETER_NAME.match(name) is None:
            raise ConfigError(f"{section.field_path(name)}: a parameter name is a lower-case identifier, not {name!r}")
        if name in BUILTIN_NAMES:
            raise ConfigError(f"{section.field_path(name)}: {name!r} is set by the Node itself, not a parameter")
        specs.append(_parameter(section.section(name), name))
    return tuple(specs)


def _parameter(section: Section, name: str) -> ParameterSpec:
    section.reject_unknown({"type", "min", "max", "choices", "pattern", "default"})
    kind = section.string("type", required=True)
    if kind not in PARAMETER_TYPES:
        raise ConfigError(f"{section.field_path('type')}: must be one of {', '.join(PARAMETER_TYPES)}, not {kind!r}")
    minimum = maximum = None
    if section.has("min") or section.has("max"):
        if kind not in ("int", "number"):
            key = "min" if section.has("min") else "max"
            raise ConfigError(f"{section.field_path(key)}: only for types int and number")
        minimum = _bound(section, "min", kind)
        maximum = _bound(section, "max", kind)
        if minimum is not None and maximum is not None and minimum > maximum:
            raise ConfigError(f"{section.field_path('max')}: must be at least min ({minimum:g})")
    choices: tuple[str, ...] = ()
    if kind == "enum":
        raw = section.raw("choices")
        if not isinstance(raw, list) or not raw or len(raw) > MAX_CHOICES:
            raise ConfigError(
                f"{section.field_path('choices')}: required for type enum: a list of 1-{MAX_CHOICES} values"
            )
        for index, value in enumerate(raw):
            if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
                raise ConfigError(f"{section.field_path('choices')}[{index}]: must be a string")
        choices = tuple(str(v) for v in raw)
        if len(set(choices)) != len(choices):
            raise ConfigError(f"{section.field_path('choices')}: a value is listed twice")
    elif section.has("choices"):
        raise ConfigError(f"{section.field_path('choices')}: only for type enum")
    pattern = None
    if section.has("pattern"):
        if kind != "string":
            raise ConfigError(f"{section.field_path('pattern')}: only for type string")
        pattern = section.string("pattern")
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"{section.field_path('pattern')}: not a regular expression: {e}") from None
    spec = ParameterSpec(name=name, type=kind, minimum=minimum, maximum=maximum, choices=choices, pattern=pattern)
    if section.has("default"):
        default = _default_text(section, kind)
        problem = check_value(spec, default)
        if problem is not None:
            raise ConfigError(f"{section.field_path('default')}: {problem}")
        spec = attrs.evolve(spec, default=default)
    return spec


def _bound(section: Section, key: str, kind: str) -> Optional[float]:
    if not section.has(key):
        return None
    value = section.raw(key)
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{section.field_path(key)}: must be a whole number for type int, not {value!r}"[:200])
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{section.field_path(key)}: must be a number, not {value!r}"[:200])
    return float(value)


def _default_text(section: Section, kind: str) -> str:
    """A default as the wire's text: ``true``/``false`` for bool, the number's digits for int."""
    value = section.raw("default")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{section.field_path('default')}: must be true or false, not {value!r}"[:200])
        return "true" if value else "false"
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        raise ConfigError(f"{section.field_path('default')}: must be a {kind}, not {value!r}"[:200])
    if kind == "number" and isinstance(value, float) and value.is_integer():
        return str(value)
    return str(value)
