"""The status repository against canned JSON (StubTreq), and its error mapping."""

from __future__ import annotations

import copy
import json
import socket
from datetime import UTC, datetime

import pytest
import pytest_twisted
from iop_client_fakes import (
    EDGE_STATUS,
    EVENTS,
    FLEET_STATUS,
    OPERATION,
    FakeControlPlaneResource,
    error_body,
)
from treq.testing import StubTreq

from twisted_iop.client import (
    ControlPlaneError,
    ControlPlaneStatusRepository,
    ControlPlaneUnreachable,
    EdgeDisconnectedError,
    EdgeNotConnectedError,
    EdgeTimeoutError,
    ForbiddenError,
    InvalidResponse,
    NotFoundError,
    UnauthorizedError,
    UnknownCommandError,
    UnknownEdgeError,
)
from twisted_iop.client.models import EdgeStatus, ProviderCounters, format_time, parse_time, to_json
from twisted_iop.client.repository import DEFAULT_HTTP_URL, HTTP_URL_ENV


def make(resource: FakeControlPlaneResource, token: str | None = None) -> ControlPlaneStatusRepository:
    """A repository speaking to ``resource`` through StubTreq."""
    return ControlPlaneStatusRepository("http://cp.test:8080/", api_token=token, http_client=StubTreq(resource))


@pytest.fixture
def fake() -> FakeControlPlaneResource:
    """A fresh fake Control Plane."""
    return FakeControlPlaneResource()


