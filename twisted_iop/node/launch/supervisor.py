"""The Node runs its engines: start, readiness, restart with backoff, logs, stop.

:class:`EngineSupervisor` is the one owner of every launched engine's
state (the ``launch`` blocks of node.yaml). Per engine a
:class:`LaunchedEngine` feeds its pure
:class:`~twisted_iop.node.launch.lifecycle.EngineLifecycle` with what
happens (its process spawned or exited, its readiness answered, its
timer due, an operator's ask) and does what the rules say (spawn, signal,
kill), keeping one timer and at most one readiness check at a time.

* **Readiness**: while ``starting`` or ``loading`` the engine is asked
  every ``readiness.interval_seconds``: by default the adapter's own check
  (the probe of its kind: health endpoint, then models list), so
  llama.cpp's 503 "Loading model", a vLLM ``/health`` that is not 200 yet
  or a port not yet bound is ``loading``, with the probe's reason.
  Once ready, the runtime's periodic probes take over its health.
* **Pidfiles** (:mod:`~twisted_iop.node.launch.pidfiles`): one per
  running engine in the state directory. At start, an engine an earlier
  Node left running (its pidfile and its command line match) is stopped
  before ours starts; a stale pidfile is removed.
* **Commands** (the Edge's ``provider.*``): run by
  :mod:`~twisted_iop.node.launch.commands` on the engine
  :meth:`EngineSupervisor.commanded` names (drain, restart, stop, start,
  logs), through the same lifecycle rules.
* **Stop**: when the Node stops, after its requests in flight had their
  grace, every engine gets its stop signal and SIGKILL after its stop
  timeout; :meth:`EngineSupervisor.stopService` fires once all exited.

The listener (the runtime) hears of every change of state at once, so
the Edge stops leasing a provider the moment its engine is not ready.
Reasons name the engine by its provider id only: never its command,
environment or address.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Optional, Protocol, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorProcess
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from twisted_iop.daemon import StartupError, wait_until
from twisted_iop.eventloop.reactor_types import Reactor
from twisted_iop.node.config import NodeProviderConfig
from twisted_iop.node.engines.probes import ProbeResult
from twisted_iop.node.launch.lifecycle import STARTING_STATES, Do, EngineLifecycle, EngineState, Exit
from twisted_iop.node.launch.logs import LogTail
from twisted_iop.node.launch.pidfiles import EngineRecord, PidfileDirectory, is_recorded_engine, process_start_ticks
from twisted_iop.node.launch.process import (
    EngineProcessProtocol,
    kill_group_members,
    launcher_argv,
    process_gone,
    signal_group,
    spawn_engine,
)
from twisted_iop.node.launch.readiness import ReadinessAnswer, ReadinessCheck, failed_check
from twisted_iop.wire import control_pb2 as pb

#: How often a leftover engine (not our child) is looked at while it stops.
LEFTOVER_POLL_SECONDS = 0.1
#: How long a stopping engine may take to be gone after SIGKILL before the Node gives up on it.
KILL_GRACE_SECONDS = 5.0


#: Lifecycle states as the wire spells them.
WIRE_STATES = {
    EngineState.STARTING: pb.ENGINE_STATE_STARTING,
    EngineState.LOADING: pb.ENGINE_STATE_LOADING,
    EngineState.READY: pb.ENGINE_STATE_READY,
    EngineState.DRAINING: pb.ENGINE_STATE_DRAINING,
    EngineState.STOPPING: pb.ENGINE_STATE_STOPPING,
    EngineState.CRASHED: pb.ENGINE_STATE_CRASHED,
    EngineState.STOPPED: pb.ENGINE_STATE_STOPPED,
    EngineState.FAILED: pb.ENGINE_STATE_FAILED,
}


class LaunchListener(Protocol):
    """Who hears of every change of a launched engine's state (the runtime)."""

    def launch_changed(self, provider_id: str, ready_probe: Optional[ProbeResult]) -> None:
        """``provider_id``'s engine changed state; ``ready_probe`` is the probe that found it ready."""


class NotLaunched(Exception):
    """No engine of that provider is launched by this Node."""


