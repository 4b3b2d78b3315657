"""The lifecycle of one inference request at the Edge (pure, no I/O).

A request is ``queued`` (a place in its model's FIFO admission queue),
then ``leased`` (it holds a lease on a provider, forwarded to its Node,
nothing relayed yet), then ``streaming`` (output reached the client),
then ``finished``. :class:`InferenceLifecycle` owns the leases it takes
from the :class:`~twisted_iop.edge.providers.pool.ProviderPool` and releases each
exactly once, whatever ends the request; a request whose Node is lost
before any output reached the client goes back to its queue (once). The
I/O around it is :class:`~twisted_iop.edge.inference.gateway.InferenceGateway`'s.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from typing import Any, Optional

import attrs
from twisted.internet.defer import CancelledError, Deferred
from twisted.python.failure import Failure

from twisted_iop.edge.inference.config import DEFAULT_MAX_RETRIES
from twisted_iop.edge.providers.pool import Lease, NoSuchModel, ProviderKey, ProviderPool


class InferenceError(Exception):
    """A request ends with an OpenAI-shaped error (mapped once, in the HTTP API)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        kind: str = "invalid_request_error",
        retry_after: Optional[int] = None,
        body: Optional[bytes] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind
        self.retry_after = retry_after
        #: A provider's own OpenAI error body, passed through as it is.
        self.body = body

    def to_json(self) -> bytes:
        """The OpenAI error body."""
        if self.body is not None:
            return self.body
        return json.dumps({"error": {"message": self.message, "type": self.kind, "code": self.code}}).encode()


class QueueFull(Exception):
    """The model's admission queue is at ``max_queued_per_model``."""


class Phase(enum.Enum):
    """Where one request is in its life."""

    QUEUED = "queued"
    LEASED = "leased"
    STREAMING = "streaming"
    FINISHED = "finished"


class Outcome(enum.Enum):
    """How a request ended."""

    COMPLETED = "completed"
    PROVIDER_ERROR = "provider_error"
    CLIENT_GONE = "client_gone"
    CLIENT_TOO_SLOW = "client_too_slow"
    NODE_LOST = "node_lost"
    NODE_SILENT = "node_silent"
    QUEUE_TIMEOUT = "queue_timeout"
    EDGE_STOPPING = "edge_stopping"


#: Outcomes after which the Node may still be running the request.
_NODE_STILL_RUNS = frozenset({Outcome.CLIENT_GONE, Outcome.CLIENT_TOO_SLOW, Outcome.NODE_SILENT, Outcome.EDGE_STOPPING})


@attrs.define(eq=False)
class Ticket:
    """One request's state in the lifecycle."""

    inference_id: int
    model: str
    long_context: bool
    granted: Callable[[Ticket], None] = attrs.field(repr=False)
    phase: Phase = Phase.QUEUED
    lease: Optional[Lease] = None
    outcome: Optional[Outcome] = None
    attempts: int = 0
    #: Providers that failed this request before its first output.
    avoid: frozenset[ProviderKey] = frozenset()
    #: Submission order within its queue (FIFO checks).
    sequence: int = 0
    waiting: Optional[Deferred[Lease]] = attrs.field(default=None, repr=False)


