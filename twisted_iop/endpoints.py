"""Endpoint strings: Twisted's forms plus the plain ``host:port`` forms."""

from __future__ import annotations

import ipaddress
import re

_LISTEN_KINDS = ("tcp:", "tcp6:", "ssl:", "unix:", "systemd:")
#: ``tls:HOST:PORT:trustRoots=DIR`` verifies the server's name; ``ssl:``
#: alone does not.
_CONNECT_KINDS = ("tcp:", "tcp6:", "ssl:", "tls:", "unix:")
_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[^:\[\]]*):(?P<port>\d+)$")


class EndpointError(ValueError):
    """An endpoint string that cannot be used."""


def listen_endpoint(value: str) -> str:
    """Return a Twisted server endpoint string for ``value``.

    ``tcp:8080:interface=127.0.0.1``, ``ssl:...``, ``unix:...`` pass through;
    ``host:port`` becomes ``tcp:port:interface=host`` and ``:port`` binds
    loopback (``127.0.0.1``), never every interface by accident.
    """
    text = value.strip()
    if not text:
        raise EndpointError("listen address is empty")
    if text.startswith(_LISTEN_KINDS):
        return text
    match = _HOST_PORT.match(text)
    if match is None:
        raise EndpointError(
            f"cannot understand listen address {value!r}: use host:port, :port "
            "or a Twisted endpoint such as tcp:8080:interface=127.0.0.1"
        )
    port = _port(match.group("port"), value)
    host = match.group("host").strip("[]") or "127.0.0.1"
    return f"tcp:{port}:interface={_escape(host)}"


def connect_endpoint(value: str) -> str:
    """Return a Twisted client endpoint string for ``value``.

    ``tcp:host=...:port=...``, ``ssl:...``, ``tls:...``, ``unix:...`` pass through;
    ``host:port`` becomes ``tcp:host=host:port=port``.
    """
    text = value.strip()
    if not text:
        raise EndpointError("address is empty")
    if text.startswith(_CONNECT_KINDS):
        return text
    match = _HOST_PORT.match(text)
    if match is None or not match.group("host"):
        raise EndpointError(
            f"cannot understand address {value!r}: use host:port or a Twisted "
            "endpoint such as tcp:host=127.0.0.1:port=7443"
        )
    port = _port(match.group("port"), value)
    host = match.group("host").strip("[]")
    return f"tcp:host={_escape(host)}:port={port}"


def _port(text: str, value: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise EndpointError(f"port out of range in {value!r}")
    return port


def _escape(host: str) -> str:
    return host.replace("\\", "\\\\").replace(":", "\\:")


def listen_interface(description: str) -> str:
    """The interface a ``tcp:``/``ssl:`` listen endpoint binds ("" = every interface).

    Other kinds (``unix:``, ``systemd:``) answer ``"local"``: they are not
    reachable over a network by themselves.
    """
    kind = description.split(":", 1)[0]
    if kind not in ("tcp", "tcp6", "ssl"):
        return "local"
    for part in re.split(r"(?<!\\):", description)[1:]:
        if part.startswith("interface="):
            return part[len("interface=") :].replace("\\:", ":")
    return ""


def is_loopback_listen(description: str) -> bool:
    """Whether a listen endpoint is reachable from this machine only."""
    interface = listen_interface(description)
    if interface == "local":
        return True
    if interface == "localhost":
        return True
    try:
        return ipaddress.ip_address(interface).is_loopback
    except ValueError:
        return False


def is_tls_listen(description: str) -> bool:
    """Whether a listen endpoint speaks TLS."""
    return description.startswith("ssl:")
