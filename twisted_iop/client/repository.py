"""The Control Plane status repository: one async method per HTTP view.

:class:`ControlPlaneStatusRepository` speaks the JSON API of
docs/http-api.md through treq and returns the frozen models of
:mod:`twisted_iop.client.models`. Error answers raise the
:class:`~twisted_iop.client.errors.ControlPlaneError` subclass of their
code; a Control Plane that cannot be reached raises
:class:`~twisted_iop.client.errors.ControlPlaneUnreachable`.

The treq client is injectable: tests pass a ``treq.testing.StubTreq``, and a
long-running program can share one ``treq.client.HTTPClient``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union
from urllib.parse import quote, urlencode

from twisted.internet.defer import CancelledError
from twisted.internet.error import (
    ConnectError,
    ConnectingCancelledError,
    ConnectionRefusedError,
    DNSLookupError,
)
from twisted.internet.error import (
    TimeoutError as ConnectTimeoutError,
)
from twisted.logger import Logger
from twisted.web.client import ResponseFailed, ResponseNeverReceived

from twisted_iop.client.deployments import DeploymentViews
from twisted_iop.client.errors import (
    ERRORS_BY_CODE,
    ControlPlaneError,
    ControlPlaneUnreachable,
    EdgeNotConnectedError,
    InvalidResponse,
    OperationError,
)
from twisted_iop.client.history import HistoryViews
from twisted_iop.client.model_json import read
from twisted_iop.client.models import (
    CommandCatalog,
    EdgeDetail,
    EdgePage,
    EdgeStatus,
    EdgeSummary,
    EventPage,
    FleetStatus,
    FleetStatusRow,
    Health,
    Operation,
    OperationPage,
    Readiness,
)
from twisted_iop.client.rollouts import RolloutViews
from twisted_iop.client.slos import SloViews

#: Environment variable naming the Control Plane's HTTP base URL.
HTTP_URL_ENV = "IOP_CONTROL_PLANE_HTTP_URL"
#: Environment variable holding the API token, when the CLI is not given one.
API_TOKEN_ENV = "IOP_CONTROL_PLANE_API_TOKEN"
#: Where the Control Plane listens by default.
DEFAULT_HTTP_URL = "http://127.0.0.1:8080"
#: How long one HTTP request may take before the Control Plane counts as unreachable.
DEFAULT_TIMEOUT_SECONDS = 30.0
#: Extra time allowed on top of a command's own timeout for the HTTP answer.
COMMAND_TIMEOUT_MARGIN_SECONDS = 5.0
#: The largest page the list views hand out.
MAX_PAGE_LIMIT = 1000
#: A ``state`` filter: ``"error,timeout"`` or ``["error", "timeout"]`` (any of them).
States = Union[str, Iterable[str], None]


def http_url_from_environment(url: Optional[str] = None) -> str:
    """The Control Plane base URL: ``url``, else the environment, else the default."""
    chosen = url or os.environ.get(HTTP_URL_ENV) or DEFAULT_HTTP_URL
    return chosen.rstrip("/")


def describe_connection_error(error: BaseException, timeout: float) -> Optional[str]:
    """A short human reason for a failure to talk to the server, or ``None``.

    ``None`` means the error is not a connection problem (a bug, say) and
    should not be reported as "unreachable".
    """
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, DNSLookupError):
        return "host name lookup failed"
    if isinstance(error, (CancelledError, ConnectingCancelledError, ConnectTimeoutError)):
        return f"no answer within {timeout:g} s"
    if isinstance(error, (ResponseNeverReceived, ResponseFailed)):
        reasons = getattr(error, "reasons", None) or []
        for reason in reasons:
            inner = getattr(reason, "value", None)
            if isinstance(inner, CancelledError):
                return f"no answer within {timeout:g} s"
        return "the connection closed before an answer arrived"
    if isinstance(error, ConnectError):
        text = str(error.osError or "") if getattr(error, "osError", None) else ""
        return text or error.__class__.__name__
    if isinstance(error, OSError):
        return error.strerror or str(error)
    return None


def _default_http_client() -> Any:
    """A treq client on the global reactor with non-persistent connections.

    Non-persistent, so that a short-lived program (iopctl) leaves no idle
    connection behind when it exits.
    """
    from treq.client import HTTPClient
    from twisted.internet import reactor
    from twisted.web.client import Agent, HTTPConnectionPool

    pool = HTTPConnectionPool(reactor, persistent=False)
    agent: Any = Agent(reactor, pool=pool)
    return HTTPClient(agent)


def error_from_response(status: int, body: bytes) -> ControlPlaneError:
    """Build the typed exception for an error answer of the Control Plane."""
    document: Mapping[str, Any] = {}
    try:
        decoded = json.loads(body.decode("utf-8")) if body else {}
        if isinstance(decoded, Mapping):
            document = decoded
    except (UnicodeDecodeError, ValueError):
        pass
    error = document.get("error")
    if isinstance(error, Mapping) and isinstance(error.get("code"), str):
        code = str(error["code"])
        message = str(error.get("message") or "")
        given = error.get("status")
        if isinstance(given, int) and not isinstance(given, bool):
            status = given
    else:
        code = f"http_{status}"
        text = body.decode("utf-8", "replace").strip().splitlines()
        message = text[0][:200] if text else "the Control Plane answered without an error document"
    cls = ERRORS_BY_CODE.get(code, ControlPlaneError)
    exc = cls(code, message, status, document)
    try:
        if isinstance(exc, EdgeNotConnectedError) and document.get("snapshot") is not None:
            exc.snapshot = read(EdgeStatus, document["snapshot"], "snapshot")
        if isinstance(exc, OperationError) and document.get("operation") is not None:
            exc.operation = read(Operation, document["operation"], "operation")
            replayed = document.get("replayed")
            exc.replayed = replayed if isinstance(replayed, bool) else None
    except InvalidResponse:
        # The error itself is what matters; context that does not parse is dropped.
        pass
    return exc


class ControlPlaneStatusRepository(RolloutViews, HistoryViews, SloViews, DeploymentViews):
    """Typed access to every HTTP view of one Control Plane.

    ``base_url`` defaults to ``$IOP_CONTROL_PLANE_HTTP_URL`` and then to
    ``http://127.0.0.1:8080``; ``api_token`` is sent as a Bearer token;
    ``http_client`` is any treq ``HTTPClient``-like object (``StubTreq`` in
    tests); ``timeout`` bounds each request, in seconds.
    """

    _log = Logger()

    def __init__(
        self,
        base_url: Optional[str] = None,
        api_token: Optional[str] = None,
        http_client: Any = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.base_url = http_url_from_environment(base_url)
        self._api_token = api_token or None
        self._http = http_client if http_client is not None else _default_http_client()
        self.timeout = timeout

    # -- plumbing -----------------------------------------------------------

    def _url(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        url = self.base_url + path
        if query:
            pairs = [(k, str(v)) for k, v in query.items() if v is not None]
            if pairs:
                url += "?" + urlencode(pairs)
        return url

    def _headers(self, extra: Optional[Mapping[str, str]] = None) -> dict[bytes, list[bytes]]:
        headers: dict[bytes, list[bytes]] = {b"Accept": [b"application/json"]}
        if self._api_token:
            headers[b"Authorization"] = [b"Bearer " + self._api_token.encode("utf-8")]
        for k, v in (extra or {}).items():
            headers[k.encode("ascii")] = [v.encode("utf-8")]
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        query: Optional[Mapping[str, Any]] = None,
        body: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None,
        accept_statuses: frozenset[int] = frozenset(),
        headers: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """Send one request and return the decoded JSON of a 2xx answer."""
        seconds = timeout if timeout is not None else self.timeout
        all_headers = self._headers(headers)
        data = None
        if body is not None:
            all_headers[b"Content-Type"] = [b"application/json"]
            data = json.dumps(body).encode("utf-8")
        url = self._url(path, query)
        try:
            response = await self._http.request(method, url, headers=all_headers, data=data, timeout=seconds)
            content = await response.content()
        except Exception as e:
            reason = describe_connection_error(e, seconds)
            if reason is None:
                raise
            raise ControlPlaneUnreachable(self.base_url, reason) from None
        status = int(response.code)
        if not (200 <= status < 300) and status not in accept_statuses:
            raise error_from_response(status, content)
        try:
            return json.loads(content.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise InvalidResponse(f"{method} {path}: the answer is not JSON (status {status})") from None

    @staticmethod
    def _edge_path(edge_id: str, *rest: str) -> str:
        parts = ["edges", quote(edge_id, safe="")] + [quote(p, safe="") for p in rest]
        return "/" + "/".join(parts)

    # -- health ---------------------------------------------------------------

    async def healthz(self) -> Health:
        """``GET /healthz``."""
        return read(Health, await self._request("GET", "/healthz"))

    async def readyz(self) -> Readiness:
        """``GET /readyz``; a not-ready server (503) answers ``ready=False``."""
        return read(Readiness, await self._request("GET", "/readyz", accept_statuses=frozenset({503})))

    # -- edges ----------------------------------------------------------------

    async def edges(
        self,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        selector: Optional[str] = None,
        state: States = None,
        q: Optional[str] = None,
    ) -> EdgePage:
        """``GET /edges``: one page of edge summaries, sorted by id.

        ``selector`` (a label selector over the edges' hello labels, e.g.
        ``"region=eu,tier!=canary"``), ``state`` (``connected`` and/or
        ``disconnected``: any of them) and ``q`` (a case-insensitive
        substring of the id) must all hold; ``total`` counts the matching
        edges. A bad selector raises :class:`InvalidSelectorError`, a bad
        state :class:`InvalidStateError`.
        """
        query = {"limit": limit, "cursor": cursor, **_filters(selector, state, q)}
        return read(EdgePage, await self._request("GET", "/edges", query))

    async def all_edges(
        self, selector: Optional[str] = None, state: States = None, q: Optional[str] = None
    ) -> EdgePage:
        """Every matching edge, following ``next_cursor`` across pages, as one page.

        ``total`` is the first page's; ``next_cursor`` is ``None``. The
        filters are those of :meth:`edges`.
        """
        first = await self.edges(limit=MAX_PAGE_LIMIT, selector=selector, state=state, q=q)
        items: list[EdgeSummary] = list(first.items)
        cursor = first.next_cursor
        seen: set[str] = set()
        while cursor:
            _check_cursor(cursor, seen)
            page = await self.edges(limit=MAX_PAGE_LIMIT, cursor=cursor, selector=selector, state=state, q=q)
            items.extend(page.items)
            cursor = page.next_cursor
        return EdgePage(items=tuple(items), total=first.total, next_cursor=None)

    async def edge(self, edge_id: str) -> EdgeDetail:
        """``GET /edges/{id}``: the summary and buffer figures of one edge."""
        return read(EdgeDetail, await self._request("GET", self._edge_path(edge_id)))

    async def edge_status(self, edge_id: str) -> EdgeStatus:
        """``GET /edges/{id}/status``: a fresh snapshot of the edge's nodes.

        Raises :class:`EdgeNotConnectedError` (with ``.snapshot``) when the edge
        is known but not connected, :class:`EdgeTimeoutError` when it did not
        answer in time.
        """
        return read(EdgeStatus, await self._request("GET", self._edge_path(edge_id, "status")))

    async def events(self, edge_id: str, since: int = 0, limit: Optional[int] = None) -> EventPage:
        """``GET /edges/{id}/events``: events with a sequence above ``since``."""
        data = await self._request("GET", self._edge_path(edge_id, "events"), {"since": since, "limit": limit})
        return read(EventPage, data)

    async def operations(
        self, edge_id: str, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> OperationPage:
        """``GET /edges/{id}/operations``: one page of operations, newest first."""
        data = await self._request("GET", self._edge_path(edge_id, "operations"), {"limit": limit, "cursor": cursor})
        return read(OperationPage, data)

    async def operation(self, edge_id: str, operation_id: str) -> Operation:
        """``GET /edges/{id}/operations/{operation_id}``."""
        return read(Operation, await self._request("GET", self._edge_path(edge_id, "operations", operation_id)))

    async def commands(self, edge_id: str) -> CommandCatalog:
        """``GET /edges/{id}/commands``: the edge's command catalog."""
        return read(CommandCatalog, await self._request("GET", self._edge_path(edge_id, "commands")))

    async def send_command(
        self,
        edge_id: str,
        name: str,
        target: Optional[str] = None,
        arguments: Optional[Mapping[str, str]] = None,
        timeout_seconds: Optional[float] = None,
        idempotency_key: Optional[str] = None,
    ) -> Operation:
        """``POST /edges/{id}/commands``: run a command and wait for its outcome.

        Returns the operation when it ended ``succeeded``, ``failed`` or
        ``rejected``; its ``replayed`` says whether the idempotency key matched
        an identical earlier command (nothing was sent again). Raises
        :class:`EdgeTimeoutError`, :class:`EdgeDisconnectedError` or
        :class:`EdgeSupersededError` (each with ``.operation`` and
        ``.replayed``) when the edge did not finish it,
        :class:`IdempotencyConflictError` (with the earlier ``.operation``)
        when the key names a different command, :class:`EdgeNotConnectedError`
        when nothing was sent.
        """
        body: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        if target is not None:
            body["target"] = target
        if timeout_seconds is not None:
            body["timeout_seconds"] = timeout_seconds
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        wait = max(self.timeout, (timeout_seconds or 10.0) + COMMAND_TIMEOUT_MARGIN_SECONDS)
        data = await self._request("POST", self._edge_path(edge_id, "commands"), body=body, timeout=wait)
        return read(Operation, data)

    # -- fleet ----------------------------------------------------------------

    async def fleet_status(
        self,
        limit: Optional[int] = None,
        cursor: Optional[str] = None,
        selector: Optional[str] = None,
        state: States = None,
        q: Optional[str] = None,
    ) -> FleetStatus:
        """``GET /fleet/status``: one page of per-edge rows and the fleet totals.

        The filters are those of :meth:`edges`; ``state`` also takes the
        rows' own states (``ok``, ``error``, ``timeout``). A filtered view
        asks only the matching edges, and its ``total`` and ``totals`` are
        those of the matching rows.
        """
        query = {"limit": limit, "cursor": cursor, **_filters(selector, state, q)}
        return read(FleetStatus, await self._request("GET", "/fleet/status", query))

    async def full_fleet_status(
        self, selector: Optional[str] = None, state: States = None, q: Optional[str] = None
    ) -> FleetStatus:
        """The fleet status with the rows of every page (totals of the first),
        filtered as :meth:`fleet_status` is."""
        first = await self.fleet_status(limit=MAX_PAGE_LIMIT, selector=selector, state=state, q=q)
        rows: list[FleetStatusRow] = list(first.items)
        cursor = first.next_cursor
        seen: set[str] = set()
        while cursor:
            _check_cursor(cursor, seen)
            page = await self.fleet_status(limit=MAX_PAGE_LIMIT, cursor=cursor, selector=selector, state=state, q=q)
            rows.extend(page.items)
            cursor = page.next_cursor
        return FleetStatus(
            generated_at=first.generated_at,
            items=tuple(rows),
            total=first.total,
            next_cursor=None,
            totals=first.totals,
            round_at=first.round_at,
        )

    async def fleet_events(self, since: int = 0, limit: Optional[int] = None) -> EventPage:
        """``GET /fleet/events``: events of all edges above fleet sequence ``since``."""
        return read(EventPage, await self._request("GET", "/fleet/events", {"since": since, "limit": limit}))

    async def fleet_operations(self, limit: Optional[int] = None, cursor: Optional[str] = None) -> OperationPage:
        """``GET /fleet/operations``: one page of operations of all edges."""
        data = await self._request("GET", "/fleet/operations", {"limit": limit, "cursor": cursor})
        return read(OperationPage, data)


def _filters(selector: Optional[str], state: States, q: Optional[str]) -> dict[str, Optional[str]]:
    """The filter parameters of the fleet views (``None``: not sent)."""
    if state is not None and not isinstance(state, str):
        state = ",".join(state)
    return {"selector": selector or None, "state": state or None, "q": q or None}


def _check_cursor(cursor: str, seen: set[str]) -> None:
    """Refuse a cursor seen before: a server bug must not loop us forever."""
    if cursor in seen:
        raise InvalidResponse(f"the Control Plane repeated the page cursor {cursor!r}")
    seen.add(cursor)
