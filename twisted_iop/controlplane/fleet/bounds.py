"""Bounds on what the Control Plane keeps of an edge's words.

Everything an edge sends that the registry stores (events, command results
and reasons, status snapshots, the hello catalog) passes through here
first. Pure functions, no I/O: an event or a result over a bound is cut
down and marked (attribute ``truncated: "true"``), never stored whole; a
status snapshot over a bound is refused; a catalog is compacted when its
edge goes away. Hello bounds live in :mod:`twisted_iop.wire.hello`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional

from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.hello import (
    MAX_DESCRIPTION,
    MAX_LABELS,
    MAX_PROVIDERS,
    MAX_TEXT,
)

#: Characters of an event kind, node, provider or command id that are kept.
MAX_EVENT_ID = MAX_TEXT
#: Characters of an event's message that are kept.
MAX_EVENT_MESSAGE = 4096
#: Attributes an event keeps (besides the ``truncated`` marker).
MAX_EVENT_ATTRIBUTES = 32
#: Characters of an attribute or result key; a longer key is dropped.
MAX_KEY = MAX_TEXT
#: Characters of an attribute value that are kept.
MAX_ATTRIBUTE_VALUE = 1024
#: Entries a command result keeps (besides the ``truncated`` marker).
MAX_RESULT_ENTRIES = 64
#: Characters of a command argument value that the HTTP view admits.
MAX_ARGUMENT_VALUE = 1024
#: Characters of a result value that are kept.
MAX_RESULT_VALUE = 1024
#: Characters of an edge's reason (command answer, late outcome) that are kept.
MAX_REASON = 1024

#: The marker added to attributes or results that were cut down.
TRUNCATED_KEY = "truncated"
TRUNCATED = {TRUNCATED_KEY: "true"}
#: What ends a string that was cut.
ELLIPSIS = "..."

#: Bounds on one status snapshot; a larger one is refused as an edge error.
MAX_STATUS_BYTES = 256 * 1024
MAX_STATUS_NODES = 512
#: Providers, node labels and models in one snapshot, counted over all its nodes.
MAX_STATUS_PROVIDERS = 1024
MAX_STATUS_LABELS = 1024
MAX_STATUS_MODELS = 4096


def clip(text: str, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters (ending in ``...``), and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS, True


def clip_map(values: Mapping[str, str], max_entries: int, max_value: int) -> tuple[dict[str, str], bool]:
    """A bounded copy of a peer's ``str -> str`` map, and whether anything was cut.

    Keys longer than :data:`MAX_KEY` are dropped, values longer than
    ``max_value`` cut; beyond ``max_entries`` the keys that sort last are
    dropped (the map's order on the wire means nothing). A cut map gets
    the ``truncated: "true"`` marker.
    """
    if len(values) <= max_entries and all(len(k) <= MAX_KEY and len(v) <= max_value for k, v in values.items()):
        return dict(values), False
    kept: dict[str, str] = {}
    for key in sorted(values):
        if len(key) > MAX_KEY or key == TRUNCATED_KEY:
            continue
        if len(kept) == max_entries:
            break
        kept[key] = clip(values[key], max_value)[0]
    kept.update(TRUNCATED)
    return kept, True


#: Characters of each event text that are kept, by field name (others: :data:`MAX_EVENT_ID`).
EVENT_TEXT_LIMITS = {"message": MAX_EVENT_MESSAGE}

#: An event of at most this many bytes on the wire has no text over its
#: bound (a character takes at least one byte).
SMALL_EVENT_BYTES = min(MAX_EVENT_ID, MAX_EVENT_MESSAGE, MAX_KEY, MAX_ATTRIBUTE_VALUE)


def clip_event(
    event: pb.EdgeEvent, texts: tuple[str, ...], limits: tuple[int, ...]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """The bounded ``texts`` of ``event`` (read from it, each with its limit)
    and its attributes; marked ``truncated`` if anything was cut.

    A small event (:data:`SMALL_EVENT_BYTES`, within the attribute count)
    cannot be over any bound and is taken whole without a look at each text.
    """
    attributes = event.attributes
    if len(attributes) <= MAX_EVENT_ATTRIBUTES and event.ByteSize() <= SMALL_EVENT_BYTES:
        # The same dict as dict(attributes), in half the time: the
        # protobuf map's keys() and items() are Python-level views.
        return texts, {key: attributes[key] for key in attributes}
    return full_clip_event(event, texts, limits)


def full_clip_event(
    event: pb.EdgeEvent, texts: tuple[str, ...], limits: tuple[int, ...]
) -> tuple[tuple[str, ...], dict[str, str]]:
    """:func:`clip_event` looking at every text and attribute."""
    cut = False
    clipped = []
    for text, limit in zip(texts, limits, strict=True):
        value, was_cut = clip(text, limit)
        clipped.append(value)
        cut = cut or was_cut
    kept, attributes_cut = clip_map(event.attributes, MAX_EVENT_ATTRIBUTES, MAX_ATTRIBUTE_VALUE)
    if cut and not attributes_cut:
        kept.update(TRUNCATED)
    return tuple(clipped), kept


def clip_result(result: Mapping[str, str]) -> dict[str, str]:
    """A command result as the registry may keep it (cut and marked if over a bound)."""
    return clip_map(result, MAX_RESULT_ENTRIES, MAX_RESULT_VALUE)[0]


def clip_reason(reason: str) -> str:
    """An edge's reason as the registry may keep it."""
    return clip(reason, MAX_REASON)[0]


#: A snapshot of at most this many bytes on the wire cannot hold more
#: providers, node labels or models in all than the bounds allow: every
#: element of a repeated field takes at least two bytes (tag and length).
SMALL_STATUS_BYTES = 2 * min(MAX_STATUS_PROVIDERS, MAX_STATUS_LABELS, MAX_STATUS_MODELS)
#: A node of at most this many bytes on the wire has no string longer than
#: the bounds (a character takes at least one byte) and at most half as
#: many providers (every one at least two bytes) as a node may have.
SMALL_NODE_BYTES = min(MAX_TEXT, MAX_DESCRIPTION, 2 * MAX_PROVIDERS)
#: The fewest bytes a node's labels take on the wire with more than
#: MAX_LABELS distinct keys: every map entry takes a tag and a length, and
#: every key but one (the empty key) at least a tag, a length and a
#: character, so each but one entry takes at least 5 bytes.
MANY_LABELS_BYTES = 2 + 5 * MAX_LABELS
# A small node cannot carry more labels than a node may have.
assert SMALL_NODE_BYTES < MANY_LABELS_BYTES


def status_problem(response: pb.EdgeStatusResponse, size: Optional[int] = None) -> Optional[str]:
    """Why a status snapshot is too large to keep, or None.

    ``size`` is its size on the wire when the caller knows it (the length
    of its serialization); otherwise it is computed.

    Bounds: its size on the wire, the number of nodes, of providers in all,
    of models per provider, of labels per node, and every string.

    Most snapshots are small, and their wire sizes alone rule out every
    count and string bound (:data:`SMALL_STATUS_BYTES`,
    :data:`SMALL_NODE_BYTES`, :data:`MANY_LABELS_BYTES`): those are
    checked with one size per node, without visiting each string or
    label. Any other snapshot gets every bound checked one by one.
    """
    if size is None:
        size = response.ByteSize()
    if size > MAX_STATUS_BYTES:
        return f"status snapshot is {size} bytes (more than {MAX_STATUS_BYTES})"
    if len(response.nodes) > MAX_STATUS_NODES:
        return f"status snapshot has {len(response.nodes)} nodes (more than {MAX_STATUS_NODES})"
    if size <= SMALL_STATUS_BYTES:
        for node in response.nodes:
            if node.ByteSize() > SMALL_NODE_BYTES:
                return full_status_problem(response)
        return None
    return full_status_problem(response)


def full_status_problem(response: pb.EdgeStatusResponse) -> Optional[str]:
    """:func:`status_problem` checking every count and string one by one."""
    if response.ByteSize() > MAX_STATUS_BYTES:
        return f"status snapshot is {response.ByteSize()} bytes (more than {MAX_STATUS_BYTES})"
    if len(response.nodes) > MAX_STATUS_NODES:
        return f"status snapshot has {len(response.nodes)} nodes (more than {MAX_STATUS_NODES})"
    providers = labels = models = 0
    for node in response.nodes:
        providers += len(node.providers)
        if len(node.providers) > MAX_PROVIDERS or providers > MAX_STATUS_PROVIDERS:
            return f"status snapshot has more than {MAX_STATUS_PROVIDERS} providers (or {MAX_PROVIDERS} on one node)"
        labels += len(node.labels)
        if len(node.labels) > MAX_LABELS or labels > MAX_STATUS_LABELS:
            return f"status snapshot has more than {MAX_STATUS_LABELS} node labels (or {MAX_LABELS} on one node)"
        if _too_long(node.labels.keys(), MAX_TEXT) or _too_long(node.labels.values(), MAX_TEXT):
            return f"status snapshot has a node label longer than {MAX_TEXT} characters"
        if len(node.node_id) > MAX_TEXT:
            return f"status snapshot has a node id longer than {MAX_TEXT} characters"
        for provider in node.providers:
            models += len(provider.models)
            if models > MAX_STATUS_MODELS:
                return f"status snapshot names more than {MAX_STATUS_MODELS} models"
            if (
                len(provider.provider_id) > MAX_TEXT
                or len(provider.kind) > MAX_TEXT
                or len(provider.health_reason) > MAX_DESCRIPTION
                or len(provider.launch.reason) > MAX_DESCRIPTION
                or _too_long(provider.models, MAX_TEXT)
            ):
                return "status snapshot has a provider string over its bound"
    return None


def _too_long(texts: Iterable[str], limit: int) -> bool:
    return any(len(text) > limit for text in texts)


def compact_catalog(commands: Iterable[pb.CommandSpec]) -> tuple[pb.CommandSpec, ...]:
    """The catalog a disconnected edge keeps: names, target kinds and
    argument names (with ``required``); descriptions are dropped."""
    return tuple(
        pb.CommandSpec(
            name=spec.name,
            target_kind=spec.target_kind,
            arguments=[pb.CommandArgumentSpec(name=a.name, required=a.required) for a in spec.arguments],
        )
        for spec in commands
    )


def detached_catalog(commands: Iterable[pb.CommandSpec]) -> tuple[pb.CommandSpec, ...]:
    """Copies of an announced catalog that do not keep the hello frame alive."""
    copies = []
    for spec in commands:
        copy = pb.CommandSpec()
        copy.CopyFrom(spec)
        copies.append(copy)
    return tuple(copies)
