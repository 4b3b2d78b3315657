"""The console and iopctl against a real fleet: CP, Edge and Nodes as twistd daemons.

This is the operator's view end to end: the daemons are started the way a
user starts them, a Node process is killed and the open console shows it
without a reload, a drain is sent from the console's form, and iopctl
reads the same fleet. Its screenshot stays in the test's temporary directory
(docs/console.md's pictures are test_console_screenshots.py's).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import yaml
from iop_console_browser import Browser, page_errors
from twisted.internet import reactor
from twisted.internet.utils import getProcessOutputAndValue

from twisted_iop.testing.configs import CONTROL_PLANE_LOOPBACK_ENV, LOOPBACK_ZERO, mock_provider_entry
from twisted_iop.testing.harness import IOPCTL, Daemon, start_daemon, wait_for_ports

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

BACKOFF = {"initial_seconds": 0.05, "max_seconds": 0.5}


def edge_config(cp_edge_wire: str) -> dict[str, Any]:
    """edge.yaml: two mock nodes that will run and a vLLM node that never comes."""
    return {
        "control_plane": {
            "address": cp_edge_wire,
            "edge_id": "edge-lab",
            "labels": {"site": "lab", "region": "eu"},
            "backoff": BACKOFF,
        },
        "node_server": {"listen": LOOPBACK_ZERO, "probe_timeout_seconds": 2},
        "inference": {"listen": LOOPBACK_ZERO},
        "nodes": [
            {
                "node_id": "gpu-01",
                "providers": [mock_provider_entry("mock-a")],
            },
            {
                "node_id": "gpu-02",
                "providers": [mock_provider_entry("mock-b")],
            },
            {
                "node_id": "gpu-03",
                "providers": [
                    {
                        "provider_id": "vllm-c",
                        "kind": "vllm",
                        "models": ["llama-3-70b"],
                        "capacity": 16,
                        "long_context_capacity": 4,
                    }
                ],
            },
        ],
    }


def node_config(node_id: str, edge_port: int) -> dict[str, Any]:
    """node.yaml for the two mock nodes (gpu-02 reports itself degraded)."""
    providers = {
        "gpu-01": [{"provider_id": "mock-a", "kind": "mock", "models": ["llama-3-8b"]}],
        "gpu-02": [
            {
                "provider_id": "mock-b",
                "kind": "mock",
                "models": ["llama-3-8b", "qwen-2-7b"],
                "mock": {"health": "degraded", "reason": "p95 latency above 2 s"},
            }
        ],
    }[node_id]
    return {
        "node_id": node_id,
        "edge": {"address": f"127.0.0.1:{edge_port}", "backoff": BACKOFF},
        "probes": {"interval_seconds": 0.2, "timeout_seconds": 1},
        "providers": providers,
    }


def write(path: Path, data: dict[str, Any]) -> str:
    """Write YAML; answer the path."""
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest_twisted.ensureDeferred
async def test_console_on_a_fleet_of_daemons(browser: Browser, tmp_path: Path) -> None:
    """Real daemons: the console shows the nodes, a killed Node live, a drain from the form; iopctl agrees."""
    screenshot = tmp_path / "console.png"
    daemons: list[Daemon] = []
    try:
        cp = start_daemon(["iop-control-plane"], tmp_path, env=CONTROL_PLANE_LOOPBACK_ENV, name="cp")
        daemons.append(cp)
        ports = await wait_for_ports(cp, {"http", "edge_wire", "client_wire"})
        http = f"http://127.0.0.1:{ports['http']}"
        edge = start_daemon(
            ["iop-edge", "--config", write(tmp_path / "edge.yaml", edge_config(f"127.0.0.1:{ports['edge_wire']}"))],
            tmp_path,
            name="edge",
        )
        daemons.append(edge)
        node_port = (await wait_for_ports(edge, {"node_server"}))["node_server"]
        nodes = {}
        for node_id in ("gpu-01", "gpu-02"):
            config = write(tmp_path / f"{node_id}.yaml", node_config(node_id, node_port))
            nodes[node_id] = start_daemon(["iop-node", "--config", config], tmp_path, name=node_id)
            daemons.append(nodes[node_id])
        page = browser.page

        def shows_the_fleet() -> None:
            page.goto(http + "/console/")
            page.wait_for_selector(
                'iop-fleet-overview button[data-edge="edge-lab"][data-connected="true"]', timeout=20_000
            )
            page.wait_for_selector('iop-edge-detail tr[data-node="gpu-01"][data-connected="true"]', timeout=20_000)
            page.wait_for_selector('iop-edge-detail tr[data-node="gpu-02"][data-connected="true"]', timeout=20_000)
            page.wait_for_selector('iop-edge-detail tr[data-provider="mock-b"][data-health="degraded"]')
            page.wait_for_selector('iop-edge-detail tr[data-node="gpu-03"][data-connected="false"]')
            page.wait_for_selector(
                'iop-edge-detail tr[data-provider="vllm-c"][data-status="unavailable"][data-health="offline"]'
            )
            page.wait_for_selector('iop-event-stream [data-state="live"]')

        await browser.call(shows_the_fleet)

        env = {k: v for k, v in os.environ.items() if not k.startswith("IOP_")}
        out, err, code = await getProcessOutputAndValue(
            IOPCTL, ["--url", http, "status", "edge-lab"], env=env, reactor=reactor
        )
        assert code == 0, err
        text = out.decode()
        assert "gpu-01" in text and "degraded" in text and "p95 latency above 2 s" in text

        nodes["gpu-01"].kill()

        def node_gone_live() -> None:
            page.wait_for_selector('iop-event-stream li[data-kind="node.disconnected"]', timeout=5000)
            page.wait_for_selector('iop-edge-detail tr[data-node="gpu-01"][data-connected="false"]', timeout=5000)
            page.wait_for_selector(
                'iop-edge-detail tr[data-provider="mock-a"][data-status="unavailable"][data-health="offline"]'
            )

        await browser.call(node_gone_live)

        def drain_from_the_form() -> None:
            page.select_option("iop-command-form select#cmd-name", "node.drain")
            page.wait_for_selector('iop-command-form select#cmd-target option[value="gpu-02"]', state="attached")
            page.select_option("iop-command-form select#cmd-target", "gpu-02")
            page.click("iop-command-form button[type=submit]")
            page.wait_for_selector('iop-command-form .outcome[data-state="succeeded"]')
            page.wait_for_selector('iop-edge-detail tr[data-provider="mock-b"][data-status="drained"]', timeout=6000)
            page.wait_for_selector('iop-operations tr[data-state="succeeded"]')
            # From the top (the form scrolled the page: a full-page shot of a
            # scrolled page draws the sticky header and fleet list mid-page);
            # animations="disabled" finishes the new-event highlight before the shot.
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshot), full_page=True, animations="disabled")

        await browser.call(drain_from_the_form)
        assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert screenshot.stat().st_size > 10_000
        out, err, code = await getProcessOutputAndValue(
            IOPCTL, ["--url", http, "--json", "operations", "edge-lab"], env=env, reactor=reactor
        )
        assert code == 0, err
        assert b'"node.drain"' in out and b'"succeeded"' in out
        assert page_errors(browser) == []
    finally:
        for daemon in reversed(daemons):
            daemon.stop()
