"""Dispatch-ready ownership of Nodes by their connections (pure rules, no I/O).

A Node may have several connections at once (a restart racing the old
socket's close, a duplicate process). Each accepted connection gets a fresh
**connection token** and is *pending* until the Node says it is ready; the
ready connection becomes the Node's single **owner**. The rules:

* a pending connection never disturbs the current owner;
* a pending connection that becomes ready takes ownership; the previous
  owner is *superseded* and must be closed by the caller;
* only transitions of the owner (ready, superseded, disconnect) produce
  transitions, and only they change what the snapshot shows;
* the close of a stale (superseded), pending or unknown connection changes
  nothing and produces nothing.

:class:`NodeOwnership` only decides; callers turn its :class:`Transition`
values into events, snapshot changes and socket closes.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator
from typing import Optional

import attrs
from twisted.internet.interfaces import IReactorTime


class TransitionKind(enum.Enum):
    """What happened to a Node's ownership."""

    PENDING = "node.pending"  # first connection of an owner-less node
    READY = "node.ready"  # a connection became the owner
    SUPERSEDED = "node.superseded"  # the previous owner lost to a newer one
    DISCONNECTED = "node.disconnected"  # the owner's connection closed


@attrs.frozen
class Transition:
    """One change of a Node's ownership, to become an event."""

    kind: TransitionKind
    node_id: str
    token: int
    #: For SUPERSEDED: the token of the new owner.
    replaced_by: int = 0


@attrs.define
class _NodeState:
    owner: Optional[int] = None
    owner_since: float = 0.0
    pending: set[int] = attrs.field(factory=set)
    last_seen: float = 0.0


class NodeOwnership:
    """Pending/ready/owner bookkeeping for every Node, keyed by token."""

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._tokens = itertools.count(1)
        self._nodes: dict[str, _NodeState] = {}
        self._node_of: dict[int, str] = {}

    # -- transitions ---------------------------------------------------------

    def open(self, node_id: str) -> tuple[int, list[Transition]]:
        """Record a newly accepted (pending) connection; return its token."""
        token = next(self._tokens)
        state = self._nodes.setdefault(node_id, _NodeState())
        transitions: list[Transition] = []
        if state.owner is None and not state.pending:
            transitions.append(Transition(TransitionKind.PENDING, node_id, token))
        state.pending.add(token)
        self._node_of[token] = node_id
        return token, transitions

    def ready(self, token: int) -> list[Transition]:
        """The connection ``token`` is ready: it becomes the owner.

        A token that is already the owner, or is unknown (closed, superseded),
        changes nothing.
        """
        node_id = self._node_of.get(token)
        if node_id is None:
            return []
        state = self._nodes[node_id]
        if token not in state.pending:
            return []
        now = self._clock.seconds()
        transitions: list[Transition] = []
        state.pending.discard(token)
        previous = state.owner
        if previous is not None:
            del self._node_of[previous]
            transitions.append(Transition(TransitionKind.SUPERSEDED, node_id, previous, replaced_by=token))
        state.owner = token
        state.owner_since = now
        state.last_seen = now
        transitions.append(Transition(TransitionKind.READY, node_id, token))
        return transitions

    def close(self, token: int) -> list[Transition]:
        """The connection ``token`` closed.

        Only the owner's close is a transition; a pending, stale or unknown
        token's close changes nothing.
        """
        node_id = self._node_of.pop(token, None)
        if node_id is None:
            return []
        state = self._nodes[node_id]
        if token in state.pending:
            state.pending.discard(token)
            return []
        if state.owner == token:
            state.owner = None
            state.owner_since = 0.0
            state.last_seen = self._clock.seconds()
            return [Transition(TransitionKind.DISCONNECTED, node_id, token)]
        return []  # pragma: no cover - every known token is pending or owner

    def seen(self, token: int) -> None:
        """The owner ``token`` sent something: refresh the Node's last_seen."""
        node_id = self._node_of.get(token)
        if node_id is not None:
            state = self._nodes[node_id]
            if state.owner == token:
                state.last_seen = self._clock.seconds()

    # -- queries -------------------------------------------------------------

    def is_owner(self, token: int) -> bool:
        """Whether ``token`` is its Node's current owner."""
        node_id = self._node_of.get(token)
        return node_id is not None and self._nodes[node_id].owner == token

    def is_pending(self, token: int) -> bool:
        """Whether ``token`` is a pending (not yet ready) connection."""
        node_id = self._node_of.get(token)
        return node_id is not None and token in self._nodes[node_id].pending

    def node_of(self, token: int) -> Optional[str]:
        """The Node of a live (pending or owner) token."""
        return self._node_of.get(token)

    def owner(self, node_id: str) -> Optional[int]:
        """The owner token of ``node_id``, if it is dispatch-ready."""
        state = self._nodes.get(node_id)
        return state.owner if state is not None else None

    def owner_since(self, node_id: str) -> float:
        """When the current owner became ready (0 when there is none)."""
        state = self._nodes.get(node_id)
        return state.owner_since if state is not None and state.owner is not None else 0.0

    def last_seen(self, node_id: str) -> float:
        """When the owner last spoke, or when the last owner left (0: never)."""
        state = self._nodes.get(node_id)
        return state.last_seen if state is not None else 0.0

    def pending(self, node_id: str) -> frozenset[int]:
        """The pending tokens of ``node_id``."""
        state = self._nodes.get(node_id)
        return frozenset(state.pending) if state is not None else frozenset()

    def tokens(self, node_id: str) -> frozenset[int]:
        """Every live token of ``node_id`` (owner first is not implied)."""
        state = self._nodes.get(node_id)
        if state is None:
            return frozenset()
        owner = {state.owner} if state.owner is not None else set()
        return frozenset(state.pending | owner)

    def live_tokens(self) -> Iterator[int]:
        """Every live token of every Node."""
        return iter(list(self._node_of))
