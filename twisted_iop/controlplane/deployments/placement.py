"""Where a deployment's instances go on each edge, and what a dry run answers (pure, no I/O).

Input: the deployments (spec and generation), one edge as the Control Plane
last heard of it (:class:`EdgeView`: connected, labels, held, its nodes with
their labels, engine profiles, free ports and GPU slots, and the instances
it reports), and where each instance was placed before. Output: the
edge's desired instances (:class:`EdgePlan`) and, for a dry run, what would
start, restart, stay or stop (:func:`changes`) and what cannot be placed
and why.

**Converge, never churn.** An instance keeps its id (``<deployment>-<n>``,
``n`` from 1 to ``replicas_per_edge``) and its node: where it runs (as the
edge reports) or where it was placed before, as long as that node is still
on the edge and still matches the node selector, and does not now declare
profiles without the deployment's. Only a new instance is placed: on the
node matching the node selector that declares the profile, accepts the
parameters, and has a free port and the GPU slots, that holds the fewest
instances of this deployment so far (then by node id). So the same
deployments and the same edge give the same instances on the same nodes,
whatever order they come in.

A parameter the profile's declared bounds refuse on every node that
declares it is still placed (the Node is the authority, and refuses it
with a reason shown in the rollup); the plan names the problem so a dry
run reports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

import attrs

from twisted_iop.controlplane.deployments.spec import DeploymentSpec, Scalar, value_text
from twisted_iop.label_selectors import parse_selector
from twisted_iop.wire import control_pb2 as pb

START = "start"
RESTART = "restart"
STAY = "stay"
STOP = "stop"


@attrs.frozen
class Deployment:
    """A deployment as placement needs it: its spec and generation."""

    spec: DeploymentSpec
    generation: int


@attrs.frozen
class ParameterBounds:
    """What a profile declares of one parameter (from ``pb.ProfileParameter``)."""

    name: str
    type: str
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    choices: tuple[str, ...] = ()
    pattern: str = ""
    has_default: bool = False


@attrs.frozen
class ProfileView:
    """One engine profile of a node, with its free ports when the node last said."""

    name: str
    parameters: tuple[ParameterBounds, ...] = ()
    free_ports: int = 0
    gpus_per_instance: int = 0


@attrs.frozen
class NodeView:
    """One node of an edge, from the edge's last status snapshot."""

    node_id: str
    connected: bool = True
    labels: tuple[tuple[str, str], ...] = ()
    profiles: tuple[ProfileView, ...] = ()
    free_gpus: int = 0

    def profile(self, name: str) -> Optional[ProfileView]:
        """The profile ``name``, if the node declares it."""
        return next((p for p in self.profiles if p.name == name), None)


@attrs.frozen
class RunningInstance:
    """An instance an edge reports (what runs, or what its node says of it)."""

    instance_id: str
    node_id: str
    deployment: str = ""
    spec_hash: str = ""
    state: int = pb.INSTANCE_STATE_UNSPECIFIED


@attrs.frozen
class EdgeView:
    """One edge as the Control Plane last heard of it."""

    edge_id: str
    connected: bool = True
    held: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    nodes: tuple[NodeView, ...] = ()
    running: tuple[RunningInstance, ...] = ()


@attrs.frozen
class PlacedInstance:
    """One desired instance on one node."""

    instance_id: str
    deployment: str
    generation: int
    node_id: str
    profile: str
    model: str
    parameters: tuple[tuple[str, str], ...]
    capacity: int
    spec_hash: str
    #: Why its node is expected to refuse it ("" when none is known).
    problem: str = ""

    def desired(self) -> pb.DesiredInstance:
        """The instance as the Edge wire sends it."""
        return pb.DesiredInstance(
            instance_id=self.instance_id,
            deployment=self.deployment,
            generation=self.generation,
            node_id=self.node_id,
            profile=self.profile,
            model=self.model,
            parameters=dict(self.parameters),
            capacity=self.capacity,
            spec_hash=self.spec_hash,
        )


@attrs.frozen
class Unplaced:
    """An instance that cannot be placed on an edge, and why."""

    deployment: str
    instance_id: str
    reason: str


