"""The Edge's OpenAI-compatible HTTP API (Klein), on its own listener.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``POST /v1/embeddings`` (``stream: true`` answers as server-sent events,
``data: {...}`` then ``data: [DONE]``), ``GET /v1/models`` and
``GET /v1/models/{id}``, and ``GET /openapi.json`` (this API's OpenAPI
document, ``twisted_iop/edge/inference/openapi.json``, served without a key like the
Control Plane's). Every error is an OpenAI error body
``{"error": {"message", "type", "code"}}``; :class:`InferenceError` is
mapped to it here, once. See docs/inference.md.

Every inference answer carries ``traceparent`` (the Edge's server span of
the request's trace, continued from the client's ``traceparent`` or new)
and, once a provider was tried, ``x-iop-route:
node=<id>;provider=<id>;attempts=N`` (see docs/tracing.md).
"""

from __future__ import annotations

import hmac
import json
from importlib import resources
from typing import Any, Optional

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.iweb import IRequest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET
from zope.interface import implementer

from twisted_iop.credentials import token_digest
from twisted_iop.edge.inference.config import InferenceConfig
from twisted_iop.edge.inference.gateway import InferenceGateway
from twisted_iop.edge.inference.lifecycle import InferenceError, Outcome
from twisted_iop.openai_api import CHAT_COMPLETIONS, COMPLETIONS, EMBEDDINGS, error_body, whole_tokens
from twisted_iop.tracing.spans import ROUTE_HEADER, RequestTrace
from twisted_iop.web.http_site import GuardedSite
from twisted_iop.web.request_guard import GuardedRequest, Refusal, SiteLimits
from twisted_iop.web.route_methods import allow_header, served_methods
from twisted_iop.wire import control_pb2 as pb

#: The OpenAPI document of this API (packaged beside this module).
OPENAPI_RESOURCE = "openapi.json"
#: The one path served without an API key.
OPENAPI_PATH = b"/openapi.json"

#: The inference paths routed without Klein (the POST routes below).
_POST_PATHS = {
    b"/v1/chat/completions": CHAT_COMPLETIONS,
    b"/v1/completions": COMPLETIONS,
    b"/v1/embeddings": EMBEDDINGS,
}
_WIRE_ENDPOINTS = {
    CHAT_COMPLETIONS: pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
    COMPLETIONS: pb.INFERENCE_ENDPOINT_COMPLETIONS,
    EMBEDDINGS: pb.INFERENCE_ENDPOINT_EMBEDDINGS,
}


def openai_refusal(status: int, code: str, message: str) -> bytes:
    """A refusal of the guarded site in the OpenAI error shape."""
    code = {"body_too_large": "request_too_large"}.get(code, code)
    return error_body(message, "invalid_request_error", code)


def inference_site(api: InferenceAPI, config: InferenceConfig, reactor: Optional[IReactorTime] = None) -> GuardedSite:
    """The inference listener: a guarded site (deadlines, caps, body bound, key check before the body).

    Refusals use the OpenAI error shape; no access-log line per request (at
    hundreds a second they would be most of the Edge's log and a noticeable
    share of its CPU: the gateway counts outcomes instead); no Nagle delay
    on streamed events, each sent from its write (no writable poll around it).
    The three inference paths are routed by :class:`InferenceRoutes`, the
    rest by Klein.
    """
    limits = SiteLimits(
        max_body_bytes=config.max_request_bytes,
        allowed_hosts=config.allowed_hosts,
        max_connections=config.max_connections,
        max_connections_per_address=config.max_connections_per_address,
    )
    return GuardedSite(
        InferenceRoutes(api),
        limits,
        api.check_headers,
        reactor,
        error_json=openai_refusal,
        realm=b"iop-edge",
        access_log=False,
        tcp_nodelay=True,
        allowed_methods=api.allow_header,
        write_now=True,
    )


