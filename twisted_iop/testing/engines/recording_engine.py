"""An OpenAI engine that records what it was sent, for trace propagation tests.

:class:`RecordingEngine` is a small ``twisted.web`` resource served on
``127.0.0.1:0`` (:func:`listen_recording_engine`) in the test's reactor.
It lists one model, answers chat completions (whole, or streamed as
server-sent events with a usage chunk), or, while :attr:`overloaded`, a
429 in the OpenAI error shape, so the Edge fails over to another provider.
Every POST it got is kept (bounded) with its ``traceparent`` and
``tracestate`` headers, so a test can check the engine saw the client's
trace.
"""

from __future__ import annotations

import json
from typing import Any, Optional, cast

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.testing.configs import MODEL

#: Requests kept at most (the oldest go first).
MAX_RECORDED = 1000


@attrs.frozen
class RecordedRequest:
    """One request as the engine received it."""

    path: str
    traceparent: Optional[str]
    tracestate: Optional[str]
    body: Any


class RecordingEngine(Resource):
    """An OpenAI engine for :data:`MODEL` that records each request's trace headers."""

    isLeaf = True

    def __init__(self, model: str = MODEL) -> None:
        super().__init__()
        self.model = model
        #: While true, every completion is answered 429 ``overloaded``.
        self.overloaded = False
        self.requests: list[RecordedRequest] = []

    def render_GET(self, request: Request) -> bytes:
        """Health and the model list."""
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps({"object": "list", "data": [{"id": self.model, "object": "model"}]}).encode()

    def render_POST(self, request: Request) -> bytes:
        """Record the request; answer it whole, streamed, or 429 while overloaded."""
        raw = request.content.read() if request.content is not None else b""
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.requests.append(
            RecordedRequest(
                request.path.decode("ascii", "replace"),
                _one(request, b"traceparent"),
                _one(request, b"tracestate"),
                body,
            )
        )
        del self.requests[:-MAX_RECORDED]
        if self.overloaded:
            request.setResponseCode(429)
            request.setHeader(b"Content-Type", b"application/json")
            request.setHeader(b"Retry-After", b"3")
            return json.dumps({"error": {"message": "busy", "type": "server_error", "code": "overloaded"}}).encode()
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        if isinstance(body, dict) and body.get("stream"):
            request.setHeader(b"Content-Type", b"text/event-stream")
            events: list[dict[str, Any]] = [
                {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]} for word in ("hi", "!")
            ]
            events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            events.append({"choices": [], "usage": usage})
            text = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            return text + b"data: [DONE]\n\n"
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": usage,
            }
        ).encode()


def _one(request: Request, name: bytes) -> Optional[str]:
    values = request.requestHeaders.getRawHeaders(name)
    if not values:
        return None
    return ",".join(v.decode("latin-1") for v in values)


def listen_recording_engine(reactor: Reactor, engine: RecordingEngine) -> tuple[IListeningPort, str]:
    """Serve ``engine`` on ``127.0.0.1:0``: its port and its base URL (a provider's ``base_url``)."""
    port: IListeningPort = reactor.listenTCP(0, Site(engine), interface="127.0.0.1")
    return port, f"http://127.0.0.1:{cast(IPv4Address, port.getHost()).port}"
