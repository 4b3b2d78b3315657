"""The web console in headless Chromium against a real Control Plane.

The browser runs in one dedicated thread (Playwright's sync API must stay on
the thread that started it) while the test reactor serves the Control Plane
and drives a scripted edge; every browser wait is bounded.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors

from twisted_iop.testing.harness import start_control_plane
from twisted_iop.testing.wires.peers import connect_edge, set_engine, snapshot
from twisted_iop.wire import control_pb2 as pb


def subscribe_envelope_bytes() -> list[int]:
    """What Python's protobuf makes of a subscribe request envelope."""
    envelope = pb.ClientEnvelope(request_id=300)
    envelope.subscribe_request.CopyFrom(pb.SubscribeRequest(edge_id="edge-ä", resume=True, since_sequence=2**40 + 5))
    return list(envelope.SerializeToString())


def event_envelope_bytes() -> list[int]:
    """A FleetEvent envelope with every field set, as the server sends it."""
    envelope = pb.ClientEnvelope(request_id=0)
    envelope.event.CopyFrom(
        pb.FleetEvent(
            sequence=7,
            fleet_sequence=2**33,
            edge_id="edge-a",
            kind="node.ready",
            occurred_at_ms=1_764_446_400_123,
            recorded_at_ms=1_764_446_400_456,
            node_id="node-1",
            provider_id="mock-1",
            command_id="c1",
            message="ready ✓",
            attributes={"a": "1", "b": "2"},
        )
    )
    return list(envelope.SerializeToString())


PROTO_CHECK = """
async ([subscribeBytes, eventBytes]) => {
  const proto = await import('/console/js/proto.js');
  const encoded = Array.from(proto.encodeClientEnvelope(300, 'subscribe_request',
      {edgeId: 'edge-ä', resume: true, sinceSequence: 2 ** 40 + 5}));
  const hello = proto.decodeClientEnvelope(proto.encodeClientEnvelope(1, 'client_hello_request',
      {clientName: 'x', protocolMajor: 1, protocolMinor: 0, apiToken: 't'}));
  const decoded = proto.decodeClientEnvelope(new Uint8Array(eventBytes));
  let truncated = null;
  try { proto.decodeClientEnvelope(new Uint8Array(eventBytes.slice(0, 9))); } catch (e) { truncated = e.name; }
  return {sameAsPython: JSON.stringify(encoded) === JSON.stringify(subscribeBytes), decoded, truncated,
          helloBody: hello.body};
}
"""


