"""An edge's status snapshot as the Control Plane keeps it, built in one place.

Every snapshot the registry keeps is made here, from whatever brought it:

* :func:`checked_snapshot`: an edge's answer on the wire (or a snapshot
  read back from the shared store), checked against the bounds and its
  totals, then kept as its bytes and counts;
* :func:`routed_snapshot`: a routed answer (cluster mode) that the
  replica owning the edge checked and counted, with those counts.

A snapshot is kept as its serialized bytes (about a fifth of what the
parsed message and its arena hold) with its counts
(:func:`~twisted_iop.wire.status_totals.response_counts`), taken once,
when it arrives: fleet rounds need only the counts, and a view that shows
the nodes parses the bytes once (:meth:`StatusSnapshot.parse`).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from typing import Optional

import attrs

from twisted_iop.controlplane.fleet import bounds
from twisted_iop.controlplane.fleet.memory import MAX_SNAPSHOT_BYTES
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.status_totals import COUNTS_LEN, carried_counts, counts_problem, response_counts

#: Why a snapshot is refused (the ``reason`` label of
#: ``iop_status_answers_refused_total``).
BOUNDS = "bounds"
TOTALS = "totals"

#: The tag of ``ProviderSnapshot.latency`` (field 20, length-delimited) as serialized.
_LATENCY_TAG = b"\xa2\x01"  # the varint of (20 << 3) | 2 = 162
assert pb.ProviderSnapshot.DESCRIPTOR.fields_by_name["latency"].number == 20

#: The most a count of a routed snapshot may say (far above any real fleet).
MAX_COUNT = 2**40


@attrs.frozen(eq=False)
class StatusSnapshot:
    """The last status an edge sent, and when it arrived (compared by identity)."""

    #: The serialized ``EdgeStatusResponse`` (without the totals it carried).
    data: bytes
    received_at: float
    counts: tuple[int, ...]
    #: What its providers' latency figures are, as a key (:func:`latency_key`): b"" when
    #: none carries any, None when unknown (a routed snapshot: its bytes tell).
    latency_key: Optional[bytes] = None

    def parse(self) -> pb.EdgeStatusResponse:
        """The snapshot parsed from its bytes (a new message on every call: parse once per view)."""
        response = pb.EdgeStatusResponse()
        response.ParseFromString(self.data)
        return response

    def size(self) -> int:
        """Estimated bytes this snapshot keeps: itself, its bytes and its counts."""
        return (
            sys.getsizeof(self)
            + sys.getsizeof(self.data)
            + sys.getsizeof(self.counts)
            + (sys.getsizeof(self.latency_key) if self.latency_key else 0)
        )


class SnapshotRefused(Exception):
    """A snapshot over its bounds, or whose totals do not add up."""

    def __init__(self, reason: str, problem: str) -> None:
        super().__init__(problem)
        self.reason = reason
        self.problem = problem


def checked_snapshot(
    response: pb.EdgeStatusResponse,
    received_at: float,
    recount: bool = False,
    share_counts: Callable[[tuple[int, ...]], tuple[int, ...]] = tuple,
) -> StatusSnapshot:
    """The snapshot to keep of ``response``; raises :class:`SnapshotRefused`.

    The totals the edge sent are checked for consistency (and, with
    ``recount``, against a count of its providers); an answer without
    totals (an older Edge) is counted here. ``share_counts`` gives the
    copy of the counts to keep (the registry shares equal ones). The
    message loses its totals (they are kept as the counts).
    """
    counts = carried_counts(response)
    if counts is not None:
        response.ClearField("totals")
    # Serialized once: its length is the size the bounds check needs, and
    # the bytes are what is kept.
    data = response.SerializeToString()
    problem = bounds.status_problem(response, len(data))
    if problem is not None:
        raise SnapshotRefused(BOUNDS, problem)
    if counts is None:
        counts = response_counts(response)
    else:
        problem = counts_problem(counts, len(response.nodes))
        if problem is None and recount and response_counts(response) != counts:
            problem = "status totals differ from the counts of its providers"
        if problem is not None:
            raise SnapshotRefused(TOTALS, problem)
    # A provider's latency field's tag in the bytes, or no figures (a match may be a false one: then counted).
    key = latency_key(response) if _LATENCY_TAG in data else b""
    return StatusSnapshot(data, received_at, share_counts(counts), key)


def latency_key(response: pb.EdgeStatusResponse) -> bytes:
    """A digest of every provider's latency figures, in order (b"" when none has any).

    Snapshots with equal keys show equal latency, so a view writes the
    figures once per key, not once per snapshot: an edge answers a new
    snapshot every round, and most of them carry no figures or the same
    ones (an idle edge), which then cost no parse of sketches.
    """
    digest = None
    for node in response.nodes:
        for provider in node.providers:
            if provider.HasField("latency"):
                if digest is None:
                    digest = hashlib.blake2b(digest_size=16)
                figures = provider.latency.SerializeToString(deterministic=True)
                digest.update(b"%d:" % len(figures))
                digest.update(figures)
    return digest.digest() if digest is not None else b""


def routed_snapshot(data: bytes, counts: Sequence[object], at: object) -> Optional[StatusSnapshot]:
    """The snapshot of a routed answer with the owner's counts, if they have
    the right shape (else None: the caller parses and counts the bytes)."""
    if (
        len(counts) != COUNTS_LEN
        or isinstance(at, bool)
        or not isinstance(at, (int, float))
        or len(data) > MAX_SNAPSHOT_BYTES
    ):
        return None
    kept: list[int] = []
    for value in counts:
        if type(value) is not int or not 0 <= value < MAX_COUNT:
            return None
        kept.append(value)
    return StatusSnapshot(data, float(at), tuple(kept))
