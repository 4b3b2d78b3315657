"""The one reading of a command in a request body: its name, target and arguments.

``POST /edges/{id}/commands`` takes them at the top of its body,
``POST /rollouts`` under ``command``; both read them here, so a command
has one set of rules whoever sends it (bounds from the wire's own:
:data:`~twisted_iop.wire.hello.MAX_TEXT`,
:data:`~twisted_iop.wire.hello.MAX_COMMAND_ARGUMENTS`,
:data:`~twisted_iop.controlplane.fleet.bounds.MAX_ARGUMENT_VALUE`). Every error
is a :class:`~twisted_iop.controlplane.http.errors.BadRequest` naming the
field.
"""

from __future__ import annotations

from typing import Any

import attrs

from twisted_iop.controlplane.fleet.bounds import MAX_ARGUMENT_VALUE
from twisted_iop.controlplane.http.errors import BadRequest, body_field
from twisted_iop.wire.hello import MAX_COMMAND_ARGUMENTS, MAX_TEXT


@attrs.frozen
class CommandBody:
    """A command as a request body gives it, checked."""

    name: str
    target: str
    #: Argument values as the wire carries them (text; ``true``/``false`` for booleans).
    arguments: dict[str, str]


def parse_command_body(body: dict[str, Any], prefix: str = "") -> CommandBody:
    """The command of ``body`` (its fields named ``prefix`` + name in errors, e.g. ``command.``)."""
    name = body.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise BadRequest(f"field '{prefix}name' must be a non-empty string of at most {MAX_TEXT} characters")
    target = body_field(body, "target", "")
    if not isinstance(target, str) or len(target) > MAX_TEXT:
        raise BadRequest(f"field '{prefix}target' must be a string of at most {MAX_TEXT} characters")
    arguments = body_field(body, "arguments", {})
    if not isinstance(arguments, dict) or not all(
        isinstance(k, str) and isinstance(v, (str, int, float, bool)) for k, v in arguments.items()
    ):
        raise BadRequest(f"field '{prefix}arguments' must be an object of strings")
    args = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in arguments.items()}
    if len(args) > MAX_COMMAND_ARGUMENTS or any(
        len(k) > MAX_TEXT or len(v) > MAX_ARGUMENT_VALUE for k, v in args.items()
    ):
        raise BadRequest(
            f"field '{prefix}arguments': at most {MAX_COMMAND_ARGUMENTS}, names of at most {MAX_TEXT} "
            f"characters and values of at most {MAX_ARGUMENT_VALUE}"
        )
    return CommandBody(name, target, args)
