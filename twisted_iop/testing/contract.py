"""Contract runs: schemathesis's ``st run`` against a real daemon's own
``/openapi.json``, and the figures of a run (cases, checks, failures, time).

The tests in ``tests/contract/`` start the daemons as a user would and hand
their URL here; ``st`` runs as a process (its own event loop and threads
stay out of the test reactor) and writes its JSON and NDJSON reports, which
are read back for the figures. See docs/http-api.md#contract-checks.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import attrs
from twisted.internet import reactor as global_reactor
from twisted.internet.interfaces import IReactorProcess
from twisted.internet.utils import getProcessOutputAndValue

from twisted_iop.testing.harness import TWISTD

#: The schemathesis command line of the test environment (beside twistd).
ST = str(Path(TWISTD).parent / "st")
#: The generation phases every contract run goes through.
PHASES = ("examples", "coverage", "fuzzing", "stateful")
#: Checks a run with a token cannot pass by design: ``ignored_auth`` sends
#: requests without the token and expects 401 (the token-less sweep checks
#: that on every route instead).
EXCLUDED_CHECKS = ("ignored_auth",)


@attrs.frozen
class ContractRun:
    """What one ``st run`` did."""

    exit_code: int
    #: Its console output (the failures, each with a curl line to replay it).
    output: str
    #: Test cases generated, over every phase.
    cases: int
    #: Checks evaluated (one per check per case), and those that failed.
    checks: int
    failed_checks: int
    #: The failures schemathesis counted (unique), and its own errors.
    failures: int
    errors: int
    #: Operations of the document tested.
    operations: int
    #: Wall-clock time of the run (a figure to quote, never asserted).
    seconds: float

    def summary(self, name: str) -> str:
        """One line of figures for the test's output."""
        return (
            f"schemathesis {name}: {self.operations} operations, {self.cases} cases, "
            f"{self.checks} checks, {self.failed_checks} failed checks, {self.failures} failures, "
            f"{self.errors} errors, {self.seconds:.1f}s"
        )


async def run_schemathesis(
    schema_url: str,
    work_dir: Path,
    *,
    settings: Path,
    token: str,
    seed: int,
    max_examples: int,
    workers: int = 1,
    extra: Sequence[str] = (),
    reactor: IReactorProcess = global_reactor,
) -> ContractRun:
    """``st run`` against ``schema_url`` with ``Authorization: Bearer token``, every
    check but :data:`EXCLUDED_CHECKS`, every phase of :data:`PHASES`, a fixed
    seed and at most ``max_examples`` cases per operation and phase;
    ``settings`` is the run's schemathesis TOML (what it accepts and why)."""
    json_report = work_dir / "schemathesis.json"
    events = work_dir / "schemathesis.ndjson"
    args = [
        "--config-file",
        str(settings),
        "run",
        schema_url,
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--exclude-checks",
        ",".join(EXCLUDED_CHECKS),
        "--phases",
        ",".join(PHASES),
        "--seed",
        str(seed),
        "--max-examples",
        str(max_examples),
        "--workers",
        str(workers),
        "--no-color",
        "--generation-database",
        "none",
        "--report",
        "json,ndjson",
        "--report-json-path",
        str(json_report),
        "--report-ndjson-path",
        str(events),
        *extra,
    ]
    started = time.monotonic()
    out, err, code = await getProcessOutputAndValue(ST, args, env=dict(os.environ), path=str(work_dir), reactor=reactor)
    seconds = time.monotonic() - started
    output = (out + err).decode("utf-8", "replace")
    report = _json_or_none(json_report)
    if report is None:
        raise AssertionError(f"st run wrote no report (exit {code}):\n{output[-4000:]}")
    checks, failed = _check_counts(events)
    return ContractRun(
        exit_code=code,
        output=output,
        cases=int(report["test_cases"]["generated"]),
        checks=checks,
        failed_checks=failed,
        failures=len(report["failures"]),
        errors=len(report["errors"]),
        operations=int(report["operations"]["tested"]),
        seconds=seconds,
    )


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """Every (path, method, operation) of an OpenAPI document."""
    methods = ("get", "post", "put", "patch", "delete")
    return [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in methods
    ]


def _json_or_none(path: Path) -> Optional[dict[str, Any]]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def _check_counts(events: Path) -> tuple[int, int]:
    """Checks evaluated and failed, from the NDJSON events' finished scenarios."""
    total = failed = 0
    with open(events, encoding="utf-8") as handle:
        for line in handle:
            event = json.loads(line)
            finished = event.get("ScenarioFinished")
            if finished is None:
                continue
            # A scenario that made no request (a stateful link never followed) has no checks.
            for results in finished["recorder"].get("checks", {}).values():
                total += len(results)
                failed += sum(1 for result in results if result["status"] != "success")
    return total, failed