@attrs.frozen
class EdgePlan:
    """The desired instances of one edge, and what could not be placed."""

    edge_id: str
    instances: tuple[PlacedInstance, ...] = ()
    unplaced: tuple[Unplaced, ...] = ()
    #: The deployments whose edge selector matches this edge, by name.
    selected: tuple[str, ...] = ()

    def assignments(self, deployment: str) -> dict[str, str]:
        """Instance id -> node id of one deployment's placed instances."""
        return {i.instance_id: i.node_id for i in self.instances if i.deployment == deployment}


@attrs.frozen
class Change:
    """What a plan changes on an edge: ``start``, ``restart``, ``stay`` or ``stop`` one instance."""

    action: str
    deployment: str
    instance_id: str
    node_id: str


def profile_view(profile: pb.EngineProfile) -> ProfileView:
    """A node's profile from its wire form."""
    return ProfileView(
        name=profile.name,
        parameters=tuple(
            ParameterBounds(
                name=p.name,
                type=p.type,
                minimum=p.minimum if p.has_bounds else None,
                maximum=p.maximum if p.has_bounds else None,
                choices=tuple(p.choices),
                pattern=p.pattern,
                has_default=p.has_default,
            )
            for p in profile.parameters
        ),
        free_ports=profile.free_ports,
        gpus_per_instance=profile.gpus_per_instance,
    )


def node_views(status: pb.EdgeStatusResponse) -> tuple[NodeView, ...]:
    """The nodes of an edge's status snapshot as placement sees them."""
    return tuple(
        NodeView(
            node_id=node.node_id,
            connected=node.connected,
            labels=tuple(sorted(node.labels.items())),
            profiles=tuple(profile_view(p) for p in node.profiles),
            free_gpus=node.free_gpus,
        )
        for node in status.nodes
    )


def running_instances(statuses: Iterable[pb.InstanceStatus]) -> tuple[RunningInstance, ...]:
    """The instances an edge reports, as placement sees them."""
    return tuple(RunningInstance(s.instance_id, s.node_id, s.deployment, s.spec_hash, s.state) for s in statuses)


def parameter_problem(profile: ProfileView, parameters: Sequence[tuple[str, Scalar]]) -> Optional[str]:
    """Why the profile's declaration refuses these values (as the Node would), or None."""
    declared = {p.name: p for p in profile.parameters}
    given = dict(parameters)
    for name, value in sorted(given.items()):
        bounds = declared.get(name)
        if bounds is None:
            known = ", ".join(sorted(declared)) or "none"
            return f"parameter {name}: profile {profile.name} does not declare it (declared: {known})"
        problem = _value_problem(bounds, value)
        if problem is not None:
            return f"parameter {name}={value_text(value)[:64]}: {problem}"
    for name, bounds in sorted(declared.items()):
        if name not in given and not bounds.has_default:
            return f"parameter {name}: required by profile {profile.name} (it has no default)"
    return None


def _value_problem(bounds: ParameterBounds, value: Scalar) -> Optional[str]:
    kind = bounds.type
    if kind in ("int", "number"):
        if isinstance(value, bool):
            return f"must be {'an integer' if kind == 'int' else 'a number'}"
        number: float
        if isinstance(value, str):
            try:
                number = int(value) if kind == "int" else float(value)
            except ValueError:
                return f"must be {'an integer' if kind == 'int' else 'a number'}"
        else:
            number = value
        if kind == "int" and float(number) != int(number):
            return "must be an integer"
        if bounds.minimum is not None and number < bounds.minimum:
            return f"below the profile's minimum {bounds.minimum:g}"
        if bounds.maximum is not None and number > bounds.maximum:
            return f"above the profile's maximum {bounds.maximum:g}"
        return None
    if kind == "bool":
        return None if value_text(value) in ("true", "false") else "must be true or false"
    text = value_text(value)
    if kind == "enum":
        return None if text in bounds.choices else f"not one of {', '.join(bounds.choices)}"
    if kind == "string" and bounds.pattern:
        try:
            if re.fullmatch(bounds.pattern, text) is None:
                return "does not match the profile's pattern"
        except re.error:
            return None  # the Node checks it with its own pattern
    return None


