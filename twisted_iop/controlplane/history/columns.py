"""A chunk of many series at one tier, column by column, as bytes (pure, no I/O).

The series of the edges (and of the models on each edge) are not kept one
by one: the keys of one *segment* (:mod:`.frames`) share their chunks.
A chunk holds **frames**, one per point time, each giving every key (a
*slot*, numbered in the order the keys were declared) its row of values.
A frame stores only what changed since the frame before, as differences:

* **whole columns**: a column whose values changed, as one difference
  per slot (*dense*), or, when few slots changed, as the changed slots
  and their differences (*sparse*);
* **patches**: a few slots whose *patch columns* (fixed per chunk)
  changed, each with its differences in those columns.

A column nobody's value changed in costs nothing, so a steady fleet's
frame is a few bytes for all its edges, and a busy one's is about one
byte per changed value. Every value is a difference from the slot's
value in the frame before (0 before its first frame); a key is absent
from a frame (no point) when its first column is :data:`~.fields.MISSING`
(a sampled chunk) or 0 (a rolled-up chunk's count). Decoding follows
the frames for the wanted keys only (:func:`decode`), so a one-key view
reads its slots out of the chunk without building every key's rows.

The differences are zigzag varints packed by protobuf's C code (one
``Packed`` message of :mod:`.chunks`; messages written one after another
parse back as one), compressed as they are written by one zlib stream
per chunk (:class:`ColumnChunkWriter`): an open chunk is the stream
flushed so far (readable as it is), a closed one the finished stream.

Layout: ``COLUMNS`` byte, ``kind`` byte (:data:`~.chunks.SAMPLED` or
:data:`~.chunks.ROLLED`), the column count, the patch column count P and
the P patch columns (a byte each), then the zlib stream of records:

* keys: ``-1``, the count, each key's UTF-8 length, then their bytes
  (new slots, numbered on);
* frame: the milliseconds since the frame before (the first: since 0;
  always > 0), the count of whole columns then each as ``column, 0,
  one difference per slot`` or ``column, 1, m, m slot gaps, m
  differences``, then the count of patches and each as ``slot gap,
  one difference per patch column`` (a gap is the slot less the one
  before, which for the first is -1).

A rolled-up chunk's rows are :mod:`.tiers` points (count, then per field
sum, max, last, n); each n is stored as the count less n (0 unless a
value was missing, so it costs nothing) and given back as n.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Sequence
from itertools import accumulate, compress
from operator import sub
from typing import Optional

from twisted_iop.controlplane.history.chunks import ROLLED, SAMPLED, ChunkError, _Packed, inflate, packed_values
from twisted_iop.controlplane.history.tiers import PER_FIELD

#: The first byte of a column chunk (row chunks use 1 and 2).
COLUMNS = 3
#: The record tag of declared keys (a frame starts with its time step, > 0).
KEYS_TAG = -1
#: How a whole column is stored.
DENSE = 0
SPARSE = 1
#: A whole column is stored sparse when at most this share of its slots changed.
SPARSE_SHARE = 4
#: zlib's level, and a small window and memory level: each open chunk
#: keeps a compressor (about 48 KiB with these, 256 KiB with zlib's
#: defaults: 96 open chunks at the default tiers), and the frames'
#: redundancy is local (measured on a busy simulated day of
#: bench/history.py: the finest tier 4 % larger than with the default
#: window, the rolled-up tiers the same).
ZLIB_LEVEL = 6
ZLIB_WBITS = 12
ZLIB_MEMLEVEL = 6
#: Values packed before they are handed to the compressor.
PACK_VALUES = 32_768
#: A chunk decompresses to at most this (a bound against a corrupt one).
MAX_DECODED_BYTES = 64 * 1024 * 1024
#: The longest key, in UTF-8 bytes.
MAX_KEY_BYTES = 1024

Row = tuple[int, ...]


def _pack(values: Sequence[int]) -> bytes:
    message = _Packed()
    message.v.extend(values)
    data: bytes = message.SerializeToString()
    return data


def header(kind: int, columns: int, patch_columns: Sequence[int]) -> bytes:
    """The bytes before a column chunk's stream."""
    if not 1 <= columns <= 255 or len(patch_columns) > columns:
        raise ValueError(f"a column chunk has 1 to 255 columns, not {columns}")
    if any(not 0 <= c < columns for c in patch_columns) or list(patch_columns) != sorted(set(patch_columns)):
        raise ValueError("patch columns must be distinct columns, in order")
    return bytes((COLUMNS, kind, columns, len(patch_columns), *patch_columns))