class LaunchedEngine:
    """One provider's engine: its lifecycle, process, timer, readiness checks and tail."""

    _log = Logger()

    def __init__(self, supervisor: EngineSupervisor, provider: NodeProviderConfig) -> None:
        assert provider.launch is not None
        self.supervisor = supervisor
        self.provider = provider
        launch = provider.launch
        self.lifecycle = EngineLifecycle(
            launch.restart, launch.readiness.start_timeout_seconds, launch.stop.timeout_seconds, self._now()
        )
        self.tail = LogTail(launch.logs.tail_bytes)
        self.protocol: Optional[EngineProcessProtocol] = None
        #: The running engine's pid (ours, or a leftover being stopped).
        self.pid: Optional[int] = None
        self._leftover = False
        self._leftover_poll: Optional[LoopingCall] = None
        #: Counts spawns, so a late readiness answer of an earlier process is ignored.
        self.generation = 0
        self._timer: Optional[IDelayedCall] = None
        self._check_call: Optional[IDelayedCall] = None
        self._checking = False
        self._shown: Optional[tuple[Any, ...]] = None
        self._waiters: list[tuple[Callable[[], bool], Deferred[bool]]] = []
        #: Set when the provider left the configuration: it is dropped once stopped.
        self.retired = False
        #: Output lines kept out of the Node's log by the rate limit, by processes that ended.
        self._suppressed_before = 0
        #: Periodic probes in a row that found this ready engine down (its liveness).
        self._failed_probes = 0

    @property
    def provider_id(self) -> str:
        """The provider whose engine this is."""
        return self.provider.provider_id

    @property
    def suppressed_lines(self) -> int:
        """Output lines the rate limit kept out of the Node's log, over every process of this engine."""
        current = self.protocol.limit.suppressed_total if self.protocol is not None else 0
        return self._suppressed_before + current

    def _now(self) -> float:
        return float(self.supervisor.clock.seconds())

    # -- starting -------------------------------------------------------------------

    def begin(self) -> None:
        """The first start: a copy an earlier Node left running is stopped first."""
        pidfiles = self.supervisor.pidfiles
        record, present = pidfiles.read(self.provider_id)
        assert self.provider.launch is not None
        if record is not None and is_recorded_engine(record, also=launcher_argv(record.argv)):
            self._log.warn(
                "provider {provider_id}: its engine from an earlier Node still runs (pid {pid}); stopping it first",
                provider_id=self.provider_id,
                pid=record.pid,
            )
            self.pid = record.pid
            self._leftover = True
            self.act(
                self.lifecycle.leftover(
                    self._now(), f"stopping the engine an earlier Node left running (pid {record.pid})"
                )
            )
            poll = self._leftover_poll = LoopingCall(self._poll_leftover)
            poll.clock = self.supervisor.clock
            poll.start(LEFTOVER_POLL_SECONDS, now=False)
            return
        if present:
            self._log.info(
                "provider {provider_id}: removing a stale pidfile (its process is gone or another one)",
                provider_id=self.provider_id,
            )
            pidfiles.remove(self.provider_id)
        self.act(self.lifecycle.start(self._now(), "started by the Node"))

    def _poll_leftover(self) -> None:
        if self.pid is not None and process_gone(self.pid):
            self._stop_leftover_poll()
            self._log.info(
                "provider {provider_id}: the earlier engine (pid {pid}) is gone",
                provider_id=self.provider_id,
                pid=self.pid,
            )
            self.pid = None
            self._leftover = False
            self.supervisor.pidfiles.remove(self.provider_id)
            self.act(self.lifecycle.exited(self._now(), Exit()))

    def _stop_leftover_poll(self) -> None:
        if self._leftover_poll is not None and self._leftover_poll.running:
            self._leftover_poll.stop()
        self._leftover_poll = None

    # -- doing what the rules say -----------------------------------------------------

    def act(self, actions: Iterable[Do], ready_probe: Optional[ProbeResult] = None) -> None:
        """Carry out ``actions``, then arrange the timer and checks and tell the listener."""
        pending = list(actions)
        while pending:
            action = pending.pop(0)
            if action is Do.SPAWN:
                pending.extend(self._spawn())
            elif action is Do.SIGNAL:
                assert self.provider.launch is not None
                self._signal(self.provider.launch.stop.signal_number)
            elif action is Do.KILL:
                self._log.warn(
                    "provider {provider_id}: its engine did not stop within {seconds:g}s; killing it",
                    provider_id=self.provider_id,
                    seconds=self.lifecycle.stop_timeout,
                )
                self._signal(signal.SIGKILL)
        self._arrange()
        self._changed(ready_probe)

    def _spawn(self) -> list[Do]:
        launch = self.provider.launch
        assert launch is not None
        supervisor = self.supervisor
        self.generation += 1
        protocol = EngineProcessProtocol(
            self.provider_id, launch, supervisor.clock, self.tail, lambda how: self._exited(protocol, how), _ENGINE_LOG
        )
        try:
            # The running reactor spawns processes (Twisted types the global one
            # with IReactorProcess); Reactor leaves it out so MemoryReactorClock fits.
            spawner = cast(IReactorProcess, supervisor.reactor)
            pid = spawn_engine(spawner, launch, protocol, supervisor.environ, supervisor.stdin_fd())
        except OSError as e:
            reason = e.strerror or str(e)
            self._log.error(
                "provider {provider_id}: its engine cannot be started: {reason}",
                provider_id=self.provider_id,
                reason=reason,
            )
            return self.lifecycle.spawn_failed(self._now(), reason)
        self.protocol = protocol
        self.pid = pid
        self._log.info(
            "provider {provider_id}: engine started (pid {pid}): {why}",
            provider_id=self.provider_id,
            pid=pid,
            why=self.lifecycle.reason,
        )
        record = EngineRecord(self.provider_id, pid, launch.command, process_start_ticks(pid))
        try:
            supervisor.pidfiles.write(record)
        except OSError as e:
            self._log.warn(
                "provider {provider_id}: cannot write its pidfile: {error}", provider_id=self.provider_id, error=str(e)
            )
        return []

    def _signal(self, number: int) -> None:
        if self.pid is None:
            return
        if not signal_group(self.pid, number):
            self._log.warn(
                "provider {provider_id}: could not signal its engine (pid {pid})",
                provider_id=self.provider_id,
                pid=self.pid,
            )

    def _exited(self, protocol: EngineProcessProtocol, how: Exit) -> None:
        if protocol is not self.protocol:
            return
        self._suppressed_before += protocol.limit.suppressed_total
        self.protocol = None
        pid = self.pid
        self.pid = None
        if pid is not None:
            kill_group_members(pid)  # its workers do not outlive it
        self.supervisor.pidfiles.remove(self.provider_id)
        asked = self.lifecycle.state is EngineState.STOPPING
        emit = self._log.info if asked else self._log.warn
        emit(
            "provider {provider_id}: engine (pid {pid}) {how}{asked}",
            provider_id=self.provider_id,
            pid=pid,
            how=how.reason,
            asked="" if asked else " (not asked to stop)",
        )
        protocol.stop_notes()
        self.act(self.lifecycle.exited(self._now(), how))

    def _arrange(self) -> None:
        """One timer for the state's deadline; readiness checks while starting or loading."""
        clock = self.supervisor.clock
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        deadline = self.lifecycle.deadline
        if deadline is not None and not self.supervisor.stopped:
            self._timer = clock.callLater(max(0.0, deadline - self._now()), self._due)
        starting = self.lifecycle.state in STARTING_STATES and self.protocol is not None
        if not starting and self._check_call is not None:
            if self._check_call.active():
                self._check_call.cancel()
            self._check_call = None
        elif starting and self._check_call is None and not self._checking:
            assert self.provider.launch is not None
            self._check_call = clock.callLater(self.provider.launch.readiness.interval_seconds, self._check)

    def _due(self) -> None:
        self._timer = None
        self.act(self.lifecycle.timer_due(self._now()))

    def _check(self) -> None:
        self._check_call = None
        if self.lifecycle.state not in STARTING_STATES:
            return
        self._checking = True
        generation = self.generation
        d = self.supervisor.check(self.provider)
        d.addErrback(failed_check)
        d.addCallback(self._checked, generation)

    def _checked(self, answer: ReadinessAnswer, generation: int) -> None:
        self._checking = False
        if generation != self.generation or self.lifecycle.state not in STARTING_STATES:
            self._arrange()
            return
        self.act(
            self.lifecycle.readiness(self._now(), answer.ready, answer.reason),
            answer.result if answer.ready else None,
        )

    # -- what others see --------------------------------------------------------------

    def report(self) -> pb.EngineLaunch:
        """The engine's state as the wire carries it (the Node's clock in ms)."""
        lifecycle = self.lifecycle
        return pb.EngineLaunch(
            state=WIRE_STATES[lifecycle.state],
            reason=lifecycle.reason,
            restarts=lifecycle.restarts,
            next_try_at_ms=int(lifecycle.next_try_at * 1000) if lifecycle.next_try_at is not None else 0,
            since_ms=int(lifecycle.since * 1000),
            pid=(self.pid or 0) if lifecycle.running else 0,
        )

    def _changed(self, ready_probe: Optional[ProbeResult]) -> None:
        lifecycle = self.lifecycle
        shown = (lifecycle.state, lifecycle.reason, lifecycle.restarts, lifecycle.next_try_at, self.pid)
        if shown == self._shown:
            return
        before = self._shown[0].value if self._shown is not None else "new"
        self._shown = shown
        if before != lifecycle.state.value:
            self._log.info(
                "provider {provider_id} engine {before} -> {after}{reason}",
                provider_id=self.provider_id,
                before=before,
                after=lifecycle.state.value,
                reason=f": {lifecycle.reason}" if lifecycle.reason else "",
            )
        listener = self.supervisor.listener
        if listener is not None:
            listener.launch_changed(self.provider_id, ready_probe)
        # After the listener: whoever waits (a command's answer) sees what the Edge was told.
        waiters, self._waiters = self._waiters, []
        for done, waiter in waiters:
            if done():
                waiter.callback(True)
            else:
                self._waiters.append((done, waiter))
        if self.retired and not lifecycle.running:
            self.supervisor.forget(self)

    def probed(self, alive: bool, reason: str) -> None:
        """A periodic probe's verdict on the engine while it is ready (its liveness)."""
        assert self.provider.launch is not None
        limit = self.provider.launch.liveness.failures
        if alive or self.lifecycle.state is not EngineState.READY or not limit:
            self._failed_probes = 0
            return
        self._failed_probes += 1
        if self._failed_probes < limit:
            return
        self._failed_probes = 0
        self._log.warn(
            "provider {provider_id}: {count} health checks in a row failed ({reason}); restarting its engine",
            provider_id=self.provider_id,
            count=limit,
            reason=reason,
        )
        self.act(self.lifecycle.unresponsive(self._now(), f"not alive: {limit} health checks failed ({reason})"))

    def wait_for(self, done: Callable[[], bool], seconds: float) -> Deferred[bool]:
        """Fire with True as soon as ``done()`` holds after a change (or now), False after ``seconds``."""
        if done():
            return succeed(True)
        waiter: Deferred[bool] = Deferred()
        entry = (done, waiter)
        self._waiters.append(entry)

        def expired() -> None:
            if entry in self._waiters:
                self._waiters.remove(entry)
                waiter.callback(False)

        self.supervisor.clock.callLater(max(0.0, seconds), expired)
        return waiter

    def close(self) -> None:
        """Cancel its timers (the Node stops)."""
        for call in (self._timer, self._check_call):
            if call is not None and call.active():
                call.cancel()
        self._timer = self._check_call = None
        self._stop_leftover_poll()


