"""The errors every client error builds on, and the one the model reader raises.

:mod:`twisted_iop.client.models` reads documents and raises
:class:`InvalidResponse`; :mod:`twisted_iop.client.errors` builds every
other error on :class:`ClientError`, some carrying a model (the stale
snapshot, the operation), and names both of these too (import them from
there). Kept apart so the models and the errors never import each other.
"""

from __future__ import annotations


class ClientError(Exception):
    """Base class of everything the clients raise on purpose."""


class InvalidResponse(ClientError):
    """The Control Plane answered something that is not the documented JSON."""

    code = "invalid_response"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
