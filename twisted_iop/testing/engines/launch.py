"""Launched engines for tests: node.yaml entries with a ``launch`` block, and
an engine supervisor in this reactor with what it reported recorded.

The engines are real processes: ``iop-mock-provider`` (an OpenAI-compatible
server) on a free loopback port, or a short Python script for engines that
misbehave (exit at once, ignore SIGTERM, fork workers, print a lot).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Optional

import attrs
from twisted.internet import reactor as global_reactor

from twisted_iop.node.config import NodeProviderConfig, parse_node_providers
from twisted_iop.node.engines.probes import ProbeResult, ProviderProber
from twisted_iop.node.launch.lifecycle import EngineState
from twisted_iop.node.launch.readiness import readiness_check
from twisted_iop.node.launch.supervisor import EngineSupervisor
from twisted_iop.testing.configs import MODEL
from twisted_iop.testing.harness import MOCK_PROVIDER
from twisted_iop.testing.http import chat, post

#: A restart policy quick enough for tests.
FAST_RESTART = {"policy": "always", "initial_seconds": 0.2, "max_seconds": 1, "max_restarts": 5, "window_seconds": 60}
#: Readiness asked often, for tests.
FAST_READINESS = {"interval_seconds": 0.1, "request_timeout_seconds": 1, "start_timeout_seconds": 30}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launched_mock(
    provider_id: str, port: int, models: tuple[str, ...] = (MODEL,), args: tuple[str, ...] = (), **launch: Any
) -> dict[str, Any]:
    """A node.yaml provider whose engine the Node launches: ``iop-mock-provider`` on ``port``.

    ``args`` are more of its flags; ``launch`` overrides keys of the launch block.
    """
    block: dict[str, Any] = {
        "command": [MOCK_PROVIDER, "--listen", f"tcp:{port}:interface=127.0.0.1", "--models", ",".join(models), *args],
        "restart": dict(FAST_RESTART),
        "readiness": dict(FAST_READINESS),
        "stop": {"signal": "TERM", "timeout_seconds": 5},
    }
    block.update(launch)
    return {
        "provider_id": provider_id,
        "kind": "openai",
        "models": list(models),
        "base_url": f"http://127.0.0.1:{port}",
        "launch": block,
    }


def launched_script(provider_id: str, script: str, port: Optional[int] = None, **launch: Any) -> dict[str, Any]:
    """A provider whose launched engine is ``python -c script`` (nothing listens on ``port``
    unless the script does, so it stays loading)."""
    block: dict[str, Any] = {
        "command": [sys.executable, "-c", script],
        "restart": dict(FAST_RESTART),
        "readiness": dict(FAST_READINESS),
        "stop": {"timeout_seconds": 5},
    }
    block.update(launch)
    return {
        "provider_id": provider_id,
        "kind": "openai",
        "models": [MODEL],
        "base_url": f"http://127.0.0.1:{port or free_port()}",
        "launch": block,
    }


def providers(*entries: dict[str, Any]) -> tuple[NodeProviderConfig, ...]:
    """node.yaml provider entries, parsed."""
    return parse_node_providers(list(entries))


@attrs.define
class Change:
    """One change of state the supervisor reported."""

    provider_id: str
    state: EngineState
    reason: str
    restarts: int
    ready_probe: Optional[ProbeResult]


class SupervisorRig:
    """An :class:`EngineSupervisor` in this reactor, its changes recorded.

    ``in_flight`` is what ``running_on`` answers for every provider.
    """

    def __init__(self, entries: list[dict[str, Any]], state_directory: Path) -> None:
        self.prober = ProviderProber(global_reactor)
        self.in_flight = 0
        self.changes: list[Change] = []
        self.supervisor = EngineSupervisor(
            providers(*entries),
            str(state_directory),
            global_reactor,
            readiness_check(self.prober),
            lambda provider_id: self.in_flight,
        )
        self.supervisor.listener = self

    def launch_changed(self, provider_id: str, ready_probe: Optional[ProbeResult]) -> None:
        """Record the change (the supervisor's listener)."""
        engine = self.supervisor.engines.get(provider_id)
        if engine is not None:
            lifecycle = engine.lifecycle
            self.changes.append(Change(provider_id, lifecycle.state, lifecycle.reason, lifecycle.restarts, ready_probe))

    def start(self) -> EngineSupervisor:
        """Start the supervisor (and so its engines)."""
        self.supervisor.privilegedStartService()
        self.supervisor.startService()
        return self.supervisor

    async def stop(self) -> None:
        """Stop the supervisor and every engine; close the prober's connections."""
        if self.supervisor.running:
            await self.supervisor.stopService()
        await self.prober.close()

    def states(self, provider_id: str) -> list[EngineState]:
        """The states ``provider_id``'s engine went through, in order, without repeats."""
        seen: list[EngineState] = []
        for change in self.changes:
            if change.provider_id == provider_id and (not seen or seen[-1] is not change.state):
                seen.append(change.state)
        return seen

    def state(self, provider_id: str) -> Optional[EngineState]:
        """Its state now."""
        return self.supervisor.state(provider_id)

    def pid(self, provider_id: str) -> Optional[int]:
        """Its engine's pid now."""
        engine = self.supervisor.engines.get(provider_id)
        return engine.pid if engine is not None else None


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line holds ``marker`` (``/proc`` is read)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in argv and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def group_members(leader: int) -> list[int]:
    """Live processes in the process group ``leader`` leads (an engine and the workers it forked)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(leader).encode() and alive(int(entry.name)):
            members.append(int(entry.name))
    return sorted(members)


@attrs.define
class ChatLoad:
    """Clients of an Edge's gateway asking one chat completion after another (every other one
    streamed) until :attr:`running` is cleared; each outcome is ``(status, problem)``, the
    problem ``""`` for a whole answer (all ``max_tokens`` tokens, a stream ending in ``[DONE]``)."""

    base: str
    model: str = MODEL
    max_tokens: int = 10
    outcomes: list[tuple[int, str]] = attrs.field(factory=list)
    running: bool = True

    async def client(self, index: int, stream_only: bool = False) -> None:
        """One client's loop."""
        stream = stream_only or bool(index % 2)
        while self.running:
            answer = await post(
                self.base, "/v1/chat/completions", chat(stream=stream, max_tokens=self.max_tokens, model=self.model)
            )
            if answer.code != 200:
                self.outcomes.append((answer.code, answer.body.decode(errors="replace")[:200]))
            elif stream:
                complete = answer.events[-1:] == [b"[DONE]"] and not any(b'"error"' in e for e in answer.events)
                self.outcomes.append((200, "" if complete else f"broken stream: {answer.events[-2:]!r}"))
            else:
                tokens = answer.json()["usage"]["completion_tokens"]
                self.outcomes.append((200, "" if tokens == self.max_tokens else f"{tokens} tokens"))
            stream = stream_only or not stream

    def failures(self) -> list[tuple[int, str]]:
        """Every request that did not end with a whole answer."""
        return [o for o in self.outcomes if o != (200, "")]
