"""What the registry keeps per edge, kept compactly: snapshots as bytes, buffers on demand."""

from __future__ import annotations

from twisted.internet.task import Clock

from twisted_iop.controlplane import json_views as views
from twisted_iop.controlplane.registry import EdgeHello, EdgeRegistry, StatusSnapshot, response_counts
from twisted_iop.testing.peers import HeldEdgePeer, snapshot
from twisted_iop.wire import control_pb2 as pb


def _registry_with_edge(edge_id: str = "edge-1") -> tuple[EdgeRegistry, int]:
    """A registry with one connected edge, and its connection token."""
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels={"site": "a"}, software_version="1", protocol_version="1.0", commands=())
    return registry, registry.connect(edge_id, HeldEdgePeer(), hello)


def test_a_snapshot_is_kept_as_bytes_and_renders_what_the_message_renders() -> None:
    """The kept snapshot holds the serialized response and its counts; its JSON is
    the JSON of the message it came from, rendered once per snapshot."""
    registry, token = _registry_with_edge()
    response = snapshot("edge-1", nodes=3)
    response.nodes[1].labels["rack"] = "r7"
    response.nodes[2].providers[0].health_reason = "warming up"
    kept = registry.record_status("edge-1", token, response)
    assert kept is not None
    assert kept.data == response.SerializeToString() and kept.counts == response_counts(response)
    assert kept.response == response and kept.response is not kept.response
    record = registry.get("edge-1")
    rendered = views.snapshot_json(record, kept, False)
    assert rendered["nodes"] == [views.node_json(node) for node in response.nodes]
    assert rendered["totals"] == views.counts_json(response_counts(response))
    assert rendered["generated_at"] == views.iso_ms(response.generated_at_ms)
    again = views.snapshot_json(record, kept, True)
    assert again["nodes"] is rendered["nodes"] and again["stale"] is True
    assert record.kept_bytes() >= len(kept.data)


def test_a_snapshot_is_smaller_than_the_parsed_message_it_replaces() -> None:
    """The estimate of a kept snapshot counts its bytes, not a parsed message tree."""
    response = snapshot("edge-1", nodes=4)
    kept = StatusSnapshot.of(response, 1.0)
    assert len(kept.data) <= kept.size() < len(kept.data) + 512
    assert isinstance(kept.response, pb.EdgeStatusResponse)