@pytest.mark.browser
@pytest_twisted.ensureDeferred
async def test_console_end_to_end(browser: Browser) -> None:
    """The console shows the edge and its nodes, follows a Node disconnect live and runs a command."""
    cp = await start_control_plane()
    nodes_up = {"node-1": True}

    def status() -> pb.EdgeStatusResponse:
        response = snapshot("edge-a")
        for node in response.nodes:
            if not nodes_up.get(node.node_id, True):
                node.connected = False
                for p in node.providers:
                    p.status = pb.PROVIDER_STATUS_UNAVAILABLE
                    p.health = pb.PROVIDER_HEALTH_OFFLINE
                    p.capacity = p.in_flight = p.queued = 0
                    p.long_context_capacity = p.long_context_in_flight = p.long_context_queued = 0
        return response

    try:
        edge, hello = await connect_edge(cp.edge_wire_port, "edge-a", status=status)
        assert hello is not None and hello.accepted
        await connect_edge(cp.edge_wire_port, "edge-b")
        page = browser.page

        def load() -> None:
            page.goto(cp.http_url + "/console/")
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-a"][data-connected="true"]')
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-b"]')
            page.click('iop-fleet-overview button[data-edge="edge-a"]')
            page.wait_for_selector('iop-edge-detail tr[data-node="node-1"][data-connected="true"]')
            page.wait_for_selector('iop-edge-detail tr[data-node="node-2"][data-connected="true"]')
            page.wait_for_selector(
                'iop-edge-detail tr[data-provider="mock-1"][data-status="available"][data-health="healthy"]'
            )
            page.wait_for_selector('iop-event-stream [data-state="live"]')

        await browser.call(load)
        assert await browser.call(lambda: page.url.endswith("#edge=edge-a"))
        detail_text = await browser.call(lambda: page.inner_text("iop-edge-detail section"))
        assert "Long context" in detail_text and "1/4" in detail_text

        proto = await browser.call(
            lambda: page.evaluate(PROTO_CHECK, [subscribe_envelope_bytes(), event_envelope_bytes()])
        )
        assert proto["sameAsPython"], proto
        assert proto["helloBody"] is None  # a request body is not one the console decodes
        decoded = proto["decoded"]
        assert decoded["body"] == "event" and decoded["request_id"] == 0
        event = decoded["message"]
        assert (event["sequence"], event["fleet_sequence"], event["kind"], event["message"]) == (
            7,
            2**33,
            "node.ready",
            "ready ✓",
        )
        assert event["attributes"] == {"a": "1", "b": "2"} and event["occurred_at_ms"] == 1_764_446_400_123
        assert proto["truncated"] == "ProtoDecodeError"

        # A Node goes away at the edge: the console shows it without a reload.
        nodes_up["node-1"] = False
        edge.event("node.disconnected", node_id="node-1", message="node node-1 disconnected")

        def node_gone() -> None:
            page.wait_for_selector('iop-event-stream li[data-kind="node.disconnected"]', timeout=4000)
            page.wait_for_selector('iop-edge-detail tr[data-node="node-1"][data-connected="false"]', timeout=4000)
            page.wait_for_selector(
                'iop-edge-detail tr[data-provider="mock-1"][data-status="unavailable"][data-health="offline"]'
            )
            page.wait_for_selector('iop-edge-detail tr[data-node="node-2"][data-connected="true"]')

        await browser.call(node_gone)

        # A command from the form: its result shows, and the operation is listed.
        def run_command() -> str:
            page.select_option("iop-command-form select#cmd-name", "node.drain")
            page.wait_for_selector('iop-command-form select#cmd-target option[value="node-2"]', state="attached")
            page.select_option("iop-command-form select#cmd-target", "node-2")
            page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="succeeded"]')
            page.wait_for_selector('iop-operations tr[data-state="succeeded"]')
            text: str = page.inner_text("iop-command-form .outcome")
            return text

        outcome = await browser.call(run_command)
        assert "node.drain" in outcome and "node-2" in outcome
        assert [c.name for c in edge.commands_seen] == ["node.drain"]
        assert edge.commands_seen[0].target == "node-2"

        def unknown_target_rejected() -> str:
            page.select_option("iop-command-form select#cmd-name", "edge.diagnostics")
            page.wait_for_selector("iop-command-form input#cmd-target", state="detached")
            edge_rejects = page.inner_text("iop-command-form [data-params]")
            return str(edge_rejects)

        assert await browser.call(unknown_target_rejected) == ""

        # Choosing another edge switches every panel to it.
        def switch_edge() -> None:
            page.click('iop-fleet-overview button[data-edge="edge-b"]')
            page.wait_for_selector('iop-edge-detail h2:has-text("Edge edge-b")')
            page.wait_for_selector('iop-event-stream h2:has-text("Events of edge-b")')
            page.wait_for_selector('iop-event-stream li[data-kind="edge.connected"]')
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-b"][aria-current="true"]')

        await browser.call(switch_edge)
        assert await browser.call(lambda: page.url.endswith("#edge=edge-b"))

        # The elements work on their own, with their attributes in the markup.
        def hosted() -> int:
            page.evaluate(
                """() => { document.body.innerHTML =
                  '<iop-edge-detail edge-id="edge-a" refresh-interval="0"></iop-edge-detail>' +
                  '<iop-operations edge-id="edge-a"></iop-operations>'; }"""
            )
            page.wait_for_selector('body > iop-edge-detail tr[data-node="node-2"][data-connected="true"]')
            page.wait_for_selector('body > iop-operations tr[data-state="succeeded"]')
            count: int = page.evaluate(
                "async () => (await import('/console/js/wire.js')).liveConnections()"
                ".filter(c => c.edgeId === 'edge-a' && c.listeners > 0).length"
            )
            return count

        assert await browser.call(hosted) == 1  # both elements share one WebSocket
        assert page_errors(browser) == []
    finally:
        await cp.stop()


