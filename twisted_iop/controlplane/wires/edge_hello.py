"""What an edge says about itself when it enrolls, as the Control Plane keeps it."""

from __future__ import annotations

import attrs

from twisted_iop.wire import control_pb2 as pb


@attrs.frozen
class EdgeHello:
    """What an edge said about itself when it enrolled (replaced, never edited)."""

    labels: dict[str, str]
    software_version: str
    protocol_version: str
    commands: tuple[pb.CommandSpec, ...]
