"""Shared pieces of config parsing: YAML loading, typed field readers and
the sections every daemon that speaks a framed wire has in common.

Each daemon's ``config.py`` turns one YAML document into frozen attrs
classes with these readers, so that every bad value is reported with the
dotted path of its field (``edge_wire.max_frame_bytes: must be ...``).
Nothing outside the ``config`` modules imports yaml. Whether an endpoint
string is usable is :mod:`twisted_iop.endpoints`' to say.
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
from twisted_iop.endpoints import check_connect_endpoint, check_listen_endpoint
from twisted_iop.ids import id_problem
from twisted_iop.tls import TLSConfigError, TLSListenConfig, server_tls_options
from twisted_iop.wire import DEFAULT_MAX_FRAME_BYTES
from twisted_iop.wire.limits import FailedHelloLimits
from twisted_iop.wire.settings import BackoffConfig, KeepaliveConfig

T = TypeVar("T")
C = TypeVar("C")

_log = Logger()

#: At most this many secrets may be valid for one id at once (rotation).
MAX_SECRETS_PER_ID = 4


class ConfigError(ValueError):
    """A config file or value that cannot be used; the text names the field.

    Once read from a file (:func:`load_config`) the text starts with the
    file's path: ``configs/edge.yaml: nodes[0].node_id: required``.
    """


class EnvironmentConfigError(ConfigError):
    """A bad value in an environment variable: the text names the variable
    (and the setting it overrides), never the file."""


def load_yaml_mapping(path: Optional[str]) -> dict[str, Any]:
    """Read ``path`` as a YAML mapping; ``None`` gives an empty mapping."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the config file: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: cannot read the config file: it is not UTF-8 text") from None
    return parse_yaml_mapping(text, source=path)


def load_config(
    path: Optional[str],
    environ: Optional[Mapping[str, str]],
    parse: Callable[[Mapping[str, Any], Mapping[str, str]], C],
) -> C:
    """Read the YAML file at ``path`` with ``parse``, remembering ``source_path``.

    Environment overrides come from ``environ``, or from the process's
    environment when it is ``None``. Errors name the file (or the
    environment variable) and the dotted field.
    """
    data = load_yaml_mapping(path)
    try:
        config = parse(data, environ if environ is not None else os.environ)
    except EnvironmentConfigError:
        raise
    except ConfigError as e:
        if path is None:
            raise
        raise ConfigError(f"{path}: {e}") from None
    # mypy's attrs plugin cannot check evolve() on a type variable.
    return cast("C", attrs.evolve(cast(Any, config), source_path=path))


def parse_yaml_mapping(text: str, source: str = "<config>") -> dict[str, Any]:
    """Parse ``text`` as a YAML mapping (an empty document is ``{}``).

    A syntax error is one line naming ``source``, the line and the column.
    """
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = " ".join(str(e.problem or e.context or "syntax error").split())
        raise ConfigError(f"{source}: {where}not valid YAML: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections")
    return data


