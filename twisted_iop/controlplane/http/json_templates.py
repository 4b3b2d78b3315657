"""Views written as JSON bytes from a declaration of their members.

A view is declared once, as a tuple of :class:`Member` (its name, how its
value is read from the view's subject, how it is written, and how often:
on every rendering, once per key, or once per distinct value). A
:class:`Template` compiles the declaration into a ``%`` template of the
view's text, with a placeholder for each value written on every
rendering, and into Python functions that read and write those values,
generated as ``attrs`` generates ``__init__`` (their source is
:attr:`Template.source`): a rendering is one call and one ``%``, with no
call per member; plain closures cost a fleet row about a third more.
The bounded tables the renderer keeps its texts in are here too. The
views themselves, and what they save, are in
:mod:`~twisted_iop.controlplane.http.json_bytes`.
"""

from __future__ import annotations

import enum
import json
import keyword
import linecache
import weakref
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Generic, Optional, TypeVar, Union

import attrs

from twisted_iop.controlplane.fleet.snapshots import StatusSnapshot
from twisted_iop.controlplane.http.json_views import iso

#: Distinct values' texts kept per shared member (label maps, counts), and
#: the longest kept (a longer one is written each time): at most 1 MiB each.
FRAGMENTS_KEPT = 1024
FRAGMENT_MAX_BYTES = 1024

# -- how a value is written ---------------------------------------------------------

#: A value's JSON as bytes (ASCII: texts are escaped as ``json.dumps`` escapes them).
Writer = Callable[[Any], bytes]

escape_text: Callable[[str], str] = json.encoder.encode_basestring_ascii


def write_text(value: str) -> bytes:
    """A string, escaped as ``json.dumps`` escapes it."""
    return escape_text(value).encode("ascii")


def write_int(value: int) -> bytes:
    """A whole number."""
    return b"%d" % value


def write_bool(value: object) -> bytes:
    """``true`` or ``false``."""
    return b"true" if value else b"false"


def write_present(value: object) -> bytes:
    """``true`` when there is a value (it is not None), else ``false``."""
    return b"false" if value is None else b"true"


def write_time(seconds: Optional[float]) -> bytes:
    """Seconds since the epoch as :func:`iso` writes them, or ``null``."""
    text = None if seconds is None else iso(seconds)
    return b"null" if text is None else b'"%s"' % text.encode("ascii")


def write_received_at(snapshot: Optional[StatusSnapshot]) -> bytes:
    """When a snapshot arrived (:func:`write_time`), or ``null`` without one."""
    return write_time(None if snapshot is None else snapshot.received_at)


def write_number(value: Optional[float]) -> bytes:
    """A finite number as ``json.dumps`` writes it, or ``null``."""
    return b"null" if value is None else repr(value).encode("ascii")


def write_optional_int(value: Optional[int]) -> bytes:
    """A whole number, or ``null``."""
    return b"null" if value is None else b"%d" % value


def write_texts(values: Iterable[str]) -> bytes:
    """A list of strings (any iterable of them: a protobuf repeated field)."""
    return ("[" + ",".join(map(escape_text, values)) + "]").encode("ascii")


def write_time_ms(milliseconds: int) -> bytes:
    """Milliseconds since the epoch as :func:`write_time` writes them (``null`` for 0)."""
    return write_time(milliseconds / 1000.0 if milliseconds > 0 else None)


def write_json(value: object) -> bytes:
    """Any JSON value, by ``json.dumps`` (compact)."""
    return b"null" if value is None else json.dumps(value, separators=(",", ":")).encode("ascii")


def write_raw(value: bytes) -> bytes:
    """A value already written as JSON."""
    return value


