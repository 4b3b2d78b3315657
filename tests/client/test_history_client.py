"""Capacity history in the client: the repository's views and ``iopctl history``,
against a REAL Control Plane (``start_fleet``: loopback sockets, scripted
edges) that samples every 0.2 s."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest
import pytest_twisted
from twisted.internet import reactor

from twisted_iop.client import ControlPlaneStatusRepository
from twisted_iop.client.cli import EXIT_ERROR, EXIT_OK, EXIT_USAGE, parse_arguments, run
from twisted_iop.client.errors import ControlPlaneError
from twisted_iop.client.iopctl.cli_base import UsageError
from twisted_iop.client.iopctl.completion import script
from twisted_iop.client.iopctl.history_render import render_history_sparklines, sparkline
from twisted_iop.controlplane.history.service import HistoryService
from twisted_iop.testing.harness import Fleet, eventually, start_fleet
from twisted_iop.testing.latency import LatencyFeed, latency_snapshot, sketch_of

#: Samples every 0.2 s; 0.4 s and 2 s tiers.
HISTORY = (
    "history:\n  interval_seconds: 0.2\n  tiers:\n"
    "  - {keep_hours: 1}\n  - {step_seconds: 0.4, keep_hours: 1}\n  - {step_seconds: 2, keep_hours: 2}\n"
)


async def sampled_fleet() -> Fleet:
    """Two scripted edges (two providers each: capacity 4, 1 in flight, 2 queued) and four samples."""
    fleet = await start_fleet("edge-a", "edge-b", config_text=HISTORY)
    history = fleet.cp.service.history
    await eventually(lambda: history.samples >= 4, timeout=10, message="four samples")
    return fleet


async def iopctl(argv: list[str], fleet: Fleet, tty: bool = False) -> tuple[int, str, str]:
    """Run iopctl's ``run`` against the fleet's real Control Plane."""

    class Out(io.StringIO):
        def isatty(self) -> bool:
            return tty

    args = parse_arguments(argv)
    out, err = Out(), io.StringIO()
    repository = ControlPlaneStatusRepository(fleet.cp.http_url, timeout=10)
    code = await run(reactor, args, repository, lambda a: None, out, err)
    return code, out.getvalue(), err.getvalue()


@pytest_twisted.ensureDeferred
async def test_repository_reads_the_fleet_an_edge_a_model_and_a_rolled_up_tier() -> None:
    """Typed views with the real sampled figures; a rolled-up view's columns are its means, maxima and lasts."""
    fleet = await sampled_fleet()
    try:
        repo = fleet.repository()
        whole = await repo.fleet_history(start="-60s", series=["capacity", "in_flight", "engine_running"])
        assert whole.series == "fleet" and not whole.rolled_up and whole.step_seconds == 0.2
        assert len(whole.points) >= 3 and whole.column("capacity")[-1] == 16 and whole.column("in_flight")[-1] == 4
        assert whole.column("engine_running")[-1] is None
        assert whole.models == ("llama-3-8b",)
        assert whole.times() == sorted(whole.times())
        edge = await repo.edge_history("edge-a", start="-60s", series="queued")
        assert edge.edge_id == "edge-a" and edge.column("queued")[-1] == 4
        model = await repo.edge_history("edge-b", start="-60s", model="llama-3-8b", series="providers")
        assert model.series == "edge:edge-b/model:llama-3-8b" and model.column("providers")[-1] == 2
        chosen = await repo.fleet_history(start="-60s", selector="site=test", series="capacity")
        assert chosen.edges == 2 and chosen.column("capacity")[-1] == 16
        rolled = await repo.fleet_history(step="0.4", series="in_flight")
        assert rolled.rolled_up and rolled.column("in_flight")[-1] == 4 and rolled.column("in_flight.max")[-1] == 4
        assert all(count is not None and count >= 1 for count in rolled.column("count"))
        with pytest.raises(ControlPlaneError) as info:
            await repo.fleet_history(step="7s")
        assert info.value.code == "invalid_step"
        with pytest.raises(ControlPlaneError) as info:
            await repo.edge_history("edge-a", series="gpus")
        assert info.value.code == "invalid_series"
    finally:
        await fleet.stop()


