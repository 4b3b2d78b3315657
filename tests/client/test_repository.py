"""The status repository against the real Control Plane, and the one model reader.

Every view is read from a real Control Plane fed by scripted edges (or the
real Klein app through StubTreq where no edge is needed). The reader's own
rules (types, JSON paths in errors, optional keys) are unit tests on real
answers, changed one value at a time.
"""

from __future__ import annotations

import copy
import json
import socket
from typing import Any

import attrs
import pytest
import pytest_twisted

from twisted_iop.client import (
    ControlPlaneError,
    ControlPlaneStatusRepository,
    ControlPlaneUnreachable,
    EdgeDisconnectedError,
    EdgeNotConnectedError,
    EdgeTimeoutError,
    ForbiddenError,
    InvalidJSON,
    InvalidResponse,
    NotFoundError,
    UnauthorizedError,
    UnknownCommandError,
    UnknownEdgeError,
)
from twisted_iop.client.model_json import format_time, parse_time, read, to_json
from twisted_iop.client.models import (
    CommandCatalog,
    EdgeDetail,
    EdgePage,
    EdgeStatus,
    Event,
    EventPage,
    FleetStatus,
    LateOutcome,
    Operation,
    OperationPage,
    ProviderCounters,
    RowError,
)
from twisted_iop.client.repository import DEFAULT_HTTP_URL, HTTP_URL_ENV, error_from_response
from twisted_iop.testing.harness import Fleet, contract_validator, start_fleet, stub_repository
from twisted_iop.testing.wires.peers import set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb


