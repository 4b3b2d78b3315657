"""Inference engines' recorded answers, served over HTTP on 127.0.0.1 (tests only).

Each engine kind's documented shapes (health answers, the models list,
load endpoints, error bodies, a streamed chat completion with its usage
chunk or an error event) are served by a small twisted.web server, so the
Node's adapters and probes are tested over real sockets against what the
engines really send. Every shape names where it is documented (the
engine's docs, or the source file that builds it); the shapes themselves
are in :mod:`twisted_iop.testing.engines.engine_shapes`.

Use::

    fixture = EngineFixture("vllm", models=("m",))
    base_url = fixture.start()            # http://127.0.0.1:<port>
    fixture.health = "loading"            # "ok" | "loading" | "down"
    fixture.hang_probes = True            # health, models and load never answer (a busy engine)
    fixture.next_chat("context_length_exceeded")  # the next POST answers that recorded error
    fixture.next_chat(STREAM_ERROR)       # ... or a 200 stream with an error event, no [DONE]
    fixture.serve("/metrics", 200, b"...")  # any GET path answers this instead
    await fixture.stop()                  # closes the port and every open connection

``fixture.requests`` lists ``(method, path)`` of what was asked.
Kinds: the Node's HTTP kinds plus ``llama-cpp-python`` (kind ``llamacpp``
on the Node, see :attr:`EngineFixture.node_kind`).
"""

from __future__ import annotations

import json
from typing import Any, Optional, cast

from twisted.internet import reactor as default_reactor
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.internet.interfaces import IListeningPort
from twisted.web.http import HTTPChannel
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Request, Site

from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.testing.engines.engine_shapes import (
    JSON,
    SHAPES,
    STREAM_EMPTY,
    STREAM_ERROR,
    STREAM_OK,
    STREAM_TRUNCATED,
    Reply,
    as_json,
    openai_error,
)

__all__ = ["FIXTURE_USAGE", "SHAPES", "STREAM_EMPTY", "STREAM_ERROR", "STREAM_OK", "STREAM_TRUNCATED", "EngineFixture"]


_NOT_FOUND = Reply(404, as_json({"detail": "Not Found"}))


class _TrackingSite(Site):
    """A site that remembers its connections, so stopping the fixture closes them (as a dead engine would)."""

    noisy = False

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource)
        self.channels: set[HTTPChannel] = set()

    def buildProtocol(self, addr: Any) -> Any:
        channel = super().buildProtocol(addr)
        channels = self.channels
        channels.add(channel)
        lost = channel.connectionLost

        def connection_lost(reason: Any) -> None:
            channels.discard(channel)
            lost(reason)

        channel.connectionLost = connection_lost
        return channel


