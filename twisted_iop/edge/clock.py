"""The one thing the Edge's rule services need from a clock.

Twisted's ``IReactorTime`` is a zope interface, which mypy cannot check
without the mypy-zope plugin; services that only read the time take this
structural type instead (a reactor, ``task.Clock`` or ``MemoryReactorClock``
all fit).
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Something that tells the time in seconds."""

    def seconds(self) -> float:
        """The current time in seconds since the epoch."""
