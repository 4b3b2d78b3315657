"""The static web console's files, served by the Control Plane at /console/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.web.pages import notFound
from twisted.web.static import File

CONSOLE_DIR = Path(__file__).resolve().parents[2] / "console" / "static"


class ConsoleFiles(File):
    """Static console files; never a directory listing."""

    indexNames = ["index.html"]  # noqa: RUF012 (twisted.web.static.File declares it an instance attribute)

    def directoryListing(self) -> Any:
        return notFound("Not Found", "no such console page")

    def getChild(self, path: bytes, request: Any) -> Any:
        # A NUL (or a path that is not text) can name no file; refuse it
        # before the file system sees it.
        if b"\x00" in path or b"\\" in path:
            return notFound("Not Found", "no such console page")
        try:
            path.decode("utf-8")
        except UnicodeDecodeError:
            return notFound("Not Found", "no such console page")
        return super().getChild(path, request)

    def createSimilarFile(self, path: str) -> ConsoleFiles:
        return ConsoleFiles(path, self.defaultType, self.ignoredExts, self.registry)
