"""Settings of the framed wires: limits, keepalive, and how a daemon dials.

These frozen attrs classes belong to the wire, not to config parsing:
:mod:`twisted_iop.configuration` reads YAML into them, and the wire modules
(:mod:`~twisted_iop.wire.peer`, :mod:`~twisted_iop.wire.dialer`) use them
without importing anything that parses configuration.
"""

from __future__ import annotations

import attrs

from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES


@attrs.frozen
class PeerSettings:
    """Limits and deadlines of one framed wire endpoint."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: The largest frame an accepted connection may send before its hello:
    #: a hello's size, so an unidentified peer cannot make this side buffer
    #: (and parse) megabytes. Never above ``max_frame_bytes``.
    max_hello_frame_bytes: int = 64 * 1024
    #: Protocol violations after which a peer is closed.
    max_violations: int = 10
    #: From the accept to the peer's hello; over TLS, from the finished handshake.
    hello_timeout_seconds: float = 10.0
    #: From the accept to the finished TLS handshake (TLS listeners only).
    tls_handshake_timeout_seconds: float = 30.0
    keepalive_interval_seconds: float = 15.0
    keepalive_deadline_seconds: float = 45.0
    request_timeout_seconds: float = 10.0


@attrs.frozen
class BackoffConfig:
    """Reconnect delays: exponential with full jitter, capped at ``max_seconds``.

    The n-th retry in a row waits a random time between 0 and
    ``min(max_seconds, initial_seconds * 2 ** (n - 1))``.
    """

    initial_seconds: float = 0.5
    max_seconds: float = 30.0


@attrs.frozen
class KeepaliveConfig:
    """Ping an idle peer after ``interval``; drop it after ``deadline``."""

    interval_seconds: float = 15.0
    deadline_seconds: float = 45.0


@attrs.frozen(kw_only=True)
class DialConfig:
    """How a daemon dials its peer on a framed wire and keeps the link up.

    The common part of ``control_plane`` in edge.yaml and ``edge`` in
    node.yaml; each daemon's section class adds its own settings.
    ``address`` is a Twisted client endpoint string.
    """

    address: str
    backoff: BackoffConfig = BackoffConfig()
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    request_timeout_seconds: float = 10.0

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of the connection to the peer."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            keepalive_interval_seconds=self.keepalive.interval_seconds,
            keepalive_deadline_seconds=self.keepalive.deadline_seconds,
            request_timeout_seconds=self.request_timeout_seconds,
        )