def _label_map(labels: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(labels)


def selects(spec: DeploymentSpec, edge: EdgeView) -> bool:
    """Whether the deployment's edge selector matches the edge."""
    return spec.edge_selector_parsed.matches(_label_map(edge.labels))


def place_edge(deployments: Iterable[Deployment], edge: EdgeView, previous: Mapping[str, str] = {}) -> EdgePlan:
    """The desired instances of ``edge`` (see the module docstring).

    ``previous`` maps an instance id to the node it was placed on before.
    """
    running = {r.instance_id: r for r in edge.running if r.state != pb.INSTANCE_STATE_STOPPED}
    nodes = sorted(edge.nodes, key=lambda n: n.node_id)
    by_id = {n.node_id: n for n in nodes}
    #: What new instances of this pass took, per node: ports per profile, GPU slots.
    ports_taken: dict[tuple[str, str], int] = {}
    gpus_taken: dict[str, int] = {}
    chosen = [d for d in sorted(deployments, key=lambda d: d.spec.name) if selects(d.spec, edge)]
    candidates: dict[str, list[NodeView]] = {}
    for deployment in chosen:
        node_selector = parse_selector(deployment.spec.node_selector)
        candidates[deployment.spec.name] = [n for n in nodes if node_selector.matches(_label_map(n.labels))]

    def take(instance_id: str, spec: DeploymentSpec, node: NodeView) -> None:
        if instance_id in running:
            return  # running: the node's free ports and GPU slots already count it
        profile = node.profile(spec.profile)
        if profile is not None:
            key = (node.node_id, profile.name)
            ports_taken[key] = ports_taken.get(key, 0) + 1
            gpus_taken[node.node_id] = gpus_taken.get(node.node_id, 0) + profile.gpus_per_instance

    # First what stays where it is (its resources are held before anything new is placed) ...
    kept: dict[str, tuple[NodeView, Optional[str]]] = {}
    for deployment in chosen:
        spec = deployment.spec
        for replica in range(1, spec.replicas_per_edge + 1):
            instance_id = spec.instance_id(replica)
            node, problem = _keep(instance_id, spec, running, previous, by_id, candidates[spec.name])
            if node is not None:
                kept[instance_id] = (node, problem)
                take(instance_id, spec, node)
    # ... then the new instances, in order.
    placed: list[PlacedInstance] = []
    unplaced: list[Unplaced] = []
    for deployment in chosen:
        spec = deployment.spec
        parameters_text = tuple(sorted(spec.parameters_text().items()))
        per_node: dict[str, int] = {}
        for node, _ in (
            kept[spec.instance_id(r)] for r in range(1, spec.replicas_per_edge + 1) if spec.instance_id(r) in kept
        ):
            per_node[node.node_id] = per_node.get(node.node_id, 0) + 1
        for replica in range(1, spec.replicas_per_edge + 1):
            instance_id = spec.instance_id(replica)
            if instance_id in kept:
                node, problem = kept[instance_id]
            else:
                found, problem, reason = _choose(spec, candidates[spec.name], per_node, ports_taken, gpus_taken)
                if found is None:
                    unplaced.append(Unplaced(spec.name, instance_id, reason))
                    continue
                node = found
                take(instance_id, spec, node)
                per_node[node.node_id] = per_node.get(node.node_id, 0) + 1
            placed.append(
                PlacedInstance(
                    instance_id=instance_id,
                    deployment=spec.name,
                    generation=deployment.generation,
                    node_id=node.node_id,
                    profile=spec.profile,
                    model=spec.model,
                    parameters=parameters_text,
                    capacity=spec.capacity,
                    spec_hash=spec.spec_hash,
                    problem=problem or "",
                )
            )
    selected = [d.spec.name for d in chosen]
    return EdgePlan(edge.edge_id, tuple(placed), tuple(unplaced), tuple(selected))


def _keep(
    instance_id: str,
    spec: DeploymentSpec,
    running: Mapping[str, RunningInstance],
    previous: Mapping[str, str],
    by_id: Mapping[str, NodeView],
    candidates: Sequence[NodeView],
) -> tuple[Optional[NodeView], Optional[str]]:
    """The node an instance stays on (where it runs, else where it was placed), if it still may."""
    for node_id in (running[instance_id].node_id if instance_id in running else None, previous.get(instance_id)):
        node = by_id.get(node_id) if node_id is not None else None
        if node is None or node not in candidates:
            continue
        if node.profiles and node.profile(spec.profile) is None:
            continue  # the node declares its profiles now, and not this one
        profile = node.profile(spec.profile)
        problem = parameter_problem(profile, spec.parameters) if profile is not None else None
        return node, f"{problem}: its node will refuse it" if problem else None
    return None, None


def _choose(
    spec: DeploymentSpec,
    candidates: Sequence[NodeView],
    per_node: Mapping[str, int],
    ports_taken: Mapping[tuple[str, str], int],
    gpus_taken: Mapping[str, int],
) -> tuple[Optional[NodeView], Optional[str], str]:
    """A node for a new instance, the problem its node will have with it, or why there is none."""
    if not candidates:
        if spec.node_selector:
            return None, None, f"no node of this edge matches node_selector {spec.node_selector!r}"
        return None, None, "this edge reports no nodes"
    declaring = [n for n in candidates if n.profile(spec.profile) is not None]
    if not declaring:
        silent = [n.node_id for n in candidates if not n.profiles]
        detail = f" (nodes that declared none yet: {', '.join(silent[:5])})" if silent else ""
        return None, None, f"no node declares engine profile {spec.profile!r}{detail}"
    accepting = []
    refusal = ""
    for node in declaring:
        profile = node.profile(spec.profile)
        assert profile is not None
        problem = parameter_problem(profile, spec.parameters)
        if problem is None:
            accepting.append(node)
        elif not refusal:
            refusal = problem
    pool = accepting or declaring
    with_gpus = []
    for node in pool:
        profile = node.profile(spec.profile)
        assert profile is not None
        if node.free_gpus - gpus_taken.get(node.node_id, 0) >= profile.gpus_per_instance:
            with_gpus.append(node)
    if not with_gpus:
        return None, None, f"no free GPU: profile {spec.profile!r} needs GPU slots no matching node has free"
    with_ports = []
    for node in with_gpus:
        profile = node.profile(spec.profile)
        assert profile is not None
        if profile.free_ports - ports_taken.get((node.node_id, profile.name), 0) > 0:
            with_ports.append(node)
    if not with_ports:
        return None, None, f"no free port in profile {spec.profile!r}'s range on any matching node"
    node = min(with_ports, key=lambda n: (per_node.get(n.node_id, 0), n.node_id))
    problem = None if accepting else f"{refusal}: its node will refuse it"
    return node, problem, ""


def changes(plan: EdgePlan, edge: EdgeView, deployment: Optional[str] = None) -> list[Change]:
    """What ``plan`` changes on ``edge`` (of one deployment, or all): by instance id."""
    running = {r.instance_id: r for r in edge.running if r.state != pb.INSTANCE_STATE_STOPPED}
    out: list[Change] = []
    wanted = set()
    for instance in plan.instances:
        if deployment is not None and instance.deployment != deployment:
            continue
        wanted.add(instance.instance_id)
        now = running.get(instance.instance_id)
        if now is None or now.node_id != instance.node_id:
            if now is not None:
                out.append(Change(STOP, now.deployment, now.instance_id, now.node_id))
            out.append(Change(START, instance.deployment, instance.instance_id, instance.node_id))
        elif now.spec_hash != instance.spec_hash or now.state == pb.INSTANCE_STATE_REFUSED:
            out.append(Change(RESTART, instance.deployment, instance.instance_id, instance.node_id))
        else:
            out.append(Change(STAY, instance.deployment, instance.instance_id, instance.node_id))
    others = {i.instance_id for i in plan.instances}
    for instance_id, now in sorted(running.items()):
        if instance_id in wanted or instance_id in others or not now.deployment:
            continue
        if deployment is not None and now.deployment != deployment:
            continue
        out.append(Change(STOP, now.deployment, instance_id, now.node_id))
    return out
