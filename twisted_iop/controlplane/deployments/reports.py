"""What edges say of their deployments (no I/O): their answers to a desired set and their snapshots.

:class:`EdgeReports` keeps, per edge, its last answer to a desired set
(``EdgeDeploymentsResponse``) and what its last status snapshot says of
deployments (read once per snapshot, compared by identity: its nodes'
profiles and free slots, its instances, its hold). The newer of the two is
the edge's word on what runs (:meth:`EdgeReports.observation`);
:meth:`EdgeReports.edge_view` is the edge as placement sees it, and
:func:`takes_deployments` whether this process sends it desired sets at all.
"""

from __future__ import annotations

from typing import Optional

from twisted_iop.controlplane.cluster.remote import RemotePeer
from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments.kept import SnapshotRead
from twisted_iop.controlplane.deployments.rollup import Observation
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.wire import control_pb2 as pb

#: The command an Edge that takes desired sets announces in its catalog.
HOLD_COMMAND = "edge.hold"


def takes_deployments(record: EdgeRecord) -> bool:
    """Whether this process sends the edge desired sets: the edge announces ``edge.hold`` (an
    Edge older than deployments announces no such command and is sent nothing), and its
    connection is held here (cluster mode: another replica's edge gets its set from that one)."""
    if isinstance(record.peer, RemotePeer):
        return False
    return any(command.name == HOLD_COMMAND for command in record.hello.commands)


class EdgeReports:
    """Each edge's last answer to a desired set and the deployments part of its last snapshot."""

    def __init__(self, registry: EdgeRegistry) -> None:
        self._registry = registry
        #: What each edge last answered to a desired set.
        self._answers: dict[str, Observation] = {}
        #: The snapshot last read per edge, and what it said (compared by identity).
        self._reads: dict[str, SnapshotRead] = {}

    def answered(self, edge_id: str, response: pb.EdgeDeploymentsResponse, at: float) -> None:
        """The edge answered a desired set at ``at``."""
        self._answers[edge_id] = Observation(response.observed_version, tuple(response.instances), response.held, at)

    def connected(self, edge_id: str) -> None:
        """A new connection of the edge: its answers on the older one no longer say what runs."""
        self._answers.pop(edge_id, None)

    def forget_unknown(self) -> None:
        """Forget the edges the registry forgot."""
        for kept in (self._answers, self._reads):
            for edge_id in [e for e in kept if self._registry.find(e) is None]:
                del kept[edge_id]

    def read(self, record: EdgeRecord) -> Optional[SnapshotRead]:
        """What the edge's last snapshot says of deployments: read once per snapshot, and only that
        kept (its nodes' profiles and free slots, its instances), not the whole parsed snapshot."""
        snapshot = record.snapshot
        if snapshot is None:
            return None
        read = self._reads.get(record.edge_id)
        if read is None or read.snapshot is not snapshot:
            status = snapshot.parse()
            observed = Observation(
                status.observed_deployments_version, tuple(status.instances), status.held, snapshot.received_at
            )
            read = self._reads[record.edge_id] = SnapshotRead(snapshot, observed, pl.node_views(status))
        return read

    def observation(self, edge_id: str) -> Optional[Observation]:
        """What the edge said last of its deployments: its answer to a set, or a newer snapshot."""
        answer = self._answers.get(edge_id)
        record = self._registry.find(edge_id)
        if record is None or record.snapshot is None:
            return answer
        if answer is None or record.snapshot.received_at > answer.at:
            read = self.read(record)
            if read is not None:
                return read.observation
        return answer

    def edge_view(self, record: EdgeRecord) -> pl.EdgeView:
        """The edge as placement sees it (its last snapshot, and its newest word on what runs)."""
        observed = self.observation(record.edge_id)
        read = self.read(record)
        return pl.EdgeView(
            edge_id=record.edge_id,
            connected=record.token is not None,
            held=observed.held if observed is not None else False,
            labels=tuple(sorted(record.hello.labels.items())),
            nodes=read.nodes if read is not None else (),
            running=pl.running_instances(observed.instances if observed is not None else ()),
        )
