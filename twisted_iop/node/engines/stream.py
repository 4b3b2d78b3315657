"""What the Node sends an engine and how it reads the engine's answer.

* :func:`engine_request`: the body sent for one inference request. A
  streamed chat or text completion whose client did not ask for the usage
  chunk asks for it (``stream_options.include_usage``) when the engine's
  adapter says it honours it, so the Node learns the tokens of every
  stream; that chunk is then kept from the client.
* :class:`EngineBodyReader`: reads the answer, whole (bounded) or as
  server-sent events one by one, and ends it with one
  :class:`EngineAnswer`. Every error, whatever the engine's shape, comes
  out as an :class:`~twisted_iop.node.engines.base.EngineError` (the
  adapter's :meth:`engine_error` for a status >= 400, the adapter's stream
  classification for an error event inside a 200 stream). A stream that
  ends without ``data: [DONE]`` is an error, never a success.

Cost (``timeit``, best of 5, CPython 3.11 on a shared 2-core machine):

* per request, :func:`engine_request` when it adds ``stream_options``
  (parse, add, serialise): 6.8 us for a 136-byte chat body, 51 us for a
  16 KiB one, 4.6 ms for a 1 MiB one; when the client asked for usage
  itself (parse only): 3.2 us for 161 bytes; not streamed, or embeddings: 0.3 us;
* per chunk, one 200-byte ``data:`` line of a chat chunk through the
  reader to its sink (line split, classification, relay): 2.1 us (the
  reader before classification: 1.6 us); the final usage chunk (parsed): 5.9 us.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Optional, Protocol, cast

import attrs
from twisted.internet.protocol import Protocol as TwistedProtocol
from twisted.python.failure import Failure
from twisted.web.client import ResponseDone
from twisted.web.http import PotentialDataLoss

from twisted_iop.node.engines.base import PROVIDER_ERROR, EngineAdapter, EngineError, StreamEventKind
from twisted_iop.openai_api import CHAT_COMPLETIONS, COMPLETIONS

#: Largest non-streamed engine answer relayed (it travels in one frame).
MAX_RESPONSE_BYTES = 3 * 1024 * 1024
#: Longest line of an engine's event stream.
MAX_EVENT_LINE_BYTES = 1024 * 1024
#: Bytes of an engine's error answer kept (the rest is read and dropped).
MAX_ERROR_BODY_BYTES = 64 * 1024

#: The endpoints whose streams carry a usage chunk when asked.
USAGE_ENDPOINTS = frozenset({CHAT_COMPLETIONS, COMPLETIONS})

NO_DONE = "the engine ended the stream without [DONE]"
NO_OUTPUT = NO_DONE + " and without any output"
CUT = "the engine closed the connection mid-answer"

_DATA = StreamEventKind.DATA
_USAGE = StreamEventKind.USAGE
_DONE = StreamEventKind.DONE


@attrs.frozen
class EngineRequest:
    """The body sent to the engine, and whether the usage chunk goes on to the client."""

    body: bytes
    relay_usage: bool = True


def engine_request(body: bytes, endpoint: str, stream: bool, adapter: EngineAdapter) -> EngineRequest:
    """The engine's body for a request: ``stream_options.include_usage`` added where the client did not ask.

    The body is parsed once and serialised again only when it changes; a
    body that is not a JSON object is sent as it is.
    """
    if not stream or endpoint not in USAGE_ENDPOINTS or not adapter.stream_usage:
        return EngineRequest(body)
    try:
        parsed: Any = json.loads(body)
    except (ValueError, RecursionError):
        return EngineRequest(body)
    if not isinstance(parsed, dict):
        return EngineRequest(body)
    options = parsed.get("stream_options")
    if isinstance(options, dict):
        if options.get("include_usage") is True:
            return EngineRequest(body)
        parsed["stream_options"] = {**options, "include_usage": True}
    else:
        parsed["stream_options"] = {"include_usage": True}
    # ensure_ascii (the default) keeps a lone escaped surrogate encodable.
    return EngineRequest(json.dumps(parsed, separators=(",", ":")).encode(), relay_usage=False)


#: A streamed event with some content: a non-empty ``content`` (chat) or ``text`` (completions) string.
_CONTENT = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
#: Characters per prompt token in an estimated usage (the usual rule of thumb for English).
CHARS_PER_TOKEN = 4


def estimated_usage(request_body: bytes, content_chunks: int) -> dict[str, Any]:
    """The usage of a stream whose engine sent none: one token per content chunk, the prompt's characters / 4.

    The prompt is the request's ``messages`` contents (text parts of
    multi-part ones) or its ``prompt``; a body that is not JSON counts 0.
    """
    try:
        parsed = json.loads(request_body)
    except ValueError:
        parsed = None
    chars = 0
    if isinstance(parsed, dict):
        messages = parsed.get("messages")
        if isinstance(messages, list):
            for message in messages[:10_000]:
                content = message.get("content") if isinstance(message, dict) else None
                if isinstance(content, str):
                    chars += len(content)
                elif isinstance(content, list):
                    chars += sum(
                        len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                    )
        prompt = parsed.get("prompt")
        if isinstance(prompt, str):
            chars += len(prompt)
        elif isinstance(prompt, list):
            chars += sum(len(p) for p in prompt if isinstance(p, str))
    prompt_tokens = (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": content_chunks,
        "total_tokens": prompt_tokens + content_chunks,
        "estimated": True,
    }


@attrs.frozen
class EngineAnswer:
    """How an engine's answer ended: a success (``error`` is ``None``) or an error in the client's terms."""

    http_status: int
    body: bytes = b""
    usage: Optional[Mapping[str, Any]] = None
    error: Optional[EngineError] = None
    #: The engine's connection was cut before the answer ended (a killed engine).
    cut: bool = False
    #: Streamed events that carried some content (what an estimated usage counts).
    content_chunks: int = 0


def provider_error(message: str) -> EngineError:
    """An error of the engine's answer itself (cut, unfinished, too large): 502 ``provider_error``."""
    return EngineError(502, PROVIDER_ERROR, message)


