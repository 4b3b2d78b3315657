"""Why a request to an edge did not get its answer: the domain errors of the
gateway's rooms (status asks, fleet rounds, commands), which the HTTP views
map to status codes (``http_errors.DOMAIN_ERRORS``), and the one translation
of wire failures into them."""

from __future__ import annotations

from twisted.internet.defer import CancelledError

from twisted_iop.wire.peer import PeerDisconnected, RemoteError, RequestTimeout

#: Why a command ended (``failed``) when the Control Plane stopped before its answer.
SHUTTING_DOWN_REASON = "the Control Plane is shutting down"

#: What a replay of such a command says once the Control Plane runs again:
#: it ended for good (a client retrying the same key must not loop on a 503).
STOPPED_BEFORE_END_REASON = (
    "the Control Plane stopped before this operation ended; send the command again with a new key"
)


class EdgeTimeout(Exception):
    """The edge did not answer within the deadline."""

    def __init__(self, edge_id: str, seconds: float) -> None:
        super().__init__(f"edge {edge_id!r} did not answer within {seconds:g}s")
        self.edge_id = edge_id


class EdgeDisconnected(Exception):
    """The edge's connection dropped while a request was in flight."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"edge {edge_id!r} disconnected before answering")
        self.edge_id = edge_id


class EdgeErrorAnswer(Exception):
    """The edge answered a request with an error."""

    def __init__(self, edge_id: str, detail: str) -> None:
        super().__init__(f"edge {edge_id!r} answered with an error: {detail}")
        self.edge_id = edge_id


class ShuttingDown(Exception):
    """The Control Plane is stopping: the request was refused or ended unanswered."""

    def __init__(self) -> None:
        super().__init__(SHUTTING_DOWN_REASON)


def translated(edge_id: str, seconds: float, error: Exception) -> Exception:
    """The domain error for a wire failure of a request to ``edge_id``
    (``seconds``: its deadline); anything else unchanged."""
    if isinstance(error, (RequestTimeout, CancelledError)):
        return EdgeTimeout(edge_id, seconds)
    if isinstance(error, PeerDisconnected):
        return EdgeDisconnected(edge_id)
    if isinstance(error, RemoteError):
        return EdgeErrorAnswer(edge_id, str(error))
    return error