class InferenceLifecycle:
    """Every live request and its lease; pure transitions over the pool."""

    def __init__(self, pool: ProviderPool, max_queued_per_model: int, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.pool = pool
        self.max_queued_per_model = max_queued_per_model
        #: Leases after the first that one request may be given.
        self.max_retries = max_retries
        self.tickets: dict[int, Ticket] = {}
        self._queued: dict[tuple[str, bool], int] = {}
        self._next_id = 0
        self._sequence = 0

    def queued(self, model: str, long_context: bool) -> int:
        """Requests of this lifecycle waiting in one queue."""
        return self._queued.get((model, long_context), 0)

    def queued_total(self) -> int:
        """Requests waiting in every queue."""
        return sum(self._queued.values())

    def submit(self, model: str, long_context: bool, granted: Callable[[Ticket], None]) -> Ticket:
        """A new request: leased at once, or queued, or :class:`QueueFull`.

        ``granted`` runs when (and every time) the request obtains a lease.
        Raises :class:`~twisted_iop.edge.providers.pool.NoSuchModel` when no provider
        could ever serve it.
        """
        self._next_id += 1
        ticket = Ticket(self._next_id, model, long_context, granted)
        self._admit(ticket, bounded=True)
        return ticket

    def _admit(self, ticket: Ticket, bounded: bool) -> None:
        key = (ticket.model, ticket.long_context)
        lease = None
        if not self._queued.get(key):
            lease = self.pool.try_acquire(ticket.model, ticket.long_context, ticket.avoid)
        if lease is None and bounded and self._queued.get(key, 0) >= self.max_queued_per_model:
            raise QueueFull(f"{self._queued.get(key, 0)} requests already wait for model {ticket.model!r}")
        if lease is None:
            d = self.pool.admit(ticket.model, ticket.long_context, ticket.avoid)
            if d.called:
                # Only a synchronous NoSuchModel (or a lease, which
                # try_acquire just said cannot be) fires at once.
                failure_or_lease: list[Any] = []
                d.addBoth(failure_or_lease.append)
                result = failure_or_lease[0]
                if isinstance(result, Failure):
                    result.raiseException()
                lease = result
            else:
                self._sequence += 1
                ticket.sequence = self._sequence
                ticket.phase = Phase.QUEUED
                ticket.waiting = d
                self._queued[key] = self._queued.get(key, 0) + 1
                self.tickets[ticket.inference_id] = ticket
                d.addCallbacks(self._leased_later, _ignore_cancel, callbackArgs=(ticket,))
                return
        self.tickets[ticket.inference_id] = ticket
        self._grant(ticket, lease)

    def _leased_later(self, lease: Lease, ticket: Ticket) -> None:
        key = (ticket.model, ticket.long_context)
        ticket.waiting = None
        self._queued[key] -= 1
        if not self._queued[key]:
            del self._queued[key]
        self._grant(ticket, lease)

    def _grant(self, ticket: Ticket, lease: Lease) -> None:
        ticket.lease = lease
        ticket.phase = Phase.LEASED
        ticket.attempts += 1
        ticket.granted(ticket)

    def first_output(self, ticket: Ticket) -> None:
        """Output of ``ticket`` reached its client: it can no longer be retried."""
        if ticket.phase is Phase.LEASED:
            ticket.phase = Phase.STREAMING

    def finish(self, ticket: Ticket, outcome: Outcome) -> bool:
        """End ``ticket``; release its lease once. Returns whether to cancel on the Node."""
        if ticket.phase is Phase.FINISHED:
            return False
        previous = ticket.phase
        ticket.phase = Phase.FINISHED
        ticket.outcome = outcome
        self.tickets.pop(ticket.inference_id, None)
        if previous is Phase.QUEUED:
            key = (ticket.model, ticket.long_context)
            self._queued[key] -= 1
            if not self._queued[key]:
                del self._queued[key]
            waiting, ticket.waiting = ticket.waiting, None
            if waiting is not None:
                waiting.cancel()
            return False
        self._release(ticket)
        return outcome in _NODE_STILL_RUNS

    def node_lost(self, ticket: Ticket) -> bool:
        """The Node running ``ticket`` is gone. True if it went back to its queue.

        Only a request with no output at its client yet is retried, and
        only while it has retries left; otherwise it finishes ``NODE_LOST``.
        """
        if ticket.phase is Phase.LEASED and ticket.attempts <= self.max_retries:
            return self._requeue(ticket, Outcome.NODE_LOST)
        self.finish(ticket, Outcome.NODE_LOST)
        return False

    def failed_before_output(self, ticket: Ticket) -> bool:
        """The provider of ``ticket`` failed it in a way another may not. True if it went back to its queue.

        Retried only with no output at its client yet, while it has retries
        left and another provider of its model (not one that failed it)
        takes work; otherwise the caller ends it with the error.
        """
        lease = ticket.lease
        if ticket.phase is not Phase.LEASED or lease is None or ticket.attempts > self.max_retries:
            return False
        avoid = ticket.avoid | {(lease.node_id, lease.provider_id)}
        if not self.pool.another_takes_work(ticket.model, ticket.long_context, avoid):
            return False
        ticket.avoid = avoid
        return self._requeue(ticket, Outcome.PROVIDER_ERROR)

    def wait_for_return(self, ticket: Ticket) -> bool:
        """The only providers of ``ticket`` could not take it but are "not now" (an engine
        restarting, re-probing, cooling down). True if it went back to its queue to wait
        for one of them (its queue timeout bounds the wait).

        Only with no output at its client yet and while it has retries left.
        """
        if ticket.phase is not Phase.LEASED or ticket.lease is None or ticket.attempts > self.max_retries:
            return False
        return self._requeue(ticket, Outcome.PROVIDER_ERROR)

    def _requeue(self, ticket: Ticket, outcome: Outcome) -> bool:
        self._release(ticket)
        self.tickets.pop(ticket.inference_id, None)
        try:
            self._admit(ticket, bounded=False)
        except NoSuchModel:
            ticket.phase = Phase.FINISHED
            ticket.outcome = outcome
            return False
        return True

    def _release(self, ticket: Ticket) -> None:
        lease, ticket.lease = ticket.lease, None
        if lease is not None and not lease.released:
            self.pool.release(lease)


def _ignore_cancel(failure: Failure) -> None:
    failure.trap(CancelledError)
