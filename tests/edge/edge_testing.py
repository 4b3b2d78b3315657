"""Shared helpers for the Edge tests: configs, fake Node peers, frame decoding."""

from __future__ import annotations

from typing import Any, Optional

from twisted.internet.defer import Deferred

from twisted_iop.edge.config import EdgeConfig, parse_edge_config
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.peer import FramedPeerProtocol, PeerSettings


def edge_mapping(**control_plane: Any) -> dict[str, Any]:
    """A valid edge.yaml mapping with two nodes (one with a credential)."""
    cp = {"address": "127.0.0.1:7443", "edge_id": "edge-a", "labels": {"site": "lab"}}
    cp.update(control_plane)
    return {
        "control_plane": cp,
        "node_server": {"listen": "tcp:0:interface=127.0.0.1"},
        "nodes": [
            {
                "node_id": "node-1",
                "labels": {"rack": "r1"},
                "providers": [
                    {
                        "provider_id": "mock-a",
                        "kind": "mock",
                        "models": ["llama-3-8b"],
                        "capacity": 4,
                        "long_context_capacity": 1,
                    }
                ],
            },
            {
                "node_id": "node-2",
                "credential": "s3cret",
                "providers": [
                    {
                        "provider_id": "mock-b",
                        "kind": "mock",
                        "models": ["llama-3-8b", "qwen-2-7b"],
                        "capacity": 8,
                        "long_context_capacity": 2,
                    }
                ],
            },
        ],
    }


def edge_config(**control_plane: Any) -> EdgeConfig:
    """The :func:`edge_mapping` config, parsed."""
    return parse_edge_config(edge_mapping(**control_plane), {})


def node_hello(node_id: str = "node-1", credential: str = "", major: int = PROTOCOL_MAJOR) -> pb.NodeHelloRequest:
    """A Node hello announcing the providers :func:`edge_mapping` configures."""
    providers = {
        "node-1": [pb.NodeProviderSpec(provider_id="mock-a", kind="mock", models=["llama-3-8b"])],
        "node-2": [pb.NodeProviderSpec(provider_id="mock-b", kind="mock", models=["llama-3-8b", "qwen-2-7b"])],
    }.get(node_id, [])
    return pb.NodeHelloRequest(
        node_id=node_id, protocol_major=major, protocol_minor=0, credential=credential, providers=providers
    )


def healthy(*provider_ids: str) -> list[pb.ProviderHealthReport]:
    """Healthy reports for ``provider_ids``."""
    return [pb.ProviderHealthReport(provider_id=p, health=pb.PROVIDER_HEALTH_HEALTHY) for p in provider_ids]


class FakeNodePeer:
    """A NodePeer that records closes and answers probes when told to."""

    def __init__(self) -> None:
        self.closed = 0
        self.probes: list[Deferred[pb.NodeProbeResponse]] = []
        self.answer: Optional[pb.NodeProbeResponse] = None

    def close(self) -> None:
        """Record the close."""
        self.closed += 1

    def supersede(self) -> None:
        """Record the close (a supersede is a close with a reason)."""
        self.closed += 1

    def probe(self, timeout: float) -> Deferred[pb.NodeProbeResponse]:
        """Answer at once with ``answer`` if set, else wait for the test."""
        d: Deferred[pb.NodeProbeResponse] = Deferred()
        if self.answer is not None:
            d.callback(self.answer)
        else:
            self.probes.append(d)
        return d


def decode_frames(data: bytes) -> list[pb.Envelope]:
    """Split a byte stream of length-prefixed frames into envelopes."""
    out = []
    while data:
        length = int.from_bytes(data[:4], "big")
        envelope = pb.Envelope()
        envelope.ParseFromString(data[4 : 4 + length])
        out.append(envelope)
        data = data[4 + length :]
    return out


class FakeControlPlane(FramedPeerProtocol):
    """A tiny Control Plane end of the Edge wire, driven by the test.

    It answers hello with ``hello_response`` and records every other
    envelope (events, unsolicited messages) in ``received``.
    """

    def __init__(self, clock: Any, hello_response: Optional[pb.EdgeHelloResponse] = None) -> None:
        super().__init__(clock, PeerSettings())
        self.hello_response = hello_response or pb.EdgeHelloResponse(accepted=True, server_version="fake")
        self.hellos: list[pb.EdgeHelloRequest] = []
        self.received: list[pb.Envelope] = []
        self.lost: Deferred[None] = Deferred()
        self.hello_seen: Deferred[pb.EdgeHelloRequest] = Deferred()

    def envelope_received(self, envelope: pb.Envelope, body: str) -> None:
        """Answer hello; record the rest."""
        if body == "edge_hello_request":
            self.hellos.append(envelope.edge_hello_request)
            self.send("edge_hello_response", self.hello_response, envelope.request_id)
            if not self.hello_seen.called:
                self.hello_seen.callback(envelope.edge_hello_request)
            return
        self.received.append(envelope)

    def peer_disconnected(self, reason: Any) -> None:
        """Fire ``lost``."""
        if not self.lost.called:
            self.lost.callback(None)

    def events(self) -> list[pb.EdgeEvent]:
        """Every relayed event so far, in arrival order."""
        return [e.edge_event for e in self.received if e.WhichOneof("body") == "edge_event"]

    def status(self) -> Deferred[pb.EdgeStatusResponse]:
        """Ask the Edge for a snapshot."""
        d = self.request("edge_status_request", pb.EdgeStatusRequest(), timeout=5)
        return d.addCallback(lambda envelope: envelope.edge_status_response)

    def command(
        self, name: str, target: str = "", command_id: str = "op-1", **arguments: str
    ) -> Deferred[pb.EdgeCommandResponse]:
        """Send a command; fire with the Edge's answer."""
        request = pb.EdgeCommandRequest(
            command_id=command_id, name=name, target=target, arguments=arguments, timeout_ms=5000
        )
        d = self.request("edge_command_request", request, timeout=5)
        return d.addCallback(lambda envelope: envelope.edge_command_response)
