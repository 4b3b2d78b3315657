"""Exceptions raised by the Control Plane clients.

Every HTTP error answer of the Control Plane has the shape
``{"error": {"code", "message", "status"}}`` (docs/http-api.md); it becomes
one :class:`ControlPlaneError` subclass chosen by its stable ``code``, so
callers catch what they mean (``except UnknownEdgeError``) and still see the
server's words. Failing to reach the Control Plane at all is a different
thing and raises :class:`ControlPlaneUnreachable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

# The base of every client error, and the error the model reader raises, live
# below the models, so that the errors here may carry models (a snapshot, an
# operation) without the two modules importing each other.
from twisted_iop.client.base_errors import ClientError as ClientError
from twisted_iop.client.base_errors import InvalidResponse as InvalidResponse

if TYPE_CHECKING:
    from twisted_iop.client.models import EdgeStatus, Operation


class ControlPlaneUnreachable(ClientError):
    """The Control Plane could not be reached or did not answer in time."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the Control Plane at {url}: {reason}")
        self.url = url
        self.reason = reason


class ControlPlaneError(ClientError):
    """The Control Plane answered with an error.

    ``code`` is the stable machine code, ``status`` the HTTP status and
    ``message`` the human-readable text; ``body`` is the whole decoded error
    document (it may carry more context next to ``error``).
    """

    #: The code this class stands for; the base class takes any code.
    CODE: str = ""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        body: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.body: Mapping[str, Any] = body if body is not None else {}


class BadRequestError(ControlPlaneError):
    """A query parameter or body field was invalid (400 ``bad_request``)."""

    CODE = "bad_request"


class InvalidSelectorError(BadRequestError):
    """A label selector did not parse (400 ``invalid_selector``); the message names the position."""

    CODE = "invalid_selector"


class InvalidStateError(BadRequestError):
    """A ``state`` filter named a state the view does not have (400 ``invalid_state``)."""

    CODE = "invalid_state"


class InvalidJSON(ControlPlaneError):
    """The request body was not a JSON object (400 ``invalid_json``)."""

    CODE = "invalid_json"


class UnknownCommandError(ControlPlaneError):
    """The command is not in the edge's catalog (400 ``unknown_command``)."""

    CODE = "unknown_command"


class UnauthorizedError(ControlPlaneError):
    """An API token is required and was not given (401 ``unauthorized``)."""

    CODE = "unauthorized"


class ForbiddenError(ControlPlaneError):
    """The API token is wrong (403 ``forbidden``)."""

    CODE = "forbidden"


class UnknownEdgeError(ControlPlaneError):
    """No edge with that id is known (404 ``unknown_edge``)."""

    CODE = "unknown_edge"


class NotFoundError(ControlPlaneError):
    """No such route or operation (404 ``not_found``)."""

    CODE = "not_found"


class EdgeNotConnectedError(ControlPlaneError):
    """The edge is known but not connected (409 ``edge_not_connected``).

    ``snapshot`` is the last status the Control Plane received from it
    (marked stale), or ``None`` when none was ever received or the view does
    not carry one.
    """

    CODE = "edge_not_connected"
    snapshot: Optional[EdgeStatus] = None


class EdgeError(ControlPlaneError):
    """The edge answered with an error (502 ``edge_error``)."""

    CODE = "edge_error"


class OperationError(ControlPlaneError):
    """A command error answer that carries the command's operation.

    ``operation`` is the operation record (``None`` when the answer did not
    carry one, e.g. a status request); ``replayed`` is ``True`` when an
    idempotency key matched an identical earlier command, so the record is
    that command's (``None`` when the server did not say).
    """

    operation: Optional[Operation] = None
    replayed: Optional[bool] = None


class BodyTooLargeError(ControlPlaneError):
    """The request body exceeds the server's limit (413 ``body_too_large``)."""

    CODE = "body_too_large"


class IdempotencyConflictError(OperationError):
    """The idempotency key names an earlier command with a different name,
    target or arguments (409 ``idempotency_conflict``); ``operation`` is that
    earlier command's record."""

    CODE = "idempotency_conflict"


class EdgeDisconnectedError(OperationError):
    """The edge went away while the request was in flight (503 ``edge_disconnected``)."""

    CODE = "edge_disconnected"


class EdgeSupersededError(OperationError):
    """A newer connection of the edge took over while the command was in
    flight (503 ``edge_superseded``); ``operation`` is in state ``superseded``."""

    CODE = "edge_superseded"


class EdgeTimeoutError(OperationError):
    """The edge did not answer in time (504 ``edge_timeout``).

    ``operation`` is the command's operation record (state ``timed_out``)
    when the request was a command.
    """

    CODE = "edge_timeout"


class UnknownRolloutError(ControlPlaneError):
    """No rollout with that id is known (404 ``unknown_rollout``)."""

    CODE = "unknown_rollout"


class InvalidTransitionError(ControlPlaneError):
    """The rollout (or a deployment's roll) cannot pause, resume or be cancelled in its state (409
    ``invalid_transition``)."""

    CODE = "invalid_transition"


#: Error classes by their server code.
ERRORS_BY_CODE: Mapping[str, type[ControlPlaneError]] = {
    cls.CODE: cls
    for cls in (
        BadRequestError,
        InvalidSelectorError,
        InvalidStateError,
        InvalidJSON,
        UnknownCommandError,
        UnauthorizedError,
        ForbiddenError,
        UnknownEdgeError,
        NotFoundError,
        EdgeNotConnectedError,
        IdempotencyConflictError,
        BodyTooLargeError,
        EdgeError,
        EdgeDisconnectedError,
        EdgeSupersededError,
        EdgeTimeoutError,
        UnknownRolloutError,
        InvalidTransitionError,
    )
}


class WireClientError(ClientError):
    """Base class of failures on the WebSocket ``/client`` wire."""


class HelloRejected(WireClientError):
    """The Control Plane refused the client hello."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"hello rejected: {reason}")
        self.reason = reason


class WireRequestError(WireClientError):
    """The Control Plane answered a wire request with an ``Error`` message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class WireConnectionLost(WireClientError):
    """The WebSocket closed before a request was answered."""