def test_base_url_from_argument_environment_and_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The base URL comes from the argument, else the environment, else the default."""
    monkeypatch.delenv(HTTP_URL_ENV, raising=False)
    assert ControlPlaneStatusRepository(http_client=object()).base_url == DEFAULT_HTTP_URL
    monkeypatch.setenv(HTTP_URL_ENV, "http://cp.example:9000/")
    assert ControlPlaneStatusRepository(http_client=object()).base_url == "http://cp.example:9000"
    assert ControlPlaneStatusRepository("http://x:1", http_client=object()).base_url == "http://x:1"


@pytest_twisted.ensureDeferred
async def test_edges_page_is_typed(fake: FakeControlPlaneResource) -> None:
    """GET /edges gives typed summaries with parsed times, labels and commands."""
    page = await make(fake).edges()
    assert page.total == 2 and page.next_cursor is None
    a, b = page.items
    assert a.edge_id == "edge-a" and a.connected is True
    assert a.labels == {"site": "lab", "region": "eu"}
    assert a.commands == ("node.drain", "node.undrain")
    assert a.connected_at == datetime(2026, 11, 29, 20, 0, 0, 123000, tzinfo=UTC)
    assert b.connected is False and b.disconnected_at is not None and b.connected_at is None


@pytest_twisted.ensureDeferred
async def test_limit_and_cursor_go_into_the_query(fake: FakeControlPlaneResource) -> None:
    """Paging parameters are sent as query arguments, absent ones are not sent."""
    repo = make(fake)
    await repo.edges(limit=5, cursor="edge-a")
    assert fake.requests[-1]["args"] == {"limit": ["5"], "cursor": ["edge-a"]}
    await repo.edges()
    assert fake.requests[-1]["args"] == {}
    await repo.events("edge-a", since=7, limit=10)
    assert fake.requests[-1]["args"] == {"since": ["7"], "limit": ["10"]}


@pytest_twisted.ensureDeferred
async def test_edge_detail_has_buffer_figures(fake: FakeControlPlaneResource) -> None:
    """GET /edges/{id} carries the snapshot and buffer blocks."""
    edge = await make(fake).edge("edge-a")
    assert edge.status is not None and edge.status.available and not edge.status.stale
    assert edge.events is not None and (edge.events.capacity, edge.events.kept, edge.events.dropped) == (1000, 120, 3)
    assert edge.events.last_sequence == 123
    assert edge.operations is not None and edge.operations.last_sequence is None


@pytest_twisted.ensureDeferred
async def test_edge_status_has_nodes_providers_and_counters(fake: FakeControlPlaneResource) -> None:
    """The status view parses nodes, providers and both counter classes."""
    status = await make(fake).edge_status("edge-a")
    assert [n.node_id for n in status.nodes] == ["node-1", "node-2"]
    provider = status.nodes[0].providers[0]
    assert provider.status == "available" and provider.health == "healthy"
    assert provider.general == ProviderCounters(capacity=4, in_flight=1, queued=0)
    assert provider.long_context == ProviderCounters(capacity=1, in_flight=0, queued=2)
    offline = status.nodes[1].providers[0]
    assert (offline.status, offline.health, offline.general.capacity) == ("unavailable", "offline", 0)
    assert status.totals is not None and status.totals.providers_by_health["offline"] == 1
    assert status.totals.edges_known is None


@pytest_twisted.ensureDeferred
async def test_events_operations_commands(fake: FakeControlPlaneResource) -> None:
    """Events, operations, one operation and the command catalog parse."""
    repo = make(fake)
    events = await repo.events("edge-a")
    assert [e.sequence for e in events.items] == [7, 8] and events.next_since == 8
    assert events.items[0].provider_id is None and events.edge_id == "edge-a"
    operations = await repo.operations("edge-a")
    assert operations.items[0].state == "succeeded" and operations.capacity == 500
    operation = await repo.operation("edge-a", "0f3c9a")
    assert operation.finished and [h.state for h in operation.history] == ["sent", "accepted", "succeeded"]
    catalog = await repo.commands("edge-a")
    assert [c.name for c in catalog.commands] == ["node.drain", "edge.diagnostics"]
    assert catalog.commands[0].arguments[0].name == "reason" and not catalog.commands[0].arguments[0].required


@pytest_twisted.ensureDeferred
async def test_send_command_posts_the_documented_body(fake: FakeControlPlaneResource) -> None:
    """POST /edges/{id}/commands carries name, target, arguments, timeout and key as JSON."""
    operation = await make(fake).send_command(
        "edge-a",
        "node.drain",
        target="node-1",
        arguments={"reason": "maintenance"},
        timeout_seconds=3,
        idempotency_key="drain-1",
    )
    request = fake.requests[-1]
    assert request["method"] == "POST" and request["headers"]["content-type"] == "application/json"
    assert json.loads(request["body"]) == {
        "name": "node.drain",
        "target": "node-1",
        "arguments": {"reason": "maintenance"},
        "timeout_seconds": 3,
        "idempotency_key": "drain-1",
    }
    assert operation.result == {"drained": "true"}


@pytest_twisted.ensureDeferred
async def test_fleet_views(fake: FakeControlPlaneResource) -> None:
    """Fleet status, all pages of it, fleet events and fleet operations parse."""
    repo = make(fake)
    first = await repo.fleet_status()
    assert first.next_cursor == "edge-a" and first.totals.edges_known == 2
    full = await repo.full_fleet_status()
    assert [r.edge_id for r in full.items] == ["edge-a", "edge-b"]
    assert full.items[1].state == "disconnected" and full.items[1].stale
    assert full.next_cursor is None and full.totals.general.capacity == 12
    events = await repo.fleet_events(since=41)
    assert events.edge_id is None and fake.requests[-1]["args"] == {"since": ["41"]}
    operations = await repo.fleet_operations()
    assert operations.total == 1 and operations.capacity is None


@pytest_twisted.ensureDeferred
async def test_health_and_readiness(fake: FakeControlPlaneResource) -> None:
    """healthz answers ok; a 503 readyz is a result (ready=False), not an error."""
    repo = make(fake)
    assert (await repo.healthz()).status == "ok"
    assert (await repo.readyz()).ready is True
    fake.routes[("GET", "/readyz")] = (503, {"ready": False, "listeners": {"http": True, "edge_wire": False}})
    readiness = await repo.readyz()
    assert readiness.ready is False and readiness.listeners["edge_wire"] is False


@pytest_twisted.ensureDeferred
async def test_unknown_edge_error_carries_code_status_message(fake: FakeControlPlaneResource) -> None:
    """A 404 unknown_edge becomes UnknownEdgeError with the server's code, status and message."""
    with pytest.raises(UnknownEdgeError) as caught:
        await make(fake).edge_status("nope")
    assert caught.value.code == "unknown_edge" and caught.value.status == 404
    assert caught.value.message == "no edge named 'nope' is known"
    assert isinstance(caught.value, ControlPlaneError)


@pytest_twisted.ensureDeferred
async def test_not_connected_carries_the_stale_snapshot(fake: FakeControlPlaneResource) -> None:
    """409 edge_not_connected raises EdgeNotConnectedError with the last snapshot, marked stale."""
    with pytest.raises(EdgeNotConnectedError) as caught:
        await make(fake).edge_status("edge-b")
    snapshot = caught.value.snapshot
    assert snapshot is not None and snapshot.stale and snapshot.edge_id == "edge-b"
    assert len(snapshot.nodes) == 2


@pytest_twisted.ensureDeferred
async def test_command_timeout_and_disconnect_carry_the_operation(fake: FakeControlPlaneResource) -> None:
    """504 edge_timeout / 503 edge_disconnected raise with the operation record attached."""
    timed_out = dict(OPERATION, state="timed_out", reason="no answer in 3 s")
    fake.routes[("POST", "/edges/edge-a/commands")] = (
        504,
        error_body("edge_timeout", "edge 'edge-a' did not answer in time", 504, operation=timed_out),
    )
    with pytest.raises(EdgeTimeoutError) as caught:
        await make(fake).send_command("edge-a", "node.drain", target="node-1")
    assert caught.value.operation is not None and caught.value.operation.state == "timed_out"
    gone = dict(OPERATION, state="edge_disconnected")
    fake.routes[("POST", "/edges/edge-a/commands")] = (
        503,
        error_body("edge_disconnected", "edge went away", 503, operation=gone),
    )
    with pytest.raises(EdgeDisconnectedError) as caught2:
        await make(fake).send_command("edge-a", "node.drain")
    assert caught2.value.operation is not None and caught2.value.operation.state == "edge_disconnected"


