"""Where a replica finds things in Redis: the key layout (docs/scale-out.md),
and the two reply shapes every room of the replica reads (flat field/value
lists, stream entry ids)."""

from __future__ import annotations

from twisted_iop.controlplane.store import forms as codec


class Keys:
    """The Redis key layout (docs/scale-out.md), under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.edges = f"{prefix}:edges"
        self.fleet = f"{prefix}:fleet"
        self.fleet_seq = f"{prefix}:fleet_seq"
        self.replicas = f"{prefix}:replicas"

    def edge(self, edge_id: str) -> str:
        """The hash of one edge."""
        return f"{self.prefix}:edge:{edge_id}"

    def events(self, edge_id: str) -> str:
        """The event stream of one edge."""
        return f"{self.prefix}:events:{edge_id}"

    def operations(self, edge_id: str) -> str:
        """The operation index (sorted set) of one edge."""
        return f"{self.prefix}:ops:{edge_id}"

    def operation(self, operation_id: str) -> str:
        """One operation (JSON)."""
        return f"{self.prefix}:op:{operation_id}"

    def alive(self, replica: str) -> str:
        """The lease of one replica."""
        return f"{self.prefix}:alive:{replica}"

    def inbox(self, replica: str) -> str:
        """The request stream of one replica."""
        return f"{self.prefix}:inbox:{replica}"

    def owned(self, replica: str) -> str:
        """The edges one replica holds (a set the scripts keep)."""
        return f"{self.prefix}:owned:{replica}"


def pairs(flat: object) -> dict[str, str]:
    """A Redis flat ``[k1, v1, k2, v2 ...]`` reply as a dict."""
    if not isinstance(flat, list) or len(flat) % 2:
        raise codec.BadRecord("not a list of field/value pairs")
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def id_number(entry_id: str) -> int:
    """The number of a stream entry id (``<number>-<sequence>``)."""
    return int(str(entry_id).split("-", 1)[0])
