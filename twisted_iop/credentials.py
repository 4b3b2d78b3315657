"""Shared secrets kept as SHA-256 digests, compared in constant time.

Every secret a daemon *checks* (API tokens, edge credentials, node
credentials) is kept in memory only as its SHA-256 digest. A configured
value is either the secret itself or ``sha256:<64 hex digits>``, its
digest, so a configuration file need not hold the secret at all. A
presented secret is hashed and compared with every candidate digest in
constant time with no early exit, so neither timing nor a memory dump
gives a secret away.

The side that *sends* a secret (an Edge dialling the Control Plane, a Node
dialling its Edge) must hold the secret itself.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

#: Prefix of a configured value that is a digest, not a secret.
DIGEST_PREFIX = "sha256:"

#: The digests a presented secret may match (empty: no secret is needed).
Digests = tuple[bytes, ...]


class SecretError(ValueError):
    """A configured secret or digest that cannot be used (the text never holds the secret)."""


def token_digest(secret: bytes) -> bytes:
    """The SHA-256 digest a secret is kept and compared as."""
    return hashlib.sha256(secret).digest()


def is_digest(value: str) -> bool:
    """Whether a configured value is given as ``sha256:<hex>``."""
    return value.startswith(DIGEST_PREFIX)


def digest_of(value: str) -> bytes:
    """The digest of a configured value: the secret itself or ``sha256:<64 hex>``.

    Raises :class:`SecretError` for a malformed digest or an empty secret.
    """
    if is_digest(value):
        text = value[len(DIGEST_PREFIX) :]
        try:
            digest = bytes.fromhex(text)
        except ValueError:
            digest = b""
        if len(digest) != 32:
            raise SecretError("a sha256: value must be followed by 64 hex digits (a SHA-256 digest)")
        return digest
    if not value:
        raise SecretError("must not be empty")
    return token_digest(value.encode())


def matches(presented: str, candidates: Iterable[bytes]) -> bool:
    """Whether ``presented`` is the secret of any of ``candidates``.

    The presented secret is hashed once and compared with every candidate
    (no early exit), each comparison in constant time.
    """
    digest = token_digest(presented.encode())
    found = False
    for candidate in candidates:
        found = hmac.compare_digest(digest, candidate) | found
    return found
