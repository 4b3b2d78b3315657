"""Names of enum values read from a wire, known or not.

proto3 enums are open: a peer built from a newer ``.proto`` (or a hostile
one) may send any int32 in an enum field, and the parser keeps it as is.
``pb.ErrorCode.Name(99)`` then raises ``ValueError``; a name computed for a
log line or an error message must never be the thing that drops a
connection. Every enum value that came from a wire is named through
:func:`enum_name` or :func:`enum_label`, which always return a string.
"""

from __future__ import annotations

from typing import Any, Protocol


class EnumType(Protocol):
    """What a generated protobuf enum wrapper offers (``pb.ErrorCode`` ...)."""

    DESCRIPTOR: Any

    def Name(self, number: int) -> str: ...


def _prefix(enum_type: EnumType) -> str:
    """The common value prefix, ``ERROR_CODE_`` for ``ErrorCode``.

    Our enums follow the style guide: value 0 is ``<PREFIX>UNSPECIFIED``.
    """
    for value in enum_type.DESCRIPTOR.values:
        if value.number == 0 and value.name.endswith("UNSPECIFIED"):
            return str(value.name[: -len("UNSPECIFIED")])
    return ""


def is_known(enum_type: EnumType, value: int) -> bool:
    """Whether ``value`` is one this side's ``.proto`` defines."""
    return value in enum_type.DESCRIPTOR.values_by_number


def enum_name(enum_type: EnumType, value: int) -> str:
    """The value's full name: ``ERROR_CODE_HELLO_REQUIRED``; ``ERROR_CODE_99`` if unknown."""
    if is_known(enum_type, value):
        return enum_type.Name(value)
    prefix = _prefix(enum_type) or f"{enum_type.DESCRIPTOR.name.upper()}_"
    return f"{prefix}{value}"


def enum_label(enum_type: EnumType, value: int, unknown: str = "unknown_{value}") -> str:
    """The value's short lower-case name: ``hello_required``.

    An unknown value gives ``unknown`` formatted with ``value``
    (``unknown_99`` by default).
    """
    if not is_known(enum_type, value):
        return unknown.format(value=value)
    return enum_type.Name(value).removeprefix(_prefix(enum_type)).lower()
