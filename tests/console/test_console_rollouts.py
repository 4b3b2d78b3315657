"""The rollout panel against a real Control Plane with labelled scripted edges (the agreed /rollouts shapes).

From the command form, "Run on many edges" with a selector starts a
rollout (POST /rollouts); the rollout panel's progress bar moves to done
and its counts match; a second, paced rollout is paused, resumed and
cancelled from the panel's buttons.
"""

from __future__ import annotations

from typing import Any

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors
from labelled_edges import MANY_EDGES_CONFIG, connect_fleet

from twisted_iop.testing.harness import start_control_plane

pytestmark = pytest.mark.browser

EDGES = {f"edge-{i:02d}": {"region": "eu" if i % 2 == 0 else "us"} for i in range(20)}
EU = sorted(e for e, labels in EDGES.items() if labels["region"] == "eu")
DETAIL = "iop-rollouts [data-rollout-detail]"


def start_rollout(page: Any, selector: str, batch: int, in_flight: int, pause: float) -> str:
    """Fill the command form as a rollout of node.drain on node-1 and submit it; answer the rollout id."""
    page.select_option("iop-command-form select#cmd-name", "node.drain")
    page.wait_for_selector('iop-command-form select#cmd-target option[value="node-1"]', state="attached")
    page.select_option("iop-command-form select#cmd-target", "node-1")
    if not page.is_checked("iop-command-form #cmd-many"):
        page.check("iop-command-form #cmd-many")
    page.fill("iop-command-form #ro-selector", selector)
    page.fill("iop-command-form #ro-batch", str(batch))
    page.fill("iop-command-form #ro-in-flight", str(in_flight))
    page.fill("iop-command-form #ro-pause", str(pause))
    page.click("iop-command-form button[type=submit]")
    started = page.wait_for_selector("iop-command-form [data-rollout-started]")
    rollout_id: str = started.get_attribute("data-rollout-started")
    page.wait_for_selector(f'iop-rollouts [data-rollout-detail="{rollout_id}"]')
    return rollout_id


@pytest_twisted.ensureDeferred
async def test_rollout_from_the_form_runs_to_done_and_can_be_paused_resumed_cancelled(browser: Browser) -> None:
    """A selector rollout's bar reaches 100% with every eu edge succeeded; a paced one pauses, resumes and cancels."""
    cp = await start_control_plane(config_text=MANY_EDGES_CONFIG)
    try:
        await connect_fleet(cp.edge_wire_port, EDGES)
        page = browser.page

        def run_to_done() -> dict[str, Any]:
            page.goto(cp.http_url + "/console/#edge=edge-00")
            page.wait_for_selector("iop-command-form select#cmd-name")
            page.evaluate(
                "() => { window.__progress = []; document.addEventListener('iop-rollout-loaded',"
                " (e) => window.__progress.push(e.detail.rollout.progress)); }"
            )
            rollout_id = start_rollout(page, "region=eu", batch=3, in_flight=3, pause=0)
            page.wait_for_selector(f'{DETAIL}[data-state="succeeded"] [data-progress="100"]', timeout=20_000)
            counts = {
                state: int(page.inner_text(f'{DETAIL} [data-count-state="{state}"] b'))
                for state in ("succeeded", "failed", "pending", "in_flight")
            }
            return {"rollout_id": rollout_id, "counts": counts, "progress": page.evaluate("() => window.__progress")}

        done = await browser.call(run_to_done)
        progress = done["progress"]
        assert progress[-1] == 1 and progress == sorted(progress), progress  # the bar only moves forward, to done
        assert done["counts"] == {"succeeded": len(EU), "failed": 0, "pending": 0, "in_flight": 0}, done
        code, rollout = await cp.get_json(f"/rollouts/{done['rollout_id']}")
        assert code == 200 and rollout["state"] == "succeeded" and rollout["targets"] == len(EU), rollout
        code, executions = await cp.get_json(f"/rollouts/{done['rollout_id']}/executions?limit=100")
        assert code == 200 and sorted(e["edge_id"] for e in executions["items"]) == EU

        def pause_resume_cancel() -> list[str]:
            # One edge per batch and a long pause between batches: there is time to press the buttons.
            start_rollout(page, "region=us", batch=1, in_flight=1, pause=30)
            states = []
            page.wait_for_selector(f'{DETAIL}[data-state="running"]')
            page.click(f'{DETAIL} button[data-action="pause"]')
            page.wait_for_selector(f'{DETAIL}[data-state="paused"]')
            states.append("paused")
            page.click(f'{DETAIL} button[data-action="resume"]')
            page.wait_for_selector(f'{DETAIL}[data-state="running"]')
            states.append("running")
            page.click(f'{DETAIL} button[data-action="cancel"]')
            page.wait_for_selector(f'{DETAIL}[data-state="cancelled"]')
            states.append("cancelled")
            assert page.is_disabled(f'{DETAIL} button[data-action="pause"]')
            assert page.is_disabled(f'{DETAIL} button[data-action="cancel"]')
            return states

        assert await browser.call(pause_resume_cancel) == ["paused", "running", "cancelled"]
        assert page_errors(browser) == []
    finally:
        await cp.stop()
