"""Requests for an edge held by another replica, routed through Redis.

Every replica reads its own **inbox** stream (``<prefix>:inbox:<replica>``).
A status ask or a command for an edge owned elsewhere is written to the
owner's inbox; the owner runs it on its local connection, exactly as for
a local caller, and writes the answer to the asker's inbox. Messages for
one replica are batched per reactor turn (a fleet round asks thousands of
edges at once: a few stream entries, not thousands).

:class:`RemotePeer` gives the gateway the same peer interface as a local
connection, so deadlines, coalescing and error codes are the gateway's own:
the caller cannot tell a remote edge from a local one except by latency.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Optional

from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot, routed_snapshot
from twisted_iop.controlplane.store.forms import b64, dumps, unb64
from twisted_iop.controlplane.wires.edge_peer import StatusListener
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerDisconnected, RemoteError, RequestTimeout

#: Entries kept in an inbox stream (``MAXLEN ~``); a replica reads its own
#: as they come, so this only bounds what a dead replica leaves behind.
INBOX_LENGTH = 10_000
#: Error codes of a routed answer.
TIMEOUT, DISCONNECTED, ERROR = "timeout", "disconnected", "error"

#: Writes one batch of messages to a replica's inbox.
Sender = Callable[[str, list[dict[str, Any]]], Deferred[Any]]


class _Pending:
    """A routed request waiting for its answer."""

    __slots__ = ("deferred", "edge_id", "listener", "timer")

    def __init__(
        self,
        edge_id: str,
        listener: Optional[StatusListener] = None,
        deferred: Optional[Deferred[pb.EdgeCommandResponse]] = None,
    ) -> None:
        self.edge_id = edge_id
        self.listener = listener
        self.deferred = deferred
        self.timer: Optional[IDelayedCall] = None


class Router:
    """This replica's routed requests: what it sent and what it waits for."""

    _log = Logger()

    def __init__(self, replica_id: str, clock: IReactorTime, send: Sender) -> None:
        self.replica_id = replica_id
        self._clock = clock
        self._send = send
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._outboxes: dict[str, list[dict[str, Any]]] = {}
        self._flush_scheduled = False
        #: For /metrics: routed requests sent and answers received.
        self.sent = 0
        self.answered = 0

    @property
    def waiting(self) -> int:
        """Routed requests still waiting for an answer."""
        return len(self._pending)

    # -- sending ------------------------------------------------------------------

    def post(self, replica: str, message: dict[str, Any]) -> None:
        """Queue ``message`` for ``replica``'s inbox (written at the end of this turn)."""
        self._outboxes.setdefault(replica, []).append(message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outboxes, self._outboxes = self._outboxes, {}
        for replica, messages in outboxes.items():
            self._send(replica, messages).addErrback(self._not_sent, messages)

    def _not_sent(self, failure: Any, messages: list[dict[str, Any]]) -> None:
        """The inbox could not be written: the requests in it fail now."""
        for message in messages:
            pending = self._pending.pop(message.get("id", 0), None) if message.get("t") != "reply" else None
            if pending is not None:
                self._fail(pending, PeerDisconnected("the replica holding the edge could not be reached"))

    # -- the asking side ------------------------------------------------------------

    def ask_status(self, peer: RemotePeer, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Route a status ask to the owner of ``peer``."""
        request_id = next(self._ids)
        pending = _Pending(peer.edge_id, listener=listener)
        self._pending[request_id] = pending
        if own_deadline:
            pending.timer = self._clock.callLater(timeout, self._timed_out, request_id)
        self.sent += 1
        self.post(
            peer.owner,
            {"t": "status", "id": request_id, "from": self.replica_id, "edge": peer.edge_id, "fence": peer.fence},
        )
        return request_id

    def command(self, peer: RemotePeer, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Route a command to the owner of ``peer``; the caller owns the deadline (it cancels)."""
        request_id = next(self._ids)

        def cancelled(_: Deferred[pb.EdgeCommandResponse]) -> None:
            self._pending.pop(request_id, None)

        d: Deferred[pb.EdgeCommandResponse] = Deferred(cancelled)
        self._pending[request_id] = _Pending(peer.edge_id, deferred=d)
        self.sent += 1
        self.post(
            peer.owner,
            {
                "t": "command",
                "id": request_id,
                "from": self.replica_id,
                "edge": peer.edge_id,
                "fence": peer.fence,
                "request": b64(request.SerializeToString()),
            },
        )
        return d

    def cancel(self, request_id: int) -> None:
        """Stop waiting for status ask ``request_id`` (its listener hears CancelledError)."""
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            self._fail(pending, CancelledError())

    def _timed_out(self, request_id: int) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.timer = None
            self._fail(pending, RequestTimeout(f"no answer from edge {pending.edge_id!r}"))

    def fail_all(self, reason: str) -> None:
        """Every routed request fails (this replica lost the cluster)."""
        pendings, self._pending = list(self._pending.values()), {}
        for pending in pendings:
            self._fail(pending, PeerDisconnected(reason))

    def answered_message(self, message: dict[str, Any]) -> None:
        """An answer from the owner (a message of kind ``reply`` in the inbox)."""
        request_id = message.get("id")
        if not isinstance(request_id, int):
            return
        pending = self._pending.pop(request_id, None)
        if pending is None:
            return  # cancelled, timed out, or not ours
        self.answered += 1
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()
        pending.timer = None
        error = message.get("error")
        if error is not None:
            text = str(message.get("message", ""))[:500]
            if error == TIMEOUT:
                self._fail(pending, RequestTimeout(text))
            elif error == DISCONNECTED:
                self._fail(pending, PeerDisconnected(text))
            else:
                self._fail(pending, RemoteError(pb.ERROR_CODE_INTERNAL, text))
            return
        try:
            data = unb64(str(message.get("ok", "")), "answer")
            if pending.listener is not None:
                counts = message.get("counts")
                snapshot = routed_snapshot(data, counts, message.get("at")) if isinstance(counts, list) else None
                keep = getattr(pending.listener, "snapshot_answered", None)
                if snapshot is not None and keep is not None:
                    # The owner checked and counted it: no second parse here.
                    keep(snapshot)
                    return
                status = pb.EdgeStatusResponse()
                status.ParseFromString(data)
                pending.listener.status_answered(status, None)
            elif pending.deferred is not None:
                response = pb.EdgeCommandResponse()
                response.ParseFromString(data)
                pending.deferred.callback(response)
        except Exception as e:
            self._log.warn(
                "a routed answer for edge {edge_id} did not parse: {error}", edge_id=pending.edge_id, error=e
            )
            self._fail(pending, RemoteError(pb.ERROR_CODE_INTERNAL, "the owner's answer did not parse"))

    @staticmethod
    def _fail(pending: _Pending, error: Exception) -> None:
        if pending.timer is not None and pending.timer.active():
            pending.timer.cancel()
        pending.timer = None
        if pending.listener is not None:
            pending.listener.status_answered(None, error)
        elif pending.deferred is not None and not pending.deferred.called:
            pending.deferred.errback(error)

    # -- the answering side ----------------------------------------------------------

    def answer(
        self,
        message: dict[str, Any],
        data: Optional[bytes],
        error: str = "",
        text: str = "",
        snapshot: Optional[StatusSnapshot] = None,
    ) -> None:
        """Answer the request ``message`` (to the replica that sent it); a
        status answer carries the snapshot's counts and time with its bytes."""
        reply: dict[str, Any] = {"t": "reply", "id": message.get("id")}
        if error:
            reply["error"] = error
            reply["message"] = text
        elif snapshot is not None:
            reply["ok"] = b64(snapshot.data)
            reply["counts"] = list(snapshot.counts)
            reply["at"] = snapshot.received_at
        else:
            assert data is not None
            reply["ok"] = b64(data)
        sender = message.get("from")
        if isinstance(sender, str) and sender:
            self.post(sender, reply)


class DeploymentsNotRouted(Exception):
    """Desired sets go to an edge from the replica that holds its connection, never through another."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"edge {edge_id}: its desired set is sent by the replica that holds its connection")


class RemotePeer:
    """An edge's connection held by another replica (the registry's peer shape)."""

    last_received = 0.0

    def __init__(self, router: Router, owner: str, fence: str, edge_id: str) -> None:
        self._router = router
        self.owner = owner
        self.fence = fence
        self.edge_id = edge_id

    def ask_status(self, timeout: float, own_deadline: bool, listener: StatusListener) -> int:
        """Ask the owner for the edge's status."""
        return self._router.ask_status(self, timeout, own_deadline, listener)

    def cancel_status(self, request_id: int) -> None:
        """Stop waiting for a routed status ask."""
        self._router.cancel(request_id)

    def request_command(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command through the owner."""
        return self._router.command(self, request)

    def request_deployments(self, request: pb.EdgeDeploymentsRequest) -> Deferred[pb.EdgeDeploymentsResponse]:
        """Not routed: the replica that holds the edge's connection sends its desired set."""
        return fail(DeploymentsNotRouted(self.edge_id))

    def disconnect(self, code: pb.ErrorCode, message: str) -> None:
        """Nothing to close here: the owner learns of a newer connection
        from the fleet stream and closes its own."""


def inbox_entry(messages: list[dict[str, Any]]) -> str:
    """The one field of an inbox stream entry."""
    return dumps(messages)
