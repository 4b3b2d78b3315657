"""The console shows engines their Nodes launch: a crashed one with its reason, restart count
and next try, and its last lines (provider.logs through the command path).

A real Control Plane, Edge and Node run in this reactor; the Node launches an engine that
prints a few lines and exits with code 3, and restarts it only after a long delay, so the
console sees it crashed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors

from twisted_iop.testing.configs import gateway_edge_yaml, gateway_node_yaml, write_yaml
from twisted_iop.testing.engines.launch import free_port, launched_mock, launched_script
from twisted_iop.testing.harness import eventually, start_control_plane, start_edge, start_node, stop

#: The crashing engine's output, then its exit.
CRASHING = (
    "import sys\n"
    "print('loading weights from /models/tiny.gguf', flush=True)\n"
    "print('CUDA error: out of memory', file=sys.stderr, flush=True)\n"
    "sys.exit(3)\n"
)

LAUNCH_CELLS = """() => {
  const root = document.querySelector('iop-edge-detail').shadowRoot;
  const cell = (id) => root.querySelector(`tr[data-provider="${id}"] td[data-launch]`);
  const crashed = cell('crashy');
  return {
    state: crashed.dataset.launch,
    restarts: crashed.dataset.restarts,
    badge: crashed.querySelector('.badge').innerText,
    facts: crashed.querySelector('[data-launch-facts]').innerText,
    reason: crashed.querySelector('[data-launch-reason]').innerText,
    health: root.querySelector('tr[data-provider="crashy"]').dataset.health,
    ready: cell('steady').dataset.launch,
    headers: root.querySelector('thead').innerText,
  };
}"""

TARGET_OPTIONS = """() => Array.from(
  document.querySelector('iop-command-form').shadowRoot.querySelectorAll('select#cmd-target option'),
  (o) => o.textContent)"""

LOG_PANEL = """() => {
  const panel = document.querySelector('iop-edge-detail').shadowRoot.querySelector('[data-logs-panel]');
  return {hidden: panel.hidden, title: panel.querySelector('[data-logs-title]').textContent,
          text: panel.querySelector('[data-log-text]').innerText, state: panel.dataset.state || ''};
}"""


@pytest.mark.browser
@pytest_twisted.ensureDeferred
async def test_crashed_engine_shows_reason_restarts_and_its_last_lines(browser: Browser, tmp_path: Path) -> None:
    """A crashed launched engine: a "crashed" badge, "exited with code 3", "1 restart, next
    try ...", its health offline; "last lines" shows what it printed (stdout and stderr); the
    command form offers node/provider targets with their engines' states."""
    cp = await start_control_plane()
    services: list[Any] = []
    try:
        edge_config = gateway_edge_yaml(cp_address=cp.edge_wire_address, second_node=False)
        edge_config["nodes"][0]["providers"] = [
            {"provider_id": "crashy", "kind": "openai", "models": ["llama-3-8b"]},
            {"provider_id": "steady", "kind": "openai", "models": ["llama-3-8b"]},
        ]
        edge = await start_edge(write_yaml(tmp_path / "edge.yaml", edge_config))
        services.append(edge)
        restart = {"policy": "always", "initial_seconds": 300, "max_seconds": 300, "max_restarts": 5}
        node_config = gateway_node_yaml("node-1", edge.node_port, launched_script("crashy", CRASHING, restart=restart))
        node_config["providers"].append(launched_mock("steady", free_port()))
        node_config["state_directory"] = str(tmp_path / "state")
        node = start_node(write_yaml(tmp_path / "node.yaml", node_config))
        services.insert(0, node)

        def launch_of(provider_id: str) -> str:
            launch = edge.registry.providers.launch("node-1", provider_id)
            return launch.name if launch is not None else ""

        await eventually(
            lambda: launch_of("crashy") == "crashed" and launch_of("steady") == "ready",
            timeout=30,
            message="crashy crashed and steady ready at the Edge",
        )
        await eventually(lambda: cp.registry.get("edge-a").connected, timeout=10, message="the edge connected")
        page = browser.page

        def shown() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-a")
            page.wait_for_selector('iop-edge-detail tr[data-provider="crashy"] td[data-launch="crashed"]')
            cells: dict[str, Any] = page.evaluate(LAUNCH_CELLS)
            return cells

        cells = await browser.call(shown)
        assert (cells["state"], cells["restarts"], cells["badge"]) == ("crashed", "1", "crashed")
        assert cells["reason"] == "exited with code 3"
        assert cells["facts"].startswith("1 restart, next try ")
        assert cells["health"] == "offline" and cells["ready"] == "ready"
        assert "Launch" in cells["headers"]

        def logs() -> dict[str, Any]:
            page.click('iop-edge-detail button[data-logs="node-1/crashy"]')
            page.wait_for_function(
                "() => document.querySelector('iop-edge-detail').shadowRoot"
                ".querySelector('[data-logs-panel]').dataset.state === 'shown'"
            )
            panel: dict[str, Any] = page.evaluate(LOG_PANEL)
            return panel

        panel = await browser.call(logs)
        assert not panel["hidden"] and panel["title"] == "Last lines of node-1/crashy"
        assert "loading weights from /models/tiny.gguf" in panel["text"]
        assert "CUDA error: out of memory" in panel["text"]

        def form_targets() -> list[str]:
            page.select_option("iop-command-form #cmd-name", "provider.restart")
            page.wait_for_selector(
                'iop-command-form select#cmd-target[data-kind="provider"] option[value="node-1/crashy"]',
                state="attached",
            )
            options: list[str] = page.evaluate(TARGET_OPTIONS)
            return options

        assert await browser.call(form_targets) == [
            "node-1/crashy (engine crashed)",
            "node-1/steady (engine ready)",
        ]
        operations = cp.registry.get("edge-a").operations_kept or ()
        assert any(op.name == "provider.logs" and op.target == "node-1/crashy" for op in operations)
        assert page_errors(browser) == []
    finally:
        await stop(*services)
        await cp.stop()
