"""What the Control Plane needs of an edge's connection, whatever carries it.

The edge wire's protocol, a routed peer in cluster mode (an edge held by
another replica) and the test doubles all provide :class:`EdgePeer`; the
registry and the gateway see nothing else of a connection.
"""

from __future__ import annotations

from typing import Optional, Protocol

from twisted.internet.defer import Deferred

from twisted_iop.wire import control_pb2 as pb


class StatusListener(Protocol):
    """Who hears the end of one status ask (:meth:`EdgePeer.ask_status`)."""

    def status_answered(self, response: Optional[pb.EdgeStatusResponse], error: Optional[Exception]) -> None:
        """The edge's snapshot, or why there is none (exactly one is set)."""


class EdgePeer(Protocol):
    """What the registry needs of a connection: identity and a way to close it."""

    last_received: float

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Ask the edge for a status snapshot; return the ask's request id.

        ``listener.status_answered`` is called exactly once: with the
        snapshot, or with the failure (``CancelledError`` after
        :meth:`cancel_status`). Without ``own_deadline`` no timer is set:
        the caller cancels the ask when it stops waiting.
        """

    def cancel_status(self, request_id: int) -> None:
        """Stop waiting for the status ask ``request_id`` (if it still waits)."""

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command; the answer is awaited until it comes, the caller
        cancels, or the connection ends (the caller owns the deadline)."""

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Send the edge its whole desired set; its answer (the version it took, what runs)."""

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Close the connection, telling the edge why."""
