"""Clients of the Control Plane: status repository, wire client, iopctl.

* :class:`ControlPlaneStatusRepository` -- one async method per HTTP view,
  typed results (:mod:`twisted_iop.client.models`), typed errors
  (:mod:`twisted_iop.client.errors`).
* :class:`ClientWireClient` -- the WebSocket ``/client`` wire: hello and
  live event subscriptions that resume after reconnects.
* ``iopctl`` -- the operator CLI (:mod:`twisted_iop.client.cli`).
"""

from twisted_iop.client.errors import (
    BadRequestError,
    BodyTooLargeError,
    ClientError,
    ControlPlaneError,
    ControlPlaneUnreachable,
    EdgeDisconnectedError,
    EdgeError,
    EdgeNotConnectedError,
    EdgeSupersededError,
    EdgeTimeoutError,
    ForbiddenError,
    HelloRejected,
    IdempotencyConflictError,
    InvalidJSON,
    InvalidResponse,
    InvalidSelectorError,
    InvalidStateError,
    NotFoundError,
    OperationError,
    UnauthorizedError,
    UnknownCommandError,
    UnknownEdgeError,
    WireClientError,
    WireConnectionLost,
    WireRequestError,
)
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient, EventSubscription

__all__ = [
    "BadRequestError",
    "BodyTooLargeError",
    "ClientError",
    "ClientWireClient",
    "ControlPlaneError",
    "ControlPlaneStatusRepository",
    "ControlPlaneUnreachable",
    "EdgeDisconnectedError",
    "EdgeError",
    "EdgeNotConnectedError",
    "EdgeSupersededError",
    "EdgeTimeoutError",
    "EventSubscription",
    "ForbiddenError",
    "HelloRejected",
    "IdempotencyConflictError",
    "InvalidJSON",
    "InvalidResponse",
    "InvalidSelectorError",
    "InvalidStateError",
    "NotFoundError",
    "OperationError",
    "UnauthorizedError",
    "UnknownCommandError",
    "UnknownEdgeError",
    "WireClientError",
    "WireConnectionLost",
    "WireRequestError",
]
