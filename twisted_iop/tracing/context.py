"""W3C Trace Context: the ``traceparent`` and ``tracestate`` headers, and new ids.

A ``traceparent`` is ``<version>-<trace-id>-<parent-id>-<flags>``: two,
thirty-two, sixteen and two lowercase hex digits
(https://www.w3.org/TR/trace-context/). :func:`parse_traceparent` follows
the specification strictly: version ``00`` has exactly these 55 characters;
version ``ff`` is invalid; a later version may carry more fields after a
``-``; an all-zero trace id or parent id is invalid; upper-case hex is
invalid. An invalid header is never an error to whoever sent it: the
caller starts a new trace instead (the specification's "restart").

A ``tracestate`` is passed along, bounded: at most 32 list members and 512
characters (members over 128 characters go first, then members from the
right, as the specification advises); one that does not parse is dropped
whole.

:class:`IdSource` makes the ids of new traces and spans from
``os.urandom``, read in blocks: one system call serves hundreds of
requests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from typing import Optional, Union

import attrs

#: The version this module writes.
VERSION = "00"
#: The ``sampled`` bit of the flags.
SAMPLED = 0x01
#: A header longer than this is not read at all (version 00 is 55 characters).
MAX_TRACEPARENT_BYTES = 256
#: ``tracestate`` bounds (the specification's: members, and characters propagated).
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_CHARS = 512
#: A member longer than this is the first to go when the whole is over the bound.
LONG_TRACESTATE_MEMBER = 128
#: Raw ``tracestate`` input longer than this is dropped unread.
MAX_TRACESTATE_INPUT_BYTES = 8192

_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[\x21-\x7e]*)?")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
# key: simple (lcalpha then up to 255 of lcalpha, digits, _-*/) or multi-tenant (tenant@system);
# value: up to 256 printable characters but "," and "=", not ending in a space.
_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=([\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e])"
)


@attrs.frozen
class TraceParent:
    """A valid ``traceparent``: the trace, the span that sent it, and its flags."""

    trace_id: str
    span_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        """Whether the sender records this trace."""
        return bool(self.flags & SAMPLED)

    def header(self) -> str:
        """The header value (version 00)."""
        return format_traceparent(self.trace_id, self.span_id, self.sampled)


def format_traceparent(trace_id: str, span_id: str, sampled: bool) -> str:
    """A version 00 ``traceparent`` (only the sampled flag is ever set)."""
    return f"{VERSION}-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def parse_traceparent(value: Union[bytes, str, None]) -> Optional[TraceParent]:
    """The trace context of a ``traceparent`` header value, or ``None`` if it is not valid."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = value.encode("ascii")
        except UnicodeEncodeError:
            return None
    if len(value) > MAX_TRACEPARENT_BYTES:
        return None
    value = value.strip(b" \t")
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest is not None):
        return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return TraceParent(trace_id.decode("ascii"), span_id.decode("ascii"), int(flags, 16))


def parse_traceparent_headers(values: Optional[Sequence[bytes]]) -> Optional[TraceParent]:
    """The ``traceparent`` of a request's header lines: one valid line, else ``None``
    (two lines are invalid, as the specification says)."""
    if not values or len(values) != 1:
        return None
    return parse_traceparent(values[0])


def parse_tracestate(values: Optional[Sequence[Union[bytes, str]]]) -> str:
    """A request's ``tracestate`` lines as one bounded header value ("" for none or invalid)."""
    if not values:
        return ""
    texts = []
    size = 0
    for value in values:
        size += len(value)
        if size > MAX_TRACESTATE_INPUT_BYTES:
            return ""
        if isinstance(value, bytes):
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                return ""
        texts.append(value)
    members = []
    keys = set()
    for member in ",".join(texts).split(","):
        member = member.strip(" \t")
        if not member:
            continue
        if _MEMBER.fullmatch(member) is None:
            return ""
        key = member.partition("=")[0]
        if key in keys:
            return ""  # a key twice is invalid
        keys.add(key)
        members.append(member)
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return ""
    return _bounded(members)


def _bounded(members: list[str]) -> str:
    """At most :data:`MAX_TRACESTATE_CHARS`: long members go first, then from the right."""

    def length(items: list[str]) -> int:
        return sum(len(m) for m in items) + max(0, len(items) - 1)

    if length(members) > MAX_TRACESTATE_CHARS:
        members = [m for m in members if len(m) <= LONG_TRACESTATE_MEMBER]
    while members and length(members) > MAX_TRACESTATE_CHARS:
        members.pop()
    return ",".join(members)


class IdSource:
    """Random trace ids (16 bytes) and span ids (8 bytes), never all zero.

    Bytes come from ``random_bytes`` (``os.urandom``) a block at a time, so
    the ids of hundreds of requests cost one system call.
    """

    def __init__(self, random_bytes: Callable[[int], bytes] = os.urandom, block_bytes: int = 4096) -> None:
        self._random_bytes = random_bytes
        self._block_bytes = block_bytes
        self._block = b""
        self._offset = 0

    def _take(self, size: int) -> bytes:
        while True:
            if self._offset + size > len(self._block):
                self._block = self._random_bytes(self._block_bytes)
                self._offset = 0
            start = self._offset
            self._offset = start + size
            data = self._block[start : self._offset]
            if data.count(0) != size:  # all zero is not a valid id (1 in 2**64 at worst)
                return data

    def trace_id(self) -> str:
        """A new trace id: 32 lowercase hex digits."""
        return self._take(16).hex()

    def span_id(self) -> str:
        """A new span id: 16 lowercase hex digits."""
        return self._take(8).hex()


def sampled_by_ratio(trace_id: str, ratio: float) -> bool:
    """Whether a new trace is recorded at ``ratio`` (0..1), decided by its id as
    OpenTelemetry's ``TraceIdRatioBased`` does (the low 64 bits below ``ratio * 2**64``),
    so every hop that decides by the same ratio agrees."""
    if ratio >= 1.0:
        return True
    if ratio <= 0.0:
        return False
    return int(trace_id[16:], 16) < int(ratio * 2**64)