def test_base_url_from_argument_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base URL comes from the argument, else the environment, else the default."""
    monkeypatch.delenv(HTTP_URL_ENV, raising=False)
    assert ControlPlaneStatusRepository(http_client=object()).base_url == DEFAULT_HTTP_URL
    monkeypatch.setenv(HTTP_URL_ENV, "http://cp.example:9000/")
    assert ControlPlaneStatusRepository(http_client=object()).base_url == "http://cp.example:9000"
    assert ControlPlaneStatusRepository("http://x:1", http_client=object()).base_url == "http://x:1"


# -- the real Control Plane ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_every_view_reads_the_real_answers() -> None:
    """Edges, detail, status, events, operations, catalog and the fleet views give typed models."""
    fleet = await start_fleet("edge-a", "edge-b")
    repo = fleet.repository()
    try:
        page = await repo.edges(limit=1)
        assert [e.edge_id for e in page.items] == ["edge-a"] and page.total == 2 and page.next_cursor == "edge-a"
        everything = await repo.all_edges()
        assert [e.edge_id for e in everything.items] == ["edge-a", "edge-b"] and everything.next_cursor is None
        a = everything.items[0]
        assert a.connected and a.labels == {"site": "test"} and a.software_version == "test-edge"
        assert a.commands == ("node.drain", "node.undrain", "edge.diagnostics") and a.connected_at is not None

        status = await repo.edge_status("edge-a")
        assert [n.node_id for n in status.nodes] == ["node-1", "node-2"] and not status.stale
        provider = status.nodes[0].providers[0]
        assert (provider.provider_id, provider.status, provider.health) == ("mock-1", "available", "healthy")
        assert provider.general == ProviderCounters(capacity=4, in_flight=1, queued=2)
        assert provider.long_context == ProviderCounters(capacity=1, in_flight=0, queued=1)
        assert status.totals.providers_by_health["healthy"] == 2 and status.totals.edges_known is None

        detail = await repo.edge("edge-a")
        assert detail.summary == a.__class__(
            **{**attrs.asdict(a, recurse=False), "last_seen": detail.summary.last_seen}
        )
        assert detail.status.available and not detail.status.stale and detail.events.last_sequence is not None
        assert detail.operations.last_sequence is None

        catalog = await repo.commands("edge-a")
        assert catalog.connected and next(c.name for c in catalog.commands) == "node.drain"

        events = await repo.events("edge-a")
        assert events.edge_id == "edge-a" and "edge.connected" in [e.kind for e in events.items]
        assert events.next_since == events.items[-1].sequence

        operation = await repo.send_command("edge-a", "node.drain", target="node-1", idempotency_key="k-1")
        assert operation.state == "succeeded" and operation.result == {"target": "node-1"}
        assert operation.finished and operation.late_outcome is None
        again = await repo.send_command("edge-a", "node.drain", target="node-1", idempotency_key="k-1")
        assert again.operation_id == operation.operation_id and len(fleet.edges["edge-a"].commands_seen) == 1
        operations = await repo.operations("edge-a")
        assert operations.edge_id == "edge-a" and operations.capacity == 500 and operations.total == 1
        one = await repo.operation("edge-a", operation.operation_id)
        assert [h.state for h in one.history][-1] == "succeeded" and one.replayed is None

        fleet_status = await repo.full_fleet_status()
        assert [r.edge_id for r in fleet_status.items] == ["edge-a", "edge-b"]
        assert all(r.state == "ok" and r.error is None for r in fleet_status.items)
        assert fleet_status.totals.edges_connected == 2 and fleet_status.totals.general.capacity == 16
        fleet_events = await repo.fleet_events(since=1)
        assert fleet_events.edge_id is None and all(e.fleet_sequence > 1 for e in fleet_events.items)
        fleet_operations = await repo.fleet_operations()
        assert fleet_operations.total == 1 and fleet_operations.capacity is None
        assert (await repo.healthz()).status == "ok" and (await repo.readyz()).ready
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_frozen_edge_row_carries_a_typed_error() -> None:
    """A frozen edge's fleet row is ``timeout`` with a RowError; the other rows stay fresh."""
    fleet = await start_fleet("edge-a", "edge-b", "edge-c")
    repo = fleet.repository()
    try:
        await repo.edge_status("edge-b")  # so the frozen edge has a last snapshot
        fleet.freeze("edge-b")
        status = await repo.full_fleet_status()
        rows = {r.edge_id: r for r in status.items}
        frozen = rows["edge-b"]
        assert frozen.state == "timeout" and frozen.stale and frozen.connected
        assert isinstance(frozen.error, RowError) and frozen.error.code == "edge_timeout"
        assert "edge-b" in frozen.error.message and "did not answer" in frozen.error.message
        assert frozen.nodes_configured == 2 and frozen.received_at is not None  # its last snapshot
        assert [(r.state, r.error) for r in (rows["edge-a"], rows["edge-c"])] == [("ok", None), ("ok", None)]
        assert status.totals.nodes_configured == 4  # only fresh rows count
        with pytest.raises(EdgeTimeoutError) as caught:
            await repo.edge_status("edge-b")
        assert caught.value.status == 504 and caught.value.operation is None
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_disconnected_edge_gives_the_stale_snapshot() -> None:
    """409 edge_not_connected raises EdgeNotConnectedError with the last snapshot, marked stale."""
    fleet = await start_fleet("edge-a")
    repo = fleet.repository()
    try:
        await repo.edge_status("edge-a")
        await fleet.disconnect("edge-a")
        with pytest.raises(EdgeNotConnectedError) as caught:
            await repo.edge_status("edge-a")
        snapshot = caught.value.snapshot
        assert snapshot is not None and snapshot.stale and not snapshot.connected and len(snapshot.nodes) == 2
        row = (await repo.fleet_status()).items[0]
        assert (row.state, row.error, row.stale) == ("disconnected", None, True)
        with pytest.raises(EdgeNotConnectedError) as refused:
            await repo.send_command("edge-a", "node.drain")
        assert refused.value.snapshot is None
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_commands_rejected_timed_out_and_disconnected() -> None:
    """A rejected command is a result; a timeout or a lost edge raises with the operation attached."""
    fleet = await start_fleet("edge-a")
    repo = fleet.repository()
    edge = fleet.edges["edge-a"]
    try:
        edge.command_behaviour = "reject"
        rejected = await repo.send_command("edge-a", "node.drain", target="node-1", arguments={"reason": "x"})
        assert (rejected.state, rejected.reason, rejected.arguments) == ("rejected", "told to reject", {"reason": "x"})
        edge.command_behaviour = "silent"
        with pytest.raises(EdgeTimeoutError) as caught:
            await repo.send_command("edge-a", "node.drain", timeout_seconds=0.2)
        assert caught.value.operation is not None and caught.value.operation.state == "timed_out"
        with pytest.raises(UnknownCommandError):
            await repo.send_command("edge-a", "gpu.melt")
        edge.command_behaviour = "disconnect"
        with pytest.raises(EdgeDisconnectedError) as gone:
            await repo.send_command("edge-a", "node.drain")
        assert gone.value.operation is not None and gone.value.operation.state == "edge_disconnected"
    finally:
        await fleet.stop()


