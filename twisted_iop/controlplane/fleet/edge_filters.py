"""Filters of the fleet views: which edges (and fleet rows) a request asks for.

``GET /edges`` and ``GET /fleet/status`` take three filters, all of which
must hold (AND):

* ``selector=``: a label selector (:mod:`twisted_iop.label_selectors`)
  over the labels the edge announced in its hello;
* ``state=``: a comma-separated set of states, any of which may hold (OR):
  ``connected`` and ``disconnected`` for both views, and the fleet rows'
  own states (ok, error, timeout; see :data:`FLEET_STATES`) for the fleet view;
* ``q=``: a case-insensitive substring of the edge id.

An :class:`EdgeFilter` is parsed once per request, then matched against
records. Edges share their label maps (``SharedTables``), so a walk over
the fleet matches each distinct map once (:meth:`EdgeFilter.records`), not
once per edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Optional, Protocol, TypeVar

import attrs

from twisted_iop.label_selectors import EVERYTHING, Selector, parse_selector

if TYPE_CHECKING:
    from twisted_iop.controlplane.fleet.edge_record import EdgeRecord

CONNECTED = "connected"
DISCONNECTED = "disconnected"
#: The states of ``GET /edges``.
EDGE_STATES = (CONNECTED, DISCONNECTED)
#: The states of ``GET /fleet/status``: the connection, and the rows' own
#: states (``StatusRow.state``, of which ``disconnected`` is one too).
FLEET_STATES = (CONNECTED, DISCONNECTED, "ok", "error", "timeout")
#: Longest ``q`` accepted (an edge id is at most this long anyway).
MAX_QUERY_CHARS = 256


class FilteredRow(Protocol):
    """What a filter reads of a fleet row (``fleet_rounds.StatusRow``)."""

    @property
    def record(self) -> EdgeRecord:
        """The edge of the row."""

    @property
    def state(self) -> str:
        """ok, error, timeout or disconnected."""

    @property
    def connected(self) -> bool:
        """Whether the edge had a connection during the round."""


Row = TypeVar("Row", bound=FilteredRow)


class InvalidState(ValueError):
    """A ``state`` filter naming a state the view does not have."""

    def __init__(self, given: str, allowed: Iterable[str]) -> None:
        super().__init__(f"state {given[:40]!r} is not one of {', '.join(allowed)}")
        self.given = given


class InvalidQuery(ValueError):
    """A ``q`` filter over its length bound."""


def parse_states(text: Optional[str], allowed: tuple[str, ...]) -> frozenset[str]:
    """The set of states in ``text`` (comma-separated; empty: no filter)."""
    if text is None or not text.strip():
        return frozenset()
    states = frozenset(part.strip().lower() for part in text.split(",") if part.strip())
    for state in sorted(states):
        if state not in allowed:
            raise InvalidState(state, allowed)
    return states


@attrs.frozen
class EdgeFilter:
    """A parsed filter: a selector, a set of states (any of) and an id substring."""

    selector: Selector = EVERYTHING
    states: frozenset[str] = frozenset()
    #: Lower-cased; empty: no filter.
    q: str = ""

    @classmethod
    def parse(
        cls, selector: Optional[str], state: Optional[str], q: Optional[str], allowed: tuple[str, ...]
    ) -> EdgeFilter:
        """Parse the three query parameters; :class:`SelectorError`,
        :class:`InvalidState` or :class:`InvalidQuery` when one is bad."""
        if len(q or "") > MAX_QUERY_CHARS:
            raise InvalidQuery(f"query parameter 'q' is longer than {MAX_QUERY_CHARS} characters")
        return cls(parse_selector(selector), parse_states(state, allowed), (q or "").strip().lower())

    @property
    def empty(self) -> bool:
        """Whether this filter lets everything through."""
        return self.selector.empty and not self.states and not self.q

    @property
    def key(self) -> str:
        """A canonical text of the filter (equal filters, equal keys)."""
        return f"{self.selector}\x00{','.join(sorted(self.states))}\x00{self.q}"

    def records(self, records: Iterable[EdgeRecord]) -> list[EdgeRecord]:
        """The records whose labels, id and connection match, sorted by id.

        Fleet rows' own states (ok, error, timeout) are not known before a
        round: a record that may have one is kept, and the rows are
        matched after the round (:meth:`rows`).
        """
        states = self.states
        other = bool(states - set(EDGE_STATES))
        want_connected = not states or CONNECTED in states or other
        want_disconnected = not states or DISCONNECTED in states or other
        matches = self._matcher()
        chosen = [
            record
            for record in records
            if (want_connected if record.token is not None else want_disconnected) and matches(record)
        ]
        chosen.sort(key=_edge_id)
        return chosen

    def rows(self, rows: Iterable[Row]) -> list[Row]:
        """The fleet rows whose labels, id and state match (order kept)."""
        states = self.states
        matches = self._matcher()
        return [row for row in rows if matches(row.record) and (not states or row_matches_states(row, states))]

    def _matcher(self) -> Callable[[EdgeRecord], bool]:
        """Whether a record's labels and id match, each distinct label map
        matched once (edges share their maps)."""
        selector = self.selector
        q = self.q
        # The map is kept in its entry, so its id cannot be reused by another.
        verdicts: dict[int, tuple[Mapping[str, str], bool]] = {}

        def matches(record: EdgeRecord) -> bool:
            if q and q not in record.edge_id.lower():
                return False
            if selector.empty:
                return True
            labels = record.hello.labels
            verdict = verdicts.get(id(labels))
            if verdict is None:
                verdict = verdicts[id(labels)] = (labels, selector.matches(labels))
            return verdict[1]

        return matches


def row_matches_states(row: FilteredRow, states: frozenset[str]) -> bool:
    """Whether a fleet row has one of ``states`` (its own state, or its connection)."""
    if row.state in states:
        return True
    return (CONNECTED if row.connected else DISCONNECTED) in states


def _edge_id(record: EdgeRecord) -> str:
    return record.edge_id
