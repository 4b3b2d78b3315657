"""The spec hash of a deployment instance, computed alike by the Control Plane and the Node.

An instance's spec is its engine profile, model, parameter values (as text,
the way they travel on the wire) and capacity. Its hash is the first 16 hex
characters of the SHA-256 of a canonical JSON document of those four
(``sort_keys``, no spaces), so two processes that agree on the spec agree on
the hash whatever order they hold the parameters in. An equal hash restarts
nothing: a reconnect, a restart or a repeated apply of the same spec leaves
its engine running.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

#: Hex characters of the SHA-256 kept in a spec hash.
SPEC_HASH_LENGTH = 16


def spec_document(profile: str, model: str, parameters: Mapping[str, str], capacity: int) -> bytes:
    """The canonical JSON bytes the spec hash is taken of."""
    document = {
        "profile": profile,
        "model": model,
        "parameters": {str(name): str(value) for name, value in parameters.items()},
        "capacity": int(capacity),
    }
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def spec_hash(profile: str, model: str, parameters: Mapping[str, str], capacity: int) -> str:
    """The spec hash of one instance: 16 hex characters."""
    return hashlib.sha256(spec_document(profile, model, parameters, capacity)).hexdigest()[:SPEC_HASH_LENGTH]