#: What a compiled view does in place of calling these writers: lines
#: that set ``{value}`` to what the writer writes of ``{read}`` (without a
#: call for each value: about 60 ns each). ``%d`` writes a whole number.
_INLINE: dict[Writer, tuple[str, ...]] = {
    write_int: ("{value} = {read}",),
    write_bool: ('{value} = b"true" if {read} else b"false"',),
    write_present: ('{value} = b"false" if {read} is None else b"true"',),
    write_raw: ("{value} = {read}",),
    write_text: ('{value} = escape_text({read}).encode("ascii")',),
    write_time: (
        "{value} = {read}",
        "{value} = None if {value} is None else _iso({value})",
        """{value} = b"null" if {value} is None else b'"%s"' % {value}.encode("ascii")""",
    ),
    write_received_at: (
        "{value} = {read}",
        "{value} = None if {value} is None else _iso({value}.received_at)",
        """{value} = b"null" if {value} is None else b'"%s"' % {value}.encode("ascii")""",
    ),
    write_json: ("{value} = {read}", '{value} = b"null" if {value} is None else _write_json({value})'),
    write_number: ("{value} = {read}", '{value} = b"null" if {value} is None else repr({value}).encode("ascii")'),
    write_optional_int: ("{value} = {read}", '{value} = b"null" if {value} is None else b"%d" % {value}'),
}

# -- declarations ---------------------------------------------------------------------

#: How a value is read from a view's subject: a dotted attribute path, a
#: function of the subject, or None for the subject itself.
Read = Union[str, Callable[[Any], Any], None]


class Keep(enum.Enum):
    """How often a member's value is written."""

    #: On every rendering.
    EVERY_TIME = "every time"
    #: Into the template of the view's key (see each view), once per key.
    PER_KEY = "per key"
    #: Once per distinct value, kept by value: a map by its items in order,
    #: anything else by itself. Equal values must write equal text (maps of
    #: texts, tuples of whole numbers: not ``1`` and ``True``).
    PER_VALUE = "per value"


@attrs.frozen
class Member:
    """One member of a JSON object view: its name, how its value is read
    and how it is written (a :data:`Writer`, or the members of a nested
    object read from the value), and how often.

    A member without a name writes members of the enclosing object: its
    writer writes them without braces (never none).
    """

    name: Optional[str]
    read: Read
    write: Union[Writer, tuple[Member, ...]]
    keep: Keep = Keep.EVERY_TIME


@attrs.frozen
class Slot:
    """A value of a compiled view: the expression that reads it, the
    nested objects it is read from, its writer and how often it is written."""

    expression: str
    objects: tuple[str, ...]
    write: Writer
    keep: Keep


class Compiler:
    """The names a compiled view's functions use: the functions and values
    of the declaration, and the nested objects they read from."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"escape_text": escape_text, "_write_json": write_json, "_iso": iso}
        #: Each nested object's local name and the expression it is read by.
        self.objects: dict[str, str] = {}

    def bind(self, value: object, kind: str) -> str:
        """A name for ``value`` in the compiled functions' globals."""
        name = f"_{kind}{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def read(self, outer: str, read: Read) -> str:
        """The expression of ``read`` applied to ``outer`` (every expression
        is a name, an attribute or a call: one to read from as it stands)."""
        if read is None:
            return outer
        if isinstance(read, str):
            if not all(part.isidentifier() and not keyword.iskeyword(part) for part in read.split(".")):
                raise ValueError(f"not an attribute path: {read!r}")
            return f"{outer}.{read}"
        return f"{self.bind(read, 'read')}({outer})"

    def parts(
        self, members: tuple[Member, ...], outer: str = "subject", objects: tuple[str, ...] = ()
    ) -> Iterator[Union[bytes, Slot]]:
        """An object's text in order: literal text, and a slot for each value."""
        yield b"{"
        for i, member in enumerate(members):
            if i:
                yield b","
            expression = self.read(outer, member.read)
            if isinstance(member.write, tuple):
                if member.name is None:
                    raise ValueError("a nested object needs a name")
                yield write_text(member.name) + b":"
                if member.read is None:
                    yield from self.parts(member.write, outer, objects)
                else:
                    # Read once per rendering, into a local of the function.
                    name = f"_object{len(self.objects)}"
                    self.objects[name] = expression
                    yield from self.parts(member.write, name, (*objects, name))
                continue
            if member.name is not None:
                yield write_text(member.name) + b":"
            yield Slot(expression, objects, member.write, member.keep)
        yield b"}"

    def reading(self, slots: list[Slot]) -> list[str]:
        """The lines that read the nested objects ``slots`` are read from."""
        needed = {name for slot in slots for name in slot.objects}
        return [f"{name} = {expression}" for name, expression in self.objects.items() if name in needed]