# -- the real Klein app, no edges --------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_errors_of_the_real_app_map_to_their_classes() -> None:
    """unknown_edge, not_found, bad_request and readiness come typed from the real app."""
    repo = stub_repository()
    with pytest.raises(UnknownEdgeError) as caught:
        await repo.edge_status("nope")
    assert (caught.value.code, caught.value.status) == ("unknown_edge", 404)
    assert caught.value.message == "no edge named 'nope' is known" and isinstance(caught.value, ControlPlaneError)
    with pytest.raises(ControlPlaneError) as bad:
        await repo.edges(limit=0)
    assert bad.value.code == "bad_request" and "limit" in bad.value.message
    readiness = await repo.readyz()  # no listener is bound: 503 is a result, not an error
    assert readiness.ready is False and readiness.listeners == {}
    fleet = await repo.fleet_status()
    assert fleet.items == () and fleet.totals.edges_known == 0


@pytest_twisted.ensureDeferred
async def test_bearer_token_is_sent() -> None:
    """The API token goes out as a Bearer header; without it 401, a wrong one 403."""
    assert (await stub_repository(token="s3cret", api_token="s3cret").edges()).total == 0
    with pytest.raises(UnauthorizedError):
        await stub_repository(api_token="s3cret").edges()
    with pytest.raises(ForbiddenError):
        await stub_repository(token="wrong", api_token="s3cret").edges()


@pytest_twisted.ensureDeferred
async def test_edge_ids_are_quoted_in_paths() -> None:
    """An edge id with reserved characters stays in its path segment: the server sees the whole id."""
    with pytest.raises(UnknownEdgeError) as caught:
        await stub_repository().edge("a?b#c")
    assert caught.value.message == "no edge named 'a?b#c' is known"
    with pytest.raises(NotFoundError):  # "/" is quoted too: no route has a segment with one
        await stub_repository().operation("edge-a", "../../fleet/status")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest_twisted.ensureDeferred
async def test_unreachable_control_plane() -> None:
    """A refused connection raises ControlPlaneUnreachable naming the URL and reason."""
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ControlPlaneUnreachable) as caught:
        await ControlPlaneStatusRepository(url, timeout=5).fleet_status()
    assert caught.value.url == url and caught.value.reason == "connection refused"
    assert str(caught.value) == f"cannot reach the Control Plane at {url}: connection refused"


def test_error_answers_that_are_not_error_documents() -> None:
    """A proxy's HTML page still becomes ControlPlaneError with its status; unknown codes the base class."""
    html = error_from_response(502, b"<html>Bad Gateway</html>")
    assert (type(html), html.code, html.status) == (ControlPlaneError, "http_502", 502)
    assert "Bad Gateway" in html.message
    newer = error_from_response(
        418, json.dumps({"error": {"code": "brand_new", "message": "m", "status": 418}}).encode()
    )
    assert type(newer) is ControlPlaneError and newer.code == "brand_new"
    assert type(error_from_response(400, b'{"error":{"code":"invalid_json","message":"","status":400}}')) is InvalidJSON
    assert type(error_from_response(404, b'{"error":{"code":"not_found","message":"","status":404}}')) is NotFoundError


# -- the reader, on real answers -------------------------------------------------------


async def real_documents(fleet: Fleet) -> dict[str, Any]:
    """Raw JSON of every view of ``fleet``, keyed by model name."""
    cp = fleet.cp
    await fleet.repository().send_command("edge-a", "node.drain", target="node-1")
    docs: dict[str, Any] = {}
    for name, path in (
        ("EdgePage", "/edges"),
        ("EdgeDetail", "/edges/edge-a"),
        ("EdgeStatus", "/edges/edge-a/status"),
        ("EventPage", "/edges/edge-a/events"),
        ("OperationPage", "/edges/edge-a/operations"),
        ("CommandCatalog", "/edges/edge-a/commands"),
        ("FleetStatus", "/fleet/status"),
        ("FleetEventPage", "/fleet/events"),
        ("FleetOperationPage", "/fleet/operations"),
    ):
        code, docs[name] = await cp.get_json(path)
        assert code == 200, (path, docs[name])
    return docs