class AnswerSink(Protocol):
    """Where the reader puts what it read."""

    def event(self, data: bytes) -> None:
        """One ``data:`` payload to relay to the client."""

    def finished(self, answer: EngineAnswer) -> None:
        """The answer ended (called once, unless the reader was aborted first)."""


class EngineBodyReader(TwistedProtocol):
    """Reads one engine answer: server-sent events one by one, or whole (bounded).

    ``status`` is the answer's HTTP status: >= 400 (or any non-2xx) is an
    error answer, read whole and given to ``adapter.engine_error`` with the
    ``retry_after`` header; a 2xx answer to a streamed request is read as
    events, each ``data:`` line classified once by ``adapter.stream_event``.
    """

    def __init__(
        self,
        sink: AnswerSink,
        adapter: EngineAdapter,
        status: int,
        streaming: bool,
        relay_usage: bool = True,
        retry_after: Optional[str] = None,
    ) -> None:
        self._sink = sink
        self._adapter = adapter
        self._classify = adapter.stream_event
        self._status = status
        self._failed = not 200 <= status < 300
        self._streaming = streaming and not self._failed
        self._relay_usage = relay_usage
        self._retry_after = retry_after
        self._buffer = bytearray()
        self._usage: Optional[Mapping[str, Any]] = None
        self._relayed = 0
        self._content_chunks = 0
        self._saw_done = False
        self._stopped = False

    def dataReceived(self, data: bytes) -> None:
        if self._stopped:
            return
        if not self._streaming:
            if self._failed:
                room = MAX_ERROR_BODY_BYTES - len(self._buffer)
                if room > 0:
                    self._buffer += data[:room]
                return
            self._buffer += data
            if len(self._buffer) > MAX_RESPONSE_BYTES:
                self._end_with(provider_error(f"the engine's answer is larger than {MAX_RESPONSE_BYTES} bytes"))
            return
        # Usually a read holds whole events: they are read from it as they are,
        # and only a line cut by the read's end waits in the buffer.
        buffer = self._buffer
        if buffer:
            buffer += data
            source = bytes(buffer)
            buffer.clear()
        else:
            source = data
        find = source.find
        start = 0
        while True:
            end = find(b"\n", start)
            if end < 0:
                break
            if end != start:  # a blank line only ends an event
                self._line(source[start:end])
                if self._stopped:
                    return
            start = end + 1
        if start < len(source):
            buffer += source[start:] if start else source
            if len(buffer) > MAX_EVENT_LINE_BYTES:
                self._end_with(provider_error(f"the engine sent an event longer than {MAX_EVENT_LINE_BYTES} bytes"))

    def _line(self, line: bytes) -> None:
        # Comments and pings (":"), "event:", "id:" and blank separators are skipped.
        if not line.startswith(b"data:") or self._saw_done:
            return
        payload = line[5:].strip()
        if not payload:
            return
        event = self._classify(payload)
        kind = event.kind
        if kind is _DATA:
            if event.usage is not None:
                self._usage = event.usage
            if _CONTENT.search(payload) is not None:
                self._content_chunks += 1
            self._relayed += 1
            self._sink.event(payload)
        elif kind is _DONE:
            self._saw_done = True
        elif kind is _USAGE:
            self._usage = event.usage
            if self._relay_usage:
                self._relayed += 1
                self._sink.event(payload)
        else:
            self._end_with(event.error or provider_error("the engine sent an error event"))

    def _end_with(self, error: EngineError) -> None:
        self._stopped = True
        self._sink.finished(EngineAnswer(error.status, error.to_json(), self._usage, error))
        self.abort()

    def connectionLost(self, reason: Failure = Failure(ResponseDone())) -> None:
        if self._stopped:
            return
        self._stopped = True
        complete = bool(reason.check(ResponseDone, PotentialDataLoss))
        if self._failed:
            # Even a cut error answer says what went wrong.
            error = self._adapter.engine_error(self._status, bytes(self._buffer), self._retry_after)
            self._sink.finished(EngineAnswer(error.status, error.to_json(), None, error))
            return
        if not complete:
            error = provider_error(CUT)
            self._sink.finished(EngineAnswer(error.status, error.to_json(), self._usage, error, cut=True))
            return
        if self._streaming:
            last = bytes(self._buffer).strip()
            if last.startswith(b"data:") and last[5:].strip() == b"[DONE]":
                self._saw_done = True  # the last line without its newline
            if not self._saw_done:
                error = provider_error(NO_DONE if self._relayed else NO_OUTPUT)
                self._sink.finished(EngineAnswer(error.status, error.to_json(), self._usage, error))
                return
            self._sink.finished(EngineAnswer(self._status, b"", self._usage, content_chunks=self._content_chunks))
            return
        body = bytes(self._buffer)
        self._sink.finished(EngineAnswer(self._status, body, _whole_usage(body)))

    def pause(self) -> None:
        """Stop reading (the Edge reads slowly)."""
        if self.transport is not None and not self._stopped:
            cast(Any, self.transport).pauseProducing()

    def resume(self) -> None:
        """Read again."""
        if self.transport is not None and not self._stopped:
            cast(Any, self.transport).resumeProducing()

    def abort(self) -> None:
        """Stop reading and drop the connection; nothing more reaches the sink."""
        self._stopped = True
        if self.transport is not None:
            cast(Any, self.transport).stopProducing()


def _whole_usage(body: bytes) -> Optional[Mapping[str, Any]]:
    if b'"usage"' not in body:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    usage = parsed.get("usage") if isinstance(parsed, dict) else None
    return usage if isinstance(usage, dict) else None