def escaped(text: bytes) -> bytes:
    """``text`` as it stands in a ``%`` template."""
    return text.replace(b"%", b"%%")


# -- kept values --------------------------------------------------------------------

K = TypeVar("K")
V = TypeVar("V")


@attrs.frozen
class Kept:
    """What one cache holds: its entries, and their bytes (as sized when kept)."""

    entries: int
    bytes: int


class SharedTexts:
    """The JSON of each distinct value of one shared member, kept by value."""

    def __init__(self, write: Writer, count: int = FRAGMENTS_KEPT, max_bytes: int = FRAGMENT_MAX_BYTES) -> None:
        self._write = write
        self._count = count
        self._max_bytes = max_bytes
        #: Each value's JSON by the value's key; the compiled view looks here first.
        self.texts: dict[Hashable, bytes] = {}
        self.bytes = 0

    def write(self, key: Any, value: Any) -> bytes:
        """The JSON of a value not kept yet (kept now by ``key`` when short enough)."""
        text = self._write(value)
        texts = self.texts
        if len(text) <= self._max_bytes:
            if len(texts) >= self._count:
                self.bytes -= len(texts.pop(next(iter(texts))))
            texts[key] = text
            self.bytes += len(text)
        return text


class WeakTable(Generic[K, V]):
    """Values kept for objects while they live (by identity, weakly), at
    most ``count`` of them and ``budget`` bytes of them (as the caller
    sizes them), oldest dropped first; a value larger than the budget is
    not kept."""

    def __init__(self, count: int, budget: int) -> None:
        self._count = count
        self._budget = budget
        self._entries: dict[weakref.ref[K], tuple[V, int]] = {}
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> Optional[V]:
        """The value kept for ``key``, or None."""
        entry = self._entries.get(weakref.ref(key))
        return None if entry is None else entry[0]

    def keep(self, key: K, value: V, size: int) -> V:
        """Keep ``value`` (of ``size`` bytes) for ``key``, in place of any
        value kept for it; return it."""
        self._forget(weakref.ref(key))
        if size > self._budget:
            return value
        entries = self._entries
        while entries and (len(entries) >= self._count or self.bytes + size > self._budget):
            self._forget(next(iter(entries)))
        entries[weakref.ref(key, self._forget)] = (value, size)
        self.bytes += size
        return value

    def _forget(self, ref: weakref.ref[K]) -> None:
        # Also each kept key's weakref callback: the entry goes with its object.
        entry = self._entries.pop(ref, None)
        if entry is not None:
            self.bytes -= entry[1]


# -- compiled views -------------------------------------------------------------------