@pytest.mark.parametrize(
    "status, code, cls",
    [
        (400, "unknown_command", UnknownCommandError),
        (404, "not_found", NotFoundError),
        (418, "brand_new_code", ControlPlaneError),
    ],
)
@pytest_twisted.ensureDeferred
async def test_error_codes_map_to_classes(fake: FakeControlPlaneResource, status: int, code: str, cls: type) -> None:
    """Each documented code maps to its class; an unknown code to the base class."""
    fake.routes[("POST", "/edges/edge-a/commands")] = (status, error_body(code, "words", status))
    with pytest.raises(ControlPlaneError) as caught:
        await make(fake).send_command("edge-a", "x")
    assert type(caught.value) is cls and caught.value.code == code and caught.value.status == status


@pytest_twisted.ensureDeferred
async def test_error_without_error_document(fake: FakeControlPlaneResource) -> None:
    """A non-JSON error (a proxy's HTML page) still raises ControlPlaneError with the status."""
    fake.routes[("GET", "/fleet/status")] = (502, b"<html>Bad Gateway</html>")
    with pytest.raises(ControlPlaneError) as caught:
        await make(fake).fleet_status()
    assert caught.value.code == "http_502" and caught.value.status == 502
    assert "Bad Gateway" in caught.value.message


@pytest_twisted.ensureDeferred
async def test_bearer_token_is_sent(fake: FakeControlPlaneResource) -> None:
    """The API token goes out as a Bearer header; without it 401, wrong 403."""
    fake.api_token = "s3cret"
    assert (await make(fake, token="s3cret").edges()).total == 2
    assert fake.requests[-1]["headers"]["authorization"] == "Bearer s3cret"
    with pytest.raises(UnauthorizedError):
        await make(fake).edges()
    with pytest.raises(ForbiddenError):
        await make(fake, token="wrong").edges()


@pytest_twisted.ensureDeferred
async def test_edge_ids_are_quoted_in_paths(fake: FakeControlPlaneResource) -> None:
    """An edge id with reserved characters cannot escape its path segment."""
    with pytest.raises(NotFoundError):
        await make(fake).edge("a/b?c")
    assert fake.requests[-1]["uri"] == "/edges/a%2Fb%3Fc"


@pytest_twisted.ensureDeferred
async def test_answers_that_are_not_the_documented_json(fake: FakeControlPlaneResource) -> None:
    """A body that is not JSON, or has a wrongly typed field, raises InvalidResponse naming it."""
    fake.routes[("GET", "/edges")] = (200, b"not json")
    with pytest.raises(InvalidResponse):
        await make(fake).edges()
    broken = copy.deepcopy(EDGE_STATUS)
    broken["nodes"][0]["providers"][0]["general"]["capacity"] = "four"
    fake.routes[("GET", "/edges/edge-a/status")] = (200, broken)
    with pytest.raises(InvalidResponse) as caught:
        await make(fake).edge_status("edge-a")
    assert "nodes[0].providers[0].general.capacity" in caught.value.message


@pytest_twisted.ensureDeferred
async def test_unknown_fields_are_ignored(fake: FakeControlPlaneResource) -> None:
    """A newer server's extra fields do not break parsing."""
    newer = dict(copy.deepcopy(EDGE_STATUS), brand_new={"x": 1})
    newer["nodes"][0]["gpu_temperature"] = 71
    fake.routes[("GET", "/edges/edge-a/status")] = (200, newer)
    assert (await make(fake).edge_status("edge-a")).nodes[0].node_id == "node-1"


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


def test_models_round_trip_to_the_documented_json() -> None:
    """to_json gives back the documented shapes (times, nested counters, lists)."""
    assert to_json(EdgeStatus.from_json(EDGE_STATUS)) == EDGE_STATUS
    from twisted_iop.client.models import EventPage, FleetStatus, Operation

    assert to_json(Operation.from_json(OPERATION)) == OPERATION
    assert to_json(EventPage.from_json(EVENTS)) == EVENTS
    assert to_json(FleetStatus.from_json(FLEET_STATUS)) == FLEET_STATUS


def test_time_format_round_trip() -> None:
    """Times keep millisecond precision and come back with a Z."""
    text = "2026-11-29T20:00:00.123Z"
    assert format_time(parse_time(text)) == text
    assert format_time(parse_time("2026-11-29T21:00:00.5+01:00")) == "2026-11-29T20:00:00.500Z"
