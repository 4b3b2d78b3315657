"""The history, SLO and deployment parts of the store interface, as checks every backend must pass.

``tests/controlplane/test_cp_store.py`` runs them on the memory and SQLite
stores, ``tests/cluster/test_cluster_history_store.py`` on the Redis one:
one contract, so the history never knows which store it has. Each check
takes a store (or a writer and a reader of one shared store) and a way to
wait until what was written can be read (:func:`settled`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from twisted_iop.controlplane.store.interface import DeploymentStore, HistoryChunk, HistoryStore, SloStore

#: Waits until what the store was told is readable (a flush, a round trip to Redis).
Settle = Callable[[], Awaitable[None]]


async def _read(store: HistoryStore, series: list[str], step: int, start: float, end: float) -> list[Any]:
    return [(c.series, c.start, c.end, c.data) for c in await store.history_read(series, step, start, end)]


async def chunks_replace_by_key_and_read_by_range(writer: HistoryStore, reader: HistoryStore, settle: Settle) -> None:
    """A chunk is read back when it overlaps the range, with its bytes as
    written (any byte value); a second write of its key replaces it; other
    series and tiers are apart."""
    writer.history_write(HistoryChunk("fleet", 15, 100.0, 200.0, b"\x00\xff first"))
    writer.history_write(HistoryChunk("fleet", 15, 300.0, 400.0, b"second"))
    writer.history_write(HistoryChunk("edge:a", 15, 100.0, 200.0, b"other series"))
    writer.history_write(HistoryChunk("fleet", 60, 100.0, 200.0, b"other tier"))
    writer.history_write(HistoryChunk("fleet", 15, 100.0, 250.0, b"\x00\xff first, grown"))
    await settle()
    assert await _read(reader, ["fleet"], 15, 150.0, 350.0) == [
        ("fleet", 100.0, 250.0, b"\x00\xff first, grown"),
        ("fleet", 300.0, 400.0, b"second"),
    ]
    assert await _read(reader, ["fleet"], 15, 260.0, 290.0) == []
    both = await _read(reader, ["fleet", "edge:a"], 15, 0.0, 1000.0)
    assert [(series, start) for series, start, _, _ in both] == [("edge:a", 100.0), ("fleet", 100.0), ("fleet", 300.0)]
    assert await _read(reader, ["fleet"], 60, 0.0, 1000.0) == [("fleet", 100.0, 200.0, b"other tier")]


async def expiry_forgets_what_ended_before(writer: HistoryStore, reader: HistoryStore, settle: Settle) -> None:
    """Expiring a tier forgets its chunks that ended before the time, and only that tier's."""
    writer.history_write(HistoryChunk("fleet", 15, 100.0, 200.0, b"old"))
    writer.history_write(HistoryChunk("fleet", 15, 300.0, 400.0, b"new"))
    writer.history_write(HistoryChunk("fleet", 60, 100.0, 200.0, b"coarse"))
    await settle()
    writer.history_expire(15, 250.0)
    await settle()
    assert [data for *_, data in await _read(reader, ["fleet"], 15, 0.0, 1000.0)] == [b"new"]
    assert [data for *_, data in await _read(reader, ["fleet"], 60, 0.0, 1000.0)] == [b"coarse"]


async def slos_replace_by_name_and_deletes_forget(writer: Any, reader: Any, settle: Settle) -> None:
    """An SLO written twice is read back in its newest form (any byte value),
    others are apart, and a deleted one is gone."""
    slo_writer: SloStore = writer
    slo_reader: SloStore = reader
    slo_writer.slo_write("chat-ttft", b'{"first": 1}')
    slo_writer.slo_write("errors", b'{"errors": "\xc3\xa9"}')
    slo_writer.slo_write("chat-ttft", b'{"second": 2}')
    await settle()
    assert await slo_reader.slo_read() == {"chat-ttft": b'{"second": 2}', "errors": b'{"errors": "\xc3\xa9"}'}
    slo_writer.slo_delete("errors")
    slo_writer.slo_delete("never-kept")
    await settle()
    assert await slo_reader.slo_read() == {"chat-ttft": b'{"second": 2}'}


async def deployments_replace_by_name_and_deletes_forget(writer: Any, reader: Any, settle: Settle) -> None:
    """A deployment written twice is read back in its newest form, apart from
    the SLOs of the same name, and a deleted one is gone."""
    kept_writer: DeploymentStore = writer
    kept_reader: DeploymentStore = reader
    slos: SloStore = writer
    slos.slo_write("chat", b"an SLO")
    kept_writer.deployment_write("chat", b'{"generation": 1}')
    kept_writer.deployment_write("embed", b'{"generation": 1}')
    kept_writer.deployment_write("chat", b'{"generation": 2}')
    await settle()
    assert await kept_reader.deployment_read() == {"chat": b'{"generation": 2}', "embed": b'{"generation": 1}'}
    kept_writer.deployment_delete("embed")
    kept_writer.deployment_delete("never-kept")
    await settle()
    assert await kept_reader.deployment_read() == {"chat": b'{"generation": 2}'}
    assert (await slos.slo_read())["chat"] == b"an SLO"


#: Every check of the contract.
CHECKS = (
    chunks_replace_by_key_and_read_by_range,
    expiry_forgets_what_ended_before,
    slos_replace_by_name_and_deletes_forget,
    deployments_replace_by_name_and_deletes_forget,
)