def _shown(value: Any) -> str:
    """``value`` as an error message quotes it (bounded)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Section:
    """A mapping being read, with the dotted path used in error messages."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path or 'config'}: must be a mapping")
        self._data = data
        self._path = path

    @property
    def path(self) -> str:
        """The dotted path of this section."""
        return self._path

    def field_path(self, key: str) -> str:
        """The dotted path of ``key`` in this section."""
        return f"{self._path}.{key}" if self._path else key

    def reject_unknown(self, known: set[str]) -> None:
        """Fail on keys that are not in ``known`` (typos must not pass)."""
        unknown = sorted(str(k) for k in self._data if k not in known)
        if unknown:
            raise ConfigError(f"{self.field_path(unknown[0])}: unknown setting (known: {', '.join(sorted(known))})")

    def present_keys(self) -> list[str]:
        """The keys present, in the file's order."""
        return [str(key) for key in self._data]

    def has(self, key: str) -> bool:
        """Whether ``key`` is present."""
        return key in self._data

    def raw(self, key: str, default: Any = None) -> Any:
        """The raw value of ``key``."""
        return self._data.get(key, default)

    def names(self) -> list[str]:
        """The keys present (a section whose keys are names, not settings)."""
        return [str(key) for key in self._data]

    def mapping(self) -> Mapping[str, Any]:
        """The raw mapping (for a parser of its own that names fields itself)."""
        return self._data

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
            raise ConfigError(f"{self.field_path(key)}: must be a string, not {_shown(value)}")
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
            raise ConfigError(f"{self.field_path(key)}: must be true or false, not {_shown(value)}")
        return value

    def integer(self, key: str, default: int, minimum: int = 0, maximum: Optional[int] = None) -> int:
        """A whole number within bounds."""
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.field_path(key)}: must be a whole number, not {_shown(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
            raise ConfigError(f"{self.field_path(key)}: must be {bound}, not {value}")
        return value

    def number(self, key: str, default: float, minimum: float = 0.0, exclusive_minimum: bool = True) -> float:
        """A number (seconds, usually) above a bound."""
        value = self._data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.field_path(key)}: must be a number, not {_shown(value)}")
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
        """A listen endpoint (Twisted string, ``host:port`` or ``:port``).

        It is checked as far as Twisted can without binding: every
        parameter, the port's range, an ``ssl:`` key and certificate.
        """
        value = self.string(key, default)
        problem, description = check_listen_endpoint(value)
        if problem is not None:
            raise ConfigError(f"{self.field_path(key)}: {problem}")
        return description

    def connect(self, key: str, default: str = "", required: bool = False) -> str:
        """A client endpoint (Twisted string or ``host:port``), checked without connecting."""
        value = self.string(key, default, required=required)
        problem, description = check_connect_endpoint(value)
        if problem is not None:
            raise ConfigError(f"{self.field_path(key)}: {problem}")
        return description


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


#: Seconds a daemon lets work in flight finish after SIGTERM (``shutdown.grace_seconds``).
DEFAULT_GRACE_SECONDS = 10.0
#: The longest grace a config may ask for (systemd's stop timeout must exceed it).
MAX_GRACE_SECONDS = 600.0


@attrs.frozen
class ShutdownConfig:
    """Section ``shutdown`` of every daemon's YAML: how a stop drains."""

    #: How long work in flight may take to finish before it is ended.
    grace_seconds: float = DEFAULT_GRACE_SECONDS


def parse_shutdown(section: Section) -> ShutdownConfig:
    """Read a ``shutdown`` section (``grace_seconds``: 0 to 600, 0 ends work at once)."""
    section.reject_unknown({"grace_seconds"})
    grace = section.number("grace_seconds", DEFAULT_GRACE_SECONDS, minimum=0.0, exclusive_minimum=False)
    if grace > MAX_GRACE_SECONDS:
        raise ConfigError(
            f"{section.field_path('grace_seconds')}: must be at most {MAX_GRACE_SECONDS:g}, not {grace:g}"
        )
    return ShutdownConfig(grace_seconds=grace)


@attrs.frozen
class LoggingConfig:
    """Section ``logging`` of every daemon's YAML: how its log lines are written."""

    #: ``text`` (twistd's lines) or ``json`` (one JSON object per line).
    format: str = "text"


def parse_logging(section: Section) -> LoggingConfig:
    """Read a ``logging`` section (``format``: ``text`` or ``json``)."""
    section.reject_unknown({"format"})
    value = section.string("format", "text")
    if value not in ("text", "json"):
        raise ConfigError(f"{section.field_path('format')}: must be text or json, not {value[:40]!r}")
    return LoggingConfig(format=value)


def parse_max_frame_bytes(section: Section) -> int:
    """Read the ``max_frame_bytes`` of a framed-wire section (1 KiB to 256 MiB)."""
    return section.integer("max_frame_bytes", DEFAULT_MAX_FRAME_BYTES, minimum=1024, maximum=256 * 1024 * 1024)


def parse_max_hello_frame_bytes(section: Section, max_frame_bytes: int) -> int:
    """Read ``max_hello_frame_bytes`` of an accepting wire (256 bytes up to ``max_frame_bytes``)."""
    return section.integer(
        "max_hello_frame_bytes", min(64 * 1024, max_frame_bytes), minimum=256, maximum=max_frame_bytes
    )


def parse_max_violations(section: Section) -> int:
    """Read ``max_violations`` of a wire section: refused messages before a peer is closed."""
    return section.integer("max_violations", 10, minimum=1, maximum=10_000)


def parse_connect_setting(section: Section, key: str, default: str, environ: Mapping[str, str], variable: str) -> str:
    """A client endpoint: ``variable`` in ``environ`` if set, else ``key``."""
    override = _endpoint_override(environ, variable, section.field_path(key), check_connect_endpoint)
    return override if override is not None else section.connect(key, default)


def parse_listen_setting(section: Section, key: str, default: str, environ: Mapping[str, str], variable: str) -> str:
    """A listen endpoint: ``variable`` in ``environ`` if set, else ``key``."""
    override = _endpoint_override(environ, variable, section.field_path(key), check_listen_endpoint)
    return override if override is not None else section.listen(key, default)


def parse_metrics_listen(section: Section, default: str, environ: Mapping[str, str], variable: str) -> str:
    """Section ``metrics``: its ``listen`` endpoint, ``""`` when the listener is off.

    ``variable`` in ``environ`` overrides the file; ``listen: ""`` in the
    file disables the listener.
    """
    section.reject_unknown({"listen"})
    override = _endpoint_override(environ, variable, section.field_path("listen"), check_listen_endpoint)
    if override is not None:
        return override
    if section.has("listen") and not section.string("listen").strip():
        return ""
    return section.listen("listen", default)


def _endpoint_override(
    environ: Mapping[str, str], variable: str, field: str, check: Callable[[str], tuple[Optional[str], str]]
) -> Optional[str]:
    value = environ.get(variable, "").strip()
    if not value:
        return None
    problem, description = check(value)
    if problem is not None:
        # The environment wins over the file, so its errors name the variable.
        raise EnvironmentConfigError(f"environment variable {variable} (overrides {field}): {problem}")
    return description


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


#: Provider kinds served over HTTP by an inference engine (each has an
#: engine adapter on the Node: ``twisted_iop.node.engines``).
HTTP_PROVIDER_KINDS = ("openai", "vllm", "sglang", "llamacpp", "tgi", "ollama")
#: Every provider kind a Node can host (``mock`` runs inside the Node).
PROVIDER_KINDS = (*HTTP_PROVIDER_KINDS, "mock")


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