class EngineFixture(Resource):
    """One engine of ``kind`` answering its recorded shapes on 127.0.0.1."""

    isLeaf = True

    def __init__(self, kind: str, models: tuple[str, ...] = ("m",), reactor: Optional[Reactor] = None) -> None:
        super().__init__()
        self.shapes = SHAPES[kind]
        self.models = models
        self._reactor: Reactor = reactor if reactor is not None else default_reactor
        #: The health endpoint's state: "ok", "loading" or "down" (as the engine records them).
        self.health = "ok"
        #: When true, health, models and load requests are held unanswered (an engine busy generating).
        self.hang_probes = False
        #: ``(method, path)`` of every request, in order.
        self.requests: list[tuple[str, str]] = []
        #: The bodies of the POSTs, parsed.
        self.posted: list[Any] = []
        self._overrides: dict[str, Reply] = {}
        self._chats: list[str] = []
        self._held: list[Request] = []
        self._port: Optional[IListeningPort] = None
        self._site = _TrackingSite(self)

    @property
    def node_kind(self) -> str:
        """The ``kind`` of this engine in node.yaml."""
        return self.shapes.node_kind

    # -- control ----------------------------------------------------------------------

    def start(self) -> str:
        """Listen on 127.0.0.1, a free port; the base URL."""
        port = self._reactor.listenTCP(0, self._site, interface="127.0.0.1")
        self._port = port
        return f"http://127.0.0.1:{cast(IPv4Address, port.getHost()).port}"

    def stop(self) -> Deferred[Any]:
        """Stop listening and close every connection (later connections are refused)."""
        for request in self._held:
            transport: Any = request.transport
            if transport is not None:
                transport.abortConnection()
        self._held.clear()
        for channel in list(self._site.channels):
            # Site builds a _GenericHTTPChannelProtocol around the HTTPChannel that has the transport.
            transport = getattr(getattr(channel, "_channel", channel), "transport", None)
            if transport is not None:
                transport.abortConnection()
        if self._port is None:
            return succeed(None)
        port, self._port = self._port, None
        return maybeDeferred(port.stopListening)

    def serve(self, path: str, status: int, body: bytes, content_type: str = JSON) -> None:
        """Answer GET ``path`` with this, instead of the recorded shape."""
        self._overrides[path] = Reply(status, body, content_type)

    def next_chat(self, answer: str) -> None:
        """What the next POST answers: a recorded error's name, or one of the ``STREAM_*`` answers."""
        if answer not in (STREAM_OK, STREAM_ERROR, STREAM_TRUNCATED, STREAM_EMPTY) and answer not in self.shapes.errors:
            raise KeyError(f"{self.shapes.node_kind} has no recorded answer {answer!r}")
        self._chats.append(answer)

    def release_probes(self) -> None:
        """Answer the held probe requests now (the engine is between generations again)."""
        held, self._held = self._held, []
        self.hang_probes = False
        for request in held:
            if not request.finished and request.channel is not None:
                self._write(request, self._get_reply(request.path.decode()))
                request.finish()

    # -- twisted.web --------------------------------------------------------------------

    def render_GET(self, request: Request) -> Any:
        """Health, models, load or an override."""
        path = request.path.decode("utf-8", "replace")
        self.requests.append(("GET", path))
        if self.hang_probes:
            self._held.append(request)
            return NOT_DONE_YET
        self._write(request, self._get_reply(path))
        return NOT_DONE_YET

    def render_POST(self, request: Request) -> bytes:
        """A completion: the chosen answer, or an ordinary one."""
        path = request.path.decode("utf-8", "replace")
        self.requests.append(("POST", path))
        try:
            body = json.loads(request.content.read() if request.content is not None else b"")
        except ValueError:
            body = {}
        self.posted.append(body)
        answer = self._chats.pop(0) if self._chats else STREAM_OK
        if answer in self.shapes.errors:
            recorded = self.shapes.errors[answer]
            request.setResponseCode(recorded.status)
            request.setHeader(b"Content-Type", JSON.encode())
            return recorded.body
        stream = isinstance(body, dict) and body.get("stream") is True
        if not stream and answer == STREAM_OK:
            request.setHeader(b"Content-Type", JSON.encode())
            return as_json(self._completion())
        request.setHeader(b"Content-Type", b"text/event-stream")
        if answer == STREAM_EMPTY:
            return b""
        usage = isinstance(body, dict) and isinstance(body.get("stream_options"), dict)
        usage = usage and body["stream_options"].get("include_usage") is True
        return self._stream(answer, bool(usage))

    # -- answers ---------------------------------------------------------------------------

    def _get_reply(self, path: str) -> Reply:
        if path in self._overrides:
            return self._overrides[path]
        shapes = self.shapes
        if shapes.health_path is not None and path == shapes.health_path and shapes.health:
            return shapes.health.get(self.health, shapes.health["ok"])
        if path == shapes.models_path:
            return shapes.models
        return shapes.load.get(path, _NOT_FOUND)

    def _write(self, request: Request, reply: Reply) -> None:
        request.setResponseCode(reply.status)
        request.setHeader(b"Content-Type", reply.content_type.encode())
        request.write(self._fill(reply.body))
        request.finish()

    def _fill(self, body: bytes) -> bytes:
        return body.replace(b"{model}", self.models[0].encode())

    def _chunk(self, content: Optional[str], finish: Optional[str] = None) -> dict[str, Any]:
        delta = {} if content is None else {"content": content}
        return {
            "id": "chatcmpl-fixture",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": self.models[0],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def _completion(self) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fixture",
            "object": "chat.completion",
            "created": 1,
            "model": self.models[0],
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hello there"}, "finish_reason": "stop"}
            ],
            "usage": dict(FIXTURE_USAGE),
        }

    def _stream(self, answer: str, usage: bool) -> bytes:
        lines: list[bytes] = []
        if self.shapes.stream_comment:
            lines.append(self.shapes.stream_comment)
        lines += [b"data: " + as_json(self._chunk("Hello")), b"data: " + as_json(self._chunk(" there"))]
        if answer == STREAM_ERROR:
            error = self.shapes.stream_error
            payload = error.body if error is not None else openai_error("stream failed", "server_error", 500)
            lines.append(b"data: " + payload)
        elif answer == STREAM_OK:
            lines.append(b"data: " + as_json(self._chunk(None, "stop")))
            if usage:
                # The usage chunk asked with stream_options.include_usage: no choices.
                final = {**self._chunk(None), "choices": [], "usage": dict(FIXTURE_USAGE)}
                lines.append(b"data: " + as_json(final))
            lines.append(b"data: [DONE]")
        return b"".join(line + b"\n\n" for line in lines)


#: The usage every fixture completion reports.
FIXTURE_USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
