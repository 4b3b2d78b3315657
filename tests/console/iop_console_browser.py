"""Headless Chromium for the console tests (Python Playwright, Debian's chromium).

The browser runs in one dedicated thread (Playwright's sync API must stay on
the thread that started it) while the test reactor serves the Control Plane;
``Browser.call`` runs a function there and answers a Deferred. Every wait in
the browser is bounded by ``WAIT_MS``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads

T = TypeVar("T")

from_threads = cast(IReactorFromThreads, reactor)

ROOT = Path(__file__).resolve().parents[2]
#: Where docs/console.md's pictures are, refreshed only on request
#: (IOP_UPDATE_SCREENSHOT=1, tests/console/test_console_screenshots.py), so
#: a test run leaves the tree as it was.
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
#: Longest any single browser wait may take, in milliseconds (generous: a
#: busy machine renders slowly; a failing wait fails after it, not a test
#: that measures speed).
WAIT_MS = 30_000


class Browser:
    """A headless Chromium page driven from one worker thread."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="playwright")
        self._playwright: Any = None
        self._browser: Any = None
        self.page: Any = None
        self.console_errors: list[str] = []

    def call(self, fn: Callable[..., T], *args: Any) -> Deferred[T]:
        """Run ``fn(*args)`` on the browser thread; the Deferred fires in the reactor."""
        d: Deferred[T] = Deferred()
        future = self._executor.submit(fn, *args)

        def done(f: concurrent.futures.Future[T]) -> None:
            error = f.exception()
            if error is not None:
                from_threads.callFromThread(d.errback, error)
            else:
                from_threads.callFromThread(d.callback, f.result())

        future.add_done_callback(done)
        return d

    def _start(self) -> None:
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        context = self._browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="dark")
        context.set_default_timeout(WAIT_MS)
        self.page = context.new_page()
        self.page.on(
            "console",
            lambda m: (
                self.console_errors.append(f"{m.text} at {m.location.get('url', '')}") if m.type == "error" else None
            ),
        )
        self.page.on("pageerror", lambda e: self.console_errors.append(str(e)))

    def start(self) -> Deferred[None]:
        """Launch Chromium and open a page."""
        return self.call(self._start)

    def _stop(self) -> None:
        if self._browser is not None:
            self._browser.close()
        if self._playwright is not None:
            self._playwright.stop()

    async def stop(self) -> None:
        """Close the browser and its thread."""
        try:
            await self.call(self._stop)
        finally:
            self._executor.shutdown(wait=False)


def page_errors(browser: Browser) -> list[str]:
    """The page's console errors, less the 404 of ``GET /rollouts`` from a
    Control Plane that has no rollouts (the rollout panel says so and stops
    asking; tests/console/test_console_rollouts.py covers the panel)."""
    return [e for e in browser.console_errors if not ("404" in e and "/rollouts?" in e)]


@pytest.fixture
def browser() -> Iterator[Browser]:
    """A started browser, closed after the test."""
    b = Browser()
    pytest_twisted.blockon(b.start())
    yield b
    pytest_twisted.blockon(Deferred.fromCoroutine(b.stop()))
