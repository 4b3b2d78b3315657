"""Shared pieces of config parsing: YAML loading and typed field readers.

Each daemon's ``config.py`` turns one YAML document into frozen attrs
classes with these readers, so that every bad value is reported with the
dotted path of its field (``edge_wire.max_frame_bytes: must be ...``).
Nothing outside the ``config`` modules imports yaml.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, TypeVar

import yaml

from twisted_iop.endpoints import EndpointError, connect_endpoint, listen_endpoint

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or value that cannot be used; the text names the field."""


def load_yaml_mapping(path: Optional[str]) -> dict[str, Any]:
    """Read ``path`` as a YAML mapping; ``None`` gives an empty mapping."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    return parse_yaml_mapping(text, source=path)


def parse_yaml_mapping(text: str, source: str = "<config>") -> dict[str, Any]:
    """Parse ``text`` as a YAML mapping (an empty document is ``{}``)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return data


class Section:
    """A mapping being read, with the dotted path used in error messages."""

    def __init__(self, data: Any, path: str, known: Optional[set[str]] = None) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'config'}: must be a mapping")
        self._data = data
        self._path = path

    def field_path(self, key: str) -> str:
        """The dotted path of ``key`` in this section."""
        return f"{self._path}.{key}" if self._path else key

    def reject_unknown(self, known: set[str]) -> None:
        """Fail on keys that are not in ``known`` (typos must not pass)."""
        unknown = sorted(str(k) for k in self._data if k not in known)
        if unknown:
            raise ConfigError(
                f"{self.field_path(unknown[0])}: unknown setting "
                f"(known: {', '.join(sorted(known))})"
            )

    def has(self, key: str) -> bool:
        """Whether ``key`` is present."""
        return key in self._data

    def raw(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``."""
        return self._data.get(key, default)

    def section(self, key: str) -> "Section":
        """A nested section (absent means empty)."""
        return Section(self._data.get(key), self.field_path(key))

    def string(self, key: str, default: str = "", required: bool = False) -> str:
        """A string value."""
        if key not in self._data or self._data[key] is None:
            if required:
                raise ConfigError(f"{self.field_path(key)}: required")
            return default
        value = self._data[key]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(f"{self.field_path(key)}: must be a string")
        return str(value)

    def boolean(self, key: str, default: bool) -> bool:
        """A true/false value."""
        value = self._data.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.field_path(key)}: must be true or false")
        return value

    def integer(self, key: str, default: int, minimum: int = 0, maximum: Optional[int] = None) -> int:
        """A whole number within bounds."""
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.field_path(key)}: must be a whole number")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(f"{self.field_path(key)}: must be {bound}, not {value}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0, exclusive_minimum: bool = True) -> float:
        """A number (seconds, usually) above a bound."""
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.field_path(key)}: must be a number")
        if value < minimum or (exclusive_minimum and value == minimum):
            op = "greater than" if exclusive_minimum else "at least"
            raise ConfigError(f"{self.field_path(key)}: must be {op} {minimum:g}, not {value}")
        return float(value)

    def string_map(self, key: str) -> dict[str, str]:
        """A mapping of strings to strings (labels)."""
        value = self._data.get(key) or {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"{self.field_path(key)}: must be a mapping")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, (dict, list)) or v is None:
                raise ConfigError(f"{self.field_path(key)}.{k}: must be a string")
            out[k] = str(v)
        return out

    def string_list(self, key: str) -> list[str]:
        """A list of strings."""
        value = self._data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.field_path(key)}: must be a list of strings")
        return list(value)

    def listen(self, key: str, default: str) -> str:
        """A listen endpoint (Twisted string, ``host:port`` or ``:port``)."""
        value = self.string(key, default)
        try:
            return listen_endpoint(value)
        except EndpointError as e:
            raise ConfigError(f"{self.field_path(key)}: {e}") from None

    def connect(self, key: str, default: str = "", required: bool = False) -> str:
        """A client endpoint (Twisted string or ``host:port``)."""
        value = self.string(key, default, required=required)
        try:
            return connect_endpoint(value)
        except EndpointError as e:
            raise ConfigError(f"{self.field_path(key)}: {e}") from None
