"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` bodies, recorded.

:class:`OtlpReceiver` is a ``twisted.web`` resource served on
``127.0.0.1:0`` in the test's reactor. It answers every export ``200``
with an empty ``ExportTraceServiceResponse`` (or :attr:`status` when a
test wants the collector to refuse) and keeps each body it took;
:func:`decoded_spans` reads them with OpenTelemetry's own protobuf
classes (the ``[tracing]`` extra), so a test checks what a collector
would really see.
"""

from __future__ import annotations

from typing import Any, cast

import attrs
from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import IListeningPort
from twisted.web.resource import Resource
from twisted.web.server import Request, Site

from twisted_iop.eventloop.reactor_types import Reactor


@attrs.frozen
class ReceivedSpan:
    """One span as a collector decodes it (ids as hex, attributes as plain values)."""

    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status_code: int
    status_message: str
    service_name: str
    trace_state: str


class OtlpReceiver(Resource):
    """Records the bodies of ``POST /v1/traces``."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []
        self.content_types: list[str] = []
        #: The status of its answers (200: taken).
        self.status = 200

    def render_POST(self, request: Request) -> bytes:
        """Keep the body if the path is ``/v1/traces``; 404 otherwise."""
        if request.path != b"/v1/traces":
            request.setResponseCode(404)
            return b""
        body = request.content.read() if request.content is not None else b""
        self.bodies.append(body)
        self.content_types.append((request.getHeader(b"content-type") or b"").decode("latin-1"))
        request.setResponseCode(self.status)
        request.setHeader(b"Content-Type", b"application/x-protobuf")
        return b""  # an empty ExportTraceServiceResponse


def listen_otlp_receiver(reactor: Reactor, receiver: OtlpReceiver) -> tuple[IListeningPort, str]:
    """Serve ``receiver`` on ``127.0.0.1:0``: its port and the endpoint URL to configure."""
    port: IListeningPort = reactor.listenTCP(0, Site(receiver), interface="127.0.0.1")
    return port, f"http://127.0.0.1:{cast(IPv4Address, port.getHost()).port}"


def decoded_spans(bodies: list[bytes]) -> list[ReceivedSpan]:
    """Every span of every body, decoded as ``ExportTraceServiceRequest`` protobuf."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans: list[ReceivedSpan] = []
    for body in bodies:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource_spans in message.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                spans.extend(
                    ReceivedSpan(
                        name=span.name,
                        kind=span.kind,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={kv.key: _value(kv.value) for kv in span.attributes},
                        status_code=span.status.code,
                        status_message=span.status.message,
                        service_name=str(resource.get("service.name", "")),
                        trace_state=span.trace_state,
                    )
                    for span in scope_spans.spans
                )
    return spans


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
