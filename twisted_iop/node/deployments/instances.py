"""The instances a Node runs for deployments: converge to the desired set, report what runs.

:class:`NodeInstances` holds the desired set the Edge last sent (the whole
set of this Node: it replaces the previous one), the instances that run
(their checked spec, port, GPU slots and the provider they run as) and the
ones refused. :meth:`NodeInstances.converge` plans with
:func:`~twisted_iop.node.deployments.plan.plan_convergence` and hands the
providers to the runtime, which gives them to the
:class:`~twisted_iop.node.launch.supervisor.EngineSupervisor` exactly like
configured ``launch:`` providers: probes, load, inference and views treat
them alike. An instance whose spec hash matches what runs is never
touched (a repeated set, an Edge that reconnected); the instances keep
running while the Edge is away.

Drift: an instance's engine that exits without being asked (killed,
crashed) is ``drifted`` until the supervisor has it ready again; the
Edge hears of it at once (an unsolicited ``NodeInstancesReport``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Optional, Protocol, Union

import attrs
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from twisted_iop.node.config import NodeProviderConfig, NodeRuntimeConfig
from twisted_iop.node.deployments.checker import (
    CheckedInstance,
    InstanceSpec,
    Placement,
    Refusal,
    allocate,
    check_instance,
    instance_provider,
    spec_from_wire,
)
from twisted_iop.node.deployments.parameters import ParameterSpec
from twisted_iop.node.deployments.plan import plan_convergence
from twisted_iop.node.deployments.profiles import EngineProfileConfig
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.wire import control_pb2 as pb

#: The most instances one Node takes from one desired set (the rest are refused).
MAX_INSTANCES_PER_NODE = 256

#: How long a changed instance's requests in flight may take to finish before its engine restarts.
RESTART_DRAIN_SECONDS = 30.0
#: How long an instance no longer desired may finish its requests in flight before its engine stops.
RETIRE_DRAIN_SECONDS = 30.0

#: What an instance's engine state says of the instance.
INSTANCE_STATES = {
    EngineState.STARTING: pb.INSTANCE_STATE_STARTING,
    EngineState.LOADING: pb.INSTANCE_STATE_STARTING,
    EngineState.READY: pb.INSTANCE_STATE_READY,
    EngineState.DRAINING: pb.INSTANCE_STATE_READY,
    EngineState.STOPPING: pb.INSTANCE_STATE_STOPPING,
    EngineState.CRASHED: pb.INSTANCE_STATE_DRIFTED,
    EngineState.STOPPED: pb.INSTANCE_STATE_STOPPED,
    EngineState.FAILED: pb.INSTANCE_STATE_FAILED,
}


class EngineStates(Protocol):
    """What the instances need of the supervisor: an engine's state and report, and a restart."""

    def state(self, provider_id: str) -> Optional[EngineState]:
        """The engine's state; ``None`` when it is not launched."""

    def report(self, provider_id: str) -> Optional[pb.EngineLaunch]:
        """The engine's state as the wire carries it; ``None`` when it is not launched."""

    def restart(self, provider_id: str, reason: str, drain_seconds: float = 0.0) -> None:
        """Stop the engine (after a drain of up to ``drain_seconds``) and start it again with its
        provider's current launch block."""


#: Something that gives the runtime the instances' providers (it hands them to the supervisor).
ProvidersSink = Callable[[tuple[NodeProviderConfig, ...]], None]


@attrs.define
class RunningInstance:
    """An instance this Node runs: its checked spec, where it runs, and the provider it runs as."""

    checked: CheckedInstance
    placement: Placement
    provider: NodeProviderConfig
    #: The hash of the spec it runs.
    spec_hash: str
    #: Its engine exited unasked since it was last ready: being corrected.
    drifted: bool = False
    #: Its spec changed and its old engine still runs (draining, stopping): not yet what is asked.
    restarting: bool = False


@attrs.frozen
class _Shown:
    state: pb.InstanceState
    reason: str
    spec_hash: str
    since: float


