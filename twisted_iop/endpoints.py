"""Endpoint strings: Twisted's forms plus the plain ``host:port`` forms.

It owns what an endpoint string means and whether one is usable:
:func:`listen_endpoint` and :func:`connect_endpoint` turn the plain forms
into Twisted's, and :func:`check_listen_endpoint` and
:func:`check_connect_endpoint` check one before anything binds or dials
(the port, the interface, a socket's directory, then Twisted's own parse
of every parameter), so config errors can name the field.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

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


# -- checked before anything binds or dials ------------------------------------

#: Endpoint kinds whose port is the first positional argument or ``port=``.
_PORT_FIRST = ("tcp", "tcp6", "ssl")
#: Client endpoint kinds whose port is the second positional or ``port=``.
_PORT_SECOND = ("tcp", "tcp6", "ssl", "tls")


def _endpoint_arguments(description: str) -> tuple[list[str], dict[str, str]]:
    """The positional and keyword arguments of a Twisted endpoint string (after the kind)."""
    parts: list[str] = []
    current = ""
    escaped = False
    for char in description.split(":", 1)[1] if ":" in description else "":
        if escaped:
            current += char
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ":":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    positional = [p for p in parts if "=" not in p]
    keywords = dict(p.split("=", 1) for p in parts if "=" in p)
    return positional, keywords


def _port_problem(port: Optional[str]) -> Optional[str]:
    if port is None:
        return "no port given"
    if not port.isdigit() or int(port) > 65535:
        return f"the port must be a number from 0 to 65535, not {port!r}"
    return None


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _twisted_problem(build: Callable[[Any, str], Any], description: str) -> Optional[str]:
    # Building an endpoint binds and dials nothing, but parses every
    # parameter and loads an ssl: key and certificate or tls: trust roots.
    from twisted.internet import reactor

    try:
        build(reactor, description)
    except Exception as e:  # Twisted raises ValueError, KeyError, OSError, SSL errors ...
        text = " ".join(str(e).split()) or type(e).__name__
        return f"{type(e).__name__}: {text}" if isinstance(e, KeyError) else text
    return None


def check_listen_endpoint(value: str) -> tuple[Optional[str], str]:
    """``(problem, description)`` of a listen address: problem None if usable."""
    try:
        description = listen_endpoint(value)
    except EndpointError as e:
        return str(e), value
    kind = description.split(":", 1)[0]
    positional, keywords = _endpoint_arguments(description)
    problem = None
    if kind in _PORT_FIRST:
        problem = _port_problem(keywords.get("port", positional[0] if positional and positional[0] else None))
        interface = keywords.get("interface")
        if problem is None and interface is not None and not _is_ip_address(interface):
            problem = f"interface must be an IP address such as 127.0.0.1 or ::1, not {interface!r}"
    elif kind == "unix":
        socket_path = keywords.get("address", positional[0] if positional else "")
        if not socket_path:
            problem = "no socket path given"
        elif not Path(socket_path).parent.is_dir():
            problem = f"the directory of the socket, {str(Path(socket_path).parent)!r}, does not exist"
    if problem is not None:
        return f"cannot use {value!r}: {problem}", description
    from twisted.internet.endpoints import serverFromString

    problem = _twisted_problem(serverFromString, description)
    return (f"cannot use {value!r}: {problem}" if problem is not None else None), description


def check_connect_endpoint(value: str) -> tuple[Optional[str], str]:
    """``(problem, description)`` of a dial address: problem None if usable."""
    try:
        description = connect_endpoint(value)
    except EndpointError as e:
        return str(e), value
    kind = description.split(":", 1)[0]
    if kind in _PORT_SECOND:
        positional, keywords = _endpoint_arguments(description)
        port = keywords.get("port", positional[1] if len(positional) > 1 else None)
        problem = _port_problem(port)
        if problem is not None:
            return f"cannot use {value!r}: {problem}", description
    from twisted.internet.endpoints import clientFromString

    problem = _twisted_problem(clientFromString, description)
    return (f"cannot use {value!r}: {problem}" if problem is not None else None), description
