"""The inbox: requests other replicas routed to this one, for edges it holds,
and the answers to the requests it routed.

Every replica reads its own inbox stream (``<prefix>:inbox:<replica>``,
read with the fleet stream by ``stream_reader.py``). :class:`Inbox` owns:

* **routed status asks**: those of one inbox entry (a fleet round elsewhere
  asks thousands at once) go to the gateway as one group, under one
  deadline, and each answer (snapshot with its counts, or why not) goes
  back to the asker;
* **routed commands**: run by the gateway on the local connection
  (:meth:`~twisted_iop.controlplane.requests.gateway.EdgeGateway.run_routed_command`);
  the edge's answer, or why there is none, goes back to the replica that
  dispatched it, which alone decides the operation's state;
* **answers to our own routed requests**, handed to the :class:`Router`;
* **writing** batches of messages to other replicas' inboxes (the router's
  sender).

A request names the connection (fence) it was meant for: one that is no
longer ours here is answered ``disconnected`` at once.
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from twisted_iop.controlplane.cluster.journal import Journal
from twisted_iop.controlplane.cluster.keys import Keys
from twisted_iop.controlplane.cluster.remote import DISCONNECTED, ERROR, INBOX_LENGTH, TIMEOUT, Router, inbox_entry
from twisted_iop.controlplane.cluster.store import RedisLink
from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests.errors import EdgeDisconnected, EdgeTimeout
from twisted_iop.controlplane.requests.gateway import EdgeGateway
from twisted_iop.controlplane.store import forms as codec
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import PeerDisconnected, RemoteError

#: Why a routed request for an edge not (or no longer) held here fails.
NOT_HELD_MESSAGE = "the edge's connection is no longer held by this replica"


class Inbox:
    """Routed requests for our edges, run through the gateway; answers to ours."""

    def __init__(
        self, keys: Keys, link: RedisLink, clock: IReactorTime, gateway: EdgeGateway, journal: Journal
    ) -> None:
        self.keys = keys
        self.link = link
        self._gateway = gateway
        self._journal = journal
        #: This replica's routed requests: what it sent and what it waits for.
        self.router = Router(journal.replica_id, clock, self._send)

    def _send(self, replica: str, messages: list[dict[str, Any]]) -> Deferred[Any]:
        return self.link.call(
            "XADD", self.keys.inbox(replica), "MAXLEN", "~", INBOX_LENGTH, "*", "m", inbox_entry(messages)
        )

    def entry(self, fields: dict[str, str]) -> None:
        """One entry of our inbox stream: its answers, status asks and commands."""
        messages = codec.loads_list(fields.get("m", "[]"), "inbox entry")
        asks: list[dict[str, Any]] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            kind = message.get("t")
            if kind == "reply":
                self.router.answered_message(message)
            elif kind == "status":
                asks.append(message)
            elif kind == "command":
                self._routed_command(message)
        if asks:
            self._routed_statuses(asks)

    def _local_edge(self, message: dict[str, Any]) -> Optional[str]:
        edge_id, fence = message.get("edge"), message.get("fence")
        if not isinstance(edge_id, str) or not isinstance(fence, str) or not self._journal.holds(edge_id, fence):
            return None
        return edge_id

    def _routed_statuses(self, messages: list[dict[str, Any]]) -> None:
        """Status asks routed here (a whole inbox entry's, under one deadline)."""
        asked: list[dict[str, Any]] = []
        for message in messages:
            if self._local_edge(message) is None:
                self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            else:
                asked.append(message)

        def answered(index: int, snapshot: Optional[StatusSnapshot], error: Optional[Exception]) -> None:
            message = asked[index]
            if error is None:
                assert snapshot is not None
                self.router.answer(message, None, snapshot=snapshot)
            elif isinstance(error, EdgeTimeout):
                self.router.answer(message, None, TIMEOUT, str(error))
            elif isinstance(error, (EdgeDisconnected, EdgeNotConnected)):
                self.router.answer(message, None, DISCONNECTED, str(error))
            else:
                self.router.answer(message, None, ERROR, str(error))

        if asked:
            self._gateway.status_group([str(m["edge"]) for m in asked], answered)

    def _routed_command(self, message: dict[str, Any]) -> None:
        """A command routed here: the gateway runs it on our connection; the
        edge's answer, or why there is none, goes back to its dispatcher."""
        edge_id = self._local_edge(message)
        if edge_id is None:
            self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            return
        request = pb.EdgeCommandRequest()
        try:
            request.ParseFromString(codec.unb64(str(message.get("request", "")), "command"))
        except Exception:
            self.router.answer(message, None, ERROR, "the routed command did not parse")
            return

        def answered(response: pb.EdgeCommandResponse) -> None:
            self.router.answer(message, response.SerializeToString())

        def failed(failure: Failure) -> None:
            if failure.check(RemoteError):
                self.router.answer(message, None, ERROR, failure.getErrorMessage())
            elif failure.check(EdgeNotConnected):
                self.router.answer(message, None, DISCONNECTED, NOT_HELD_MESSAGE)
            else:
                reason = "edge disconnected before answering" if failure.check(PeerDisconnected) else "no answer"
                self.router.answer(message, None, DISCONNECTED, reason)

        self._gateway.run_routed_command(edge_id, request).addCallbacks(answered, failed)