class NodeInstances:
    """The desired set of this Node and the instances it runs (see the module docstring)."""

    _log = Logger()

    def __init__(
        self,
        config: NodeRuntimeConfig,
        clock: IReactorTime,
        engines: Optional[EngineStates],
        apply: ProvidersSink,
        reserved: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self.node_id = config.node_id
        self.profiles: tuple[EngineProfileConfig, ...] = config.engines
        self.gpus = config.gpus
        self._clock = clock
        self._engines = engines
        self._apply = apply
        self._reserved = reserved
        self.running: dict[str, RunningInstance] = {}
        #: Desired instances this Node will not run, with why.
        self.refused: dict[str, tuple[InstanceSpec, Refusal]] = {}
        #: Where instances no longer desired ran, until their engines exited (their ports are not free yet).
        self._releasing: dict[str, Placement] = {}
        #: What was last said of each instance (its state, reason, hash and since when).
        self._shown: dict[str, _Shown] = {}
        #: Specs asked for, by id, with their deployment and generation (for the statuses).
        self._asked: dict[str, InstanceSpec] = {}
        #: Engine starts, stops and restarts this Node made for deployments (for tests and figures).
        self.starts = 0
        self.stops = 0
        self.restarts = 0

    # -- what is offered ---------------------------------------------------------------------

    def providers(self) -> tuple[NodeProviderConfig, ...]:
        """The providers the instances run as, in id order."""
        return tuple(self.running[i].provider for i in sorted(self.running))

    def free_gpus(self) -> int:
        """GPU slots no instance holds (stopping ones still hold theirs)."""
        return self.gpus - len(self._taken_gpus())

    def profile_specs(self) -> list[pb.EngineProfile]:
        """The profiles as the wire carries them, with their free ports now."""
        taken = self._taken_ports()
        out = []
        for profile in self.profiles:
            first, last = profile.ports
            free = (last - first + 1) - sum(1 for port in taken if first <= port <= last)
            out.append(
                pb.EngineProfile(
                    name=profile.name,
                    kind=profile.kind,
                    parameters=[_parameter_wire(p) for p in profile.parameters],
                    free_ports=max(0, free),
                    gpus_per_instance=profile.gpus_per_instance,
                )
            )
        return out

    def _placements(self) -> Iterable[Placement]:
        self._forget_released()
        yield from (r.placement for r in self.running.values())
        yield from self._releasing.values()

    def _taken_ports(self) -> set[int]:
        return {p.port for p in self._placements()}

    def _taken_gpus(self) -> set[int]:
        return {slot for p in self._placements() for slot in p.gpus}

    def _forget_released(self) -> None:
        engines = self._engines
        for instance_id in list(self._releasing):
            state = engines.state(instance_id) if engines is not None else None
            if instance_id in self.running or state is None or state in (EngineState.STOPPED, EngineState.FAILED):
                del self._releasing[instance_id]

    # -- converging --------------------------------------------------------------------------

    def converge(self, desired: Sequence[pb.DesiredInstance]) -> list[pb.InstanceStatus]:
        """Take the whole desired set: start, stop and restart what differs; answer every instance's status."""
        specs, refused = self._read(desired)
        checked: dict[str, CheckedInstance] = {}
        for instance_id, spec in specs.items():
            result = check_instance(spec, self.profiles)
            if isinstance(result, Refusal):
                refused[instance_id] = (spec, result)
            else:
                checked[instance_id] = result
        running_hashes = {i: r.spec_hash for i, r in self.running.items()}
        plan = plan_convergence({i: c.spec.spec_hash for i, c in checked.items()}, running_hashes)
        for instance_id in [*plan.stop, *(i for i in refused if i in self.running)]:
            self._release(instance_id)
        restarted: list[str] = []
        for instance_id in plan.restart:
            if instance_id not in self.running:
                continue  # refused above
            old = self.running.pop(instance_id)
            placed = self._place(checked[instance_id], old)
            if isinstance(placed, Refusal):
                refused[instance_id] = (checked[instance_id].spec, placed)
                self.running[instance_id] = old
                self._release(instance_id)
                continue
            placed.restarting = True
            self.running[instance_id] = placed
            restarted.append(instance_id)
        for instance_id in plan.start:
            placed = self._place(checked[instance_id], None)
            if isinstance(placed, Refusal):
                refused[instance_id] = (checked[instance_id].spec, placed)
                continue
            self.running[instance_id] = placed
            self.starts += 1
        for instance_id in plan.keep:
            # The same spec: only its deployment bookkeeping (a new generation) may change.
            self.running[instance_id].checked = checked[instance_id]
        self.refused = refused
        self._asked = {**{i: s for i, (s, _) in refused.items()}, **{i: c.spec for i, c in checked.items()}}
        for instance_id, (_, refusal) in sorted(refused.items()):
            self._log.warn("instance {instance_id} refused: {reason}", instance_id=instance_id, reason=refusal.reason)
        self._apply(self.providers())
        if self._engines is not None:
            for instance_id in restarted:
                self.restarts += 1
                self._engines.restart(instance_id, "its deployment's spec changed", RESTART_DRAIN_SECONDS)
        if not plan.changes_nothing:
            self._log.info(
                "instances: {start} to start, {restart} to restart, {stop} to stop, {keep} unchanged",
                start=len(plan.start),
                restart=len(restarted),
                stop=len(plan.stop),
                keep=len(plan.keep),
            )
        return self.statuses()

    def _read(
        self, desired: Sequence[pb.DesiredInstance]
    ) -> tuple[dict[str, InstanceSpec], dict[str, tuple[InstanceSpec, Refusal]]]:
        """The wire's set as specs; a repeated id, another node's instance or one too many is refused."""
        specs: dict[str, InstanceSpec] = {}
        refused: dict[str, tuple[InstanceSpec, Refusal]] = {}
        reserved = self._reserved()
        for index, message in enumerate(desired):
            spec = spec_from_wire(message)
            if index >= MAX_INSTANCES_PER_NODE:
                if len(refused) < MAX_INSTANCES_PER_NODE:
                    refused[spec.instance_id] = (spec, Refusal(f"more than {MAX_INSTANCES_PER_NODE} instances"))
                continue
            if message.node_id and message.node_id != self.node_id:
                refused[spec.instance_id] = (spec, Refusal(f"meant for node {message.node_id[:64]!r}, not this one"))
            elif spec.instance_id in reserved:
                refused[spec.instance_id] = (spec, Refusal("a provider node.yaml configures has this id"))
            elif spec.instance_id in specs or spec.instance_id in refused:
                refused[spec.instance_id] = (spec, Refusal("the instance id is listed twice"))
                specs.pop(spec.instance_id, None)
            else:
                specs[spec.instance_id] = spec
        return specs, refused

    def _place(self, checked: CheckedInstance, old: Optional[RunningInstance]) -> Union[RunningInstance, Refusal]:
        """The instance with its port and GPU slots: the ones it held if its profile is the same."""
        if old is not None and old.checked.profile.name == checked.profile.name:
            placement = old.placement
        else:
            if old is not None:
                self._releasing[old.checked.spec.instance_id] = old.placement
            result = allocate(checked.profile, self._taken_ports(), self._taken_gpus(), self.gpus)
            if isinstance(result, Refusal):
                return result
            placement = result
        return RunningInstance(checked, placement, instance_provider(checked, placement), checked.spec.spec_hash)

    def _release(self, instance_id: str) -> None:
        instance = self.running.pop(instance_id, None)
        if instance is not None:
            self._releasing[instance_id] = instance.placement
            self.stops += 1

    # -- what runs ---------------------------------------------------------------------------

    def engine_changed(self, instance_id: str) -> Optional[pb.InstanceStatus]:
        """An instance's engine changed state: its new status if that changed what is shown, else ``None``."""
        instance = self.running.get(instance_id)
        state = self._engines.state(instance_id) if self._engines is not None else None
        if instance is not None:
            if state is EngineState.CRASHED:
                instance.drifted = True
            elif state is EngineState.READY:
                instance.drifted = False
            if state in (EngineState.STARTING, EngineState.LOADING):
                instance.restarting = False  # the engine of the new spec was spawned
        if instance is None and instance_id not in self._releasing and instance_id not in self._shown:
            return None
        before = self._shown.get(instance_id)
        status = self._status(instance_id)
        after = self._shown.get(instance_id)
        if before is not None and after is not None and (before.state, before.reason) == (after.state, after.reason):
            return None
        if status.state == pb.INSTANCE_STATE_DRIFTED:
            self._log.warn(
                "instance {instance_id} drifted from its spec: {reason}", instance_id=instance_id, reason=status.reason
            )
        return status

    def statuses(self) -> list[pb.InstanceStatus]:
        """Every instance asked for, running, refused or still stopping, in id order."""
        self._forget_released()
        ids = set(self._asked) | set(self.running) | set(self._releasing)
        statuses = [self._status(i) for i in sorted(ids)]
        for instance_id in [i for i in self._shown if i not in ids]:
            del self._shown[instance_id]
        return statuses

    def _status(self, instance_id: str) -> pb.InstanceStatus:
        spec = self._asked.get(instance_id)
        state, reason, spec_hash = self._state_of(instance_id)
        now = self._clock.seconds()
        shown = self._shown.get(instance_id)
        if shown is None or (shown.state, shown.reason, shown.spec_hash) != (state, reason, spec_hash):
            shown = self._shown[instance_id] = _Shown(state, reason, spec_hash, now)
        return pb.InstanceStatus(
            instance_id=instance_id,
            deployment=spec.deployment if spec is not None else "",
            generation=spec.generation if spec is not None else 0,
            node_id=self.node_id,
            spec_hash=spec_hash,
            state=state,
            reason=reason,
            since_ms=int(shown.since * 1000),
        )

    def _state_of(self, instance_id: str) -> tuple[pb.InstanceState, str, str]:
        """The instance's state, reason and the hash of what runs."""
        refusal = self.refused.get(instance_id)
        instance = self.running.get(instance_id)
        engines = self._engines
        state = engines.state(instance_id) if engines is not None else None
        report = engines.report(instance_id) if engines is not None else None
        engine_reason = report.reason if report is not None else ""
        if instance is None:
            running = state is not None and state not in (EngineState.STOPPED, EngineState.FAILED)
            reason = refusal[1].reason if refusal is not None else "no longer desired"
            if running:
                return pb.INSTANCE_STATE_STOPPING, reason, ""
            if refusal is not None:
                return pb.INSTANCE_STATE_REFUSED, reason, ""
            return pb.INSTANCE_STATE_STOPPED, reason, ""
        if state is None:
            return pb.INSTANCE_STATE_PENDING, "not started yet", instance.spec_hash
        wire = INSTANCE_STATES[state]
        if instance.restarting and state not in (EngineState.FAILED, EngineState.STOPPED):
            detail = f" ({engine_reason})" if engine_reason else ""
            return pb.INSTANCE_STATE_STARTING, f"restarting with its new spec{detail}", instance.spec_hash
        if instance.drifted and wire in (pb.INSTANCE_STATE_STARTING, pb.INSTANCE_STATE_DRIFTED):
            return (
                pb.INSTANCE_STATE_DRIFTED,
                f"its engine exited unasked; being restarted ({engine_reason})"
                if engine_reason
                else "its engine exited unasked; being restarted",
                instance.spec_hash,
            )
        return wire, engine_reason, instance.spec_hash


def _parameter_wire(parameter: ParameterSpec) -> pb.ProfileParameter:
    return pb.ProfileParameter(
        name=parameter.name,
        type=parameter.type,
        has_bounds=parameter.minimum is not None or parameter.maximum is not None,
        # One bound only: the other is the largest finite double (JSON has no infinity).
        minimum=parameter.minimum if parameter.minimum is not None else -sys.float_info.max,
        maximum=parameter.maximum if parameter.maximum is not None else sys.float_info.max,
        choices=list(parameter.choices),
        pattern=parameter.pattern or "",
        has_default=parameter.default is not None,
        default=parameter.default or "",
    )
