"""SLOs in the client: their models and the repository's SLO methods.

The models mirror the Control Plane's ``Slo`` documents field for field
(docs/slos.md) and are read by the generic reader
(:func:`twisted_iop.client.model_json.read`). :class:`SloViews` holds the
repository's methods for ``/slos``;
:class:`~twisted_iop.client.repository.ControlPlaneStatusRepository`
inherits them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Literal, Optional
from urllib.parse import quote

import attrs

from twisted_iop.client.model_json import OPTIONAL, read


def _optional() -> Any:
    return attrs.field(default=None, metadata=OPTIONAL)


@attrs.frozen
class SloSpec:
    """An SLO as PUT takes it: a latency metric with its percentile and
    objective, or ``error_ratio`` with its objective ratio."""

    metric: str
    model: str
    percentile: Optional[float] = _optional()
    objective_seconds: Optional[float] = _optional()
    objective_ratio: Optional[float] = _optional()
    edge_selector: Optional[str] = _optional()
    window: Optional[str] = _optional()


@attrs.frozen
class SloBurnRate:
    """The burn rate over one alert window (1.0: the budget lasts the window)."""

    window: str
    seconds: float
    burn_rate: float
    requests: int


@attrs.frozen
class SloAlert:
    """One multi-window burn-rate alert and where it is."""

    name: str
    severity: str
    state: Literal["inactive", "firing", "resolved"]
    since: Optional[datetime]
    long_window: str
    short_window: str
    burn_rate_threshold: float


@attrs.frozen
class Slo:
    """``GET /slos/{name}``: the spec, value over the window, budget left, burn rates and alerts."""

    name: str
    spec: SloSpec
    target: float
    value: Optional[float]
    value_unit: Literal["seconds", "ratio"]
    good_ratio: Optional[float]
    error_budget_remaining: float
    requests: int
    bad_requests: int
    burn_rates: tuple[SloBurnRate, ...]
    alerts: tuple[SloAlert, ...]
    created_at: datetime
    updated_at: Optional[datetime]
    evaluated_at: Optional[datetime]

    @property
    def firing(self) -> tuple[str, ...]:
        """The names of the alerts firing now."""
        return tuple(alert.name for alert in self.alerts if alert.state == "firing")


@attrs.frozen
class SloList:
    """``GET /slos``: every SLO, by name."""

    items: tuple[Slo, ...]
    total: int


Request = Callable[..., Awaitable[Any]]


class SloViews:
    """The repository's methods for ``/slos`` (mixed into the status repository, which provides ``_request``)."""

    _request: Request

    async def slos(self) -> SloList:
        """``GET /slos``: every SLO."""
        return read(SloList, await self._request("GET", "/slos"))

    async def slo(self, name: str) -> Slo:
        """``GET /slos/{name}`` (``ControlPlaneError`` code ``unknown_slo``, 404, for a name not kept)."""
        return read(Slo, await self._request("GET", "/slos/" + quote(name, safe="")))