def stored_rolled(columns: list[Sequence[int]]) -> list[Sequence[int]]:
    """Rolled-up columns as a chunk stores them: each n as count less n
    (the columns where nothing was missing share one list of zeros)."""
    count = columns[0]
    out = list(columns)
    zeros: list[int] = [0] * len(count)
    for at in range(PER_FIELD, len(columns), PER_FIELD):
        out[at] = stored_n(count, columns[at], zeros)
    return out


def stored_n(count: Sequence[int], n: Sequence[int], zeros: list[int]) -> Sequence[int]:
    """A field's n as a chunk stores it: count less n (``zeros`` when nothing was missing)."""
    if n is count or n == count:
        return zeros
    return list(map(sub, count, n))


class ColumnChunkWriter:
    """A column chunk being written: keys and frames in, bytes out (see the module docstring)."""

    def __init__(self, kind: int, columns: int, patch_columns: Sequence[int], level: int = ZLIB_LEVEL) -> None:
        self.kind = kind
        self.columns = columns
        self.patch_columns = tuple(patch_columns)
        self._header = header(kind, columns, self.patch_columns)
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, ZLIB_WBITS, ZLIB_MEMLEVEL)
        self._values: list[int] = []
        self._out = bytearray()
        self._closed: Optional[bytes] = None
        #: Keys declared (slots), frames written, first and last frame times.
        self.slots = 0
        self.frames = 0
        self.start_ms = 0
        self.end_ms = 0

    def add_keys(self, keys: Sequence[str]) -> None:
        """Declare new slots (numbered on from :attr:`slots`)."""
        if not keys:
            return
        encoded = [key.encode("utf-8") for key in keys]
        lengths = list(map(len, encoded))
        if max(lengths) > MAX_KEY_BYTES:
            raise ValueError(f"a history key of {max(lengths)} bytes (at most {MAX_KEY_BYTES})")
        values = self._values
        values += (KEYS_TAG, len(keys))
        values += lengths
        values += b"".join(encoded)
        self.slots += len(keys)
        self._spill()

    def add_frame(
        self,
        t_ms: int,
        whole: Sequence[tuple[int, Sequence[int]]],
        patches: Sequence[tuple[int, Sequence[int]]],
    ) -> None:
        """A frame at ``t_ms``: whole columns as ``(column, differences of
        every slot)``, patches as ``(slot, differences in the patch
        columns)`` in slot order."""
        if self.frames and t_ms <= self.end_ms:
            raise ValueError("a frame must come after the last one")
        if t_ms <= 0:
            raise ValueError("a frame's time is after the epoch")
        values = self._values
        values += (t_ms - self.end_ms, len(whole))
        slots = self.slots
        for column, differences in whole:
            if len(differences) != slots:
                raise ValueError(f"column {column} has {len(differences)} values for {slots} slots")
            changed = slots - differences.count(0)
            if changed * SPARSE_SHARE <= slots:
                places = list(compress(range(slots), differences))
                values += (column, SPARSE, changed)
                values += map(sub, places, [-1, *places[:-1]])
                values += filter(None, differences)
            else:
                values += (column, DENSE)
                values += differences
        values.append(len(patches))
        width = len(self.patch_columns)
        last = -1
        for slot, differences in patches:
            if slot <= last or slot >= slots or len(differences) != width:
                raise ValueError("patches must be of declared slots, in order, one difference per patch column")
            values.append(slot - last)
            values += differences
            last = slot
        if not self.frames:
            self.start_ms = t_ms
        self.end_ms = t_ms
        self.frames += 1
        self._spill()

    def _spill(self) -> None:
        if len(self._values) >= PACK_VALUES:
            self._feed()

    def _feed(self) -> None:
        if self._values:
            self._out += self._compressor.compress(_pack(self._values))
            self._values = []

    def open_bytes(self) -> bytes:
        """The chunk as it is now: the stream flushed so far (readable as a chunk)."""
        if self._closed is not None:
            return self._closed
        self._feed()
        self._out += self._compressor.flush(zlib.Z_SYNC_FLUSH)
        return self._header + bytes(self._out)

    def closed_bytes(self) -> bytes:
        """The chunk with its stream finished (nothing can be added after)."""
        if self._closed is None:
            self._feed()
            self._out += self._compressor.flush(zlib.Z_FINISH)
            self._closed = self._header + bytes(self._out)
            self._out = bytearray()
        return self._closed


def _values_of(data: bytes) -> tuple[int, int, tuple[int, ...], list[int]]:
    if len(data) < 4 or data[0] != COLUMNS or data[1] not in (SAMPLED, ROLLED) or not data[2]:
        raise ChunkError("not a column chunk (bad header)")
    kind, columns, patch_count = data[1], data[2], data[3]
    if patch_count > columns or len(data) < 4 + patch_count:
        raise ChunkError("a column chunk with a bad header")
    patch_columns = tuple(data[4 : 4 + patch_count])
    if any(c >= columns for c in patch_columns):
        raise ChunkError("a column chunk with a bad header")
    payload = inflate(data[4 + patch_count :], "a column chunk", MAX_DECODED_BYTES)
    return kind, columns, patch_columns, packed_values(payload, "a column chunk")


