"""HTTP errors of the Control Plane: exceptions, the JSON error shape, and
the one table that maps domain errors to a status and a stable code."""

from __future__ import annotations

import json
import re
from typing import Any, Optional

from twisted.web.iweb import IRequest

from twisted_iop.controlplane.cluster.store import ClusterUnavailable
from twisted_iop.controlplane.fleet.edge_filters import InvalidQuery, InvalidState
from twisted_iop.controlplane.fleet.edge_record import EdgeNotConnected, UnknownEdge
from twisted_iop.controlplane.history.queries import InvalidRange, InvalidSeries, InvalidStep
from twisted_iop.controlplane.requests.command_dispatch import UnknownCommand
from twisted_iop.controlplane.requests.errors import EdgeDisconnected, EdgeErrorAnswer, EdgeTimeout, ShuttingDown
from twisted_iop.label_selectors import SelectorError


class BadRequest(Exception):
    """The request had a bad parameter or body; the message names it."""

    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(message)
        self.code = code


def query_text(request: IRequest, name: str) -> Optional[str]:
    """The one value of query parameter ``name`` (None when absent), for every view.

    Given more than once, or not UTF-8, it is a 400 ``bad_request`` naming
    the parameter: which of two ``limit=`` a view used was a guess.
    """
    values = request.args.get(name.encode())
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"query parameter {name!r} is given {len(values)} times; give it once")
    try:
        return str(values[0].decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest(f"query parameter {name!r} is not valid UTF-8") from None


#: A whole number in a query: ASCII digits (int() would also take "5\r", "1_000" or
#: another script's digits).
_WHOLE = re.compile(r"-?[0-9]+")


def query_int(request: IRequest, name: str, default: int, minimum: int, maximum: Optional[int] = None) -> int:
    """The whole number query parameter ``name`` (``default`` when absent), for every view:
    ASCII digits only, as the document's ``integer`` says, within the bounds; else 400."""
    text = query_text(request, name)
    if text is None:
        return default
    try:
        value = int(text) if _WHOLE.fullmatch(text) else None
    except ValueError:  # more digits than int() reads
        value = None
    if value is None:
        raise BadRequest(f"query parameter {name!r} must be a whole number, not {text[:40]!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise BadRequest(f"query parameter {name!r} must be {bound}")
    return value


def body_field(body: dict[str, Any], name: str, empty: Any) -> Any:
    """The body's field ``name``, or ``empty`` when it is missing or null (null is
    "not given"); ``false``, ``0`` or ``[]`` are returned as they are, for the
    caller's type check to refuse."""
    value = body.get(name)
    return empty if value is None else value


def method_not_allowed(request: IRequest, served: list[str]) -> bytes:
    """The JSON 405 for a method ``path`` does not serve, with its ``Allow``."""
    request.setHeader(b"Allow", ", ".join(served).encode("ascii"))
    method = request.method.decode("ascii", "replace")[:20]
    return error_body(request, 405, "method_not_allowed", f"method {method} is not served here")


class NotFound(Exception):
    """No such route or object."""


class Unauthorized(Exception):
    """An API token is needed."""

    def __str__(self) -> str:
        return "an API token is required (Authorization: Bearer ...)"


class Forbidden(Exception):
    """The API token is wrong, or its role may not do this."""

    def __init__(self, message: str = "the API token is not valid") -> None:
        super().__init__(message)


class BodyTooLarge(Exception):
    """The request body is larger than the limit."""


#: Domain errors and the HTTP status and stable code each maps to.
DOMAIN_ERRORS: dict[type[Exception], tuple[int, str]] = {
    UnknownCommand: (400, "unknown_command"),
    SelectorError: (400, "invalid_selector"),
    InvalidState: (400, "invalid_state"),
    InvalidQuery: (400, "bad_request"),
    InvalidRange: (400, "invalid_range"),
    InvalidStep: (400, "invalid_step"),
    InvalidSeries: (400, "invalid_series"),
    Unauthorized: (401, "unauthorized"),
    Forbidden: (403, "forbidden"),
    UnknownEdge: (404, "unknown_edge"),
    NotFound: (404, "not_found"),
    EdgeNotConnected: (409, "edge_not_connected"),
    BodyTooLarge: (413, "body_too_large"),
    EdgeErrorAnswer: (502, "edge_error"),
    EdgeDisconnected: (503, "edge_disconnected"),
    EdgeTimeout: (504, "edge_timeout"),
    ShuttingDown: (503, "shutting_down"),
    ClusterUnavailable: (503, "cluster_unavailable"),
}


def json_body(request: IRequest, status: int, payload: Any) -> bytes:
    return encoded_json_body(request, status, json.dumps(payload, separators=(",", ":")).encode("utf-8"))


def encoded_json_body(request: IRequest, status: int, body: bytes) -> bytes:
    """:func:`json_body` for a body already encoded as compact JSON."""
    request.setResponseCode(status)
    request.setHeader(b"Content-Type", b"application/json")
    request.setHeader(b"Cache-Control", b"no-store")
    return body


def error_body(request: IRequest, status: int, code: str, message: str, **extra: Any) -> bytes:
    """The JSON error shape: ``{"error": {"code", "message", "status"}}``."""
    payload: dict[str, Any] = {"error": {"code": code, "message": message, "status": status}}
    payload.update(extra)
    return json_body(request, status, payload)
