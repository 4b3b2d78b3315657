"""The HTTP views' limits and options (``http`` in control-plane.yaml)."""

from __future__ import annotations

import attrs

from twisted_iop.controlplane.auth import ApiTokens


@attrs.frozen
class HttpSettings:
    """Limits and options of the HTTP views."""

    tokens: ApiTokens = ApiTokens()
    default_command_timeout_seconds: float = 10.0
    max_command_timeout_seconds: float = 300.0
    max_body_bytes: int = 65536
    wire_public_url: str = ""
    wire_port: int = 0
    wire_path: str = "/client"
    #: Whether the client-wire listener speaks TLS (the console then uses wss://).
    wire_tls: bool = False
