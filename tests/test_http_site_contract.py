"""What the guarded HTTP site answers for requests no route sees: body-less
writes, unreadable paths, over-long request lines, and the access log of
every answer (refusals included) with no secret in it."""

from __future__ import annotations

import io
from typing import Any

import pytest_twisted
from test_http_site import Echo, serve

from twisted_iop.testing.http import connect, request_head
from twisted_iop.web.access_log import redacted_uri
from twisted_iop.web.request_guard import SiteLimits


async def _serve(limits: SiteLimits = SiteLimits()) -> tuple[Any, int, Echo, io.StringIO]:
    """A guarded site on 127.0.0.1:0 whose access log is a string buffer."""
    port, number, echo, site = await serve(limits)
    log = io.StringIO()
    site.logFile = log
    return port, number, echo, log


@pytest_twisted.ensureDeferred
async def test_a_body_less_post_needs_no_content_type() -> None:
    """POST with no body (Content-Length: 0, or none) reaches the route without
    Content-Type (POST /rollouts/{id}/cancel as the docs show it); a body still needs JSON."""
    port, number, echo, _ = await _serve()
    try:
        for extra in ("Content-Length: 0\r\nConnection: close\r\n", "Connection: close\r\n"):
            client = await connect(number)
            client.tcp.write(request_head("POST", number, extra))
            await client.closed
            assert client.status == 200, client.received
        assert echo.bodies == [0, 0]
        typed = await connect(number)
        typed.tcp.write(request_head("POST", number, "Content-Length: 2\r\n") + b"{}")
        await typed.closed
        assert typed.status == 415
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_path_that_is_not_utf8_gets_a_json_400() -> None:
    """GET /edges/%FF: a JSON 400 ``invalid_path`` from the site, not an HTML answer and a traceback."""
    port, number, _, log = await _serve()
    try:
        client = await connect(number)
        client.tcp.write(request_head("GET", number, path="/edges/%FF"))
        await client.closed
        assert client.status == 400
        assert b"Content-Type: application/json" in client.received
        assert client.body["error"]["code"] == "invalid_path"
        assert '"GET /edges/%FF HTTP/1.1" 400' in log.getvalue()
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_over_long_request_line_gets_a_json_414() -> None:
    """A 20 KB selector is answered 414 ``uri_too_long`` in JSON, not by closing the connection."""
    port, number, _, _ = await _serve()
    try:
        client = await connect(number)
        client.tcp.write(request_head("GET", number, path="/edges?selector=" + "a" * 20000))
        await client.closed
        assert client.status == 414
        assert client.body["error"]["code"] == "uri_too_long"
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_every_refusal_gets_an_access_log_line() -> None:
    """405, 413, 415 and 421 from the site guard each write one access-log line, like any answer."""
    port, number, _, log = await _serve(SiteLimits(max_body_bytes=10))
    try:
        cases = [
            (request_head("PROPFIND", number, path="/a"), 405),
            (request_head("POST", number, "Content-Type: application/json\r\nContent-Length: 99\r\n", path="/b"), 413),
            (request_head("POST", number, "Content-Type: text/plain\r\nContent-Length: 2\r\n", path="/c") + b"{}", 415),
            (request_head("GET", number, host="evil.example", path="/d"), 421),
        ]
        for raw, status in cases:
            client = await connect(number)
            client.tcp.write(raw)
            await client.closed
            assert client.status == status
        lines = log.getvalue().splitlines()
        assert len(lines) == 4
        for line, (_, status), path in zip(lines, cases, ("/a", "/b", "/c", "/d"), strict=True):
            assert f' {path} HTTP/1.1" {status} ' in line
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_a_token_in_the_query_never_reaches_the_access_log() -> None:
    """``?access_token=`` (and any ``*token*``, ``*key*``, ``*secret*`` parameter) is written REDACTED."""
    port, number, _, log = await _serve()
    try:
        client = await connect(number)
        client.tcp.write(
            request_head("GET", number, "Connection: close\r\n", path="/edges?access_token=s3cr3t&limit=5&api_key=k9")
        )
        await client.closed
        assert client.status == 200
        text = log.getvalue()
        assert "/edges?access_token=REDACTED&limit=5&api_key=REDACTED" in text
        assert "s3cr3t" not in text and "k9" not in text
    finally:
        await port.stopListening()


def test_redacted_uri_rules() -> None:
    """Only secret-named parameters are redacted; other parameters and the path are kept as sent."""
    assert redacted_uri(b"/a/token?x=1") == b"/a/token?x=1"
    assert redacted_uri(b"/a?Secret=1&b=2&MyKey") == b"/a?Secret=REDACTED&b=2&MyKey"
    assert redacted_uri(b"/a") == b"/a"
