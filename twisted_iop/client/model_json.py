"""The JSON form of the client's typed models: one reader, one writer.

One generic reader, :func:`read`, turns a decoded document into a model of
:mod:`twisted_iop.client.models` (or of the other views' modules), driven by
the attrs field types: ``str``, ``int``, ``float``, ``bool``,
``Optional[...]``, :class:`~datetime.datetime`, nested attrs classes,
``tuple[X, ...]``/``list[X]``, ``dict[str, X]`` and ``Literal[...]``. It
ignores keys it does not know (a newer server may add some), requires every
key the document requires, and raises
:class:`~twisted_iop.client.errors.InvalidResponse` naming the JSON path of
a value that does not fit (``items[0].error: expected an object or null``).
:func:`to_json` turns a model back into the same JSON shape.

Field metadata says what the types cannot: :data:`OPTIONAL` marks a key the
document does not require (absent or ``null`` read as ``None``, and ``None``
is left out when written back); :data:`DEFAULTED` a key the document
requires that an older Control Plane leaves out (absent read as the field's
default, always written back); :data:`FLATTEN` marks a nested model whose
keys sit in the same JSON object (an edge detail *is* a summary plus more).

Times are timezone-aware :class:`datetime.datetime` in UTC, or ``None``
(:func:`parse_time`, :func:`format_time`).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal, Optional, TypeVar, Union, get_args, get_origin, get_type_hints

import attrs

from twisted_iop.client.base_errors import InvalidResponse

T = TypeVar("T")

#: Metadata of a field whose key the server may leave out (see the module doc).
OPTIONAL = {"optional": True}
#: Metadata of a nested model read from (and written into) the enclosing object.
FLATTEN = {"flatten": True}
#: Metadata of a field whose key an older Control Plane leaves out: read as
#: the field's default when absent, and always written back.
DEFAULTED = {"defaulted": True}


# ---------------------------------------------------------------- times


def parse_time(text: str) -> datetime:
    """Parse an ISO 8601 time (``2026-11-29T20:00:00.123Z``) into aware UTC."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def format_time(value: Optional[datetime]) -> Optional[str]:
    """Format a time the way the Control Plane does (UTC, milliseconds, ``Z``)."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


# ---------------------------------------------------------------- the reader


def read(model: type[T], data: Any, path: str = "") -> T:
    """Read the decoded JSON ``data`` as an instance of the attrs class ``model``.

    ``path`` prefixes the JSON paths named in errors (``"snapshot"`` for a
    document nested in an error answer, say).
    """
    result: T = _read_object(model, data, path)
    return result


@functools.cache
def _field_types(model: type) -> dict[str, Any]:
    return get_type_hints(model)


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(v) for v in get_args(kind))
    if kind is str:
        return "a string"
    if kind is bool:
        return "true or false"
    if kind is int:
        return "a whole number"
    if kind is float:
        return "a number"
    if kind is datetime:
        return "an ISO 8601 time"
    if origin in (tuple, list):
        return "a list"
    return "an object"


def _read_object(model: Any, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise InvalidResponse(f"{path or 'response'}: expected an object")
    kinds = _field_types(model)
    values: dict[str, Any] = {}
    for field in attrs.fields(model):
        kind = kinds[field.name]
        if field.metadata.get("rest"):
            # Members a newer Control Plane sends that this client does not
            # know yet: kept as they are, and written back.
            known = {f.name for f in attrs.fields(model)}
            values[field.alias] = {key: value for key, value in data.items() if key not in known}
            continue
        if field.metadata.get("flatten"):
            values[field.alias] = _read_object(kind, data, path)
            continue
        where = _at(path, field.name)
        if field.name not in data:
            if field.metadata.get("optional") or field.metadata.get("defaulted"):
                continue
            raise InvalidResponse(f"{where}: missing")
        values[field.alias] = _read_value(kind, data[field.name], where, bool(field.metadata.get("optional")))
    return model(**values)


def _read_value(kind: Any, value: Any, path: str, nullable: bool = False) -> Any:
    origin = get_origin(kind)
    if origin is Union or origin is types.UnionType:
        choices = [a for a in get_args(kind) if a is not type(None)]
        if len(choices) != 1:
            raise TypeError(f"{path}: unions other than Optional[X] are not supported: {kind!r}")
        return _read_value(choices[0], value, path, nullable=nullable or len(choices) < len(get_args(kind)))
    if value is None:
        if nullable:
            return None
        raise InvalidResponse(f"{path}: expected {_describe(kind)}, not null")
    try:
        return _read_present(kind, origin, value, path)
    except _Mismatch:
        raise InvalidResponse(f"{path}: expected {_describe(kind)}{' or null' if nullable else ''}") from None


class _Mismatch(Exception):
    """The value does not have the type the field wants."""


def _read_present(kind: Any, origin: Any, value: Any, path: str) -> Any:
    if kind is Any:
        return value  # a JSON value taken as it is (a deployment's parameters: scalars of any type)
    if origin is Literal:
        if isinstance(value, bool) or value not in get_args(kind):
            raise _Mismatch()
        return value
    if kind is str or kind is bool:
        if not isinstance(value, kind):
            raise _Mismatch()
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Mismatch()
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch()
        return float(value)
    if kind is datetime:
        if not isinstance(value, str):
            raise _Mismatch()
        try:
            return parse_time(value)
        except ValueError:
            raise InvalidResponse(f"{path}: not an ISO 8601 time: {value[:40]!r}") from None
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise _Mismatch()
        item = get_args(kind)[0]
        items = [_read_value(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise _Mismatch()
        item = get_args(kind)[1]
        return {str(k): _read_value(item, v, _at(path, str(k))) for k, v in value.items()}
    if attrs.has(kind):
        if not isinstance(value, Mapping):
            raise _Mismatch()
        return _read_object(kind, value, path)
    raise TypeError(f"{path}: no reader for {kind!r}")


# ---------------------------------------------------------------- writing


def to_json(model: Any) -> Any:
    """Turn a model (or a list of models) back into its JSON shape."""
    if isinstance(model, (list, tuple)):
        return [to_json(m) for m in model]
    if isinstance(model, datetime):
        return format_time(model)
    if isinstance(model, Mapping):
        return {k: to_json(v) for k, v in model.items()}
    if attrs.has(type(model)):
        out: dict[str, Any] = {}
        for field in attrs.fields(type(model)):
            value = getattr(model, field.name)
            if field.metadata.get("flatten") or field.metadata.get("rest"):
                out.update(to_json(value))
            elif value is not None or not field.metadata.get("optional"):
                out[field.name] = to_json(value)
        return out
    return model
