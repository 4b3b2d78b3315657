"""The Edge's deployments: the Control Plane's desired instances, split per node and applied.

:class:`EdgeDeployments` keeps the whole desired set the Control Plane last
sent (``EdgeDeploymentsRequest``, with its ``version``), splits it per node
and sends each connected node its own ``NodeInstancesRequest`` (again when a
node becomes ready, so a node that restarted gets its set back). The
instances become providers of their node in the
:class:`~twisted_iop.edge.nodes.registry.NodeRegistry` beside the ones edge.yaml
lists, so a node whose ``nodes:`` entry lists none gets all its providers
from deployments.

The Edge never sends a set it has not received: after an Edge restart,
nothing is sent until the Control Plane sends the set again, so the nodes'
instances keep running, and the same set restarts none of them (the node
compares spec hashes).

**Maintenance hold** (``deployments.hold`` in edge.yaml, the ``edge.hold``
and ``edge.release`` commands): the set is acknowledged and kept, and
nothing is changed on the nodes; release applies it.

Every value read from a node is checked: states this Edge does not know
are kept as unspecified with a reason, texts and counts are bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Optional

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from twisted_iop.edge.config import ProviderConfig
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.ids import id_problem
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.enums import enum_label, is_known
from twisted_iop.wire.hello import MAX_TEXT

#: The most instances one desired set may hold for this Edge (the rest are refused).
MAX_EDGE_INSTANCES = 10_000
#: The most instance statuses kept per node, and profiles per node.
MAX_NODE_INSTANCES = 512
MAX_NODE_PROFILES = 128
#: The largest capacity an instance's provider gets here.
MAX_CAPACITY = 100_000


@attrs.frozen
class NodeCapacity:
    """What a node declares: its profiles (with their free ports when it last said) and GPU slots."""

    profiles: tuple[pb.EngineProfile, ...] = ()
    gpus: int = 0
    free_gpus: int = 0

    def kind_of(self, profile: str) -> Optional[str]:
        """The engine kind of ``profile``, if the node declares it."""
        return next((p.kind for p in self.profiles if p.name == profile), None)


class EdgeDeployments:
    """The desired set, what each node was sent and what each runs (see the module docstring)."""

    _log = Logger()

    def __init__(
        self, registry: NodeRegistry, clock: IReactorTime, held: bool = False, node_timeout_seconds: float = 30.0
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._node_timeout = node_timeout_seconds
        self.held = held
        #: The version of the set last taken (0: none received since this Edge started).
        self.version = 0
        self.received = False
        #: The desired instances per node (of the set last taken).
        self.desired: dict[str, tuple[pb.DesiredInstance, ...]] = {}
        #: Instances of the set refused here (no such node, a bad id, too many), with why.
        self.refused: dict[tuple[str, str], pb.InstanceStatus] = {}
        #: What each node was last sent (applied); while held this stays behind ``desired``.
        self.applied: dict[str, tuple[pb.DesiredInstance, ...]] = {}
        #: What each node says of its instances, by instance id.
        self.reported: dict[str, dict[str, pb.InstanceStatus]] = {}
        self.capacity: dict[str, NodeCapacity] = {}
        #: Requests sent per node; an answer counts only if it answers the latest.
        self._sent: dict[str, int] = {}
        #: Sets sent to nodes (for tests and the diagnostics).
        self.sends = 0
        #: Hears of every instance status a node reports unsolicited (tests, the metrics).
        self.report_listener: Optional[Callable[[pb.InstanceStatus], None]] = None
        registry.listener = self

    # -- the Control Plane's set -------------------------------------------------------------

    def take(self, request: pb.EdgeDeploymentsRequest) -> pb.EdgeDeploymentsResponse:
        """Take the Control Plane's whole desired set (an older version than the one held is ignored)."""
        if self.received and request.version < self.version:
            self._log.warn(
                "ignoring desired set version {version}: this edge holds version {current}",
                version=request.version,
                current=self.version,
            )
            return self.response()
        nodes = {n.node_id for n in self._registry.nodes()}
        desired: dict[str, list[pb.DesiredInstance]] = {node_id: [] for node_id in nodes}
        refused: dict[tuple[str, str], pb.InstanceStatus] = {}
        for index, instance in enumerate(request.instances):
            problem = None
            if index >= MAX_EDGE_INSTANCES:
                problem = f"more than {MAX_EDGE_INSTANCES} instances for one edge"
            elif instance.node_id not in nodes:
                problem = f"no node {instance.node_id[:64]!r} is configured on this edge"
            else:
                problem = id_problem("instance_id", instance.instance_id)
            if problem is not None:
                if len(refused) < MAX_NODE_INSTANCES:
                    key = (instance.node_id[:MAX_TEXT], instance.instance_id[:MAX_TEXT])
                    refused[key] = self._status(instance, pb.INSTANCE_STATE_REFUSED, problem)
                continue
            desired[instance.node_id].append(instance)
        self.version = request.version
        self.received = True
        self.desired = {node_id: tuple(items) for node_id, items in desired.items()}
        self.refused = refused
        self._log.info(
            "desired set version {version}: {count} instances{held}",
            version=request.version,
            count=sum(len(v) for v in self.desired.values()),
            held=" (held: not applied)" if self.held else "",
        )
        if not self.held:
            self.apply()
        return self.response()

    def response(self) -> pb.EdgeDeploymentsResponse:
        """The version taken, what runs, and whether this edge holds changes."""
        return pb.EdgeDeploymentsResponse(observed_version=self.version, instances=self.statuses(), held=self.held)

    # -- hold ----------------------------------------------------------------------------------

    def hold(self) -> bool:
        """Hold changes (maintenance); whether that changed anything."""
        if self.held:
            return False
        self.held = True
        self._log.info("deployments held: the desired set is kept, not applied")
        return True

    def release(self) -> bool:
        """End the hold and apply the set held; whether that changed anything."""
        if not self.held:
            return False
        self.held = False
        self._log.info("deployments released: applying desired set version {version}", version=self.version)
        if self.received:
            self.apply()
        return True

    # -- the nodes -----------------------------------------------------------------------------

    def apply(self) -> None:
        """Give every node its part of the set: its providers here, its request if it is connected."""
        for node_id, instances in self.desired.items():
            self.applied[node_id] = instances
        self._registry.set_deployed({node_id: self._providers(node_id) for node_id in self.desired})
        for node_id in self.desired:
            self._send(node_id)

    def node_hello(self, node_id: str, hello: pb.NodeHelloRequest) -> None:
        """A node said hello: what it declares (its profiles and GPU slots)."""
        self.capacity[node_id] = _capacity(hello.profiles, hello.gpus, hello.free_gpus)

    def node_became_ready(self, node_id: str) -> None:
        """A node is ready: it gets its part of the set (unless none was received, or held)."""
        if self.received and not self.held and node_id in self.applied:
            self._send(node_id)

    def _set_providers(self, node_id: str) -> None:
        self._registry.set_deployed_providers(node_id, self._providers(node_id))

    def _providers(self, node_id: str) -> tuple[ProviderConfig, ...]:
        """The providers the instances applied to ``node_id`` run as here (refused ones are none)."""
        capacity = self.capacity.get(node_id, NodeCapacity())
        reported = self.reported.get(node_id, {})
        providers = []
        for instance in self.applied.get(node_id, ()):
            status = reported.get(instance.instance_id)
            if status is not None and status.state == pb.INSTANCE_STATE_REFUSED:
                continue
            asked = instance.capacity
            providers.append(
                ProviderConfig(
                    provider_id=instance.instance_id,
                    kind=capacity.kind_of(instance.profile) or "openai",
                    models=(instance.model[:MAX_TEXT],),
                    capacity=min(asked, MAX_CAPACITY) if asked else 1,
                    capacity_auto=asked == 0,
                )
            )
        return tuple(providers)

    def _send(self, node_id: str) -> None:
        peer = self._registry.owner_peer(node_id)
        if peer is None:
            return
        instances = self.applied.get(node_id, ())
        capacity = self.capacity.get(node_id, NodeCapacity())
        if not instances and not capacity.profiles and not self.reported.get(node_id):
            return  # nothing to run, nothing running, no profiles: an empty set changes nothing there
        sequence = self._sent[node_id] = self._sent.get(node_id, 0) + 1
        self.sends += 1
        request = pb.NodeInstancesRequest(instances=list(instances))
        d = peer.instances(request, self._node_timeout)
        d.addCallback(self._answered, node_id, sequence)
        d.addErrback(self._failed, node_id)

    def _answered(self, response: pb.NodeInstancesResponse, node_id: str, sequence: int) -> None:
        if self._sent.get(node_id) != sequence:
            return  # a later set was sent since
        self.reported[node_id] = {}
        self._merge(node_id, response.instances, response.profiles, response.free_gpus)

    def _failed(self, failure: Failure, node_id: str) -> None:
        self._log.warn(
            "node {node_id} did not take its desired instances: {error}",
            node_id=node_id,
            error=failure.getErrorMessage(),
        )

    def node_report(self, node_id: str, report: pb.NodeInstancesReport) -> None:
        """A node's unsolicited report (from its owner connection): an instance changed state."""
        self._merge(node_id, report.instances, report.profiles, report.free_gpus)
        if self.report_listener is not None:
            for status in report.instances[:MAX_NODE_INSTANCES]:
                self.report_listener(_checked_status(node_id, status))

    def _merge(
        self,
        node_id: str,
        statuses: Sequence[pb.InstanceStatus],
        profiles: Sequence[pb.EngineProfile],
        free_gpus: int,
    ) -> None:
        known = self.reported.setdefault(node_id, {})
        before_refused = {i for i, s in known.items() if s.state == pb.INSTANCE_STATE_REFUSED}
        for status in statuses[:MAX_NODE_INSTANCES]:
            checked = _checked_status(node_id, status)
            if checked.state == pb.INSTANCE_STATE_STOPPED and not any(
                d.instance_id == checked.instance_id for d in self.applied.get(node_id, ())
            ):
                known.pop(checked.instance_id, None)
                continue
            if len(known) < MAX_NODE_INSTANCES or checked.instance_id in known:
                known[checked.instance_id] = checked
        old = self.capacity.get(node_id, NodeCapacity())
        self.capacity[node_id] = (
            _capacity(profiles, old.gpus, free_gpus)
            if profiles
            else attrs.evolve(old, free_gpus=min(free_gpus, old.gpus))
        )
        if before_refused != {i for i, s in known.items() if s.state == pb.INSTANCE_STATE_REFUSED}:
            self._set_providers(node_id)

    # -- what is shown ---------------------------------------------------------------------------

    def statuses(self) -> list[pb.InstanceStatus]:
        """Every instance of the set (and any a node still stops), with its state and reason."""
        out: list[pb.InstanceStatus] = []
        for node_id in sorted(self.desired):
            ready = self._registry.is_ready(node_id)
            reported = self.reported.get(node_id, {}) if ready else {}
            applied = {d.instance_id: d for d in self.applied.get(node_id, ())}
            for instance in self.desired[node_id]:
                status = reported.get(instance.instance_id)
                if self.held and applied.get(instance.instance_id) != instance:
                    out.append(self._status(instance, pb.INSTANCE_STATE_PENDING, "held: this edge holds changes"))
                elif not ready:
                    out.append(self._status(instance, pb.INSTANCE_STATE_PENDING, f"node {node_id} is not connected"))
                elif status is None:
                    out.append(self._status(instance, pb.INSTANCE_STATE_PENDING, "sent to its node, no answer yet"))
                else:
                    out.append(status)
            wanted = {d.instance_id for d in self.desired[node_id]}
            out.extend(s for i, s in sorted(reported.items()) if i not in wanted)
        out.extend(self.refused[key] for key in sorted(self.refused))
        return out

    def diagnostics(self) -> dict[str, str]:
        """The deployments' part of ``edge.diagnostics``."""
        return {
            "deployments_version": str(self.version),
            "deployments_held": "true" if self.held else "false",
            "deployments_instances": str(sum(len(v) for v in self.desired.values())),
            "deployments_sends": str(self.sends),
        }

    def deployment_of(self, node_id: str, provider_id: str) -> str:
        """The deployment a provider is an instance of ("" for one edge.yaml configures)."""
        for instance in self.applied.get(node_id, ()):
            if instance.instance_id == provider_id:
                return instance.deployment[:MAX_TEXT]
        return ""

    def fill_node_snapshot(self, snapshot: pb.EdgeNodeSnapshot) -> None:
        """Add the node's profiles and GPU slots, and each instance provider's deployment."""
        capacity = self.capacity.get(snapshot.node_id)
        if capacity is not None:
            snapshot.profiles.extend(capacity.profiles)
            snapshot.gpus = capacity.gpus
            snapshot.free_gpus = capacity.free_gpus
        for provider in snapshot.providers:
            provider.deployment = self.deployment_of(snapshot.node_id, provider.provider_id)

    def fill_status(self, response: pb.EdgeStatusResponse) -> None:
        """Add the observed version, the instances and the hold to a status snapshot."""
        response.observed_deployments_version = self.version
        response.instances.extend(self.statuses())
        response.held = self.held

    def _status(self, instance: pb.DesiredInstance, state: pb.InstanceState, reason: str) -> pb.InstanceStatus:
        return pb.InstanceStatus(
            instance_id=instance.instance_id[:MAX_TEXT],
            deployment=instance.deployment[:MAX_TEXT],
            generation=instance.generation,
            node_id=instance.node_id[:MAX_TEXT],
            state=state,
            reason=reason[:MAX_TEXT],
            since_ms=int(self._clock.seconds() * 1000),
        )