@pytest_twisted.ensureDeferred
async def test_iopctl_history_prints_a_table_sparklines_or_json() -> None:
    """A pipe gets a table, a terminal sparklines, --json the view; errors are one line, exit 1."""
    fleet = await sampled_fleet()
    try:
        code, out, err = await iopctl(["history", "--since", "1m", "--series", "capacity,in_flight"], fleet)
        assert code == EXIT_OK, err
        lines = out.splitlines()
        assert lines[0].startswith("fleet: ") and lines[1].split() == ["TIME", "(UTC)", "CAPACITY", "IN_FLIGHT"]
        assert lines[-1].split()[-2:] == ["16", "4"]
        code, out, _ = await iopctl(["history", "edge-a", "--since", "1m"], fleet, tty=True)
        assert code == EXIT_OK
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert set(rows) == {
            "capacity",
            "in_flight",
            "queued",
            "long_context_capacity",
            "long_context_in_flight",
            "long_context_queued",
        }
        assert "last 8" in rows["capacity"] and "█" in rows["capacity"]
        code, out, _ = await iopctl(["history", "--since", "1m", "--table", "--json", "--model", "llama-3-8b"], fleet)
        document = json.loads(out)
        assert code == EXIT_OK and document["series"] == "model:llama-3-8b" and document["points"]
        code, _, err = await iopctl(["history", "--step", "3m"], fleet)
        assert code == EXIT_ERROR and err.startswith("iopctl: invalid_step: ")
        code, _, err = await iopctl(["history", "nope"], fleet)
        assert code == EXIT_ERROR and err.startswith("iopctl: unknown_edge: ")
    finally:
        await fleet.stop()


def samples_after(history: HistoryService, count: int) -> Callable[[], bool]:
    """Whether ``history`` took a sample after its ``count``-th."""
    return lambda: history.samples > count


@pytest_twisted.ensureDeferred
async def test_iopctl_history_latency_shows_the_p95s_in_ms_and_requests_per_second() -> None:
    """``--latency`` picks the latency series: a table of TTFT and TPOT p95 in ms and requests
    per second, sparklines with their last, min and max in ms; --series and --latency exclude
    each other."""
    fleet = await sampled_fleet()
    try:
        feed = LatencyFeed()
        feed.requests(ttft=[0.25] * 30, tpot=[0.02] * 30)
        fleet.edges["edge-a"].status = lambda: latency_snapshot("edge-a", {"mock-1": feed})
        history = fleet.cp.service.history
        seen = history.samples
        await eventually(lambda: history.samples >= seen + 3, timeout=10, message="three more samples")
        for _ in range(20):
            # A sample may still read a snapshot from before the figures (a fleet round reused
            # within its max age): ask again after the next sample, a bounded number of times.
            code, out, err = await iopctl(["history", "edge-a", "--since", "1m", "--latency", "--table"], fleet)
            assert code == EXIT_OK, err
            lines = out.splitlines()
            if lines[-1].split()[-3:] != ["-", "-", "-"]:
                break
            await eventually(samples_after(history, history.samples), timeout=10, message="one more sample")
        assert lines[1].split() == ["TIME", "(UTC)", "TTFT_P95", "TPOT_P95", "REQUESTS_PER_SECOND"]
        exact_ttft = sketch_of([0.25] * 30).quantile(0.95)
        exact_tpot = sketch_of([0.02] * 30).quantile(0.95)
        assert exact_ttft is not None and exact_tpot is not None
        ttft, tpot = round(exact_ttft, 4), round(exact_tpot, 4)  # as kept: tenths of a millisecond
        assert lines[-1].split()[-3:] == [f"{ttft * 1000:.0f}ms", f"{tpot * 1000:.0f}ms", "0.50"]
        assert lines[2].split()[-3:] == ["-", "-", "-"]  # before the figures: no Edge reported any
        code, out, _ = await iopctl(["history", "edge-a", "--since", "1m", "--latency"], fleet, tty=True)
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert set(rows) == {"ttft_p95", "tpot_p95", "requests_per_second"}
        assert f"last {ttft * 1000:.0f}ms" in rows["ttft_p95"]
    finally:
        await fleet.stop()
    with pytest.raises(UsageError):
        parse_arguments(["history", "--latency", "--series", "capacity"])


def test_history_options_are_checked_and_completed() -> None:
    """A bad selector is a usage error; --sparklines and --table exclude each other; completion knows history."""
    with pytest.raises(UsageError):
        parse_arguments(["history", "-l", "a in ("])
    with pytest.raises(UsageError):
        parse_arguments(["history", "--sparklines", "--table"])
    assert parse_arguments(["history", "edge-a", "--since", "2h"]).edge_id == "edge-a"
    from twisted_iop.client.cli import build_parser

    text = script(build_parser(), "bash")
    assert "history" in text and "--sparklines" in text
    assert EXIT_USAGE == 2


def test_sparklines_scale_to_their_largest_value_and_leave_gaps_blank() -> None:
    """Bars run from the lowest to the highest block; a stretch with no value is a blank."""
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], 8) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, None, 5], 3) == "█ █"
    assert sparkline([0, 0], 2) == "▁▁"
    assert sparkline([1.0] * 100, 10) == "█" * 10
    from twisted_iop.client.history import HistoryView

    view = HistoryView(
        series="fleet",
        step_seconds=15,
        keep_seconds=21600,
        interval_seconds=15,
        rolled_up=False,
        fields=("capacity",),
        columns=("t", "capacity"),
        points=((1.0, None), (16.0, None)),
    )
    assert "no values" in render_history_sparklines(view)
