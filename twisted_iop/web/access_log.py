"""The access-log line of an HTTP answer, with secrets kept out of it.

Every HTTP listener writes one line per answer in the combined log format,
whether a route answered or the site refused the request first (405, 413,
415, 421, ...). A query parameter whose name says it carries a secret
(``access_token=``, ``api_key=``, ``secret=``...) is written as
``REDACTED``: no token is ever written to a log, even one a client put
in a URL by mistake (tokens are accepted from the ``Authorization`` header
only).
"""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.web.http import _escape
from twisted.web.http_headers import Headers

#: Words that mark a query parameter's value as a secret (matched in its lower-cased name).
SECRET_PARAMETER_WORDS = ("token", "key", "secret", "password", "passwd", "auth", "signature", "credential")

#: What a secret parameter's value is written as.
REDACTED = b"REDACTED"


def _secret_name(name: bytes) -> bool:
    lower = name.lower()
    return any(word.encode("ascii") in lower for word in SECRET_PARAMETER_WORDS)


def redacted_uri(uri: bytes) -> bytes:
    """``uri`` with the value of every secret query parameter replaced by ``REDACTED``."""
    path, mark, query = uri.partition(b"?")
    if not mark:
        return uri
    parts = []
    for item in query.split(b"&"):
        name, equals, _ = item.partition(b"=")
        if equals and _secret_name(name):
            item = name + b"=" + REDACTED
        parts.append(item)
    return path + b"?" + b"&".join(parts)


def combined_line(
    timestamp: str,
    ip: str,
    method: bytes,
    uri: bytes,
    protocol: bytes,
    code: int,
    length: Optional[int],
    referrer: Optional[bytes] = None,
    agent: Optional[bytes] = None,
) -> str:
    """One line in the combined log format (Twisted's), the URI redacted."""
    return '"{}" - - {} "{} {} {}" {:d} {} "{}" "{}"'.format(
        _escape(ip),
        timestamp,
        _escape(method),
        _escape(redacted_uri(uri)),
        _escape(protocol),
        code,
        length or "-",
        _escape(referrer or b"-"),
        _escape(agent or b"-"),
    )


def access_line(timestamp: str, request: Any) -> str:
    """The access-log line of a request a route answered (Twisted's
    ``IAccessLogFormatter``), its secret query parameters redacted."""
    address = request.getClientAddress()
    ip = address.host if isinstance(address, (IPv4Address, IPv6Address)) else "-"
    return combined_line(
        timestamp,
        ip,
        request.method,
        request.uri,
        request.clientproto,
        request.code,
        request.sentLength,
        request.getHeader(b"referer"),
        request.getHeader(b"user-agent"),
    )


def _first(headers: Optional[Headers], name: bytes) -> Optional[bytes]:
    values = None if headers is None else headers.getRawHeaders(name)
    return values[0] if values else None


def refusal_line(timestamp: str, channel: Any, status: int, length: int, headers: Optional[Headers]) -> str:
    """The access-log line of an answer the site gave itself, from what
    ``channel`` (a ``GuardedChannel``) read of the request line and, when
    they arrived, the request's ``headers``."""
    return combined_line(
        timestamp,
        channel.peer_host or "-",
        channel.request_method or b"-",
        channel.request_uri or b"-",
        channel.request_version or b"-",
        status,
        length,
        _first(headers, b"referer"),
        _first(headers, b"user-agent"),
    )