def _capacity(profiles: Iterable[pb.EngineProfile], gpus: int, free_gpus: int) -> NodeCapacity:
    """What a node declares, bounded: at most :data:`MAX_NODE_PROFILES` profiles, texts cut."""
    kept = []
    for profile in list(profiles)[:MAX_NODE_PROFILES]:
        copy = pb.EngineProfile()
        copy.CopyFrom(profile)
        copy.name = copy.name[:MAX_TEXT]
        copy.kind = copy.kind[:MAX_TEXT]
        del copy.parameters[64:]
        kept.append(copy)
    return NodeCapacity(tuple(kept), gpus, min(free_gpus, gpus))


def _checked_status(node_id: str, status: pb.InstanceStatus) -> pb.InstanceStatus:
    """A node's instance status with its texts bounded and an unknown state named in its reason."""
    checked = pb.InstanceStatus(
        instance_id=status.instance_id[:MAX_TEXT],
        deployment=status.deployment[:MAX_TEXT],
        generation=status.generation,
        node_id=node_id,
        spec_hash=status.spec_hash[:64],
        state=status.state,
        reason=status.reason[:MAX_TEXT],
        since_ms=status.since_ms,
    )
    if not is_known(pb.InstanceState, status.state) or status.state == pb.INSTANCE_STATE_UNSPECIFIED:
        checked.state = pb.INSTANCE_STATE_UNSPECIFIED
        label = enum_label(pb.InstanceState, status.state)
        checked.reason = f"the node reported an instance state this edge does not know ({label})"[:MAX_TEXT]
    return checked