def decode(data: bytes, wanted: Optional[Collection[str]] = None) -> tuple[int, dict[str, list[tuple[int, Row]]]]:
    """The kind of a column chunk and, per key (of ``wanted``, or every
    key), its points: ``(t_ms, row)`` of each frame it is present in.

    Raises :class:`~.chunks.ChunkError` for bytes that are not one.
    """
    kind, columns, patch_columns, flat = _values_of(data)
    try:
        return kind, _walk(kind, columns, patch_columns, flat, wanted)
    except (IndexError, ValueError, UnicodeDecodeError, TypeError) as e:
        if isinstance(e, ChunkError):
            raise
        raise ChunkError(f"a column chunk whose records do not add up: {e}") from None


def _walk(
    kind: int, columns: int, patch_columns: tuple[int, ...], flat: list[int], wanted: Optional[Collection[str]]
) -> dict[str, list[tuple[int, Row]]]:
    out: dict[str, list[tuple[int, Row]]] = {}
    #: The wanted slots: their keys, their values now (one list per slot).
    slot_key: dict[int, str] = {}
    values: dict[int, list[int]] = {}
    slots = 0
    t_ms = 0
    at = 0
    end = len(flat)
    rolled = kind == ROLLED
    width = len(patch_columns)
    n_columns = list(range(PER_FIELD, columns, PER_FIELD)) if rolled else []
    while at < end:
        tag = flat[at]
        if tag == KEYS_TAG:
            count = flat[at + 1]
            _check(0 <= count <= end - at - 2, "a bad key count")
            lengths = flat[at + 2 : at + 2 + count]
            at += 2 + count
            _check(min(lengths, default=0) >= 0 and max(lengths, default=0) <= MAX_KEY_BYTES, "a bad key length")
            names = bytes(flat[at : at + sum(lengths)])
            _check(len(names) == sum(lengths), "keys past the end")
            at += len(names)
            place = 0
            for length in lengths:
                key = names[place : place + length].decode("utf-8")
                place += length
                if wanted is None or key in wanted:
                    slot_key[slots] = key
                    values[slots] = [0] * columns
                    out.setdefault(key, [])
                slots += 1
            continue
        _check(tag > 0, "a frame that does not move forward")
        t_ms += tag
        whole = flat[at + 1]
        _check(0 <= whole <= columns, "a bad column count")
        at += 2
        for _ in range(whole):
            column, mode = flat[at], flat[at + 1]
            _check(0 <= column < columns, "a bad column")
            at += 2
            if mode == DENSE:
                _check(at + slots <= end, "a column past the end")
                for slot, kept in values.items():
                    kept[column] += flat[at + slot]
                at += slots
            else:
                _check(mode == SPARSE, "a bad column mode")
                changed = flat[at]
                _check(0 <= changed <= slots and at + 1 + 2 * changed <= end, "a bad sparse column")
                places = list(accumulate(flat[at + 1 : at + 1 + changed], initial=-1))[1:]
                _check(not places or (places[-1] < slots and min(flat[at + 1 : at + 1 + changed]) > 0), "bad slots")
                if values:
                    changes = dict(zip(places, flat[at + 1 + changed : at + 1 + 2 * changed], strict=True))
                    for slot, kept in values.items():
                        difference = changes.get(slot)
                        if difference is not None:
                            kept[column] += difference
                at += 1 + 2 * changed
        patches = flat[at]
        _check(0 <= patches <= slots, "a bad patch count")
        at += 1
        slot = -1
        for _ in range(patches):
            gap = flat[at]
            _check(gap > 0, "patches out of order")
            slot += gap
            _check(slot < slots, "a patch of an undeclared slot")
            patched = values.get(slot)
            if patched is not None:
                for column, difference in zip(patch_columns, flat[at + 1 : at + 1 + width], strict=True):
                    patched[column] += difference
            at += 1 + width
        _check(at <= end, "a frame past the end")
        for slot, kept in values.items():
            if (kept[0] > 0) if rolled else (kept[0] >= 0):
                if rolled:
                    row = list(kept)
                    count = row[0]
                    for n_at in n_columns:
                        row[n_at] = count - row[n_at]
                    out[slot_key[slot]].append((t_ms, tuple(row)))
                else:
                    out[slot_key[slot]].append((t_ms, tuple(kept)))
    return out


def _check(condition: bool, problem: str) -> None:
    if not condition:
        raise ChunkError(f"a column chunk with {problem}")