class Template:
    """A view's declaration compiled: a ``%`` template of its text with a
    placeholder for each value written on every rendering, and functions
    that read and write those values into the template.

    :meth:`render` writes a subject (:meth:`render_all` a sequence of
    them) from :attr:`text`, or, for a view with :attr:`Keep.PER_KEY`
    members, from the template :meth:`template_for` wrote for the
    subject's key. The texts of its :attr:`Keep.PER_VALUE` members are
    kept in the template (:attr:`shared`).

    The functions are compiled from the declaration, as attrs compiles an
    ``__init__``: a call per member (a closure that reads, one that
    writes) cost a fleet row about a third more than the row's JSON.
    """

    def __init__(self, name: str, members: tuple[Member, ...]) -> None:
        compiler = Compiler()
        #: The template's text in order: literal text (escaped for ``%``),
        #: placeholders, and None where a per-key value goes.
        self._layout: list[Optional[bytes]] = []
        #: The texts kept for each per-value member, in order.
        self.shared: list[SharedTexts] = []
        rendered: list[Slot] = []
        one: list[str] = []
        many: list[str] = []
        per_key: list[Slot] = []
        for part in compiler.parts(members):
            if isinstance(part, bytes):
                self._layout.append(escaped(part))
            elif part.keep is Keep.PER_KEY:
                per_key.append(part)
                self._layout.append(None)
            else:
                for_one, for_many = self._value(compiler, part, f"_value{len(rendered)}")
                one += for_one
                many += for_many
                rendered.append(part)
                self._layout.append(b"%d" if part.write is write_int and part.keep is Keep.EVERY_TIME else b"%s")
        #: The template of a view without per-key members.
        self.text = b"" if per_key else self._template(())
        compiler.namespace["_text"] = self.text
        values = "".join(f"_value{i}, " for i in range(len(rendered)))
        written = "".join(f"{compiler.bind(slot.write, 'write')}({slot.expression}), " for slot in per_key)
        reading = compiler.reading(rendered)
        lines = [
            "def render(subject, template=_text):",
            *indented(1, *reading, *one, f"return template % ({values})"),
            "",
            "",
            "def render_all(subjects, template=_text):",
            *indented(1, *(f"_seen{i} = {{}}" for i in range(len(self.shared))), "written = []"),
            "    for subject in subjects:",
            *indented(2, *reading, *many, f"written.append(template % ({values}))"),
            "    return written",
            "",
            "",
            "def per_key(subject):",
            *indented(1, *compiler.reading(per_key), f"return ({written})"),
        ]
        #: The compiled functions' source, for reading (and tracebacks).
        self.source = "\n".join(lines) + "\n"
        filename = f"<json view {name}>"
        exec(compile(self.source, filename, "exec"), compiler.namespace)
        # So that a traceback through a compiled view shows its source.
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True), filename)
        #: ``render(subject, template=text) -> bytes``: the subject's JSON.
        self.render: Callable[..., bytes] = compiler.namespace["render"]
        #: ``render_all(subjects, template=text) -> list[bytes]``: each
        #: subject's JSON, in order.
        self.render_all: Callable[..., list[bytes]] = compiler.namespace["render_all"]
        self._per_key: Callable[[Any], tuple[bytes, ...]] = compiler.namespace["per_key"]

    def _value(self, compiler: Compiler, slot: Slot, value: str) -> tuple[list[str], list[str]]:
        """Lines that set ``value`` to the JSON of ``slot``'s value, in
        :meth:`render` and in :meth:`render_all`."""
        if slot.keep is Keep.PER_VALUE:
            n = len(self.shared)
            shared = SharedTexts(slot.write)
            self.shared.append(shared)
            texts, write = compiler.bind(shared.texts, "texts"), compiler.bind(shared.write, "write")
            # A map is kept by its items in order (equal items write equal
            # JSON); the kept JSON, or the writer that writes and keeps it.
            kept = [
                f"_key{n} = tuple({value}.items()) if {value}.__class__ is dict else {value}",
                f"{value} = {texts}.get(_key{n}) or {write}(_key{n}, {value})",
            ]
            # Rows share their values by identity (a shared map, a shared
            # counts tuple): one call looks each object up once. Each
            # object is held in _seen while the call runs, so its id names
            # it alone.
            seen = [
                f"_seen = _seen{n}.get(id({value}))",
                "if _seen is None:",
                f"    _object = {value}",
                *indented(1, *kept),
                f"    _seen = _seen{n}[id(_object)] = (_object, {value})",
                f"{value} = _seen[1]",
            ]
            return [f"{value} = {slot.expression}", *kept], [f"{value} = {slot.expression}", *seen]
        inline = _INLINE.get(slot.write)
        if inline is not None:
            lines = [line.format(value=value, read=slot.expression) for line in inline]
        else:
            lines = [f"{value} = {compiler.bind(slot.write, 'write')}({slot.expression})"]
        return lines, lines

    def _template(self, per_key: tuple[bytes, ...]) -> bytes:
        written = iter(per_key)
        return b"".join([escaped(next(written)) if part is None else part for part in self._layout])

    def template_for(self, subject: object) -> bytes:
        """The template of ``subject``'s key: with its per-key members written."""
        return self._template(self._per_key(subject))


def indented(depth: int, *lines: str) -> list[str]:
    return ["    " * depth + line for line in lines]


# -- the views --------------------------------------------------------------------------

#: What every buffer of an edge says of itself: its counts, then (after
#: what else a buffer says) its bytes.
