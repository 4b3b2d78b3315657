"""What the three ``twistd`` plugins share: one command line, one start-up shape.

Each daemon's ``tap.py`` has an :class:`DaemonOptions` subclass (``--config``
and ``--check``) and a ``makeService`` that hands the parsed config to its
:class:`DaemonService` subclass. The config is read once, in
``postOptions``, before anything binds: a configuration error is one line on
stderr (``iop-edge: configs/edge.yaml: nodes[0].node_id: required``) and exit
code 1, and ``--check`` stops there with one ``configuration OK`` line.

A :class:`DaemonService` adds its state service first (so it starts first
and stops last), then its listeners (:mod:`twisted_iop.listeners`), then its
outbound links (:meth:`DaemonService.add_dialer`).

Every daemon stops the same way (SIGTERM: ``twistd`` waits for the Deferred
:meth:`DaemonService.stopService` returns): it stops accepting (listeners
closed, new work refused), lets the work in flight finish for up to
``shutdown.grace_seconds``, ends what is left with a terminal answer, says
``SHUTTING_DOWN`` to its peers and closes their connections, and only then
stops its services. Each daemon fills in the four steps
(:meth:`~DaemonService.stop_accepting`, :meth:`~DaemonService.in_flight`,
:meth:`~DaemonService.end_in_flight`, :meth:`~DaemonService.close_connections`).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Generic, Optional, TypeVar

from twisted.application.service import IService, MultiService
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred, succeed
from twisted.internet.interfaces import IProtocolFactory, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure

from twisted_iop import json_logs
from twisted_iop.configuration import ConfigError, LoggingConfig
from twisted_iop.eventloop.process_tuning import tune_garbage_collector
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.listeners import BindError, ListenerService
from twisted_iop.tls import TLSListenConfig
from twisted_iop.wire.dialer import DialingService

ConfigT = TypeVar("ConfigT")
#: How often a stop looks whether work in flight (or connections) are done.
STOP_POLL_SECONDS = 0.05
#: How long a stop waits for closed connections to be gone after their goodbye.
CLOSE_WAIT_SECONDS = 3.0
ServiceT = TypeVar("ServiceT", bound="DaemonService")


class StartupError(RuntimeError):
    """A service could not start (its state directory cannot be made ...): under ``twistd``
    the daemon exits with this one line, as when a listener cannot bind."""


class ConfigurationExit(SystemExit):
    """A configuration error under ``twistd``: its text goes to stderr, exit code 1.

    ``twistd`` prints its whole usage text for a ``UsageError``; a bad config
    file is not a usage mistake, so it ends the process with this instead.
    """


class DaemonOptions(usage.Options, Generic[ConfigT]):
    """``--config PATH`` and ``--check``; the config is loaded once, here.

    Subclasses set :attr:`daemon_name`, :attr:`sample_config`, their own
    ``optParameters`` (``config`` with its help text) and implement
    :meth:`load` and :meth:`summary`.
    """

    optFlags: ClassVar[list[list[Any]]] = [
        ["check", None, "Validate the configuration and exit: 0 and one OK line, or 1 and the error on stderr."],
    ]

    #: The plugin's name, the first word of every line it prints.
    daemon_name: ClassVar[str] = "twisted-iop"
    #: The sample config named when ``--config`` is required and missing;
    #: ``None`` means the daemon runs on embedded defaults without one.
    sample_config: ClassVar[Optional[str]] = None

    def load(self, path: Optional[str], environ: Mapping[str, str]) -> ConfigT:
        """Read and validate the config at ``path`` (raises ConfigError)."""
        raise NotImplementedError

    def summary(self, config: ConfigT) -> str:
        """A few words on what the config makes the daemon do (for ``--check``)."""
        raise NotImplementedError

    def notices(self, config: ConfigT) -> tuple[str, ...]:
        """Warnings about a valid config (deprecated spellings ...)."""
        return ()

    def check(self, config: ConfigT) -> str:
        """With ``--check``: what else the config names that must be usable
        (a file, a directory), in a few words; raises ConfigError if not."""
        return ""

    @property
    def config(self) -> ConfigT:
        """The parsed config (after ``parseOptions``)."""
        config: ConfigT = self["parsed_config"]
        return config

    def postOptions(self) -> None:
        """Load the config; on an error exit with one line; with ``--check`` stop."""
        path: Optional[str] = self["config"]
        if not path and self.sample_config is not None:
            raise ConfigurationExit(f"{self.daemon_name}: --config PATH is required (see {self.sample_config})")
        try:
            config = self.load(path or None, os.environ)
        except ConfigError as e:
            raise ConfigurationExit(f"{self.daemon_name}: {e}") from None
        self["parsed_config"] = config
        self._choose_log_format(config)
        if self["check"]:
            for notice in self.notices(config):
                sys.stderr.write(f"{self.daemon_name}: warning: {notice}\n")
            source = path or "embedded defaults"
            try:
                checked = self.check(config)
            except ConfigError as e:
                raise ConfigurationExit(f"{self.daemon_name}: {source}: {e}") from None
            summary = self.summary(config) + (f"; {checked}" if checked else "")
            sys.stdout.write(f"{self.daemon_name}: {source}: configuration OK ({summary})\n")
            sys.stdout.flush()
            raise SystemExit(0)

    def log_format(self, config: ConfigT) -> str:
        """``logging.format`` of the config: ``text`` or ``json``."""
        logging: Optional[LoggingConfig] = getattr(config, "logging", None)
        return logging.format if logging is not None else "text"

    def _choose_log_format(self, config: ConfigT) -> None:
        """With ``logging.format: json``, hand twistd the JSON observer (unless ``--logger`` chose one).

        twistd reads ``--logger`` after this (its own ``postOptions`` runs
        after the subcommand's) and calls the factory without arguments,
        so the file of ``--logfile`` is handed over beforehand.
        """
        twistd = getattr(self, "parent", None)
        if self.log_format(config) != json_logs.JSON or twistd is None or twistd.get("logger") is not None:
            return
        logfile = twistd.get("logfile") or ("" if twistd.get("nodaemon", True) else "twistd.log")
        json_logs.log_to(logfile)
        twistd["logger"] = json_logs.JSON_OBSERVER_NAME


def compose(
    options: DaemonOptions[ConfigT], reactor: Optional[Reactor], build: Callable[[ConfigT, Reactor], ServiceT]
) -> ServiceT:
    """The ``makeService`` of every daemon: ``build(config, reactor)`` for ``twistd``.

    ``reactor`` defaults to the global one; the service it builds exits
    with one clear line when a listener cannot bind.
    """
    if reactor is None:
        from twisted.internet import reactor as default_reactor

        reactor = default_reactor
    service = build(options.config, reactor)
    service.exit_on_bind_failure = True
    service.exit_zero_after_stop = True
    service.tune_gc = True
    for notice in options.notices(options.config):
        service.notices.append(notice)
    return service


def wait_until(clock: IReactorTime, done: Callable[[], bool], seconds: float) -> Deferred[bool]:
    """Fire with True once ``done()`` holds, or with False after ``seconds``.

    ``done`` is checked now (an idle daemon stops without a reactor turn)
    and then every :data:`STOP_POLL_SECONDS`.
    """
    if done():
        return succeed(True)
    result: Deferred[bool] = Deferred()
    deadline = clock.seconds() + seconds

    def check() -> None:
        finished = done()
        if finished or clock.seconds() >= deadline:
            loop.stop()
            result.callback(finished)

    loop = LoopingCall(check)
    loop.clock = clock
    loop.start(STOP_POLL_SECONDS, now=False)
    return result


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return (before, after).

    Every Edge (or Node) connection is a descriptor, and the usual soft
    limit (1024) is far below the fleets a daemon serves. Raising the soft
    limit up to the hard one needs no privilege; where even that is refused
    the limit stays as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        # Linux refuses an infinite soft limit for descriptors; nr_open caps it.
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            return soft, soft
    else:
        target = hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        return soft, soft
    return soft, target


class DaemonService(MultiService):
    """A daemon's top-level service: state first, then listeners, then links.

    Under ``twistd`` (``exit_on_bind_failure``) a listener that cannot bind
    ends the process with one clear line and exit code 1 instead of a
    traceback.
    """

    _log = Logger()
    #: The daemon's name in the exit line ("iop-control-plane").
    daemon_name = "twisted-iop"
    #: Set by :func:`compose`: under twistd a bind failure ends the process.
    exit_on_bind_failure = False
    #: Set by :func:`compose`: a stop that kept its promises exits 0, even on
    #: SIGTERM (``twistd`` otherwise ends by re-raising the signal).
    exit_zero_after_stop = False
    #: Set by :func:`compose`: at start, freeze what exists and raise the
    #: collector's thresholds (:func:`~twisted_iop.eventloop.process_tuning.tune_garbage_collector`).
    tune_gc = False

    def __init__(self, clock: IReactorTime, grace_seconds: float) -> None:
        super().__init__()
        self.clock = clock
        #: How long work in flight may take to finish once a stop began.
        self.grace_seconds = grace_seconds
        self.listeners: list[ListenerService] = []
        #: Warnings about the config, logged once at start-up.
        self.notices: list[str] = []
        #: Set from the first moment of a stop (readiness answers 503 then).
        self.stopping = False
        self._stopped: Optional[Deferred[Any]] = None
        self._stop_waiters: list[Deferred[None]] = []
        self._stop_clean = True

    def add_state(self, service: IService) -> None:
        """Add the service holding the daemon's state (first: starts first, stops last)."""
        service.setServiceParent(self)

    def add_listener(
        self,
        label: str,
        description: str,
        factory: IProtocolFactory,
        reactor: Reactor,
        tls: Optional[TLSListenConfig] = None,
    ) -> ListenerService:
        """Add a listener named ``label`` on the endpoint ``description`` (mutual TLS with ``tls``)."""
        listener = ListenerService(label, description, factory, reactor, tls)
        listener.setServiceParent(self)
        self.listeners.append(listener)
        return listener

    def add_dialer(self, name: str, dialer: DialingService) -> DialingService:
        """Add an outbound link (added last: it starts once state and listeners are up)."""
        dialer.setName(name)
        dialer.setServiceParent(self)
        return dialer

    def port(self, label: str) -> int:
        """The TCP port listener ``label`` was bound to (kept after a stop)."""
        for listener in self.listeners:
            if listener.label == label and listener.port_number:
                return listener.port_number
        raise KeyError(f"listener {label!r} has not been bound")

    def privilegedStartService(self) -> None:
        before, after = raise_open_file_limit()
        if after != before:
            self._log.info("open-file limit raised from {before} to {after}", before=before, after=after)
        try:
            super().privilegedStartService()
        except (BindError, StartupError) as e:
            if not self.exit_on_bind_failure:
                raise
            self._log.error("start-up failed: {error}", error=str(e))
            raise SystemExit(f"{self.daemon_name}: {e}") from None

    def exposures(self) -> list[str]:
        """Listeners reachable from other machines without authentication, in words."""
        return []

    def startService(self) -> None:
        for notice in self.notices:
            self._log.warn("configuration: {notice}", notice=notice)
        for exposure in self.exposures():
            self._log.warn("SECURITY WARNING: {exposure}", exposure=exposure)
        if self.tune_gc:
            # After privilegedStartService: what a daemon read back at start
            # (the Control Plane's store) is frozen with the rest.
            tune_garbage_collector()
        super().startService()

    # -- stopping ---------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Refuse new work (the listeners are closed right after this)."""

    def in_flight(self) -> int:
        """How much work is still in flight (0: drained)."""
        return 0

    def end_in_flight(self) -> None:
        """The grace period is over: give what is left a terminal answer now."""

    def close_connections(self) -> Optional[Deferred[Any]]:
        """Say ``SHUTTING_DOWN`` to the peers and close their connections."""
        return None

    def stopService(self) -> Deferred[None]:
        """Stop accepting, drain for up to the grace period, end the rest, close, stop.

        The Deferred fires once everything is closed (``twistd`` waits for
        it before the reactor stops); a second call returns a Deferred of
        the same end.
        """
        if self._stopped is not None:
            if self._stopped.called:
                return succeed(None)
            done: Deferred[None] = Deferred()
            self._stop_waiters.append(done)
            return done
        self.stopping = True
        self._log.info(
            "stopping: {count} in flight, up to {grace:g}s to finish",
            count=self.in_flight(),
            grace=self.grace_seconds,
        )
        self.stop_accepting()
        closed = [maybeDeferred(listener.stopService) for listener in self.listeners if listener.running]
        d: Deferred[Any] = wait_until(self.clock, lambda: self.in_flight() == 0, self.grace_seconds)
        d.addCallback(self._grace_over)
        d.addCallback(lambda _: self.close_connections())
        d.addErrback(self._stop_step_failed)
        d.addCallback(lambda _: gatherResults(closed))
        d.addErrback(self._stop_step_failed)
        d.addCallback(lambda _: MultiService.stopService(self))
        d.addCallback(self._stop_done)
        self._stopped = d
        return d

    def _stop_done(self, _: object) -> None:
        self._log.info("stopped")
        if self.exit_zero_after_stop and self._stop_clean and hasattr(self.clock, "_exitSignal"):
            # twistd reads this after the reactor stops and kills itself with
            # the signal; a completed graceful stop is a clean exit instead.
            self.clock._exitSignal = None
        waiters, self._stop_waiters = self._stop_waiters, []
        for waiter in waiters:
            waiter.callback(None)

    def _grace_over(self, drained: bool) -> None:
        if not drained:
            self._log.warn(
                "the grace period of {grace:g}s is over with {count} still in flight; ending them",
                grace=self.grace_seconds,
                count=self.in_flight(),
            )
        self.end_in_flight()

    def _stop_step_failed(self, failure: Failure) -> None:
        self._stop_clean = False
        self._log.failure("a step of the graceful stop failed; stopping anyway", failure)
