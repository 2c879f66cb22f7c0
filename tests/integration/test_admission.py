"""Admission control with real cells: a bounded number of legs, clear refusals."""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import pytest

from cellblock.client import CellblockClient, LimitOverrides, ResourceExhaustedError, Scope, Tool
from cellblock.server.app import ServerSettings, start_service
from tests.support.cells import state_dir_in

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_legs_beyond_the_bound_get_resource_exhausted_and_no_run(docker_client: Any) -> None:
    with tempfile.TemporaryDirectory() as sockets:
        service = await start_service(ServerSettings(address="127.0.0.1:0", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets), max_concurrent_legs=2))
        try:
            async with await CellblockClient.connect(service.address) as client:
                scope = Scope("admission", "admission")
                await client.put_catalog(scope, [Tool(source="host", name="noop")])
                slow = "await new Promise(r => setTimeout(r, 1500)); return 'ran';"

                async def one(i: int) -> Any:
                    try:
                        return await client.exec(scope, tool_call_id=f"a{i}", code=slow, handlers={}, limits=LimitOverrides(timeout_ms=5000))
                    except ResourceExhaustedError as exc:
                        return exc

                results = await asyncio.gather(*(one(i) for i in range(4)))
                ran = [r for r in results if not isinstance(r, Exception)]
                refused = [r for r in results if isinstance(r, ResourceExhaustedError)]
                assert len(ran) == 2 and all(r.status == "completed" and r.value == "ran" for r in ran)
                assert len(refused) == 2
                assert all("too many legs are running on this instance (limit 2); retry shortly" in str(r) for r in refused)
                assert service.registry.active == {}, "a refused leg creates no run"
                again = await client.exec(scope, tool_call_id="after", code="return 1", handlers={})
                assert again.status == "completed"
        finally:
            await service.stop()
        assert service.executor.list_cell_containers() == []  # type: ignore[attr-defined]
