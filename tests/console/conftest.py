"""The console tests' shared fixture: one headless Chromium per test."""

from iop_console_browser import browser  # noqa: F401  (fixture)