class InferenceRoutes(Resource):
    """The listener's root: ``POST`` to the three inference paths straight to
    :class:`InferenceAPI`, everything else (models, other methods, unknown
    paths) through its Klein app.

    Klein binds a werkzeug map adapter and matches the path per request:
    12.7% of the Edge's CPU at 256 short streams (py-spy, see
    docs/performance.md). Here the path is one dict lookup; what the
    routes do (the key check, errors as OpenAI bodies, the answer or the
    stream, cancellation when the client goes) is the same code.
    """

    isLeaf = True

    def __init__(self, api: InferenceAPI) -> None:
        super().__init__()
        self._api = api
        self._klein = api.app.resource()

    def render(self, request: Any) -> Any:
        """Route one request."""
        endpoint = _POST_PATHS.get(request.path) if request.method == b"POST" else None
        if endpoint is None:
            return self._klein.render(request)
        try:
            result = self._api.infer(request, endpoint)
        except InferenceError as error:
            return self._api.error_answer(request, error)
        finished = [False]

        def written(body: bytes) -> None:
            if not finished[0]:
                if body:
                    request.write(body)
                request.finish()

        def failed(failure: Failure) -> None:
            if finished[0]:
                return
            if failure.check(InferenceError):
                error = failure.value
                assert isinstance(error, InferenceError)
                written(self._api.error_answer(request, error))
            else:
                self._log.failure("inference request failed", failure)
                request.processingFailed(failure)

        def gone(_: object) -> None:
            finished[0] = True

        request.notifyFinish().addBoth(gone)
        request.notifyFinish().addErrback(lambda _: result.cancel())
        result.addCallbacks(written, failed)
        return NOT_DONE_YET

    _log = Logger()


def _error(status: int, code: str, message: str) -> InferenceError:
    return InferenceError(status, code, message)


@implementer(IPushProducer)
class _HttpResponseSink:
    """The gateway's :class:`ResponseSink` for one HTTP request: writes its answer
    (JSON, or an event stream) and, as the response's producer, notices a
    client that reads too slowly."""

    _log = Logger()

    def __init__(
        self, request: Any, stream: bool, gateway: InferenceGateway, trace: Optional[RequestTrace] = None
    ) -> None:
        self._request = request
        self._stream = stream
        self._gateway = gateway
        self._trace = trace
        self.inference_id = 0
        self.result: Deferred[bytes] = Deferred(self._client_gone)
        self._headers_sent = False
        self._paused = False
        self._unflushed = 0
        self._over = False

    # -- ResponseSink -----------------------------------------------------------

    def chunks(self, events: list[bytes]) -> None:
        if self._over:
            return
        self._start_stream()
        lines = b"data: " + b"\n\ndata: ".join(events) + b"\n\n"
        self._request.write(lines)
        if self._paused:
            self._unflushed += len(lines)
            if self._unflushed > self._gateway.config.max_client_buffer_bytes:
                self._log.warn("closing a client that reads too slowly (inference {id})", id=self.inference_id)
                self._gateway.client_gone(self.inference_id, Outcome.CLIENT_TOO_SLOW)
                self._over = True
                self._unregister()
                transport = self._request.channel.transport if self._request.channel else None
                if transport is not None:
                    transport.abortConnection()

    def complete(self, done: pb.InferenceDone) -> None:
        if self._over:
            return
        self._over = True
        if self._stream:
            self._start_stream()
            self._request.write(b"data: [DONE]\n\n")
            self._unregister()
            self.result.callback(b"")
        else:
            self._route()
            self._request.setHeader(b"Content-Type", b"application/json")
            self.result.callback(bytes(done.body))

    def fail(self, error: InferenceError) -> None:
        if self._over:
            return
        self._over = True
        if self._headers_sent:
            # Mid-stream: the status is sent already; an error event tells
            # OpenAI clients (they raise on it), and no [DONE] follows.
            self._request.write(b"data: " + error.to_json() + b"\n\n")
            self._unregister()
            self.result.callback(b"")
        else:
            self._route()
            self.result.errback(error)

    def _start_stream(self) -> None:
        if self._headers_sent:
            return
        self._headers_sent = True
        request = self._request
        self._route()
        request.setResponseCode(200)
        request.setHeader(b"Content-Type", b"text/event-stream")
        request.setHeader(b"Cache-Control", b"no-cache")
        request.setHeader(b"X-Accel-Buffering", b"no")
        request.registerProducer(self, True)

    def _route(self) -> None:
        """``x-iop-route``: where the request ran (ids), once a provider was tried."""
        route = self._trace.route_header() if self._trace is not None else None
        if route is not None:
            self._request.setHeader(ROUTE_HEADER, route)

    def _client_gone(self, _: Deferred[bytes]) -> None:
        if not self._over:
            self._over = True
            self._gateway.client_gone(self.inference_id)
            self._unregister()

    def _unregister(self) -> None:
        if self._headers_sent and self._request.channel is not None:
            self._request.unregisterProducer()

    # -- IPushProducer (the client's socket) ---------------------------------------

    def pauseProducing(self) -> None:
        self._paused = True

    def resumeProducing(self) -> None:
        self._paused = False
        self._unflushed = 0

    def stopProducing(self) -> None:
        self._paused = True


