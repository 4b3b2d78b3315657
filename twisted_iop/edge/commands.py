"""The Edge's command catalog: validation, effects and lifecycle events.

The catalog is announced in hello. Every ``EdgeCommandRequest`` is validated
first; a request that fails validation (unknown command, unknown node, bad
arguments, nothing to act on) is answered ``REJECTED`` with a clear reason
and produces no events. A valid one relays ``command.accepted`` and
``command.started``, runs, relays ``command.succeeded`` or
``command.failed`` and is answered ``SUCCEEDED`` or ``FAILED`` with a result
map.

The ``provider.*`` commands act on the engine a Node launches for one of
its providers (target ``node_id/provider_id``, or ``node_id`` when the
node has one provider): the provider is held out of new leases here
before the Node is asked (so every request leased earlier reaches the
Node first and its drain waits for it), and released when the Node
answered. ``provider.logs`` returns the engine's last lines in result
entries ``log.000``, ``log.001`` ... of at most
:data:`LOG_CHUNK_CHARACTERS` characters each (what the Control Plane
keeps of one result value), in order.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Optional

import attrs
import google.protobuf
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

import twisted
import twisted_iop
from twisted_iop.configuration import ConfigError
from twisted_iop.edge.config import NodeConfig, load_edge_config
from twisted_iop.edge.deployments import EdgeDeployments
from twisted_iop.edge.nodes.registry import NodeRegistry
from twisted_iop.wire import PROTOCOL_MAJOR, PROTOCOL_MINOR
from twisted_iop.wire import control_pb2 as pb
from twisted_iop.wire.engine_states import engine_state_name
from twisted_iop.wire.hello import MAX_TEXT

#: Used when a request carries no deadline.
DEFAULT_COMMAND_TIMEOUT_SECONDS = 10.0
#: Of a provider command's deadline, the share the Node has to answer (the rest carries the answer).
NODE_ANSWER_SHARE = 0.8
#: Characters of engine output per result entry of ``provider.logs`` (the Control Plane keeps 1024).
LOG_CHUNK_CHARACTERS = 1000
#: Bytes of output ``provider.logs`` returns unless ``bytes`` says, and at most
#: (48 entries of the Control Plane's 64 per result, the rest for the other keys).
DEFAULT_LOG_BYTES = 8 * 1024
MAX_LOG_BYTES = 48 * LOG_CHUNK_CHARACTERS
#: The longest drain a provider command may ask for.
MAX_DRAIN_SECONDS = 3600.0


class CommandRejected(Exception):
    """The request is invalid; nothing was done."""


class CommandFailed(Exception):
    """The command ran and did not achieve its effect."""


@attrs.frozen
class ArgumentSpec:
    """One argument a command takes."""

    name: str
    description: str
    required: bool = False


@attrs.frozen
class CommandDefinition:
    """One catalog entry."""

    name: str
    description: str
    target_kind: str
    arguments: tuple[ArgumentSpec, ...] = ()

    def to_proto(self) -> pb.CommandSpec:
        """The wire form announced in hello."""
        return pb.CommandSpec(
            name=self.name,
            description=self.description,
            target_kind=self.target_kind,
            arguments=[
                pb.CommandArgumentSpec(name=a.name, description=a.description, required=a.required)
                for a in self.arguments
            ],
        )


_REASON = ArgumentSpec("reason", "free text recorded with the event")
_DRAIN = ArgumentSpec(
    "drain", "true (the default): no new leases, its requests in flight finish first; false: they are cut off"
)
_DRAIN_TIMEOUT = ArgumentSpec(
    "drain_timeout_seconds", "how long the drain waits for requests in flight (default: half the deadline)"
)
_LOG_BYTES = ArgumentSpec(
    "bytes", f"how much of the last output to return (default {DEFAULT_LOG_BYTES}, at most {MAX_LOG_BYTES})"
)

CATALOG: tuple[CommandDefinition, ...] = (
    CommandDefinition(
        "node.drain",
        "Stop giving new work to a node; work in flight finishes.",
        "node",
        (_REASON,),
    ),
    CommandDefinition("node.undrain", "Let a drained node take new work again.", "node", (_REASON,)),
    CommandDefinition(
        "node.disconnect",
        "Close the node's connections; the node runtime reconnects by itself.",
        "node",
        (_REASON,),
    ),
    CommandDefinition(
        "providers.refresh",
        "Re-read the providers of edge.yaml without a restart and ask ready nodes to probe again.",
        "edge",
    ),
    CommandDefinition(
        "edge.diagnostics",
        "Versions, uptime, connection and queue counts of this edge.",
        "edge",
    ),
    CommandDefinition(
        "edge.hold",
        "Hold deployment changes (maintenance): the desired set is kept and acknowledged, nothing changes on the nodes.",
        "edge",
        (_REASON,),
    ),
    CommandDefinition(
        "edge.release",
        "End a hold of deployment changes: the desired set held is applied to the nodes.",
        "edge",
        (_REASON,),
    ),
    CommandDefinition(
        "provider.restart",
        "Restart the engine a node launches for a provider: drain, stop, start, wait until it is ready.",
        "provider",
        (_DRAIN, _DRAIN_TIMEOUT, _REASON),
    ),
    CommandDefinition(
        "provider.stop",
        "Stop the engine a node launches for a provider (after a drain); it stays stopped until provider.start.",
        "provider",
        (_DRAIN, _DRAIN_TIMEOUT, _REASON),
    ),
    CommandDefinition(
        "provider.start",
        "Start the engine a node launches for a provider (also one that failed) and wait until it is ready.",
        "provider",
        (_REASON,),
    ),
    CommandDefinition(
        "provider.logs",
        "The last lines of the output of the engine a node launches for a provider.",
        "provider",
        (_LOG_BYTES,),
    ),
)

#: What each provider command asks the Node to do.
PROVIDER_ACTIONS = {
    "provider.restart": pb.PROVIDER_ACTION_RESTART,
    "provider.stop": pb.PROVIDER_ACTION_STOP,
    "provider.start": pb.PROVIDER_ACTION_START,
    "provider.logs": pb.PROVIDER_ACTION_LOGS,
}

#: Something that re-reads the Nodes from the config file.
NodesLoader = Callable[[], tuple[NodeConfig, ...]]
#: Extra diagnostics (the Control Plane connector adds its own).
DiagnosticsSource = Callable[[], Mapping[str, str]]


def nodes_from_file(path: Optional[str]) -> NodesLoader:
    """A loader re-reading the ``nodes`` of edge.yaml at ``path``."""

    def load() -> tuple[NodeConfig, ...]:
        if path is None:
            raise CommandFailed("this edge was not started from a config file; nothing to re-read")
        try:
            return load_edge_config(path, environ={}).nodes
        except ConfigError as e:
            raise CommandFailed(f"edge.yaml not reloaded: {e}") from None

    return load


class CommandRunner:
    """Validates and runs catalog commands against the registry."""

    _log = Logger()

    def __init__(
        self,
        registry: NodeRegistry,
        clock: IReactorTime,
        load_nodes: Optional[NodesLoader] = None,
        probe_timeout_seconds: float = 10.0,
    ) -> None:
        self._registry = registry
        self._clock = clock
        self._load_nodes = load_nodes if load_nodes is not None else nodes_from_file(registry.config.source_path)
        self._probe_timeout = probe_timeout_seconds
        self._diagnostics_sources: list[DiagnosticsSource] = []
        self._definitions = {d.name: d for d in CATALOG}
        self._runners: dict[str, Callable[[pb.EdgeCommandRequest], Awaitable[dict[str, str]]]] = {
            "node.drain": self._drain,
            "node.undrain": self._undrain,
            "node.disconnect": self._disconnect,
            "providers.refresh": self._refresh,
            "edge.diagnostics": self._diagnostics,
            "edge.hold": self._hold,
            "edge.release": self._release,
            **{name: self._provider for name in PROVIDER_ACTIONS},
        }
        self.running = 0
        #: The Edge's deployments, which ``edge.hold`` and ``edge.release`` act on (set by the tap).
        self.deployments: Optional[EdgeDeployments] = None

    def catalog(self) -> list[pb.CommandSpec]:
        """The catalog announced in hello."""
        return [d.to_proto() for d in CATALOG]

    def add_diagnostics(self, source: DiagnosticsSource) -> None:
        """Merge ``source`` into ``edge.diagnostics`` results."""
        self._diagnostics_sources.append(source)

    def validate(self, request: pb.EdgeCommandRequest) -> None:
        """Raise :class:`CommandRejected` unless ``request`` can run now."""
        definition = self._definitions.get(request.name)
        if definition is None:
            known = ", ".join(sorted(self._definitions))
            raise CommandRejected(f"unknown command {request.name!r} (this edge runs: {known})")
        allowed = {a.name for a in definition.arguments}
        for name in request.arguments:
            if name not in allowed:
                takes = ", ".join(sorted(allowed)) or "no arguments"
                raise CommandRejected(f"{request.name} does not take argument {name!r} (it takes {takes})")
        for argument in definition.arguments:
            if argument.required and not request.arguments.get(argument.name):
                raise CommandRejected(f"{request.name} needs argument {argument.name!r}")
        if definition.target_kind == "node":
            if not request.target:
                raise CommandRejected(f"{request.name} needs a target node id")
            if request.target not in {n.node_id for n in self._registry.nodes()}:
                raise CommandRejected(f"no node named {request.target!r} is configured on this edge")
            if request.name == "node.disconnect" and not self._registry.ownership.tokens(request.target):
                raise CommandRejected(f"node {request.target!r} has no connection to close")
        elif definition.target_kind == "provider":
            node_id, _ = self.provider_target(request)
            if not self._registry.is_ready(node_id):
                raise CommandRejected(f"node {node_id!r} is not connected; its engines cannot be reached")
            self._check_provider_arguments(request)
        elif definition.target_kind == "edge" and request.target not in ("", self._registry.edge_id):
            raise CommandRejected(
                f"{request.name} targets this edge; target must be empty or {self._registry.edge_id!r}"
            )

    def provider_target(self, request: pb.EdgeCommandRequest) -> tuple[str, str]:
        """``(node_id, provider_id)`` of a provider command's target; :class:`CommandRejected` if none."""
        target = request.target
        if not target:
            raise CommandRejected(f"{request.name} needs a target: node_id/provider_id")
        node_id, _, provider_id = target.partition("/")
        nodes = {n.node_id: n for n in self._registry.nodes()}
        node = nodes.get(node_id)
        if node is None:
            raise CommandRejected(f"no node named {node_id!r} is configured on this edge")
        providers = [p.provider_id for p in node.providers]
        if not provider_id:
            if len(providers) != 1:
                raise CommandRejected(
                    f"node {node_id!r} has {len(providers)} providers; name one as {node_id}/PROVIDER "
                    f"({', '.join(providers) or 'none configured'})"
                )
            provider_id = providers[0]
        elif provider_id not in providers:
            raise CommandRejected(f"no provider named {provider_id!r} is configured on node {node_id!r}")
        return node_id, provider_id

    @staticmethod
    def _check_provider_arguments(request: pb.EdgeCommandRequest) -> None:
        arguments = request.arguments
        if "drain" in arguments and arguments["drain"] not in ("true", "false"):
            raise CommandRejected(f"drain must be true or false, not {arguments['drain'][:40]!r}")
        if "drain_timeout_seconds" in arguments:
            seconds = _number(arguments["drain_timeout_seconds"])
            if seconds is None or not 0 <= seconds <= MAX_DRAIN_SECONDS:
                raise CommandRejected(f"drain_timeout_seconds must be a number from 0 to {MAX_DRAIN_SECONDS:g}")
        if "bytes" in arguments:
            size = _number(arguments["bytes"])
            if size is None or size != int(size) or not 1 <= size <= MAX_LOG_BYTES:
                raise CommandRejected(f"bytes must be a whole number from 1 to {MAX_LOG_BYTES}")

    def run(self, request: pb.EdgeCommandRequest) -> Deferred[pb.EdgeCommandResponse]:
        """Validate, run and answer ``request``, relaying its lifecycle events."""
        return Deferred.fromCoroutine(self._run(request))

    async def _run(self, request: pb.EdgeCommandRequest) -> pb.EdgeCommandResponse:
        command_id = request.command_id
        try:
            self.validate(request)
        except CommandRejected as e:
            self._log.warn(
                "command {command_id} {name} rejected: {reason}",
                command_id=command_id,
                name=request.name,
                reason=str(e),
            )
            return pb.EdgeCommandResponse(command_id=command_id, outcome=pb.COMMAND_OUTCOME_REJECTED, reason=str(e))
        self._emit(request, "command.accepted", f"{request.name} accepted")
        self._emit(request, "command.started", f"{request.name} started")
        self._log.info(
            "command {command_id} {name} target={target!r} started",
            command_id=command_id,
            name=request.name,
            target=request.target,
        )
        self.running += 1
        try:
            result = await self._runners[request.name](request)
        except Exception as e:
            reason = str(e) if isinstance(e, CommandFailed) else f"internal error: {type(e).__name__}: {e}"
            if not isinstance(e, CommandFailed):
                self._log.failure("command {command_id} {name} crashed", command_id=command_id, name=request.name)
            self._emit(request, "command.failed", f"{request.name} failed: {reason}")
            return pb.EdgeCommandResponse(command_id=command_id, outcome=pb.COMMAND_OUTCOME_FAILED, reason=reason)
        finally:
            self.running -= 1
        self._emit(request, "command.succeeded", f"{request.name} succeeded")
        self._log.info("command {command_id} {name} succeeded", command_id=command_id, name=request.name)
        return pb.EdgeCommandResponse(command_id=command_id, outcome=pb.COMMAND_OUTCOME_SUCCEEDED, result=result)

    def _emit(self, request: pb.EdgeCommandRequest, kind: str, message: str) -> None:
        """Relay one lifecycle event (``command.*``) of ``request``."""
        node_id, provider_id = self._node_of(request)
        self._registry.relay.emit(
            kind,
            command_id=request.command_id,
            node_id=node_id,
            provider_id=provider_id,
            message=message,
            attributes={"name": request.name, "target": request.target},
        )

    def _node_of(self, request: pb.EdgeCommandRequest) -> tuple[str, str]:
        kind = self._definitions[request.name].target_kind
        if kind == "node":
            return request.target, ""
        if kind == "provider":
            return self.provider_target(request)
        return "", ""

    @staticmethod
    def _timeout(request: pb.EdgeCommandRequest) -> float:
        return request.timeout_ms / 1000.0 if request.timeout_ms else DEFAULT_COMMAND_TIMEOUT_SECONDS

    # -- the commands --------------------------------------------------------

    async def _drain(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        return self._set_drained(request, True)

    async def _undrain(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        return self._set_drained(request, False)

    def _set_drained(self, request: pb.EdgeCommandRequest, drained: bool) -> dict[str, str]:
        changed = self._registry.set_drained(
            request.target, drained, request.arguments.get("reason", ""), request.command_id
        )
        return {"node_id": request.target, "drained": _flag(drained), "changed": _flag(changed)}

    async def _disconnect(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        closed = self._registry.disconnect_node(request.target)
        return {"node_id": request.target, "closed_connections": str(closed)}

    async def _refresh(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        nodes = self._load_nodes()
        summary = self._registry.replace_providers(nodes)
        # Leave a margin of the deadline for the answer itself.
        timeout = max(0.1, min(self._probe_timeout, self._timeout(request) * 0.8))
        ready = self._registry.ready_nodes()
        probes = [self._registry.probe_node(node_id, timeout) for node_id in ready]
        outcomes = await DeferredList(probes, consumeErrors=True) if probes else []
        failed = [node_id for node_id, (ok, _) in zip(ready, outcomes, strict=True) if not ok]
        changed_health = sum(len(value) for ok, value in outcomes if ok)
        providers = sum(len(n.providers) for n in self._registry.nodes())
        return {
            "providers": str(providers),
            "added": ",".join(summary.added),
            "removed": ",".join(summary.removed),
            "changed": ",".join(summary.changed),
            "ignored_nodes": ",".join(summary.ignored_nodes),
            "nodes_probed": str(len(ready) - len(failed)),
            "probe_failures": ",".join(failed),
            "health_changes": str(changed_health),
        }

    async def _hold(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        return self._set_held(request, True)

    async def _release(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        return self._set_held(request, False)

    def _set_held(self, request: pb.EdgeCommandRequest, held: bool) -> dict[str, str]:
        deployments = self.deployments
        if deployments is None:
            raise CommandFailed("this edge runs no deployments")
        changed = deployments.hold() if held else deployments.release()
        if changed:
            kind = "edge.held" if held else "edge.released"
            reason = request.arguments.get("reason", "")[:MAX_TEXT]
            self._registry.relay.emit(
                kind,
                command_id=request.command_id,
                message=f"edge {self._registry.edge_id} {'holds' if held else 'released'} deployment changes",
                attributes={"reason": reason} if reason else {},
            )
        return {
            "held": _flag(deployments.held),
            "changed": _flag(changed),
            "observed_version": str(deployments.version),
        }

    async def _diagnostics(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        registry = self._registry
        nodes = registry.nodes()
        result = {
            "edge_id": registry.edge_id,
            "software_version": twisted_iop.__version__,
            "protocol_version": f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}",
            "python_version": platform.python_version(),
            "twisted_version": twisted.__version__,
            "protobuf_version": google.protobuf.__version__,
            "platform": sys.platform,
            "uptime_seconds": f"{self._clock.seconds() - registry.started_at:.1f}",
            "nodes_configured": str(len(nodes)),
            "nodes_ready": str(len(registry.ready_nodes())),
            "nodes_drained": str(sum(1 for n in nodes if registry.is_drained(n.node_id))),
            "node_connections": str(registry.connection_count()),
            "providers_configured": str(sum(len(n.providers) for n in nodes)),
            "leases_in_flight": str(registry.pool.in_flight_total()),
            "queued": str(registry.pool.queued_total(False)),
            "long_context_queued": str(registry.pool.queued_total(True)),
            "events_emitted": str(registry.relay.last_sequence),
            "outbox_length": str(registry.relay.outbox_length),
            "outbox_dropped_total": str(registry.relay.dropped_total),
            "commands_running": str(self.running - 1),
        }
        for source in self._diagnostics_sources:
            result.update(source())
        return result

    async def _provider(self, request: pb.EdgeCommandRequest) -> dict[str, str]:
        """A ``provider.*`` command: held here (restart, stop), done by the Node, answered with the engine's state."""
        node_id, provider_id = self.provider_target(request)
        action = PROVIDER_ACTIONS[request.name]
        deadline = self._timeout(request)
        arguments = request.arguments
        answer_within = deadline * NODE_ANSWER_SHARE
        drain_timeout = _number(arguments.get("drain_timeout_seconds", "")) or answer_within / 2
        sent = pb.NodeProviderCommandRequest(
            provider_id=provider_id,
            action=action,
            drain=arguments.get("drain", "true") == "true",
            drain_timeout_ms=int(min(drain_timeout, MAX_DRAIN_SECONDS) * 1000),
            timeout_ms=int(answer_within * 1000),
            max_log_bytes=int(_number(arguments.get("bytes", "")) or DEFAULT_LOG_BYTES),
        )
        holds = action in (pb.PROVIDER_ACTION_RESTART, pb.PROVIDER_ACTION_STOP)
        if holds:
            self._registry.providers.hold(node_id, provider_id, f"{request.name} {request.command_id}")
        try:
            answer = await self._registry.provider_command(node_id, sent, deadline * (1 + NODE_ANSWER_SHARE) / 2)
        except Exception as e:
            raise CommandFailed(f"node {node_id} did not answer: {type(e).__name__}: {e}") from None
        finally:
            if holds:
                self._registry.providers.release(node_id, provider_id)
        if not answer.ok:
            raise CommandFailed(answer.reason[: MAX_TEXT * 4] or f"node {node_id} refused {request.name}")
        result = {"node_id": node_id, "provider_id": provider_id}
        if answer.HasField("launch"):
            launch = answer.launch
            result.update(
                state=engine_state_name(launch.state),
                state_reason=launch.reason[:MAX_TEXT],
                restarts=str(launch.restarts),
            )
        if action in (pb.PROVIDER_ACTION_RESTART, pb.PROVIDER_ACTION_STOP):
            result.update(drained_requests=str(answer.drained_requests), cut_requests=str(answer.cut_requests))
        if answer.reason:
            result["message"] = answer.reason[:MAX_TEXT]
        if action == pb.PROVIDER_ACTION_LOGS:
            result.update(log_chunks(answer.log_text[:MAX_LOG_BYTES], answer.log_lines))
        return result


def log_chunks(text: str, lines: int) -> dict[str, str]:
    """An engine's last lines as result entries ``log.000`` ... of at most
    :data:`LOG_CHUNK_CHARACTERS` characters, cut at line ends where a line fits."""
    chunks: list[str] = []
    current = ""
    for line in text.splitlines(keepends=True):
        while len(line) > LOG_CHUNK_CHARACTERS:
            if current:
                chunks.append(current)
                current = ""
            chunks.append(line[:LOG_CHUNK_CHARACTERS])
            line = line[LOG_CHUNK_CHARACTERS:]
        if len(current) + len(line) > LOG_CHUNK_CHARACTERS:
            chunks.append(current)
            current = ""
        current += line
    if current:
        chunks.append(current)
    result = {f"log.{i:03d}": chunk for i, chunk in enumerate(chunks)}
    result["log_lines"] = str(lines)
    result["log_chunks"] = str(len(chunks))
    return result


def _number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


def _flag(value: bool) -> str:
    return "true" if value else "false"