def _not_running(engine: LaunchedEngine) -> Callable[[], bool]:
    return lambda: not engine.lifecycle.running


#: The logger engines' output lines are written with (namespace ``iop.engine``).
_ENGINE_LOG = Logger(namespace="iop.engine")


class EngineSupervisor(Service):
    """Every engine this Node launches (see the module docstring).

    ``reactor`` spawns the processes and is the clock; ``check`` asks an
    engine whether it is ready; ``running_on`` counts this Node's requests
    on a provider (for drains).
    """

    _log = Logger()
    name = "engines"

    def __init__(
        self,
        providers: Iterable[NodeProviderConfig],
        state_directory: str,
        reactor: Reactor,
        check: ReadinessCheck,
        running_on: Callable[[str], int] = lambda provider_id: 0,
        environ: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.reactor = reactor
        self.clock = reactor
        self.check = check
        self.running_on = running_on
        self.environ: Mapping[str, str] = os.environ if environ is None else environ
        self.pidfiles = PidfileDirectory(state_directory)
        self.listener: Optional[LaunchListener] = None
        self.engines: dict[str, LaunchedEngine] = {}
        self._configured = tuple(p for p in providers if p.launch is not None)
        self._stdin: Optional[int] = None
        #: Set when the Node's stop began: engines are not started again, commands are refused.
        self.stopping = False
        #: Set once every engine was stopped.
        self.stopped = False
        #: Set when deployments may start engines here (node.yaml declares ``engines:``).
        self.launches_instances = False
        #: How long an engine no longer wanted may finish its requests in flight before it stops (0: none).
        self.retire_drain_seconds = 0.0

    # -- the service ------------------------------------------------------------------

    def privilegedStartService(self) -> None:
        """Create the state directory (a failure stops start-up with one line)."""
        if self._configured or self.launches_instances:
            try:
                self.pidfiles.prepare()
            except OSError as e:
                raise StartupError(
                    f"state_directory {self.pidfiles.path}: cannot keep the engines' pidfiles there: {e.strerror or e}"
                ) from None
        super().privilegedStartService()

    def startService(self) -> None:
        """Start every launched engine (after stopping any an earlier Node left)."""
        super().startService()
        self.stopped = self.stopping = False
        self.configure(self._configured)

    def stopService(self) -> Deferred[None]:
        """Stop every engine; fire once all exited (each within its stop timeout, then SIGKILL)."""
        super().stopService()
        self.stopping = True
        now = self.clock.seconds()
        waits = []
        longest = 0.0
        for engine in list(self.engines.values()):
            engine.act(engine.lifecycle.stop(now, "the Node is stopping"))
            longest = max(longest, engine.lifecycle.stop_timeout)
            waits.append(engine.wait_for(_not_running(engine), longest + KILL_GRACE_SECONDS))

        def done(_: object) -> None:
            self.stopped = True
            for engine in self.engines.values():
                engine.close()
                if engine.lifecycle.running:
                    self._log.error(
                        "provider {provider_id}: its engine (pid {pid}) did not exit after SIGKILL",
                        provider_id=engine.provider_id,
                        pid=engine.pid,
                    )
            if self._stdin is not None:
                os.close(self._stdin)
                self._stdin = None

        return DeferredList(waits, consumeErrors=True).addCallback(done)

    def stdin_fd(self) -> int:
        """A descriptor of ``/dev/null``, the engines' stdin."""
        if self._stdin is None:
            self._stdin = os.open(os.devnull, os.O_RDONLY)
        return self._stdin

    # -- the configuration --------------------------------------------------------------

    def configure(self, providers: Iterable[NodeProviderConfig]) -> None:
        """Take the providers (at start, or re-read): engines of new ones start, of removed
        ones stop; a changed ``launch`` block applies from the engine's next start."""
        launched = {p.provider_id: p for p in providers if p.launch is not None}
        self._configured = tuple(launched.values())
        if not self.running or self.stopping:
            return
        now = self.clock.seconds()
        for provider_id, engine in list(self.engines.items()):
            if provider_id not in launched and not engine.retired:
                engine.retired = True
                self._retire(engine, now, "no longer launched by this Node's configuration")
        for provider_id, provider in launched.items():
            known = self.engines.get(provider_id)
            if known is None:
                engine = self.engines[provider_id] = LaunchedEngine(self, provider)
                engine.begin()
            else:
                known.provider = provider
                if known.retired:
                    # Asked for again while it stops: it starts again once stopped.
                    known.retired = False
                    known.act(known.lifecycle.restart(now, "asked for again"))

    def _retire(self, engine: LaunchedEngine, now: float, reason: str) -> None:
        """Stop a retired engine: after a drain of its requests in flight (``retire_drain_seconds``)."""
        provider_id = engine.provider_id
        in_flight = self.running_on(provider_id)
        drain = self.retire_drain_seconds
        if (
            not in_flight
            or drain <= 0
            or not engine.lifecycle.drain(now, f"{reason}: waiting for {in_flight} requests")
        ):
            engine.act(engine.lifecycle.stop(now, reason))
            return
        engine.act([])

        def drained(_: bool) -> None:
            if engine.retired and self.engines.get(provider_id) is engine:
                engine.act(engine.lifecycle.stop(self.clock.seconds(), reason))

        wait_until(
            self.clock,
            lambda: self.running_on(provider_id) == 0 or engine.lifecycle.state is not EngineState.DRAINING,
            drain,
        ).addCallback(drained)

    def restart(self, provider_id: str, reason: str, drain_seconds: float = 0.0) -> None:
        """Stop ``provider_id``'s engine and start it again with its provider's current ``launch``.

        With ``drain_seconds``, a ready engine running requests is ``draining`` first (the Edge
        leases it nothing new) until they finished or that long passed.
        """
        engine = self.engines.get(provider_id)
        if engine is None or not self.running or self.stopping:
            return
        now = self.clock.seconds()
        in_flight = self.running_on(provider_id)
        if drain_seconds <= 0 or not in_flight:
            engine.act(engine.lifecycle.restart(now, reason))
            return
        if not engine.lifecycle.drain(now, f"{reason}: waiting for {in_flight} requests in flight"):
            engine.act(engine.lifecycle.restart(now, reason))
            return
        engine.act([])

        def drained(_: bool) -> None:
            if self.engines.get(provider_id) is engine and self.running and not self.stopping:
                engine.act(engine.lifecycle.restart(self.clock.seconds(), reason))

        wait_until(
            self.clock,
            lambda: self.running_on(provider_id) == 0 or engine.lifecycle.state is not EngineState.DRAINING,
            drain_seconds,
        ).addCallback(drained)

    def forget(self, engine: LaunchedEngine) -> None:
        """A retired engine has stopped: it leaves the supervisor."""
        if self.engines.get(engine.provider_id) is engine:
            engine.close()
            del self.engines[engine.provider_id]

    # -- what the runtime and the inference runner ask ------------------------------------

    def launched(self, provider_id: str) -> bool:
        """Whether this Node launches ``provider_id``'s engine."""
        return provider_id in self.engines

    def state(self, provider_id: str) -> Optional[EngineState]:
        """The state of ``provider_id``'s engine; ``None`` when it is not launched."""
        engine = self.engines.get(provider_id)
        return engine.lifecycle.state if engine is not None else None

    def report(self, provider_id: str) -> Optional[pb.EngineLaunch]:
        """``provider_id``'s engine state for the Edge; ``None`` when it is not launched."""
        engine = self.engines.get(provider_id)
        return engine.report() if engine is not None else None

    def probed(self, provider_id: str, alive: bool, reason: str = "") -> None:
        """A periodic probe of ``provider_id`` found its engine answering (or not): its liveness."""
        engine = self.engines.get(provider_id)
        if engine is not None:
            engine.probed(alive, reason)

    def refusal(self, provider_id: str) -> Optional[str]:
        """Why a request for ``provider_id`` cannot run now (its engine is not up), or ``None``."""
        engine = self.engines.get(provider_id)
        if engine is None or engine.lifecycle.state in (EngineState.READY, EngineState.DRAINING):
            return None
        return f"the engine of provider {provider_id} is {engine.lifecycle.state.value}"

    # -- the Edge's provider commands (run by :mod:`.provider_commands`) -------------------------

    def commanded(self, provider_id: str) -> LaunchedEngine:
        """The engine a provider command acts on; raises :class:`NotLaunched`."""
        if self.stopping:
            raise NotLaunched("the node is stopping; its engines are being stopped")
        engine = self.engines.get(provider_id)
        if engine is None:
            raise NotLaunched(f"provider {provider_id!r} has no engine launched by this node (no launch block)")
        return engine
