"""Shared pieces of config parsing: YAML loading, typed field readers and
the sections every daemon that speaks a framed wire has in common.

Each daemon's ``config.py`` turns one YAML document into frozen attrs
classes with these readers, so that every bad value is reported with the
dotted path of its field (``edge_wire.max_frame_bytes: must be ...``).
Nothing outside the ``config`` modules imports yaml.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, TypeVar, cast

import attrs
import yaml
from twisted.logger import Logger

from twisted_iop.credentials import Digests, SecretError, digest_of, is_digest
from twisted_iop.endpoints import EndpointError, connect_endpoint, listen_endpoint
from twisted_iop.ids import id_problem
from twisted_iop.tls import TLSConfigError, TLSListenConfig, server_tls_options
from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES
from twisted_iop.wire.limits import FailedHelloLimits
from twisted_iop.wire.peer import PeerSettings

T = TypeVar("T")
C = TypeVar("C")

_log = Logger()

#: At most this many secrets may be valid for one id at once (rotation).
MAX_SECRETS_PER_ID = 4


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


def load_config(
    path: Optional[str],
    environ: Optional[Mapping[str, str]],
    parse: Callable[[Mapping[str, Any], Mapping[str, str]], C],
) -> C:
    """Read the YAML file at ``path`` with ``parse``, remembering ``source_path``.

    Environment overrides come from ``environ``, or from the process's
    environment when it is ``None``.
    """
    data = load_yaml_mapping(path)
    config = parse(data, environ if environ is not None else os.environ)
    # mypy's attrs plugin cannot check evolve() on a type variable.
    return attrs.evolve(cast(Any, config), source_path=path)


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

    def __init__(self, data: Any, path: str) -> None:
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
            raise ConfigError(f"{self.field_path(unknown[0])}: unknown setting (known: {', '.join(sorted(known))})")

    def has(self, key: str) -> bool:
        """Whether ``key`` is present."""
        return key in self._data

    def raw(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``."""
        return self._data.get(key, default)

    def section(self, key: str) -> Section:
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

    def identifier(self, key: str) -> str:
        """A required id (``edge_id``, ``node_id``, ``provider_id``) that is valid on the wire."""
        value = self.string(key, required=True)
        problem = id_problem(key, value)
        if problem:
            raise ConfigError(f"{self.field_path(key)}: {problem}")
        return value

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

    def digests(self, key: str) -> Digests:
        """Secrets checked for one id: a string or a list of strings, each a
        secret or ``sha256:<64 hex>``; only their digests are returned.

        Errors name the field, never the value.
        """
        value = self._data.get(key)
        if value is None or value == "":
            return ()
        values = value if isinstance(value, list) else [value]
        if len(values) > MAX_SECRETS_PER_ID:
            raise ConfigError(f"{self.field_path(key)}: at most {MAX_SECRETS_PER_ID} secrets per id")
        digests = []
        for item in values:
            if isinstance(item, bool) or not isinstance(item, (str, int)):
                raise ConfigError(f"{self.field_path(key)}: must be a secret, sha256:<hex>, or a list of them")
            try:
                digests.append(digest_of(str(item)))
            except SecretError as e:
                raise ConfigError(f"{self.field_path(key)}: {e}") from None
        return tuple(digests)

    def digest_map(self, key: str) -> dict[str, Digests]:
        """A mapping of ids to :meth:`digests` (``credentials: {id: secret}``)."""
        return _digest_map(self.section(key))

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


def _digest_map(section: Section) -> dict[str, Digests]:
    out: dict[str, Digests] = {}
    for peer_id in section._data:
        if not isinstance(peer_id, str):
            raise ConfigError(f"{section.field_path(str(peer_id))}: ids must be strings")
        digests = section.digests(peer_id)
        if not digests:
            raise ConfigError(f"{section.field_path(peer_id)}: must not be empty")
        out[peer_id] = digests
    return out


# -- secrets in files -------------------------------------------------------------


def _read_secret_text(path: str, field: str) -> str:
    """The text of a secrets file; a warning is logged when others may read it."""
    try:
        mode = os.stat(path).st_mode
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{field}: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{field}: {path} is not UTF-8 text") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        _log.warn(
            "{field}: {path} is readable by group or others (mode {mode}); run chmod 600 on it",
            field=field,
            path=path,
            mode=oct(stat.S_IMODE(mode)),
        )
    return text


