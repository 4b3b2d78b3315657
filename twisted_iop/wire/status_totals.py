"""What a status snapshot adds up to: one count, for the Edge and the Control Plane.

The Edge counts each snapshot it sends (:func:`response_counts`) and sends
the counts with it as ``StatusTotals`` (:func:`totals_message`); the
Control Plane keeps them per snapshot for its fleet views, reading them
back with :func:`carried_counts` and checking them with
:func:`counts_problem`, and counts an answer itself when it carries no
totals (an older Edge) or when it recounts a sample. Both sides run this
module's code, so what "adds up" means is written once.

Counts are a flat tuple (cheap to keep and to sum for 10,000 edges per
fleet round; dicts are built only for output), laid out as
:data:`TOTALS_FIELDS`: nodes connected, nodes configured, providers,
providers by status, by health, then capacity / in flight / queued,
general and long context.
"""

from __future__ import annotations

import operator
from typing import Optional

from twisted_iop.wire import control_pb2 as pb

STATUS_NAMES = {
    pb.PROVIDER_STATUS_UNSPECIFIED: "unavailable",
    pb.PROVIDER_STATUS_AVAILABLE: "available",
    pb.PROVIDER_STATUS_DRAINED: "drained",
    pb.PROVIDER_STATUS_UNAVAILABLE: "unavailable",
}
HEALTH_NAMES = {
    pb.PROVIDER_HEALTH_UNSPECIFIED: "unknown",
    pb.PROVIDER_HEALTH_HEALTHY: "healthy",
    pb.PROVIDER_HEALTH_DEGRADED: "degraded",
    pb.PROVIDER_HEALTH_UNHEALTHY: "unhealthy",
    pb.PROVIDER_HEALTH_OFFLINE: "offline",
    pb.PROVIDER_HEALTH_UNKNOWN: "unknown",
}
STATUSES = ("available", "drained", "unavailable")
HEALTHS = ("healthy", "degraded", "unhealthy", "offline", "unknown")

STATUS_AT = {name: 3 + i for i, name in enumerate(STATUSES)}
HEALTH_AT = {name: 3 + len(STATUSES) + i for i, name in enumerate(HEALTHS)}
GENERAL_AT = 3 + len(STATUSES) + len(HEALTHS)
LONG_AT = GENERAL_AT + 3
COUNTS_LEN = LONG_AT + 3
EMPTY_COUNTS: tuple[int, ...] = (0,) * COUNTS_LEN

#: ``StatusTotals`` field names in the order of the counts tuple.
TOTALS_FIELDS: tuple[str, ...] = (
    "nodes_connected",
    "nodes_configured",
    "providers",
    *(f"providers_{name}" for name in STATUSES),
    *(f"providers_{name}" for name in HEALTHS),
    "capacity",
    "in_flight",
    "queued",
    "long_context_capacity",
    "long_context_in_flight",
    "long_context_queued",
)
assert len(TOTALS_FIELDS) == COUNTS_LEN
# counts_problem unpacks the counts in this order.
assert STATUSES == ("available", "drained", "unavailable")
assert HEALTHS == ("healthy", "degraded", "unhealthy", "offline", "unknown")

#: All the totals' fields in one call of C code.
_read_totals = operator.attrgetter(*TOTALS_FIELDS)

#: Provider status and health codes -> their place in the by-status and
#: by-health parts of the counts (unknown codes: "unavailable", "unknown").
_STATUS_PART = {code: STATUS_AT[name] - STATUS_AT["available"] for code, name in STATUS_NAMES.items()}
_HEALTH_PART = {code: HEALTH_AT[name] - HEALTH_AT["healthy"] for code, name in HEALTH_NAMES.items()}
_UNAVAILABLE_PART = STATUS_AT["unavailable"] - STATUS_AT["available"]
_UNKNOWN_PART = HEALTH_AT["unknown"] - HEALTH_AT["healthy"]

#: The largest value a provider's counter field holds (``uint32``).
MAX_COUNTER = 2**32 - 1


def response_counts(response: pb.EdgeStatusResponse) -> tuple[int, ...]:
    """Counts over one status response's nodes and providers.

    Sums in local variables: reading the protobuf fields is most of the
    cost (about 70 reads for 4 nodes of 2 providers), and the sums add
    no more than they must. ``totals``, if the response has them, are
    not read.
    """
    connected = configured = providers = 0
    capacity = in_flight = queued = long_capacity = long_in_flight = long_queued = 0
    by_status = [0] * len(STATUSES)
    by_health = [0] * len(HEALTHS)
    status_part = _STATUS_PART.get
    health_part = _HEALTH_PART.get
    for node in response.nodes:
        configured += 1
        if node.connected:
            connected += 1
        for p in node.providers:
            providers += 1
            by_status[status_part(p.status, _UNAVAILABLE_PART)] += 1
            by_health[health_part(p.health, _UNKNOWN_PART)] += 1
            capacity += p.capacity
            in_flight += p.in_flight
            queued += p.queued
            long_capacity += p.long_context_capacity
            long_in_flight += p.long_context_in_flight
            long_queued += p.long_context_queued
    return (
        connected,
        configured,
        providers,
        *by_status,
        *by_health,
        capacity,
        in_flight,
        queued,
        long_capacity,
        long_in_flight,
        long_queued,
    )


def totals_message(counts: tuple[int, ...]) -> pb.StatusTotals:
    """``counts`` as the ``StatusTotals`` an Edge sends with its snapshot."""
    return pb.StatusTotals(**dict(zip(TOTALS_FIELDS, counts, strict=True)))


def with_totals(response: pb.EdgeStatusResponse) -> pb.EdgeStatusResponse:
    """``response`` with its own totals set (what an Edge sends); returns it."""
    response.totals.CopyFrom(totals_message(response_counts(response)))
    return response


def carried_counts(response: pb.EdgeStatusResponse) -> Optional[tuple[int, ...]]:
    """The counts a response carries as ``totals``, or None if it has none."""
    if not response.HasField("totals"):
        return None
    return _read_totals(response.totals)


def counts_problem(counts: tuple[int, ...], nodes: int) -> Optional[str]:
    """Why carried counts cannot be the counts of a snapshot of ``nodes`` nodes, or None.

    The checks need no visit to the nodes: the configured nodes are the
    snapshot's nodes, no more are connected, every provider has exactly
    one status and one health, and no counter exceeds what that many
    providers' ``uint32`` fields can add up to.
    """
    (
        connected,
        configured,
        providers,
        available,
        drained,
        unavailable,
        healthy,
        degraded,
        unhealthy,
        offline,
        unknown,
        *counters,
    ) = counts
    if configured != nodes:
        return f"status totals say {configured} nodes, the snapshot has {nodes}"
    if connected > configured:
        return "status totals say more nodes connected than configured"
    if available + drained + unavailable != providers:
        return "status totals by provider status do not add up to the providers"
    if healthy + degraded + unhealthy + offline + unknown != providers:
        return "status totals by provider health do not add up to the providers"
    if max(counters) > providers * MAX_COUNTER:
        return "status totals count more than the providers can hold"
    return None
