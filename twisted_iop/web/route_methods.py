"""What a Klein app serves at a path: the methods its ``Allow`` header names.

The Control Plane's views and the Edge's inference API answer a method a
path does not serve with 405 and an ``Allow`` header naming only what is
served there, both from their own routes (a catch-all route answers the
405 and 404) and from their HTTP site's refusal of methods no route takes
(OPTIONS, TRACE ...). One reading of the URL map for both.
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import unquote_to_bytes

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map

#: Methods a route may serve, in the order an ``Allow`` header names them.
ROUTE_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def served_methods(url_map: Map, path: str, fallback_endpoint: str) -> list[str]:
    """The methods a route other than ``fallback_endpoint`` (the JSON 404 for
    every path) serves at ``path``, HEAD with GET: what ``Allow`` names."""
    adapter = url_map.bind("iop")
    served: list[str] = []
    for method in ROUTE_METHODS:
        try:
            rule, _ = adapter.match(path, method=method, return_rule=True)
        except HTTPException:
            continue
        if rule.endpoint != fallback_endpoint:
            served.append(method)
    if "GET" in served:
        served.insert(1, "HEAD")
    return served


def allow_header(url_map: Map, path: bytes, fallback_endpoint: str) -> Optional[bytes]:
    """The ``Allow`` header of a raw request ``path`` (percent-encoded), None where no route serves it."""
    try:
        text = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        return None
    served = served_methods(url_map, text, fallback_endpoint)
    return ", ".join(served).encode("ascii") if served else None
