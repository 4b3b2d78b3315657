"""Requests to connected edges: the one owner of everything in flight.

The :class:`EdgeGateway` is the only code that asks edges for anything and
the only code that decides an operation's state. It is the facade the
routes, the edge wire's registry and the cluster replica talk to; the work
is done in three rooms, each owning its own part:

* **status asks** (``status_asks.py``, :class:`StatusAsks`): at most one
  ``EdgeStatusRequest`` in flight per edge, bound to the connection
  (token) it was sent on, shared by every caller; moved to a newer
  connection at once when it supersedes the old one;
* **fleet rounds** (``fleet_rounds.py``, :class:`FleetRounds`): one round at
  a time over every known edge, joined by callers arriving while it runs
  and reused within its max age;
* **commands** (``command_dispatch.py``, :class:`CommandDispatch`): every
  dispatched command, its connection, deadline, idempotency key, late
  outcome and waiting callers, and the decisions of its operation's state
  (whose rules are ``operation_states.py``).

What the facade itself holds: whether the Control Plane is stopping (new
requests then fail with ShuttingDown), and the registry's observer hooks,
which it hands to the rooms. It works through the registry's peers, so it
runs the same over a real TCP connection, a routed peer (cluster mode) or a
test fake, and its rooms turn wire failures into the domain errors of
``request_errors.py`` that the HTTP views map to status codes.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Optional

from twisted.internet.defer import Deferred, fail
from twisted.internet.interfaces import IReactorTime

from twisted_iop.controlplane.fleet.edge_filters import EdgeFilter
from twisted_iop.controlplane.fleet.operations import OperationRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.requests.command_dispatch import (
    DISCONNECTED_REASON,
    SUPERSEDED_REASON,
    CommandDispatch,
    Dispatched,
)
from twisted_iop.controlplane.requests.errors import ShuttingDown
from twisted_iop.controlplane.requests.fleet_rounds import NO_FILTER, FleetRound, FleetRounds
from twisted_iop.controlplane.requests.operation_states import EDGE_DISCONNECTED, SUPERSEDED
from twisted_iop.controlplane.requests.status_asks import GroupAnswered, StatusAsks
from twisted_iop.metrics import LatencyHistogram
from twisted_iop.wire import control_pb2 as pb


class EdgeGateway:
    """Status and command requests to edges; owner of what is in flight."""

    def __init__(
        self,
        registry: EdgeRegistry,
        clock: IReactorTime,
        status_timeout_seconds: float = 5.0,
        fleet_max_age_seconds: float = 1.0,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._asks = StatusAsks(registry, clock, status_timeout_seconds, draw)
        self._rounds = FleetRounds(registry, clock, self._asks, fleet_max_age_seconds)
        self._commands = CommandDispatch(registry, clock)
        #: Set by :meth:`refuse_new` and :meth:`shut_down`: new requests fail with ShuttingDown.
        self.stopping = False
        registry.add_observer(self)

    # -- settings and figures -----------------------------------------------------

    @property
    def status_timeout_seconds(self) -> float:
        """The deadline of a status ask, of a fleet round and of a group ask."""
        return self._asks.timeout_seconds

    @property
    def fleet_max_age_seconds(self) -> float:
        """How long a finished fleet round is reused (from its start)."""
        return self._rounds.max_age_seconds

    @fleet_max_age_seconds.setter
    def fleet_max_age_seconds(self, seconds: float) -> None:
        self._rounds.max_age_seconds = seconds

    @property
    def status_seconds(self) -> LatencyHistogram:
        """For /metrics: single-edge status requests, asked to answered."""
        return self._asks.seconds

    @property
    def status_refused(self) -> dict[str, int]:
        """For /metrics: status answers refused, by reason ("bounds" or "totals")."""
        return self._asks.refused

    @property
    def round_seconds(self) -> LatencyHistogram:
        """For /metrics: fleet rounds, start to last row."""
        return self._rounds.seconds

    @property
    def command_seconds(self) -> LatencyHistogram:
        """For /metrics: commands dispatched here, to a terminal state."""
        return self._commands.seconds

    @property
    def operations_ended(self) -> dict[str, int]:
        """For /metrics: operations dispatched here that ended, by terminal state."""
        return self._commands.ended

    def in_flight(self) -> dict[str, int]:
        """Status requests on the wire and commands not yet ended (for /metrics)."""
        return {"status": len(self._asks), "command": self._commands.in_flight()}

    def tokens_in_flight(self) -> frozenset[int]:
        """The connections (tokens) a status ask or a command is still in flight on."""
        return frozenset(self._asks.tokens() | self._commands.tokens())

    # -- stopping -------------------------------------------------------------------

    def waiting_callers(self) -> int:
        """Callers still waiting: for commands, status asks and a fleet round (a stop drains these)."""
        return self._commands.waiting_callers() + len(self._asks) + (1 if self._rounds.running else 0)

    def refuse_new(self) -> None:
        """From now on status, fleet and command requests fail with ShuttingDown."""
        self.stopping = True

    def shut_down(self) -> None:
        """End everything in flight now; every waiting caller gets its answer.

        Commands still waiting for their edge end ``failed`` with
        ``SHUTTING_DOWN_REASON`` (a late answer can no longer arrive);
        status and fleet callers fail with :class:`ShuttingDown`.
        """
        self.stopping = True
        self._rounds.shut_down()
        self._asks.shut_down()
        self._commands.shut_down()

    # -- what the registry tells us -------------------------------------------------

    def connection_superseded(self, edge_id: str, old_token: int) -> None:
        """Settle what was in flight on the old connection, now.

        The status ask moves to the new connection (its callers then get
        the new connection's answer); commands end ``superseded``.
        """
        self._asks.connection_ended(edge_id, old_token)
        self._commands.connection_ended(old_token, SUPERSEDED, SUPERSEDED_REASON)

    def connection_closed(self, edge_id: str, token: int) -> None:
        """Settle what is still tracked for a connection that closed.

        The wire fails its pending requests as it closes, so this finds
        only what no request carries any more (a command whose request was
        answered with a foreign command id), or what a peer without that
        courtesy left behind.
        """
        self._asks.connection_ended(edge_id, token)
        self._commands.connection_ended(token, EDGE_DISCONNECTED, DISCONNECTED_REASON)

    def command_event_relayed(self, edge_id: str, token: int, event: pb.EdgeEvent) -> None:
        """``command.accepted`` / ``command.started`` advance their own command
        (on the connection it was sent on only)."""
        self._commands.command_event_relayed(edge_id, token, event)

    def operation_updated(self, operation: OperationRecord) -> None:
        """Another replica changed an operation (cluster mode): callers here
        waiting for it (a replayed idempotency key) get its end."""
        self._commands.operation_updated(operation)

    # -- status -----------------------------------------------------------------------

    def status(self, edge_id: str) -> Deferred[StatusSnapshot]:
        """A fresh snapshot of ``edge_id`` from its current connection.

        Concurrent callers for one edge share a single in-flight request.
        Fails with UnknownEdge, EdgeNotConnected, EdgeTimeout,
        EdgeDisconnected or EdgeErrorAnswer.
        """
        if self.stopping:
            return fail(ShuttingDown())
        return self._asks.status(edge_id)

    def status_group(self, edge_ids: list[str], answered: GroupAnswered) -> None:
        """Ask several edges at once, under one deadline for them all.

        ``answered(index, snapshot, error)`` is called exactly once per
        edge id (by its index). This is a fleet round's way of asking,
        for callers that are not a round (cluster mode: the asks another
        replica routed here for its round): no Deferred and no timer per
        edge, and the single-status latency histogram is left alone.
        """
        if self.stopping:
            for index in range(len(edge_ids)):
                answered(index, None, ShuttingDown())
            return
        self._asks.group(edge_ids, answered)

    def status_waiters(self, edge_id: str) -> int:
        """How many callers wait on the edge's status request in flight (0: none)."""
        return self._asks.waiting(edge_id)

    # -- fleet rounds -------------------------------------------------------------------

    @property
    def last_round(self) -> Optional[FleetRound]:
        """The newest finished fleet round, if any."""
        return self._rounds.last_round

    def fleet_status(self, filter_: EdgeFilter = NO_FILTER) -> Deferred[FleetRound]:
        """A fleet round: a status row for every known edge (with a filter:
        for every matching edge, asking only those).

        One round runs at a time: a caller arriving while one runs joins
        it, and a caller within ``fleet_max_age_seconds`` of the last
        round's start gets that round. Otherwise a new round asks every
        connected edge at once, in slices per reactor turn, so answers are
        read while later slices are still being sent. One deadline covers
        the round; one slow or failing edge marks only its own row.
        """
        if self.stopping:
            return fail(ShuttingDown())
        return self._rounds.fleet_status(filter_)

    # -- commands -------------------------------------------------------------------------

    def dispatch(
        self,
        edge_id: str,
        name: str,
        target: str,
        arguments: dict[str, str],
        timeout_seconds: float,
        idempotency_key: str = "",
        requested_by: str = "",
        operation_id: str = "",
    ) -> Dispatched:
        """Send a command; return its operation and a Deferred of its end.

        The same idempotency key for the same edge and the same command
        (name, target, arguments) returns the existing operation (and its
        end) without dispatching again; the key with a different command
        raises IdempotencyConflict. Raises UnknownEdge, EdgeNotConnected or
        UnknownCommand before anything is sent. ``operation_id`` names the
        new operation (cluster mode reserves the idempotency key under it
        first); by default a fresh one is made.
        """
        if self.stopping:
            raise ShuttingDown()
        return self._commands.dispatch(
            edge_id, name, target, arguments, timeout_seconds, idempotency_key, requested_by, operation_id
        )

    def wait_for(self, operation: OperationRecord) -> Deferred[OperationRecord]:
        """Fire with ``operation`` once it is finished."""
        return self._commands.wait_for(operation)

    def run_routed_command(self, edge_id: str, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Cluster mode: send on this replica's connection of ``edge_id`` a
        command another replica dispatched; fire with the edge's answer
        (the operation is the dispatcher's to change)."""
        return self._commands.run_routed(edge_id, request)

    def end_orphaned_operations(self, replica: str, reason: str) -> int:
        """Cluster mode: end ``failed`` the operations a dead ``replica``
        dispatched and never saw end; return how many ended."""
        return self._commands.end_orphaned(replica, reason)
