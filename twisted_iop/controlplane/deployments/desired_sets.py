"""The desired sets sent to edges: what each edge was last sent, under which version, whether it
answered, and whether it settled on it.

:class:`DesiredSets` sends an edge its whole desired set
(``EdgeDeploymentsRequest``) on the connection given, keeps what was sent
until that edge's next connection (or until the registry forgets the
edge), hands the edge's answer to the reports, and says which edges have
not settled on their set yet (the service asks those for a fresh
snapshot). Which instances a set holds is placement's
(:mod:`.placement`), when to send one the service's (:mod:`.service`).

**Versions.** A desired set's version is the larger of one more than the
last one given and the wall clock in milliseconds, and above the version
the edge reports holding, so a restarted Control Plane never sends a set
an Edge would ignore as older.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Optional

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments.kept import DeploymentState, EdgeDesired
from twisted_iop.controlplane.deployments.reports import EdgeReports
from twisted_iop.controlplane.fleet.edge_record import EdgeRecord
from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.wire import control_pb2 as pb

#: How long an edge has to answer its desired set.
SEND_TIMEOUT_SECONDS = 30.0


class DesiredSets:
    """What each edge was last sent (its version, plan and connection), and sending it."""

    _log = Logger()

    def __init__(self, registry: EdgeRegistry, reports: EdgeReports, clock: IReactorTime) -> None:
        self._registry = registry
        self._reports = reports
        self._clock = clock
        #: What each edge was last sent (forgotten when its connection ends).
        self._sent: dict[str, EdgeDesired] = {}
        self._last_version = 0
        #: For /metrics and tests: desired sets sent, and answered.
        self.sets_sent = 0
        self.sets_answered = 0

    def get(self, edge_id: str) -> Optional[EdgeDesired]:
        """What ``edge_id`` was last sent, if anything (since its current connection)."""
        return self._sent.get(edge_id)

    def connected(self, edge_id: str) -> None:
        """A new connection of the edge: what the older one was sent no longer counts."""
        self._sent.pop(edge_id, None)

    def forget_unknown(self) -> None:
        """Forget the edges the registry forgot."""
        for edge_id in [e for e in self._sent if self._registry.find(e) is None]:
            del self._sent[edge_id]

    def send(self, record: EdgeRecord, token: int, plan: pl.EdgePlan) -> None:
        """Send ``record``'s edge the set ``plan`` on its connection ``token`` under a new version."""
        peer = record.peer
        assert peer is not None
        edge_id = record.edge_id
        version = self._next_version(edge_id)
        desired = self._sent[edge_id] = EdgeDesired(version, plan, token)
        request = pb.EdgeDeploymentsRequest(version=version, instances=[i.desired() for i in plan.instances])
        self.sets_sent += 1
        self._log.info(
            "deployments: edge {edge_id} sent desired set version {version} ({count} instances)",
            edge_id=edge_id,
            version=version,
            count=len(plan.instances),
        )
        d = peer.request_deployments(request)
        d.addTimeout(SEND_TIMEOUT_SECONDS, self._clock)
        d.addCallback(self._answered, edge_id, desired)
        d.addErrback(self._not_answered, edge_id)

    def _next_version(self, edge_id: str) -> int:
        observed = self._reports.observation(edge_id)
        version = max(self._last_version + 1, int(self._clock.seconds() * 1000))
        if observed is not None:
            version = max(version, observed.version + 1)
        self._last_version = version
        return version

    def _answered(self, response: pb.EdgeDeploymentsResponse, edge_id: str, desired: EdgeDesired) -> None:
        self.sets_answered += 1
        if self._sent.get(edge_id) is not desired:
            return
        desired.acknowledged = response.observed_version >= desired.version
        self._reports.answered(edge_id, response, self._clock.seconds())

    def _not_answered(self, failure: Failure, edge_id: str) -> None:
        self._log.warn(
            "deployments: edge {edge_id} did not answer its desired set: {error}",
            edge_id=edge_id,
            error=failure.getErrorMessage(),
        )

    def unsettled(self) -> Iterator[tuple[str, int]]:
        """The edges (id and token) whose current connection was sent a set they do not run yet,
        in the order they were sent one."""
        for edge_id, desired in list(self._sent.items()):
            record = self._registry.find(edge_id)
            if record is None or record.token != desired.token:
                continue
            if not self._settled(edge_id, desired):
                yield edge_id, desired.token

    def _settled(self, edge_id: str, desired: EdgeDesired) -> bool:
        observed = self._reports.observation(edge_id)
        if observed is None or observed.version < desired.version or desired.plan.unplaced:
            return False
        ready = {(s.instance_id, s.spec_hash) for s in observed.instances if s.state == pb.INSTANCE_STATE_READY}
        wanted = {(i.instance_id, i.spec_hash) for i in desired.plan.instances}
        return wanted <= ready and {s.instance_id for s in observed.instances} <= {i for i, _ in wanted}

    def has_newest(self, edge_id: str, state: DeploymentState) -> bool:
        """Whether edge ``edge_id`` was last sent the deployment's newest generation (and is still connected)."""
        sent = self._sent.get(edge_id)
        record = self._registry.find(edge_id)
        if sent is None or record is None or record.token != sent.token:
            return False
        name, generation = state.spec.name, state.generation
        wanted = [i for i in sent.plan.instances if i.deployment == name]
        unplaced = [u for u in sent.plan.unplaced if u.deployment == name]
        return bool(unplaced) or (bool(wanted) and all(i.generation == generation for i in wanted))
