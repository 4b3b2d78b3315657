"""Clients of the Control Plane: status repository, wire client, iopctl.

* :class:`ControlPlaneStatusRepository` -- one async method per HTTP view,
  typed results (:mod:`twisted_iop.client.models`), typed errors
  (:mod:`twisted_iop.client.errors`).
* :class:`ClientWireClient` -- the WebSocket ``/client`` wire: hello and
  live event subscriptions that resume after reconnects.
* ``iopctl`` -- the operator CLI (:mod:`twisted_iop.client.cli`).
"""

from twisted_iop.client.errors import (
    BadRequest,
    ClientError,
    ControlPlaneError,
    ControlPlaneUnreachable,
    EdgeDisconnected,
    EdgeError,
    EdgeNotConnected,
    EdgeTimeout,
    Forbidden,
    HelloRejected,
    InvalidJSON,
    InvalidResponse,
    NotFound,
    Unauthorized,
    UnknownCommand,
    UnknownEdge,
    WireClientError,
    WireConnectionLost,
    WireRequestError,
)
from twisted_iop.client.repository import ControlPlaneStatusRepository
from twisted_iop.client.wire import ClientWireClient, EventSubscription

__all__ = [
    "BadRequest",
    "ClientError",
    "ClientWireClient",
    "ControlPlaneError",
    "ControlPlaneStatusRepository",
    "ControlPlaneUnreachable",
    "EdgeDisconnected",
    "EdgeError",
    "EdgeNotConnected",
    "EdgeTimeout",
    "EventSubscription",
    "Forbidden",
    "HelloRejected",
    "InvalidJSON",
    "InvalidResponse",
    "NotFound",
    "Unauthorized",
    "UnknownCommand",
    "UnknownEdge",
    "WireConnectionLost",
    "WireClientError",
    "WireRequestError",
]
