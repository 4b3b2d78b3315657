"""A profile's parameters: their declared types and bounds, and the check of one value.

Values travel as text (``DesiredInstance.parameters`` is a map of strings);
:func:`check_value` says why a text is not a value of its parameter, or
``None``. Every check is bounded: a value longer than
:data:`MAX_VALUE_CHARACTERS` is refused before any pattern runs.
"""

from __future__ import annotations

import math
import re
from typing import Optional

import attrs

#: Parameter types a profile may declare.
PARAMETER_TYPES = ("int", "number", "string", "enum", "bool")
#: The longest text value a parameter (or a model name) may take.
MAX_VALUE_CHARACTERS = 1024
#: Texts a bool parameter takes.
BOOL_VALUES = ("true", "false")
#: A whole number as text: an optional minus sign and digits (no spaces, no ``+``, no ``_``).
INT_TEXT = re.compile(r"^-?[0-9]{1,18}$")
#: A number as text: digits with an optional fraction and exponent.
NUMBER_TEXT = re.compile(r"^-?[0-9]{1,18}(\.[0-9]{1,18})?([eE][-+]?[0-9]{1,3})?$")


@attrs.frozen
class ParameterSpec:
    """One parameter a deployment may set, with its bounds (``None``: no bound)."""

    name: str
    type: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    choices: tuple[str, ...] = ()
    pattern: Optional[str] = None
    #: The default as text (the wire's form); ``None``: a deployment must give it.
    default: Optional[str] = None


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:37] + "...")


def check_value(spec: ParameterSpec, value: str) -> Optional[str]:
    """Why ``value`` is not a value of ``spec`` (for people), or ``None`` when it is."""
    if len(value) > MAX_VALUE_CHARACTERS:
        return f"longer than {MAX_VALUE_CHARACTERS} characters"
    if "\0" in value:
        return "contains a NUL character"
    if spec.type == "bool":
        return None if value in BOOL_VALUES else f"must be true or false, not {_shown(value)}"
    if spec.type == "enum":
        return None if value in spec.choices else f"must be one of {', '.join(spec.choices)}, not {_shown(value)}"
    if spec.type == "string":
        if spec.pattern is not None and re.fullmatch(spec.pattern, value) is None:
            return f"does not match the pattern {spec.pattern!r}"
        return None
    if spec.type == "int":
        if INT_TEXT.match(value) is None:
            return f"must be a whole number, not {_shown(value)}"
        number = float(int(value))
    elif spec.type == "number":
        if NUMBER_TEXT.match(value) is None:
            return f"must be a number, not {_shown(value)}"
        number = float(value)
        if not math.isfinite(number):
            return f"must be a finite number, not {_shown(value)}"
    else:
        return f"has an unknown type {spec.type!r}"
    if spec.minimum is not None and number < spec.minimum:
        return f"must be at least {spec.minimum:g}, not {value}"
    if spec.maximum is not None and number > spec.maximum:
        return f"must be at most {spec.maximum:g}, not {value}"
    return None
