"""Everything the Control Plane knows of one edge, and the errors of asking for one.

An :class:`EdgeRecord` is owned by the
:class:`~twisted_iop.controlplane.fleet.registry.EdgeRegistry`: only the
registry changes which connection is current, and every change a
connection causes is checked against its token there.
"""

from __future__ import annotations

from typing import Optional

import attrs

from twisted_iop.controlplane.fleet.event_log import EdgeEvents
from twisted_iop.controlplane.fleet.memory import hello_size
from twisted_iop.controlplane.fleet.operations import OperationBuffer
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.controlplane.wires.edge_peer import EdgePeer


class UnknownEdge(Exception):
    """No edge with that id is known."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"no edge named {edge_id!r} is known")
        self.edge_id = edge_id


class EdgeNotConnected(Exception):
    """The edge is known but has no current connection."""

    def __init__(self, edge_id: str) -> None:
        super().__init__(f"edge {edge_id!r} is not connected")
        self.edge_id = edge_id


@attrs.define(eq=False)
class EdgeRecord:
    """Everything known about one edge."""

    edge_id: str
    hello: EdgeHello
    events: EdgeEvents
    #: The edge's operations (:attr:`operations`); None until first asked
    #: for: most edges never run a command.
    _operations: Optional[OperationBuffer] = None
    #: The capacity and byte budget its operation buffer gets (one tuple
    #: shared by a registry's records).
    operation_limits: tuple[int, int] = (500, 1024 * 1024)
    token: Optional[int] = None
    peer: Optional[EdgePeer] = None
    connected_at: Optional[float] = None
    disconnected_at: Optional[float] = None
    last_seen: float = 0.0
    enrollments: int = 0
    snapshot: Optional[StatusSnapshot] = None

    @property
    def connected(self) -> bool:
        """Whether the edge has a current connection."""
        return self.token is not None

    @property
    def operations(self) -> OperationBuffer:
        """The edge's operation buffer (made on first use)."""
        operations = self._operations
        if operations is None:
            operations = self._operations = OperationBuffer(*self.operation_limits)
        return operations

    @property
    def operations_kept(self) -> Optional[OperationBuffer]:
        """The operation buffer if it was made (fleet-wide walks: none made)."""
        return self._operations

    def seen_at(self) -> float:
        """When the edge was last heard from: any frame of its current
        connection counts, keepalive pings and pongs included."""
        if self.peer is not None:
            return max(self.last_seen, self.peer.last_received)
        return self.last_seen

    def kept_bytes(self) -> int:
        """Estimated bytes the registry keeps for this edge (hello, snapshot, buffers)."""
        snapshot = 0 if self.snapshot is None else self.snapshot.size()
        operations = 0 if self._operations is None else self._operations.bytes
        return hello_size(self.hello) + snapshot + self.events.bytes + operations

    @property
    def command_names(self) -> list[str]:
        """Names in the edge's announced catalog."""
        return [c.name for c in self.hello.commands]
