"""The HTTP views' limits and options (``http`` in control-plane.yaml)."""

from __future__ import annotations

import attrs

from twisted_iop.controlplane.http.auth import ApiTokens

#: Commands that wait for an engine to start and load its model (the Node
#: answers once it is ready): their deadline when none is given is
#: ``engine_command_timeout_seconds``, not the default for every command.
ENGINE_COMMANDS = frozenset({"provider.restart", "provider.start"})


@attrs.frozen
class HttpSettings:
    """Limits and options of the HTTP views."""

    tokens: ApiTokens = ApiTokens()
    default_command_timeout_seconds: float = 10.0
    max_command_timeout_seconds: float = 300.0
    engine_command_timeout_seconds: float = 300.0
    max_body_bytes: int = 65536
    wire_public_url: str = ""
    wire_port: int = 0
    wire_path: str = "/client"
    #: Whether the client-wire listener speaks TLS (the console then uses wss://).
    wire_tls: bool = False

    def command_timeout(self, name: str) -> float:
        """The deadline of command ``name`` when the request gives none."""
        if name in ENGINE_COMMANDS:
            return self.engine_command_timeout_seconds
        return self.default_command_timeout_seconds
