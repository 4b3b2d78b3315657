"""``iop-mock-provider`` records the trace headers of its completion requests, bounded."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted
import treq
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.web.server import Site

from twisted_iop.mock_provider import MAX_RECORDED_TRACES, MockBehaviour, MockProviderServer
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.http import chat, post

CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest_twisted.ensureDeferred
async def test_the_mock_shows_the_trace_headers_it_got() -> None:
    """``GET /mock/traces`` lists each completion's traceparent and tracestate ("" when absent), oldest first."""
    server = MockProviderServer([MODEL], MockBehaviour(), reactor)
    port: Any = reactor.listenTCP(0, Site(server.app.resource()), interface="127.0.0.1")  # type: ignore[arg-type]  # listenTCP's stubs want a ServerFactory of _ProtoWithFactory, which Site is not
    base = f"http://127.0.0.1:{port.getHost().port}"
    try:
        traced = {b"traceparent": [CLIENT.encode()], b"tracestate": [b"a=1"]}
        for sent in (traced, None):
            answer = await post(base, "/v1/chat/completions", chat(), sent)
            assert answer.code == 200
        listed = json.loads(await (await treq.get(base + "/mock/traces", timeout=10)).content())
        assert listed == {
            "traces": [{"traceparent": CLIENT, "tracestate": "a=1"}, {"traceparent": "", "tracestate": ""}]
        }
    finally:
        await port.stopListening()


def test_the_mock_keeps_a_bounded_number_of_entries() -> None:
    """At most MAX_RECORDED_TRACES entries are kept, the oldest dropped first."""
    server = MockProviderServer([MODEL], MockBehaviour(), Clock())
    for index in range(MAX_RECORDED_TRACES + 5):
        server.traces.append((str(index), ""))
    assert len(server.traces) == MAX_RECORDED_TRACES and server.traces[0][0] == "5"
