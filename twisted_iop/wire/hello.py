"""Hello checks of both TCP wires: pure functions and one rejection-code enum.

The Control Plane checks an Edge's ``EdgeHelloRequest`` with
:func:`check_edge_hello`; the Edge checks a Node's ``NodeHelloRequest`` with
:func:`check_node_hello`. Both return ``None`` (accept) or a
:class:`Rejection` whose :class:`RejectionCode` the wire sends as
``reason_code`` (``rejection.code.value``), so the two wires speak one
vocabulary of machine codes. Neither function does I/O or touches state.

Every code but ``retry_later`` is *permanent*: the same hello will be
refused again until someone changes a configuration (a credential, a
certificate), so dialers retry only at their maximum backoff delay.
``retry_later`` (the Control Plane's hello rate is exceeded) comes with a
delay hint the dialer waits out before its next attempt.

Where the listener requires client certificates (mutual TLS), the caller
passes the id the peer's certificate proves as ``certified_id``; a hello
claiming any other id is refused ``identity_mismatch``, so a certificate
for edge A can never enroll as edge B.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Optional, Protocol

import attrs

from twisted_iop.credentials import Digests, matches
from twisted_iop.ids import id_problem
from twisted_iop.wire import PROTOCOL_MAJOR
from twisted_iop.wire import control_pb2 as pb

#: Bounds on what a peer may announce in hello.
MAX_COMMANDS = 256
MAX_LABELS = 64
MAX_PROVIDERS = 256
MAX_TEXT = 256
#: Characters of a description (of a command or an argument).
MAX_DESCRIPTION = 1024
#: Arguments one command may declare, and all commands together.
MAX_COMMAND_ARGUMENTS = 32
MAX_CATALOG_ARGUMENTS = 1024


class RejectionCode(enum.Enum):
    """Why a hello is refused; the value is the wire's ``reason_code``."""

    #: The peer's protocol major version differs from ours.
    UNSUPPORTED_VERSION = "unsupported_version"
    #: The edge or node id is empty or malformed (see :mod:`twisted_iop.ids`).
    INVALID_ID = "invalid_id"
    #: No Node with that id is configured on this Edge.
    UNKNOWN_NODE = "unknown_node"
    #: The credential is wrong or missing.
    BAD_CREDENTIAL = "bad_credential"
    #: The id in hello is not the one the peer's client certificate proves
    #: (or the certificate proves none).
    IDENTITY_MISMATCH = "identity_mismatch"
    #: The hello is well-formed but over a bound (too many labels, commands,
    #: providers, or an overlong text).
    INVALID_HELLO = "invalid_hello"
    #: Too many hellos right now; try again after the response's hint.
    RETRY_LATER = "retry_later"

    @property
    def permanent(self) -> bool:
        """Whether retrying the same hello soon is pointless (every code but retry_later)."""
        return self in PERMANENT_CODES


#: Codes that need a configuration change before the same hello can pass.
PERMANENT_CODES = frozenset(RejectionCode) - {RejectionCode.RETRY_LATER}

#: Codes that count as a failed attempt to prove an identity (rate-limited
#: per source address by :class:`~twisted_iop.wire.limits.FailedHelloLimiter`).
FAILED_PROOF_CODES = frozenset(
    {RejectionCode.BAD_CREDENTIAL, RejectionCode.IDENTITY_MISMATCH, RejectionCode.UNKNOWN_NODE}
)


@attrs.frozen
class Rejection:
    """A refused hello: a machine code and a reason for people."""

    code: RejectionCode
    reason: str

    @property
    def permanent(self) -> bool:
        """Whether the dialer should stop retrying at its normal pace."""
        return self.code.permanent


class CredentialCheck(Protocol):
    """How the Control Plane decides whether an edge's credential is right."""

    def check(self, edge_id: str, given: str) -> bool:
        """Whether ``given`` is the right credential for ``edge_id``."""


def check_version(major: int, minor: int, speaker: str) -> Optional[Rejection]:
    """A rejection unless ``major`` is the protocol major version we speak."""
    if major == PROTOCOL_MAJOR:
        return None
    return Rejection(
        RejectionCode.UNSUPPORTED_VERSION,
        f"protocol version {major}.{minor} is not supported ({speaker} speaks {PROTOCOL_MAJOR}.x)",
    )


def check_id(kind: str, value: str) -> Optional[Rejection]:
    """A rejection unless ``value`` is a well-formed ``kind`` id."""
    problem = id_problem(kind, value)
    return Rejection(RejectionCode.INVALID_ID, problem) if problem is not None else None


def check_labels(labels: Mapping[str, str]) -> Optional[Rejection]:
    """A rejection when there are too many labels or one is too long."""
    if len(labels) > MAX_LABELS:
        return Rejection(RejectionCode.INVALID_HELLO, f"too many labels ({len(labels)} > {MAX_LABELS})")
    for key, value in labels.items():
        if len(key) > MAX_TEXT or len(value) > MAX_TEXT:
            return Rejection(RejectionCode.INVALID_HELLO, f"label {key[:40]!r} is longer than {MAX_TEXT} characters")
    return None


