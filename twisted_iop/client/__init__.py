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
    ClientError,
    ControlPlaneError,
    ControlPlaneUnreachable,
    EdgeDisconnectedError,
    EdgeError,
    EdgeNotConnectedError,
    EdgeTimeoutError,
    ForbiddenError,
    HelloRejected,
    InvalidJSON,
    InvalidResponse,
    NotFoundError,
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
    "ClientError",
    "ClientWireClient",
    "ControlPlaneError",
    "ControlPlaneStatusRepository",
    "ControlPlaneUnreachable",
    "EdgeDisconnectedError",
    "EdgeError",
    "EdgeNotConnectedError",
    "EdgeTimeoutError",
    "EventSubscription",
    "ForbiddenError",
    "HelloRejected",
    "InvalidJSON",
    "InvalidResponse",
    "NotFoundError",
    "UnauthorizedError",
    "UnknownCommandError",
    "UnknownEdgeError",
    "WireConnectionLost",
    "WireClientError",
    "WireRequestError",
]