def parse_secrets_file(section: Section, key: str) -> dict[str, Digests]:
    """Read the secrets file named by ``key`` (``credentials_file``), if set.

    The file is a YAML mapping ``id: secret`` (or ``sha256:<hex>``, or a
    list of them while a secret is rotated); only the digests are kept.
    """
    path = section.string(key)
    if not path:
        return {}
    field = section.field_path(key)
    text = _read_secret_text(path, field)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        # The parser's message may quote a line of the file, that is, a secret.
        raise ConfigError(f"{field}: {path} is not valid YAML") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{field}: {path} must be a mapping of id: secret")
    return _digest_map(Section(data, f"{field}[{path}]"))


def parse_checked_credentials(section: Section, key: str, file_key: str) -> dict[str, Digests]:
    """The credentials a listener checks: inline ``key`` plus ``file_key``'s file.

    An id may be given in one place only, so that what counts is never in doubt.
    """
    inline = section.digest_map(key)
    from_file = parse_secrets_file(section, file_key)
    for peer_id in sorted(set(inline) & set(from_file)):
        raise ConfigError(f"{section.field_path(key)}.{peer_id}: also given in {section.field_path(file_key)}")
    return {**inline, **from_file}


def parse_dialer_secret(section: Section, key: str, file_key: str) -> str:
    """The secret a dialling daemon sends: ``key`` itself or the first line of ``file_key``.

    It must be the secret, not a ``sha256:`` digest (the peer hashes what it
    receives, so sending a digest can never match).
    """
    secret = section.string(key)
    path = section.string(file_key)
    if secret and path:
        raise ConfigError(f"{section.field_path(key)}: give {key} or {file_key}, not both")
    field = section.field_path(key)
    if path:
        field = section.field_path(file_key)
        lines = _read_secret_text(path, field).splitlines()
        secret = lines[0].strip() if lines else ""
        if not secret:
            raise ConfigError(f"{field}: {path} is empty")
    if is_digest(secret):
        raise ConfigError(f"{field}: the dialling side must hold the secret itself, not its sha256: digest")
    return secret


# -- listeners of the framed wires: mutual TLS and failed hellos ------------------

#: Listen endpoint kinds a ``tls`` section can wrap (``ssl:`` already is TLS).
_TLS_WRAPPABLE = ("tcp:", "tcp6:", "unix:", "systemd:")


def parse_tls_listen(section: Section, key: str, listen: str) -> Optional[TLSListenConfig]:
    """Read a listener's ``tls`` section (``certificate``, ``private_key``, ``client_ca``), if any.

    Every file is read and checked now, so a missing file or a key that
    does not match the certificate fails start-up naming its field.
    """
    if not section.has(key):
        return None
    tls = section.section(key)
    tls.reject_unknown({"certificate", "private_key", "client_ca"})
    config = TLSListenConfig(
        certificate=tls.string("certificate", required=True),
        private_key=tls.string("private_key", required=True),
        client_ca=tls.string("client_ca", required=True),
    )
    if not listen.startswith(_TLS_WRAPPABLE):
        raise ConfigError(
            f"{section.field_path(key)}: needs a tcp: listen address (the tls section adds TLS), not {listen!r}"
        )
    try:
        server_tls_options(config)
    except TLSConfigError as e:
        raise ConfigError(f"{tls.field_path(e.field)}: {e}") from None
    return config


def parse_failed_hellos(section: Section) -> FailedHelloLimits:
    """Read a listener's ``failed_hellos`` section."""
    section.reject_unknown({"max_failures", "window_seconds", "cooldown_seconds", "max_addresses"})
    return FailedHelloLimits(
        max_failures=section.integer("max_failures", 10, minimum=1),
        window_seconds=section.number("window_seconds", 60.0),
        cooldown_seconds=section.number("cooldown_seconds", 300.0),
        max_addresses=section.integer("max_addresses", 10_000, minimum=1, maximum=10_000_000),
    )


# -- sections shared by edge.yaml and node.yaml -------------------------------


