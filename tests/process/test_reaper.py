"""Cells whose leg ended are cut off at once and removed off the reply path.

Uses the `process` executor (named explicitly, as only tests may) so that it
runs where no container can start; the agent, its prepared VM, the bridge, the
leg and the reaper are the real ones. tests/integration/test_pool.py checks the
same with Docker cells.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, LimitOverrides, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import Cell, CellSpec, ProcessExecutor
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="module")


class _RecordingProcessExecutor(ProcessExecutor):
    """The real process executor; it also keeps the cells it started and when each one's removal started (loop time)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, Cell] = {}
        self.removal_started: dict[str, float] = {}

    async def start(self, spec: CellSpec) -> Cell:
        cell = await super().start(spec)
        self.cells[spec.cell_id] = cell
        remove = cell.remove

        async def timed_remove() -> None:
            self.removal_started.setdefault(spec.cell_id, asyncio.get_running_loop().time())
            await remove()

        cell.remove = timed_remove  # type: ignore[method-assign]
        return cell


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def process_service() -> AsyncIterator[tuple[Service, _RecordingProcessExecutor, str]]:
    with tempfile.TemporaryDirectory() as sockets:
        executor = _RecordingProcessExecutor()
        svc = await start_service(ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets)), executor=executor)
        yield svc, executor, sockets
        await svc.stop()
        assert cell_dirs(sockets) == [], "every socket directory is removed by the time the service stopped"


async def test_the_reply_does_not_wait_for_removal_and_removal_completes(process_service: tuple[Service, _RecordingProcessExecutor, str]) -> None:
    service, executor, sockets = process_service
    async with await CellblockClient.connect(service.address) as client:
        scope = Scope("reaper", "reaper")
        await client.put_catalog(scope, [Tool(source="host", name="noop")])
        results = [await client.exec(scope, tool_call_id=f"r{i}", code=f"return {i} * 2", handlers={}) for i in range(3)]
    assert [(r.status, r.value) for r in results] == [("completed", 0), ("completed", 2), ("completed", 4)]
    ids = [r.metadata.cell_id for r in results]
    assert len(set(ids)) == 3, "one cell per leg"
    await executor.reaper.drain()
    assert executor.reaper.retiring == set()
    for cell_id in ids:
        proc = executor.cells[cell_id]._proc  # type: ignore[attr-defined]
        assert proc.returncode is not None, "the agent process is gone once its removal completed"
    assert cell_dirs(sockets) == [], "no socket directory outlives its cell's removal"


async def test_a_clean_end_defers_the_removal_and_any_other_end_removes_at_once() -> None:
    # A clean end's cell is removed clean_defer_s after its leg's end (off the next leg's
    # way); a leg that timed out (a runaway guest) has its cell removed at once; drain
    # starts a deferred removal at once.
    with tempfile.TemporaryDirectory() as sockets:
        executor = _RecordingProcessExecutor()
        executor.reaper.clean_defer_s = 30.0
        settings = ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets))
        service = await start_service(settings, executor=executor)
        loop = asyncio.get_running_loop()
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope("defer", "defer")
                await client.put_catalog(scope, [Tool(source="host", name="noop")])
                clean = await client.exec(scope, tool_call_id="clean", code="return 1", handlers={})
                runaway = await client.exec(scope, tool_call_id="spin", code="while (true) {}", handlers={}, limits=LimitOverrides(timeout_ms=300))
                replied = loop.time()
                assert (clean.status, runaway.status, runaway.code) == ("completed", "failed", "timeout"), runaway.raw_json
                for _ in range(100):
                    if runaway.metadata.cell_id in executor.removal_started:
                        break
                    await asyncio.sleep(0.02)
                assert runaway.metadata.cell_id in executor.removal_started, "a cell whose leg timed out is removed at once"
                await asyncio.sleep(0.3)
                assert clean.metadata.cell_id not in executor.removal_started, "a clean end's removal waits"
                assert clean.metadata.cell_id in executor.reaper.retiring
                await asyncio.wait_for(executor.reaper.drain(), timeout=10.0)
                assert executor.removal_started[clean.metadata.cell_id] - replied < 10.0, "drain starts a deferred removal at once"
                assert executor.reaper.retiring == set()
        finally:
            await service.stop()
        assert cell_dirs(sockets) == []


async def test_a_clean_end_closes_its_cells_stream_a_little_after_the_reply() -> None:
    # The stream of a cleanly ended cell stays open clean_hangup_s (the agent's exit then
    # does not run beside the run store's fsync right after the leg), then closes and the
    # agent exits by itself, long before the deferred removal.
    with tempfile.TemporaryDirectory() as sockets:
        executor = _RecordingProcessExecutor()
        executor.reaper.clean_defer_s = 30.0
        executor.reaper.clean_hangup_s = 0.5
        settings = ServerSettings(address="127.0.0.1:0", executor="process", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets))
        service = await start_service(settings, executor=executor)
        loop = asyncio.get_running_loop()
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope("hangup", "hangup")
                await client.put_catalog(scope, [Tool(source="host", name="noop")])
                clean = await client.exec(scope, tool_call_id="clean", code="return 1", handlers={})
                replied = loop.time()
                assert clean.status == "completed", clean.raw_json
                proc = executor.cells[clean.metadata.cell_id]._proc  # type: ignore[attr-defined]
                await asyncio.sleep(0.2)
                assert proc.returncode is None, "the stream is still open: the agent waits for its end"
                await asyncio.wait_for(proc.wait(), timeout=10.0)
                assert loop.time() - replied >= 0.45, "the agent exited once its stream closed"
                assert proc.returncode == 0
                assert clean.metadata.cell_id not in executor.removal_started, "its removal still waits"
        finally:
            await service.stop()
        assert cell_dirs(sockets) == []
