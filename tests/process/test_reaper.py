"""Cells whose leg ended are cut off at once and removed off the reply path.

Uses the `process` executor (named explicitly, as only tests may) so that it
runs where no container can start; the agent, its prepared VM, the bridge, the
leg and the reaper are the real ones. tests/integration/test_pool.py checks the
same with Docker cells.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from cellblock.client import CellblockClient, Scope, Tool
from cellblock.server.app import ServerSettings, Service, start_service
from cellblock.server.cells import Cell, CellSpec, ProcessExecutor
from tests.support.cells import cell_dirs, state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="module")


class _RecordingProcessExecutor(ProcessExecutor):
    """The real process executor; it also keeps the cells it started, for the assertions."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, Cell] = {}

    async def start(self, spec: CellSpec) -> Cell:
        cell = await super().start(spec)
        self.cells[spec.cell_id] = cell
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