MODELS: dict[str, type] = {
    "EdgePage": EdgePage,
    "EdgeDetail": EdgeDetail,
    "EdgeStatus": EdgeStatus,
    "EventPage": EventPage,
    "OperationPage": OperationPage,
    "CommandCatalog": CommandCatalog,
    "FleetStatus": FleetStatus,
    "FleetEventPage": EventPage,
    "FleetOperationPage": OperationPage,
}


@pytest_twisted.ensureDeferred
async def test_models_read_and_write_back_every_real_answer() -> None:
    """read() then to_json() gives back exactly what the server sent, for every view."""
    fleet = await start_fleet("edge-a")
    try:
        docs = await real_documents(fleet)
    finally:
        await fleet.stop()
    for name, document in docs.items():
        assert to_json(read(MODELS[name], document)) == document, name


@pytest_twisted.ensureDeferred
async def test_reader_names_the_json_path_of_a_bad_value() -> None:
    """A wrongly typed, missing or unknown value raises InvalidResponse naming its JSON path."""
    fleet = await start_fleet("edge-a")
    try:
        docs = await real_documents(fleet)
    finally:
        await fleet.stop()
    cases: list[tuple[str, list[Any], Any, str]] = [
        (
            "EdgeStatus",
            ["nodes", 0, "providers", 0, "general", "capacity"],
            "four",
            "nodes[0].providers[0].general.capacity: expected a whole number",
        ),
        (
            "EdgeStatus",
            ["nodes", 0, "providers", 0, "status"],
            "on fire",
            "nodes[0].providers[0].status: expected one of 'available', 'drained', 'unavailable'",
        ),
        ("EdgeStatus", ["nodes", 0, "connected"], 1, "nodes[0].connected: expected true or false"),
        ("EdgeStatus", ["received_at"], "yesterday", "received_at: not an ISO 8601 time: 'yesterday'"),
        ("FleetStatus", ["items", 0, "error"], "boom", "items[0].error: expected an object or null"),
        ("FleetStatus", ["items", 0, "state"], "melted", "items[0].state: expected one of 'ok'"),
        ("FleetStatus", ["items", 0, "labels", "site"], 3, "items[0].labels.site: expected a string"),
        ("EdgeDetail", ["events", "kept"], None, "events.kept: expected a whole number, not null"),
        ("EdgeDetail", ["commands"], "node.drain", "commands: expected a list"),
        (
            "OperationPage",
            ["items", 0, "history", 0, "state"],
            "exploded",
            "items[0].history[0].state: expected one of",
        ),
        ("EventPage", ["items", 0, "node_id"], 7, "items[0].node_id: expected a string or null"),
    ]
    for name, where, value, message in cases:
        broken = copy.deepcopy(docs[name])
        holder: Any = broken
        for key in where[:-1]:
            holder = holder[key]
        holder[where[-1]] = value
        with pytest.raises(InvalidResponse) as caught:
            read(MODELS[name], broken)
        assert caught.value.message.startswith(message), (where, caught.value.message)
    missing = copy.deepcopy(docs["EdgeDetail"])
    del missing["edge_id"]
    with pytest.raises(InvalidResponse, match=r"^edge_id: missing$"):
        read(EdgeDetail, missing)
    with pytest.raises(InvalidResponse, match=r"^snapshot: expected an object$"):
        read(EdgeStatus, [], "snapshot")


