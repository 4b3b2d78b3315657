"""Helpers for inference gateway tests: configs, SSE reading over treq, the mock provider process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import attrs
import treq
from fleet_harness import FAST_BACKOFF
from twisted.internet.defer import Deferred
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

MOCK_PROVIDER = str(Path(sys.executable).parent / "iop-mock-provider")
MODEL = "llama-3-8b"


def gateway_edge_yaml(
    cp_address: str = "127.0.0.1:1",
    inference: Optional[dict[str, Any]] = None,
    capacity: int = 2,
    long_context_capacity: int = 1,
    second_node: bool = True,
) -> dict[str, Any]:
    """edge.yaml with one or two Nodes serving MODEL and an inference listener on a free port."""
    nodes: list[dict[str, Any]] = [
        {
            "node_id": "node-1",
            "providers": [
                {
                    "provider_id": "p1",
                    "kind": "mock",
                    "models": [MODEL],
                    "capacity": capacity,
                    "long_context_capacity": long_context_capacity,
                }
            ],
        }
    ]
    if second_node:
        nodes.append(
            {
                "node_id": "node-2",
                "providers": [{"provider_id": "p2", "kind": "mock", "models": [MODEL], "capacity": capacity}],
            }
        )
    section = {"listen": "tcp:0:interface=127.0.0.1"}
    section.update(inference or {})
    return {
        "control_plane": {"address": cp_address, "edge_id": "edge-a", "backoff": FAST_BACKOFF},
        "node_server": {"listen": "tcp:0:interface=127.0.0.1", "probe_timeout_seconds": 2},
        "inference": section,
        "nodes": nodes,
    }


def gateway_node_yaml(
    node_id: str, edge_port: int, provider: dict[str, Any], keepalive: Optional[dict[str, float]] = None
) -> dict[str, Any]:
    """node.yaml for one Node with one provider."""
    edge: dict[str, Any] = {"address": f"127.0.0.1:{edge_port}", "backoff": FAST_BACKOFF}
    if keepalive:
        edge["keepalive"] = keepalive
    return {
        "node_id": node_id,
        "edge": edge,
        "probes": {"interval_seconds": 0.2, "timeout_seconds": 1},
        "providers": [provider],
    }


def mock_provider(provider_id: str, **mock: Any) -> dict[str, Any]:
    """A node.yaml mock provider entry with inference options."""
    return {"provider_id": provider_id, "kind": "mock", "models": [MODEL], "mock": mock}


def chat(stream: bool = False, max_tokens: int = 4, content: str = "hello", **extra: Any) -> bytes:
    """A chat completion request body."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    body.update(extra)
    return json.dumps(body).encode()


class SSEReader(Protocol):
    """Reads a server-sent event stream; can hang up after some events."""

    def __init__(self, hang_up_after: Optional[int] = None) -> None:
        self.events: list[bytes] = []
        self.hang_up_after = hang_up_after
        self.first: Deferred[None] = Deferred()
        self.done: Deferred[list[bytes]] = Deferred()
        self._buffer = b""

    def dataReceived(self, data: bytes) -> None:
        """Split events; fire ``first`` on the first; hang up when told."""
        self._buffer += data
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                self.events.append(event[6:])
                if not self.first.called:
                    self.first.callback(None)
                if self.hang_up_after is not None and len(self.events) >= self.hang_up_after:
                    assert self.transport is not None
                    self.transport.stopProducing()  # type: ignore[attr-defined]
                    return

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        """Fire ``done`` with the events read."""
        if not self.done.called:
            self.done.callback(self.events)


@attrs.define
class Answer:
    """One HTTP answer of the gateway."""

    code: int
    headers: Any
    body: bytes = b""
    events: list[bytes] = attrs.field(factory=list)

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


async def post(base: str, path: str, body: bytes, headers: Optional[dict[bytes, list[bytes]]] = None) -> Answer:
    """POST and read the whole answer (events split out for event streams)."""
    all_headers = {b"Content-Type": [b"application/json"]}
    all_headers.update(headers or {})
    response = await treq.post(base + path, data=body, headers=all_headers, timeout=30)
    content = await response.content()
    events = []
    if (response.headers.getRawHeaders(b"content-type") or [b""])[0].startswith(b"text/event-stream"):
        events = [e[6:] for e in content.split(b"\n\n") if e.startswith(b"data: ")]
    return Answer(response.code, response.headers, content, events)


async def open_stream(
    base: str, body: bytes, hang_up_after: Optional[int] = None, headers: Optional[dict[bytes, list[bytes]]] = None
) -> tuple[Any, SSEReader]:
    """POST a streaming request; return the response and a reader fed with its body."""
    all_headers = {b"Content-Type": [b"application/json"]}
    all_headers.update(headers or {})
    response = await treq.post(
        base + "/v1/chat/completions",
        data=body,
        headers=all_headers,
        unbuffered=True,
        timeout=30,
    )
    reader = SSEReader(hang_up_after)
    response.deliverBody(reader)
    return response, reader


_LISTENING = re.compile(rb"mock_provider listening on \S+ \(port (\d+)\)")


@attrs.define
class MockProviderProcess:
    """``iop-mock-provider`` as a process on a free loopback port."""

    process: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0

    @property
    def base_url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Terminate it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_mock_provider(log_dir: Path, *args: str) -> MockProviderProcess:
    """Start ``iop-mock-provider --listen tcp:0`` and wait (bounded) for its port."""
    log_path = log_dir / f"mock-provider-{time.monotonic_ns()}.log"
    handle = open(log_path, "wb")
    process = subprocess.Popen(
        [MOCK_PROVIDER, "--listen", "tcp:0:interface=127.0.0.1", *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    handle.close()
    mock = MockProviderProcess(process, log_path)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        match = _LISTENING.search(log_path.read_bytes())
        if match:
            mock.port = int(match.group(1))
            return mock
        if process.poll() is not None:
            break
        time.sleep(0.05)  # a bounded wait for a child process, outside the reactor
    mock.stop()
    raise AssertionError(f"iop-mock-provider did not start:\n{log_path.read_text(errors='replace')}")