def check_certified_id(kind: str, claimed: str, certified_id: Optional[str]) -> Optional[Rejection]:
    """A rejection unless the certificate proves ``claimed`` (None: no certificate is required)."""
    if certified_id is None or certified_id == claimed:
        return None
    if not certified_id:
        return Rejection(
            RejectionCode.IDENTITY_MISMATCH, f"the client certificate proves no {kind} id; cannot enroll {claimed!r}"
        )
    return Rejection(
        RejectionCode.IDENTITY_MISMATCH,
        f"the client certificate is for {kind} {certified_id[:80]!r}, not {claimed!r}",
    )


def check_edge_hello(
    hello: pb.EdgeHelloRequest, credentials: CredentialCheck, certified_id: Optional[str] = None
) -> Optional[Rejection]:
    """Why the Control Plane must refuse this Edge hello, or ``None``.

    ``certified_id`` is the edge id the client certificate proves ("" when
    it proves none), or None when the listener does not use client
    certificates. Checked in order: protocol version, edge id, certificate
    identity, credential, then the bounds on the announced labels and
    command catalog.
    """
    rejection = check_version(hello.protocol_major, hello.protocol_minor, "this Control Plane")
    if rejection is None:
        rejection = check_id("edge_id", hello.edge_id)
    if rejection is None:
        rejection = check_certified_id("edge", hello.edge_id, certified_id)
    if rejection is not None:
        return rejection
    if not credentials.check(hello.edge_id, hello.credential):
        return Rejection(RejectionCode.BAD_CREDENTIAL, f"wrong or missing credential for edge {hello.edge_id!r}")
    rejection = check_labels(hello.labels)
    if rejection is not None:
        return rejection
    return check_catalog(hello.commands)


def check_catalog(commands: Sequence[pb.CommandSpec]) -> Optional[Rejection]:
    """A rejection when an announced command catalog is over a bound.

    Bounds: :data:`MAX_COMMANDS` commands, :data:`MAX_COMMAND_ARGUMENTS`
    arguments per command and :data:`MAX_CATALOG_ARGUMENTS` in all; names
    and target kinds up to :data:`MAX_TEXT` characters, descriptions up to
    :data:`MAX_DESCRIPTION`.
    """
    if len(commands) > MAX_COMMANDS:
        return Rejection(RejectionCode.INVALID_HELLO, f"too many commands announced ({len(commands)} > {MAX_COMMANDS})")
    arguments = 0
    for spec in commands:
        if not spec.name or len(spec.name) > MAX_TEXT:
            return Rejection(RejectionCode.INVALID_HELLO, "a command in the catalog has an empty or overlong name")
        quoted = spec.name[:40]
        if len(spec.target_kind) > MAX_TEXT or len(spec.description) > MAX_DESCRIPTION:
            return Rejection(
                RejectionCode.INVALID_HELLO,
                f"command {quoted!r} has a target kind over {MAX_TEXT} or a description over {MAX_DESCRIPTION} characters",
            )
        if len(spec.arguments) > MAX_COMMAND_ARGUMENTS:
            return Rejection(
                RejectionCode.INVALID_HELLO,
                f"command {quoted!r} declares too many arguments ({len(spec.arguments)} > {MAX_COMMAND_ARGUMENTS})",
            )
        arguments += len(spec.arguments)
        if arguments > MAX_CATALOG_ARGUMENTS:
            return Rejection(
                RejectionCode.INVALID_HELLO, f"the catalog declares more than {MAX_CATALOG_ARGUMENTS} arguments in all"
            )
        for argument in spec.arguments:
            if len(argument.name) > MAX_TEXT or len(argument.description) > MAX_DESCRIPTION:
                return Rejection(
                    RejectionCode.INVALID_HELLO,
                    f"an argument of command {quoted!r} has a name over {MAX_TEXT} "
                    f"or a description over {MAX_DESCRIPTION} characters",
                )
    return None


def check_node_hello(
    hello: pb.NodeHelloRequest, credentials: Mapping[str, Digests], certified_id: Optional[str] = None
) -> Optional[Rejection]:
    """Why the Edge must refuse this Node hello, or ``None``.

    ``credentials`` maps every configured node id to the digests of its
    credential (empty when the node needs none); a node id not in it is
    unknown. ``certified_id`` is as for :func:`check_edge_hello`. Checked
    in order: protocol version, node id, certificate identity, configured,
    credential, then the bounds on announced providers and labels.
    """
    rejection = check_version(hello.protocol_major, hello.protocol_minor, "this edge")
    if rejection is None:
        rejection = check_id("node_id", hello.node_id)
    if rejection is None:
        rejection = check_certified_id("node", hello.node_id, certified_id)
    if rejection is not None:
        return rejection
    expected = credentials.get(hello.node_id)
    if expected is None:
        return Rejection(RejectionCode.UNKNOWN_NODE, f"node {hello.node_id!r} is not configured on this edge")
    if expected and not matches(hello.credential, expected):
        return Rejection(RejectionCode.BAD_CREDENTIAL, f"wrong or missing credential for node {hello.node_id!r}")
    if len(hello.providers) > MAX_PROVIDERS:
        return Rejection(
            RejectionCode.INVALID_HELLO, f"too many providers announced ({len(hello.providers)} > {MAX_PROVIDERS})"
        )
    for spec in hello.providers:
        if len(spec.provider_id) > MAX_TEXT:
            return Rejection(RejectionCode.INVALID_HELLO, f"a provider id is longer than {MAX_TEXT} characters")
    return check_labels(hello.labels)
