"""The static web console's files, served by the Control Plane at /console/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twisted.web.resource import NoResource
from twisted.web.static import File

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console" / "static"


class ConsoleFiles(File):
    """Static console files; never a directory listing."""

    indexNames = ["index.html"]

    def directoryListing(self) -> Any:
        return NoResource("no such console page")

    def createSimilarFile(self, path: str) -> ConsoleFiles:
        return ConsoleFiles(path, self.defaultType, self.ignoredExts, self.registry)
