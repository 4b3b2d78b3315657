"""Identifiers of Edges, Nodes and providers."""

from __future__ import annotations

import re
from typing import Optional

#: 1-64 characters: letters, digits, ``.``, ``_`` and ``-``, starting with a
#: letter or digit. Safe in URLs, logs and file names.
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def id_problem(kind: str, value: str) -> Optional[str]:
    """Why ``value`` is not a valid ``kind`` id, or ``None`` if it is."""
    if not value:
        return f"{kind} is empty"
    if ID_PATTERN.match(value) is None:
        shown = value if len(value) <= 80 else value[:80] + "..."
        return (
            f"{kind} {shown!r} is malformed: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return None
