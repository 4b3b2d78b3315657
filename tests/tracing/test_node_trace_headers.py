"""The Node sends a request's trace context to its engine as headers, after checking it again."""

from __future__ import annotations

import json
from typing import Any, Optional

import pytest
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock

from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.inference import InferenceRunner
from twisted_iop.testing.configs import MODEL
from twisted_iop.wire import control_pb2 as pb

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class HeaderRecorder:
    """An engine client that keeps each request's headers and never answers."""

    def __init__(self) -> None:
        self.headers: list[dict[bytes, list[bytes]]] = []

    def request(self, method: str, url: str, **kwargs: Any) -> Deferred[Any]:
        """Keep the headers."""
        self.headers.append(dict(kwargs.get("headers") or {}))
        return Deferred()


class Session:
    """The Edge's side (nothing is answered in these tests)."""

    transport = None
    closing = False

    def send(self, body: str, message: Any, request_id: int = 0) -> None:
        """Unexpected: the engine never answers here."""
        raise AssertionError(f"unexpected {body}")

    def sendString(self, data: bytes) -> None:
        """Unexpected."""
        raise AssertionError("unexpected chunk")


def sent_headers(traceparent: str, tracestate: str = "") -> dict[bytes, list[bytes]]:
    """The headers the engine gets for a request carrying ``traceparent`` and ``tracestate``."""
    http = HeaderRecorder()
    provider = NodeProviderConfig(provider_id="p1", kind="openai", models=(MODEL,), base_url="http://127.0.0.1:9")
    runner = InferenceRunner(lambda: (provider,), Clock(), http=http)
    envelope = pb.Envelope()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    envelope.inference_request.CopyFrom(
        pb.InferenceRequest(
            inference_id=1,
            provider_id="p1",
            endpoint=pb.INFERENCE_ENDPOINT_CHAT_COMPLETIONS,
            body=json.dumps(body).encode(),
            model=MODEL,
            traceparent=traceparent,
            tracestate=tracestate,
        )
    )
    runner.handle(Session(), envelope, "inference_request")
    [headers] = http.headers
    return headers


def test_a_valid_traceparent_and_tracestate_go_to_the_engine() -> None:
    """The attempt's traceparent and the client's tracestate are the engine's headers."""
    headers = sent_headers(VALID, "rojo=00f067aa0ba902b7")
    assert headers[b"traceparent"] == [VALID.encode()]
    assert headers[b"tracestate"] == [b"rojo=00f067aa0ba902b7"]


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [
        ("", "rojo=1"),  # no traceparent: no tracestate either
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", ""),  # all-zero trace id
        ("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""),  # upper case
        ("not a traceparent\r\nx-injected: 1", ""),  # a header injection attempt
    ],
)
def test_an_invalid_trace_context_from_the_edge_is_not_sent(traceparent: str, tracestate: Optional[str]) -> None:
    """A peer's word is checked: an invalid traceparent (and its tracestate) never reaches the engine."""
    headers = sent_headers(traceparent, tracestate or "")
    assert b"traceparent" not in headers and b"tracestate" not in headers


def test_an_invalid_tracestate_is_dropped_and_the_traceparent_kept() -> None:
    """A tracestate that does not parse is not sent; the valid traceparent still is."""
    headers = sent_headers(VALID, "Bad Key=1\r\nx: y")
    assert headers[b"traceparent"] == [VALID.encode()] and b"tracestate" not in headers