class InferenceAPI:
    """Klein routes of the inference gateway over an :class:`InferenceGateway`."""

    app = Klein()
    _log = Logger()

    def __init__(self, gateway: InferenceGateway) -> None:
        self._gateway = gateway
        #: Digests of the API keys (the keys themselves are not kept).
        self._keys = tuple(token_digest(k.encode()) for k in gateway.config.api_keys)
        self._openapi: Optional[bytes] = None

    # -- errors -----------------------------------------------------------------

    @app.handle_errors(InferenceError)
    def inference_error(self, request: IRequest, failure: Failure) -> bytes:
        """Map :class:`InferenceError` to its status and OpenAI error body."""
        error = failure.value
        assert isinstance(error, InferenceError)
        return self.error_answer(request, error)

    def error_answer(self, request: IRequest, error: InferenceError) -> bytes:
        """Set ``error``'s status and headers on ``request``; its OpenAI error body."""
        request.setResponseCode(error.status)
        request.setHeader(b"Content-Type", b"application/json")
        if error.retry_after is not None:
            request.setHeader(b"Retry-After", str(error.retry_after).encode())
        if error.status == 401:
            request.setHeader(b"WWW-Authenticate", b'Bearer realm="iop-edge"')
        return error.to_json()

    def _authorize(self, request: IRequest) -> None:
        if not self._keys:
            return
        header = request.getHeader(b"authorization") or b""
        scheme, _, presented = header.partition(b" ")
        digest = token_digest(presented.strip() if scheme.lower() == b"bearer" else b"")
        matched = False
        for key in self._keys:
            # Compare against every key, so the time taken says nothing.
            matched |= hmac.compare_digest(key, digest)
        if not matched:
            raise InferenceError(401, "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)")

    def check_headers(self, request: GuardedRequest) -> Optional[Refusal]:
        """The site's check before any body is read: the API key (not for the OpenAPI document)."""
        # At header time the request line is known to the channel, not yet to the request.
        channel = request.channel
        if channel.request_path == OPENAPI_PATH and channel.request_method in (b"GET", b"HEAD"):
            return None
        try:
            self._authorize(request)
        except InferenceError as e:
            return Refusal(e.status, e.code, e.message)
        return None

    # -- the contract -------------------------------------------------------------

    @app.route("/openapi.json", methods=["GET"])
    def openapi(self, request: IRequest) -> bytes:
        """The OpenAPI document of this API (no key needed: it says nothing of the fleet)."""
        if self._openapi is None:
            self._openapi = resources.files(__package__).joinpath(OPENAPI_RESOURCE).read_bytes()
        request.setHeader(b"Content-Type", b"application/json")
        return self._openapi

    # -- models -----------------------------------------------------------------

    @app.route("/v1/models", methods=["GET"])
    def list_models(self, request: IRequest) -> bytes:
        """Models some dispatch-ready, non-drained, usable provider serves now."""
        self._authorize(request)
        request.setHeader(b"Content-Type", b"application/json")
        data = [_model_entry(m) for m in self._gateway.available_models()]
        return json.dumps({"object": "list", "data": data}).encode()

    @app.route("/v1/models/<string:model>", methods=["GET"])
    def show_model(self, request: IRequest, model: str) -> bytes:
        """One model, if some provider serves it now."""
        self._authorize(request)
        if model not in self._gateway.available_models():
            raise InferenceError(404, "model_not_found", f"the model {model!r} is not available on this gateway")
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(_model_entry(model)).encode()

    # -- inference ---------------------------------------------------------------

    @app.route("/v1/chat/completions", methods=["POST"])
    def chat_completions(self, request: IRequest) -> Deferred[bytes]:
        """``POST /v1/chat/completions``."""
        return self.infer(request, CHAT_COMPLETIONS)

    @app.route("/v1/completions", methods=["POST"])
    def completions(self, request: IRequest) -> Deferred[bytes]:
        """``POST /v1/completions``."""
        return self.infer(request, COMPLETIONS)

    @app.route("/v1/embeddings", methods=["POST"])
    def embeddings(self, request: IRequest) -> Deferred[bytes]:
        """``POST /v1/embeddings``."""
        return self.infer(request, EMBEDDINGS)

    def infer(self, request: IRequest, endpoint: str) -> Deferred[bytes]:
        """Admit one inference request; fires with the rest of its answer (raises :class:`InferenceError`)."""
        self._authorize(request)
        raw = request.content.read() if request.content is not None else b""
        body = _parse_body(raw, endpoint)
        model = body["model"]
        stream = bool(body.get("stream", False)) and endpoint != EMBEDDINGS
        long_context = self._gateway.long_context(body)
        wire_endpoint = _WIRE_ENDPOINTS[endpoint]
        headers = request.requestHeaders
        trace = self._gateway.start_trace(
            wire_endpoint, model, headers.getRawHeaders(b"traceparent"), headers.getRawHeaders(b"tracestate")
        )
        request.setHeader(b"traceparent", trace.traceparent().encode("ascii"))
        sink = _HttpResponseSink(request, stream, self._gateway, trace)
        sink.inference_id = self._gateway.submit(wire_endpoint, model, long_context, raw, stream, sink, trace)
        return sink.result

    # -- anything else -------------------------------------------------------------

    @app.route("/", defaults={"rest": ""}, methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    @app.route("/<path:rest>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    def not_found(self, request: IRequest, rest: str) -> bytes:
        """Any other path or method: OpenAI's error shape, 405 with ``Allow`` where another method is served."""
        self._authorize(request)
        served = served_methods(self.app.url_map, "/" + rest, "not_found")
        if served:
            request.setHeader(b"Allow", ", ".join(served).encode("ascii"))
            method = request.method.decode("ascii", "replace")[:20]
            raise InferenceError(405, "method_not_allowed", f"method {method} is not served here")
        raise InferenceError(404, "not_found", "no such route (see GET /openapi.json)")

    def allow_header(self, path: bytes) -> Optional[bytes]:
        """The ``Allow`` header of ``path`` (the site's 405 for OPTIONS, TRACE ...), None if unknown."""
        return allow_header(self.app.url_map, path, "not_found")


def _model_entry(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "twisted-iop"}


def _parse_body(raw: bytes, endpoint: str) -> dict[str, Any]:
    """The request's JSON object, checked enough to route it; 400 names the field."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise _error(400, "invalid_json", "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise _error(400, "invalid_body", "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _error(400, "invalid_model", "model: required, a non-empty string")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise _error(400, "invalid_stream", "stream: must be true or false")
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and whole_tokens(value) is None:
            raise _error(400, f"invalid_{key}", f"{key}: must be a positive whole number")
    if endpoint == CHAT_COMPLETIONS:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _error(400, "invalid_messages", "messages: required, a non-empty list")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise _error(400, "invalid_messages", f"messages[{index}]: must be an object with a role")
    elif endpoint == COMPLETIONS:
        if not isinstance(body.get("prompt"), (str, list)):
            raise _error(400, "invalid_prompt", "prompt: required, a string or a list")
    elif not isinstance(body.get("input"), (str, list)) or not body.get("input"):
        raise _error(400, "invalid_input", "input: required, a non-empty string or list")
    return body
