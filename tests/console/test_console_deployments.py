"""The Deployments panel against a real Control Plane, a real Edge (site=lab) and its real Node
declaring the mock engine profile: the dry run's placement shows before apply; applied, the
deployment's bar reaches 1/1 ready and its edge row shows chat-1 ready on node-1; a bad spec
shows the server's error naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_twisted
from iop_console_browser import Browser, page_errors

from twisted_iop.testing.deployments import DeploymentSite, start_site
from twisted_iop.testing.harness import start_control_plane, stop

pytestmark = pytest.mark.browser

PANEL = "iop-deployments"
SPEC = {"model": "m1", "profile": "mock", "parameters": {"tokens_per_second": 100}, "edge_selector": "site=lab"}


@pytest_twisted.ensureDeferred
async def test_dry_run_then_apply_reaches_ready(browser: Browser, tmp_path: Path) -> None:
    """Dry run: start chat-1 on node-1 at edge-lab, nothing kept; Apply: the panel shows chat with
    1/1 ready and the instance ready; a replicas_per_edge of 0 shows invalid_deployment naming it."""
    cp = await start_control_plane()
    site: DeploymentSite | None = None
    try:
        site = await start_site(tmp_path, cp, "edge-lab", "lab")
        page = browser.page

        def dry_run() -> list[str]:
            page.goto(cp.http_url + "/console/")
            page.wait_for_selector(f"{PANEL} #dep-name")
            page.fill(f"{PANEL} #dep-name", "chat")
            page.fill(f"{PANEL} #dep-spec", json.dumps(SPEC))
            page.click(f"{PANEL} button[data-dry-run]")
            page.wait_for_selector(f'{PANEL} [data-plan-for="chat"]')
            rows = page.query_selector_all(f"{PANEL} [data-plan-for] tbody tr")
            return [" ".join(row.inner_text().split()) for row in rows]

        assert await browser.call(dry_run) == ["edge-lab start chat-1 node-1"]
        code, listed = await cp.get_json("/deployments")
        assert code == 200 and listed["total"] == 0  # a dry run keeps nothing

        def apply() -> dict[str, str]:
            page.click(f"{PANEL} button[data-apply]")
            page.wait_for_selector(f'{PANEL} [data-deployment-detail="chat"]')
            page.wait_for_selector(f'{PANEL} tr[data-instance="chat-1"][data-instance-state="ready"]', timeout=30_000)
            page.wait_for_selector(f'{PANEL} tr[data-deployment="chat"] [data-ready]:has-text("1/1 ready")')
            return {
                "ready": page.inner_text(f'{PANEL} tr[data-deployment="chat"] [data-ready]'),
                "count": page.inner_text(f'{PANEL} [data-count-state="ready"] b'),
                "edge": page.get_attribute(f'{PANEL} tr[data-instance="chat-1"]', "data-edge-state") or "",
            }

        shown = await browser.call(apply)
        assert shown == {"ready": "1/1 ready", "count": "1", "edge": "ready"}

        def bad() -> str:
            page.fill(f"{PANEL} #dep-spec", json.dumps({**SPEC, "replicas_per_edge": 0}))
            page.click(f"{PANEL} button[data-apply]")
            return str(page.inner_text(f'{PANEL} [data-error-code="invalid_deployment"]'))

        assert "replicas_per_edge" in await browser.call(bad)
        code, chat = await cp.get_json("/deployments/chat")
        assert code == 200 and chat["rollup"]["ready"] == 1 and chat["generation"] == 1
        assert page_errors(browser) == [] or all("400" in e for e in page_errors(browser))
    finally:
        if site is not None:
            await stop(site.node, site.edge)
        await cp.stop()
