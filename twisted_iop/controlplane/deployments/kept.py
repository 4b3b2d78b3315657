"""What the deployment service keeps: each deployment as stored (spec, generation, placement,
its roll), what each edge was last sent, what an edge's snapshot says of deployments, and the
errors of asking for a deployment."""

from __future__ import annotations

from typing import Any, Optional

import attrs

from twisted_iop.controlplane.deployments import placement as pl
from twisted_iop.controlplane.deployments import roll
from twisted_iop.controlplane.deployments.rollup import FAILED, EdgeRollup, Observation
from twisted_iop.controlplane.deployments.spec import DeploymentSpec, parse_spec
from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot


class UnknownDeployment(Exception):
    """No deployment with that name is kept."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no deployment named {name!r} is kept")


class TooManyDeployments(Exception):
    """:data:`MAX_DEPLOYMENTS` are kept already."""


@attrs.define
class DeploymentState:
    """One deployment as kept: its spec, generation, who changed it, and where its instances went."""

    spec: DeploymentSpec
    generation: int
    created_at: float
    updated_at: float
    updated_by: str = ""
    #: Per edge: instance id -> node id.
    placement: dict[str, dict[str, str]] = attrs.field(factory=dict)
    #: While a change rolls out ``rollout.max_in_flight`` edges at a time: the spec and
    #: generation the edges not reached yet keep running, and the edges reached.
    rolling_from: Optional[DeploymentSpec] = None
    rolling_generation: int = 0
    promoted: set[str] = attrs.field(factory=set)
    #: The roll's state (:mod:`.roll`; "" when this deployment never rolled a change out) and why.
    roll_state: str = ""
    roll_reason: str = ""

    def spec_for(self, edge_id: str) -> tuple[DeploymentSpec, int]:
        """The spec and generation edge ``edge_id`` gets now (the older one until a roll reaches it)."""
        if self.rolling_from is None or edge_id in self.promoted:
            return self.spec, self.generation
        return self.rolling_from, self.rolling_generation

    def waiting_reason(self) -> str:
        """Why an edge the roll did not reach is out of sync."""
        generation, kept = self.generation, self.rolling_generation
        if self.roll_state == roll.PAUSED:
            return f"waits: the rollout of generation {generation} is paused (it runs generation {kept})"
        if self.roll_state in (roll.CANCELLED, roll.ABORTED):
            return f"keeps generation {kept}: the rollout of generation {generation} was {self.roll_state}"
        return f"waits its turn in the rollout of generation {generation} (max_in_flight {self.spec.max_in_flight})"

    def roll_view(self, edges: list[EdgeRollup]) -> Optional[dict[str, Any]]:
        """The deployment's roll as views show it (None: it never rolled a change out), from its
        ``edges`` (the service's ``edge_rollups``)."""
        if not self.roll_state:
            return None
        reached = edges if self.rolling_from is None else [e for e in edges if e.edge_id in self.promoted]
        return {
            "state": self.roll_state,
            "reason": self.roll_reason,
            "from_generation": self.rolling_generation or None,
            "max_in_flight": self.spec.max_in_flight or None,
            "reached": len(reached),
            "pending": len(edges) - len(reached),
            "failed": sum(1 for e in reached if e.state == FAILED),
        }

    def as_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "spec": self.spec.as_json(),
            "generation": self.generation,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "updated_by": self.updated_by,
            "placement": self.placement,
            "rolling_from": self.rolling_from.as_json() if self.rolling_from is not None else None,
            "rolling_generation": self.rolling_generation,
            "promoted": sorted(self.promoted),
            "roll_state": self.roll_state,
            "roll_reason": self.roll_reason,
        }

    @classmethod
    def from_json(cls, name: str, value: dict[str, Any]) -> DeploymentState:
        """A kept deployment back from its stored form; ValueError, KeyError, TypeError or SpecError."""
        placement = value.get("placement") or {}
        if not isinstance(placement, dict):
            raise ValueError("placement is not an object")
        # Kept before rolls had states: a roll kept in progress was running.
        roll_state = str(value.get("roll_state") or (roll.RUNNING if value.get("rolling_from") else ""))
        if roll_state and roll_state not in roll.ROLL_STATES:
            raise ValueError(f"unknown roll state {roll_state[:40]!r}")
        return cls(
            spec=parse_spec(name, value["spec"]),
            generation=int(value["generation"]),
            created_at=float(value["created_at"]),
            updated_at=float(value["updated_at"]),
            updated_by=str(value.get("updated_by", "")),
            placement={str(e): {str(i): str(n) for i, n in dict(p).items()} for e, p in placement.items()},
            rolling_from=parse_spec(name, value["rolling_from"]) if value.get("rolling_from") else None,
            rolling_generation=int(value.get("rolling_generation", 0)),
            promoted={str(e) for e in value.get("promoted") or ()},
            roll_state=roll_state,
            roll_reason=str(value.get("roll_reason", "")),
        )


@attrs.frozen
class SnapshotRead:
    """What one edge's kept snapshot says of deployments (read once per snapshot)."""

    snapshot: StatusSnapshot
    observation: Observation
    nodes: tuple[pl.NodeView, ...]


@attrs.define
class EdgeDesired:
    """What an edge was last sent: the version, the plan it came from, and whether it answered."""

    version: int
    plan: pl.EdgePlan
    token: int
    acknowledged: bool = False
