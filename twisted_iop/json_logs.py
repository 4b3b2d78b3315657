"""JSON logs: one object per line, for log pipelines (Loki, ELK).

Every daemon switches to them with ``logging: {format: json}`` in its
config, or with twistd's own option, as a fully qualified name of an
observer factory::

    twistd -n --logger twisted_iop.json_logs.json_log_observer iop-control-plane --config ...

Each line is Twisted's :func:`~twisted.logger.eventAsJSON` of the event
(``log_format``, ``log_level``, ``log_namespace``, ``log_time``, our own
fields, a failure as ``log_failure`` with its traceback; a value JSON
cannot hold becomes ``{"unpersistable": true}`` instead of an exception),
written by :func:`~twisted.logger.jsonFileLogObserver` without its record
separator (``\\x1e``), so each line is one JSON document. Two members are
added for people reading the pipeline: ``text`` (the formatted message,
as the text log has it, with a failure's traceback) and ``level``
(``info``, ``warn`` ...).
"""

from __future__ import annotations

import sys
from typing import IO, Any, Optional

from twisted.logger import FileLogObserver, ILogObserver, LogEvent, eventAsText, jsonFileLogObserver
from twisted.python.logfile import LogFile
from zope.interface import implementer

#: The values of ``logging.format``.
TEXT = "text"
JSON = "json"
FORMATS = (TEXT, JSON)

#: Where :func:`json_log_observer` writes ("" or "-": stdout), set from
#: twistd's ``--logfile`` when the config chose JSON (twistd calls the
#: factory without arguments).
_logfile = ""


@implementer(ILogObserver)
class JsonLineObserver:
    """Twisted's JSON file observer, one JSON object per line, with ``text`` and ``level`` added."""

    def __init__(self, out: IO[Any]) -> None:
        self._observer: FileLogObserver = jsonFileLogObserver(out, recordSeparator="")

    def __call__(self, event: LogEvent) -> None:
        """Write ``event`` as one line (a copy gets ``text`` and ``level``; the event is not changed)."""
        extra: dict[str, Any] = {}
        if "text" not in event:
            extra["text"] = eventAsText(event, includeTimestamp=False, includeSystem=False)
        level = event.get("log_level")
        if "level" not in event and level is not None:
            extra["level"] = getattr(level, "name", str(level))
        self._observer(dict(event, **extra) if extra else event)


def log_to(logfile: Optional[str]) -> None:
    """Make :func:`json_log_observer` write to ``logfile`` ("" or "-": stdout)."""
    global _logfile
    _logfile = logfile or ""


def json_log_observer() -> ILogObserver:
    """The observer factory for twistd's ``--logger``: JSON lines to stdout (or the file set by :func:`log_to`)."""
    if _logfile in ("", "-"):
        return JsonLineObserver(sys.stdout)
    return JsonLineObserver(LogFile.fromFullPath(_logfile))


#: The name twistd's ``--logger`` takes for :func:`json_log_observer`.
JSON_OBSERVER_NAME = f"{__name__}.json_log_observer"