@attrs.frozen
class BackoffConfig:
    """Reconnect delays: exponential with full jitter between the bounds."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0


@attrs.frozen
class KeepaliveConfig:
    """Ping an idle peer after ``interval``; drop it after ``deadline``."""

    interval_seconds: float = 15.0
    deadline_seconds: float = 45.0


@attrs.frozen(kw_only=True)
class DialConfig:
    """How a daemon dials its peer on a framed wire and keeps the link up.

    The common part of ``control_plane`` in edge.yaml and ``edge`` in
    node.yaml; each daemon's section class adds its own settings.
    """

    address: str
    backoff: BackoffConfig = BackoffConfig()
    keepalive: KeepaliveConfig = KeepaliveConfig()
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    request_timeout_seconds: float = 10.0

    def peer_settings(self) -> PeerSettings:
        """Framing limits and deadlines of the connection to the peer."""
        return PeerSettings(
            max_frame_bytes=self.max_frame_bytes,
            keepalive_interval_seconds=self.keepalive.interval_seconds,
            keepalive_deadline_seconds=self.keepalive.deadline_seconds,
            request_timeout_seconds=self.request_timeout_seconds,
        )


def parse_backoff(section: Section) -> BackoffConfig:
    """Read a ``backoff`` section."""
    section.reject_unknown({"initial_seconds", "max_seconds"})
    initial = section.number("initial_seconds", 0.5)
    maximum = section.number("max_seconds", max(30.0, initial))
    if maximum < initial:
        raise ConfigError(f"{section.field_path('max_seconds')}: must be at least initial_seconds ({initial:g})")
    return BackoffConfig(initial_seconds=initial, max_seconds=maximum)


def parse_keepalive(section: Section) -> KeepaliveConfig:
    """Read a ``keepalive`` section."""
    section.reject_unknown({"interval_seconds", "deadline_seconds"})
    interval = section.number("interval_seconds", 15.0)
    deadline = section.number("deadline_seconds", max(45.0, interval * 3))
    if deadline <= interval:
        raise ConfigError(
            f"{section.field_path('deadline_seconds')}: must be greater than interval_seconds ({interval:g})"
        )
    return KeepaliveConfig(interval_seconds=interval, deadline_seconds=deadline)


def parse_max_frame_bytes(section: Section) -> int:
    """Read the ``max_frame_bytes`` of a framed-wire section (1 KiB to 256 MiB)."""
    return section.integer("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1024, maximum=256 * 1024 * 1024)


def parse_connect_setting(section: Section, key: str, default: str, environ: Mapping[str, str], variable: str) -> str:
    """A client endpoint: ``variable`` in ``environ`` if set, else ``key``."""
    override = _endpoint_override(environ, variable, connect_endpoint)
    return override if override is not None else section.connect(key, default)


def parse_listen_setting(section: Section, key: str, default: str, environ: Mapping[str, str], variable: str) -> str:
    """A listen endpoint: ``variable`` in ``environ`` if set, else ``key``."""
    override = _endpoint_override(environ, variable, listen_endpoint)
    return override if override is not None else section.listen(key, default)


def _endpoint_override(environ: Mapping[str, str], variable: str, parse: Callable[[str], str]) -> Optional[str]:
    value = environ.get(variable, "").strip()
    if not value:
        return None
    try:
        return parse(value)
    except EndpointError as e:
        # The environment wins over the file, so its errors name the variable.
        raise ConfigError(f"{variable}: {e}") from None


# -- lists and providers (edge.yaml and node.yaml) ------------------------------


def parse_unique_list(raw: Any, path: str, noun: str, id_key: str, parse: Callable[[Section], T]) -> tuple[T, ...]:
    """Read the list ``raw`` at ``path`` (``None`` is empty), each entry with ``parse``.

    No two entries may share the attribute ``id_key``; ``noun`` names the
    entries when ``raw`` is not a list.
    """
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: must be a list of {noun}")
    items: list[T] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        item = parse(Section(entry, f"{path}[{index}]"))
        item_id = getattr(item, id_key)
        if item_id in seen:
            raise ConfigError(f"{path}[{index}].{id_key}: {item_id!r} is listed twice")
        seen.add(item_id)
        items.append(item)
    return tuple(items)


def parse_provider_basics(section: Section, kinds: Sequence[str]) -> tuple[str, str, tuple[str, ...]]:
    """Read what every provider entry has: ``provider_id``, ``kind`` (one of ``kinds``), ``models``."""
    provider_id = section.identifier("provider_id")
    kind = section.string("kind", required=True)
    if kind not in kinds:
        raise ConfigError(f"{section.field_path('kind')}: must be one of {', '.join(kinds)}, not {kind!r}")
    models = section.string_list("models")
    if not models:
        raise ConfigError(f"{section.field_path('models')}: list at least one model")
    return provider_id, kind, tuple(models)
