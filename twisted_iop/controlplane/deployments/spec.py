"""A deployment as an operator writes it, parsed once (pure, no I/O).

One parser (:func:`parse_spec`) for ``PUT /deployments/{name}`` bodies and
the stored form; a bad value raises :class:`SpecError` naming the field.

A deployment is:

* ``model`` (required): the model its instances serve (a model name as the
  Node accepts one: 1-256 letters, digits and ``._:/@+=-``);
* ``profile`` (required): the engine profile the nodes declare in node.yaml;
* ``parameters``: values of the profile's parameters, a map of scalars
  (string, integer, number, boolean), sent as text; each Node checks them
  against its own declaration;
* ``edge_selector`` and ``node_selector``: the label language of ``/edges``
  (empty: every edge, every node);
* ``replicas_per_edge`` (default 1, 1 to :data:`MAX_REPLICAS`);
* ``capacity``: leases per instance, an integer or ``"auto"`` (the engine's
  own slots; the default);
* ``offline``: ``wait`` (an offline edge counts as not done) or ``skip``
  (an offline edge is left out of the rollup until it is back);
* ``rollout`` (optional): ``{"max_in_flight": n, "abort": {...}}``: a change
  reaches ``n`` edges at a time; ``abort`` (the rollout engine's criteria:
  ``failure_percent``, ``min_executed``, ``any_failure``) stops the roll by
  itself when too many reached edges fail (:mod:`.roll`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Optional, Union

import attrs

from twisted_iop.controlplane.rollouts.states import AbortCriteria
from twisted_iop.deployments.spec import spec_hash
from twisted_iop.label_selectors import Selector, SelectorError, parse_selector

#: A deployment's name: what ``/deployments/{name}`` says. Its instances are
#: ``<name>-<n>``, a provider id of at most 64 characters.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,47}$")
#: A model name as the Node accepts one (docs/deployments.md, "Safety").
MODEL_PATTERN = re.compile(r"^(?![-./])(?!.*\.\.)[A-Za-z0-9._:/@+=-]{1,256}$")
#: A profile's and a parameter's names.
PROFILE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
PARAMETER_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_REPLICAS = 64
MAX_CAPACITY = 100_000
MAX_PARAMETERS = 64
MAX_VALUE_CHARS = 1024
MAX_SELECTOR_CHARS = 1024
MAX_IN_FLIGHT = 10_000
AUTO = "auto"
WAIT = "wait"
SKIP = "skip"
OFFLINE_POLICIES = (WAIT, SKIP)
KNOWN_FIELDS = frozenset(
    {
        "model",
        "profile",
        "parameters",
        "edge_selector",
        "node_selector",
        "replicas_per_edge",
        "capacity",
        "offline",
        "rollout",
    }
)
ROLLOUT_FIELDS = frozenset({"max_in_flight", "abort"})
ABORT_FIELDS = frozenset({"failure_percent", "min_executed", "any_failure"})
MAX_MIN_EXECUTED = 1_000_000

Scalar = Union[str, int, float, bool]


class SpecError(ValueError):
    """A bad deployment field: ``field`` is its name, the message says what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"field {field!r}: {message}")
        self.field = field
        self.detail = message


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` cannot name a deployment, or None."""
    if NAME_PATTERN.match(name) is None:
        shown = name if len(name) <= 80 else name[:80] + "..."
        return (
            f"deployment name {shown!r} is malformed: use 1-48 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return None


def value_text(value: Scalar) -> str:
    """A parameter value as it travels on the wire (``true``/``false`` for booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


@attrs.frozen
class DeploymentSpec:
    """One deployment (see the module docstring)."""

    name: str
    model: str
    profile: str
    #: The parameter values, sorted by name (a tuple: the spec is hashable and compares by value).
    parameters: tuple[tuple[str, Scalar], ...] = ()
    edge_selector: str = ""
    node_selector: str = ""
    replicas_per_edge: int = 1
    #: Leases per instance; 0 is ``auto``.
    capacity: int = 0
    offline: str = WAIT
    #: ``rollout.max_in_flight`` (0: not given).
    max_in_flight: int = 0
    #: ``rollout.abort`` (None: not given; only with ``max_in_flight``).
    abort: Optional[AbortCriteria] = None

    @property
    def edge_selector_parsed(self) -> Selector:
        """The edge selector, parsed (it parsed when the spec was made)."""
        return parse_selector(self.edge_selector)

    @property
    def node_selector_parsed(self) -> Selector:
        """The node selector, parsed."""
        return parse_selector(self.node_selector)

    def parameters_text(self) -> dict[str, str]:
        """The parameter values as text, as the Node receives them."""
        return {name: value_text(value) for name, value in self.parameters}

    @property
    def spec_hash(self) -> str:
        """The spec hash of each of its instances (equal hash: the Node restarts nothing)."""
        return spec_hash(self.profile, self.model, self.parameters_text(), self.capacity)

    def instance_id(self, replica: int) -> str:
        """The id of replica ``replica`` (1-based) on an edge: ``<name>-<replica>``."""
        return f"{self.name}-{replica}"

    def as_json(self) -> dict[str, Any]:
        """The spec as ``PUT`` takes it back (and as views show it)."""
        body: dict[str, Any] = {
            "model": self.model,
            "profile": self.profile,
            "parameters": dict(self.parameters),
            "edge_selector": self.edge_selector,
            "node_selector": self.node_selector,
            "replicas_per_edge": self.replicas_per_edge,
            "capacity": self.capacity if self.capacity else AUTO,
            "offline": self.offline,
        }
        if self.max_in_flight:
            body["rollout"] = {"max_in_flight": self.max_in_flight}
            if self.abort is not None:
                abort: dict[str, Any] = {"min_executed": self.abort.min_executed, "any_failure": self.abort.any_failure}
                if self.abort.failure_percent is not None:
                    abort["failure_percent"] = self.abort.failure_percent
                body["rollout"]["abort"] = abort
        return body


def _text(body: Mapping[str, Any], field: str, pattern: re.Pattern[str], what: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or pattern.match(value) is None:
        shown = "" if value is None else f", not {str(value)[:60]!r}"
        raise SpecError(field, f"is required: {what}{shown}")
    return value


def _selector(body: Mapping[str, Any], field: str) -> str:
    text = body.get(field, "")
    if not isinstance(text, str) or len(text) > MAX_SELECTOR_CHARS:
        raise SpecError(field, f"must be a label selector string of at most {MAX_SELECTOR_CHARS} characters")
    try:
        return str(parse_selector(text))
    except SelectorError as e:
        raise SpecError(field, str(e)) from None


def _int(value: Any, field: str, low: int, high: int, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 75.0 is the integer 75 (as JSON Schema's "integer" says)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SpecError(field, f"must be {what} from {low} to {high}, not {str(value)[:40]!r}")
    return value


def _parameters(body: Mapping[str, Any]) -> tuple[tuple[str, Scalar], ...]:
    if "parameters" not in body:
        return ()
    given = body["parameters"]
    if not isinstance(given, Mapping):
        raise SpecError("parameters", "must be an object mapping parameter names to scalar values")
    if len(given) > MAX_PARAMETERS:
        raise SpecError("parameters", f"at most {MAX_PARAMETERS} parameters")
    kept: list[tuple[str, Scalar]] = []
    for name in sorted(str(k) for k in given):
        field = f"parameters.{name[:64]}"
        if PARAMETER_PATTERN.match(name) is None or name in ("model", "port", "gpu"):
            raise SpecError(field, "a parameter name is a lower-case identifier (not model, port or gpu)")
        value = given[name]
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(field, "must be a finite number")
        if not isinstance(value, (str, int, float, bool)):
            raise SpecError(field, "must be a string, a number or a boolean")
        if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
            raise SpecError(field, f"at most {MAX_VALUE_CHARS} characters")
        kept.append((name, value))
    return tuple(kept)


def _abort(given: Any) -> AbortCriteria:
    """``rollout.abort``: the rollout engine's criteria (its latency criterion aside)."""
    if not isinstance(given, Mapping):
        raise SpecError("rollout.abort", 'must be an object such as {"failure_percent": 20, "min_executed": 5}')
    extra = sorted(str(k) for k in given if k not in ABORT_FIELDS)
    if extra:
        raise SpecError(f"rollout.abort.{extra[0][:64]}", f"unknown field (known: {', '.join(sorted(ABORT_FIELDS))})")
    percent: Optional[float] = None
    if given.get("failure_percent") is not None:
        value = given["failure_percent"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise SpecError("rollout.abort.failure_percent", f"must be a number from 0 to 100, not {str(value)[:40]!r}")
        percent = float(value)
    executed = _int(given.get("min_executed", 0), "rollout.abort.min_executed", 0, MAX_MIN_EXECUTED, "an integer")
    any_failure = given.get("any_failure", False)
    if not isinstance(any_failure, bool):
        raise SpecError("rollout.abort.any_failure", "must be true or false")
    return AbortCriteria(failure_percent=percent, min_executed=executed, any_failure=any_failure)


def parse_spec(name: str, body: Mapping[str, Any]) -> DeploymentSpec:
    """The deployment ``name`` that ``body`` describes; raises :class:`SpecError` naming the field."""
    problem = name_problem(name)
    if problem is not None:
        raise SpecError("name", problem)
    unknown = sorted(str(key) for key in body if key not in KNOWN_FIELDS)
    if unknown:
        raise SpecError(unknown[0][:64], f"unknown field (known: {', '.join(sorted(KNOWN_FIELDS))})")
    model = _text(body, "model", MODEL_PATTERN, "a model name (1-256 letters, digits and ._:/@+=-, no leading -./)")
    profile = _text(body, "profile", PROFILE_PATTERN, "the name of an engine profile the nodes declare")
    replicas = _int(body.get("replicas_per_edge", 1), "replicas_per_edge", 1, MAX_REPLICAS, "an integer")
    capacity_value = body.get("capacity", AUTO)
    capacity = (
        0 if capacity_value == AUTO else _int(capacity_value, "capacity", 1, MAX_CAPACITY, 'an integer (or "auto")')
    )
    offline = body.get("offline", WAIT)
    if offline not in OFFLINE_POLICIES:
        raise SpecError("offline", f'must be "wait" or "skip", not {str(offline)[:40]!r}')
    max_in_flight = 0
    abort: Optional[AbortCriteria] = None
    if "rollout" in body:
        rollout = body["rollout"]
        if not isinstance(rollout, Mapping):
            raise SpecError("rollout", 'must be an object such as {"max_in_flight": 2}')
        extra = sorted(str(k) for k in rollout if k not in ROLLOUT_FIELDS)
        if extra:
            raise SpecError(f"rollout.{extra[0][:64]}", f"unknown field (known: {', '.join(sorted(ROLLOUT_FIELDS))})")
        if "max_in_flight" in rollout:
            max_in_flight = _int(rollout["max_in_flight"], "rollout.max_in_flight", 1, MAX_IN_FLIGHT, "an integer")
        if "abort" in rollout:
            if not max_in_flight:
                raise SpecError("rollout.abort", "applies to a roll: give rollout.max_in_flight too")
            abort = _abort(rollout["abort"])
    return DeploymentSpec(
        name=name,
        model=model,
        profile=profile,
        parameters=_parameters(body),
        edge_selector=_selector(body, "edge_selector"),
        node_selector=_selector(body, "node_selector"),
        replicas_per_edge=replicas,
        capacity=capacity,
        offline=str(offline),
        max_in_flight=max_in_flight,
        abort=abort,
    )