#: What the edge detail shows of each provider's engine.
ENGINE_CELLS = """() => {
  const root = document.querySelector('iop-edge-detail').shadowRoot;
  const cells = (row) => ({
    load: row.querySelector('[data-engine-load]').innerText,
    kv: row.querySelector('[data-kv-cache]').innerText,
    kvBar: row.querySelector('[data-kv-cache] .bar > i')?.style.width ?? null,
    rate: row.querySelector('[data-tokens-per-second]').innerText,
    badges: Array.from(row.querySelectorAll('.badge')).map((b) => b.innerText),
  });
  return {
    busy: cells(root.querySelector('tr[data-provider="mock-2"]')),
    quiet: cells(root.querySelector('tr[data-provider="mock-1"]')),
    summary: root.querySelector('[data-engine-summary]').innerText,
    headers: root.querySelector('thead').innerText,
  };
}"""


@pytest.mark.browser
@pytest_twisted.ensureDeferred
async def test_engine_load_shows_beside_the_capacity_bars(browser: Browser) -> None:
    """A provider whose engine reports its load shows running / waiting, a KV
    cache bar and percent, tokens/s and saturated / cooling down badges beside
    its capacity; one without a reading shows dashes and no badge."""
    cp = await start_control_plane()

    def status() -> pb.EdgeStatusResponse:
        response = snapshot("edge-a")
        set_engine(response.nodes[1].providers[0], running=2, waiting=5, saturated=True, cooling_down=True)
        return response

    try:
        await connect_edge(cp.edge_wire_port, "edge-a", status=status)
        page = browser.page

        def shown() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector(
                'iop-edge-detail tr[data-provider="mock-2"][data-saturated="true"][data-cooling-down="true"]'
            )
            page.wait_for_selector('iop-edge-detail tr[data-provider="mock-1"][data-saturated="false"]')
            cells: dict[str, Any] = page.evaluate(ENGINE_CELLS)
            return cells

        cells = await browser.call(shown)
        busy, quiet = cells["busy"], cells["quiet"]
        assert (busy["load"], busy["kv"], busy["kvBar"], busy["rate"]) == ("2/5", "42%", "42%", "37.5")
        assert busy["badges"] == ["available", "saturated", "cooling down", "healthy"]
        assert (quiet["load"], quiet["kv"], quiet["kvBar"], quiet["rate"]) == ("—", "—", None, "0.0")
        assert quiet["badges"] == ["available", "healthy"]
        assert "Engine" in cells["headers"] and "KV cache" in cells["headers"]
        assert "2/5" in cells["summary"] and "1 of 2 report" in cells["summary"] and "37.5" in cells["summary"]
        assert page_errors(browser) == []
    finally:
        await cp.stop()


@pytest.mark.browser
@pytest_twisted.ensureDeferred
async def test_console_config_and_token_prompt(browser: Browser) -> None:
    """With an API token configured the page asks for it; once given, the fleet loads."""
    cp = await start_control_plane(config_text="http:\n  api_token: s3cret\n")
    try:
        await connect_edge(cp.edge_wire_port, "edge-a")
        code, config = await cp.get_json("/console/config.json")
        assert code == 200 and config["api_token_required"] is True
        page = browser.page

        def flow() -> None:
            page.goto(cp.http_url + "/console/")
            page.wait_for_selector("#token-form:not([hidden])")
            page.wait_for_selector("iop-fleet-overview [data-error]:not([hidden])")
            page.fill("#token", "s3cret")
            page.click("#token-form button")
            page.wait_for_selector('iop-fleet-overview button[data-edge="edge-a"][data-connected="true"]')
            page.wait_for_selector('iop-event-stream [data-state="live"]')

        await browser.call(flow)
        errors = [e for e in page_errors(browser) if "401" not in e and "403" not in e]
        assert errors == []
    finally:
        await cp.stop()
