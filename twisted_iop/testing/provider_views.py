"""How the Control Plane shows one provider, checked the same way by every
test of a provider figure from the wire (engine readings, launched engines)."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.task import Clock

from twisted_iop.controlplane.fleet.registry import EdgeRegistry
from twisted_iop.controlplane.http.json_bytes import JsonBytesRenderer
from twisted_iop.controlplane.http.json_views import provider_json
from twisted_iop.controlplane.wires.edge_hello import EdgeHello
from twisted_iop.testing import json_reference as reference
from twisted_iop.testing.harness import contract_validator
from twisted_iop.testing.wires.peers import HeldEdgePeer, keep_status
from twisted_iop.wire import control_pb2 as pb

#: The OpenAPI document's Provider schema (loaded on first use).
_validator: Any = None


def provider_errors(shown: dict[str, Any]) -> list[str]:
    """What the OpenAPI document's Provider schema finds wrong in ``shown``."""
    global _validator
    if _validator is None:
        _validator = contract_validator("Provider")
    return [error.message for error in _validator.iter_errors(shown)]


def shown_provider(provider: pb.ProviderSnapshot) -> dict[str, Any]:
    """The provider's JSON as it leaves the process: strict JSON, valid against the document."""
    shown = provider_json(provider)
    json.dumps(shown, allow_nan=False)
    errors = provider_errors(shown)
    assert not errors, errors
    return shown


def edge_status_body(response: pb.EdgeStatusResponse, labels: dict[str, str]) -> bytes:
    """``GET /edges/edge-1/status`` after ``response`` was kept, checked byte for
    byte against the reference's compact JSON."""
    registry = EdgeRegistry(Clock())
    hello = EdgeHello(labels=labels, software_version="1", protocol_version="1.0", commands=())
    token = registry.connect("edge-1", HeldEdgePeer(), hello)
    kept = keep_status(registry, "edge-1", token, response)
    assert kept is not None
    record = registry.get("edge-1")
    body = JsonBytesRenderer().edge_status(record, kept, False)
    assert body == reference.compact(reference.snapshot_json(record, kept, False))
    return body
