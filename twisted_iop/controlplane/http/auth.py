"""API tokens of the Control Plane's HTTP views and client wire, with roles.

A token has a **name** (shown in the audit as ``requested_by``), a **role**
and a secret. ``viewer`` tokens read views and subscribe to events;
``operator`` tokens may also send commands. The configuration holds either
the secret itself or its SHA-256 digest (``sha256``), and only digests are
kept in memory; a presented token is hashed and compared with every
configured digest in constant time, so neither timing nor a memory dump
gives a secret away.
"""

from __future__ import annotations

import hmac
from typing import Optional

import attrs

from twisted_iop.credentials import token_digest

VIEWER = "viewer"
OPERATOR = "operator"
ROLES = (VIEWER, OPERATOR)

__all__ = ["OPERATOR", "ROLES", "VIEWER", "ApiToken", "ApiTokens", "token_digest"]


@attrs.frozen
class ApiToken:
    """One configured token: its name, role and the digest of its secret."""

    name: str
    role: str
    digest: bytes = attrs.field(repr=False)

    def may(self, role: str) -> bool:
        """Whether this token holds ``role`` (an operator may do what a viewer may)."""
        return self.role == OPERATOR or role == VIEWER


@attrs.frozen
class ApiTokens:
    """Every configured token; with none configured, access is open."""

    tokens: tuple[ApiToken, ...] = ()

    @property
    def required(self) -> bool:
        """Whether callers must present a token."""
        return bool(self.tokens)

    def identify(self, presented: bytes) -> Optional[ApiToken]:
        """The token whose secret is ``presented``, or None.

        Every digest is compared (no early exit), each in constant time.
        """
        digest = token_digest(presented)
        found: Optional[ApiToken] = None
        for token in self.tokens:
            if hmac.compare_digest(digest, token.digest) and found is None:
                found = token
        return found
