"""Status totals: what an Edge sends with a snapshot, read back and checked
by the Control Plane (twisted_iop.wire.status_totals)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from twisted_iop.testing.wires.peers import snapshot
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import (
    COUNTS_LEN,
    GENERAL_AT,
    HEALTH_AT,
    STATUS_AT,
    TOTALS_FIELDS,
    carried_counts,
    counts_problem,
    response_counts,
    totals_message,
    with_totals,
)

_providers = st.lists(
    st.tuples(
        st.integers(-1, 7),  # status, unknown values included
        st.integers(-1, 7),  # health, unknown values included
        st.lists(st.integers(0, 2**32 - 1), min_size=6, max_size=6),
    ),
    max_size=4,
)


@given(st.lists(st.tuples(st.booleans(), _providers), max_size=6))
def test_totals_read_back_are_the_counts_on_any_snapshot(
    nodes: list[tuple[bool, list[tuple[int, int, list[int]]]]],
) -> None:
    """Totals written by :func:`with_totals` and sent over the wire read
    back as exactly :func:`response_counts`, and pass the checks."""
    response = pb.EdgeStatusResponse(edge_id="e")
    for connected, providers in nodes:
        node = response.nodes.add(node_id="n", connected=connected)
        for status, health, numbers in providers:
            provider = node.providers.add(provider_id="p")
            provider.MergeFromString(pb.ProviderSnapshot(status=status, health=health).SerializeToString())  # type: ignore[arg-type]  # the stubs want the enum types; these are their int values
            (
                provider.capacity,
                provider.in_flight,
                provider.queued,
                provider.long_context_capacity,
                provider.long_context_in_flight,
                provider.long_context_queued,
            ) = numbers
    received = pb.EdgeStatusResponse.FromString(with_totals(response).SerializeToString())
    counts = carried_counts(received)
    assert counts == response_counts(received)
    assert counts_problem(counts, len(received.nodes)) is None


def test_a_snapshot_without_totals_carries_none() -> None:
    """An older Edge's answer has no totals: the Control Plane counts it."""
    assert carried_counts(snapshot("e")) is None
    assert carried_counts(snapshot("e", totals=True)) == response_counts(snapshot("e"))


def test_the_layout_names_every_total_once() -> None:
    """The totals message has a field for each place of the counts, in order."""
    assert len(TOTALS_FIELDS) == len(set(TOTALS_FIELDS)) == COUNTS_LEN
    assert set(TOTALS_FIELDS) == {field.name for field in pb.StatusTotals.DESCRIPTOR.fields}
    counts = tuple(range(COUNTS_LEN))
    assert carried_counts(pb.EdgeStatusResponse(totals=totals_message(counts))) == counts


def _changed(counts: tuple[int, ...], at: int, value: int) -> tuple[int, ...]:
    return (*counts[:at], value, *counts[at + 1 :])


def test_totals_that_cannot_be_the_snapshots_are_named() -> None:
    """Each check names what does not add up: the node count, connected
    nodes, providers by status and by health, and impossible counters."""
    good = response_counts(snapshot("e", nodes=2))
    assert counts_problem(good, 2) is None
    assert "nodes" in (counts_problem(good, 3) or "")
    assert "connected" in (counts_problem(_changed(good, 0, 3), 2) or "")
    assert "status" in (counts_problem(_changed(good, STATUS_AT["drained"], 1), 2) or "")
    assert "health" in (counts_problem(_changed(good, HEALTH_AT["offline"], 1), 2) or "")
    assert "more than" in (counts_problem(_changed(good, GENERAL_AT, 3 * 2**32), 2) or "")