@pytest_twisted.ensureDeferred
async def test_engine_members_are_read_and_an_older_server_without_them_too() -> None:
    """A provider's engine reading, tokens and flags are read and written back
    as served; a provider of a Control Plane that does not show them yet reads
    as no reading, no tokens and no flags."""
    fleet = await start_fleet("edge-a")
    try:

        def with_engine() -> pb.EdgeStatusResponse:
            response = snapshot("edge-a")
            set_engine(response.nodes[0].providers[0], kv_cache_usage=-1.0, parallel=0, cooling_down=True)
            return response

        fleet.edges["edge-a"].status = with_engine
        code, document = await fleet.cp.get_json("/edges/edge-a/status")
    finally:
        await fleet.stop()
    assert code == 200
    status = read(EdgeStatus, document)
    assert to_json(status) == document
    first, second = (node.providers[0] for node in status.nodes)
    assert first.engine is not None and (first.engine.running, first.engine.waiting) == (1, 3)
    assert (first.engine.kv_cache_usage, first.engine.parallel, first.cooling_down) == (None, None, True)
    assert (first.tokens.prompt, first.tokens.completion, first.tokens_per_second) == (1200, 3400, 37.5)
    assert second.engine is None and second.tokens_per_second == 0.0
    older = copy.deepcopy(document)
    for node in older["nodes"]:
        for provider in node["providers"]:
            for key in ("engine", "tokens_per_second", "tokens", "saturated", "cooling_down"):
                del provider[key]
    old = read(EdgeStatus, older).nodes[0].providers[0]
    assert (old.engine, old.tokens_per_second, old.tokens.prompt, old.saturated, old.cooling_down) == (
        None,
        None,
        0,
        False,
        False,
    )


@pytest_twisted.ensureDeferred
async def test_unknown_keys_are_ignored() -> None:
    """A newer server's extra keys do not break reading."""
    fleet = await start_fleet("edge-a")
    try:
        docs = await real_documents(fleet)
    finally:
        await fleet.stop()
    newer = dict(copy.deepcopy(docs["EdgeStatus"]), brand_new={"x": 1})
    newer["nodes"][0]["gpu_temperature"] = 71
    assert read(EdgeStatus, newer).nodes[0].node_id == "node-1"


@pytest_twisted.ensureDeferred
async def test_contract_additions_late_outcome_and_replayed_are_read() -> None:
    """A real command answer extended with the contract's late_outcome and replayed reads typed.

    The extended document is first validated against the OpenAPI schema, so
    it is the contract's shape, not one made up here.
    """
    fleet = await start_fleet("edge-a")
    try:
        code, answer = await fleet.cp.post_json("/edges/edge-a/commands", {"name": "node.drain", "target": "node-1"})
    finally:
        await fleet.stop()
    assert code == 200
    answer["replayed"] = True
    answer["state"] = "timed_out"
    answer["late_outcome"] = {
        "state": "succeeded",
        "reason": "",
        "result": {"drained": "true"},
        "received_at": "2026-11-29T20:00:07.250Z",
    }
    contract_validator("CommandAnswer").validate(answer)
    operation = read(Operation, answer)
    assert operation.replayed is True and operation.state == "timed_out"
    assert operation.late_outcome == LateOutcome(
        state="succeeded", reason="", result={"drained": "true"}, received_at=parse_time("2026-11-29T20:00:07.250Z")
    )
    assert to_json(operation) == answer
    answer["late_outcome"] = None
    assert read(Operation, answer).late_outcome is None
    answer["late_outcome"] = {"state": "maybe", "reason": "", "result": {}, "received_at": "2026-11-29T20:00:07.250Z"}
    with pytest.raises(InvalidResponse, match=r"^late_outcome\.state: expected one of"):
        read(Operation, answer)


def test_time_format_round_trip() -> None:
    """Times keep millisecond precision and come back with a Z."""
    text = "2026-11-29T20:00:00.123Z"
    assert format_time(parse_time(text)) == text
    assert format_time(parse_time("2026-11-29T21:00:00.5+01:00")) == "2026-11-29T20:00:00.500Z"


def test_an_event_member_this_client_does_not_know_is_kept_and_written_back() -> None:
    """A newer Control Plane's event member reaches the caller in ``unknown``
    and is written back as it came (the known members read as before)."""
    document = {
        "sequence": 3,
        "fleet_sequence": 9,
        "edge_id": "edge-a",
        "kind": "node.ready",
        "occurred_at": "2026-12-01T10:00:00.000Z",
        "recorded_at": "2026-12-01T10:00:00.250Z",
        "node_id": "node-1",
        "provider_id": None,
        "command_id": None,
        "message": "",
        "trace_id": "t-42",
        "attributes": {"a": "b"},
    }
    event = read(Event, document)
    assert event.unknown == {"trace_id": "t-42"} and event.node_id == "node-1"
    assert to_json(event) == document
