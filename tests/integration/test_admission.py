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


async def test_one_scope_holds_at_most_three_quarters_of_the_legs_and_another_scope_still_runs(docker_client: Any) -> None:
    with tempfile.TemporaryDirectory() as sockets:
        service = await start_service(ServerSettings(address="127.0.0.1:0", code_mode={"enabled": True}, socket_dir=sockets, state_dir=state_dir_in(sockets), max_concurrent_legs=4))
        try:
            assert service.state.admission.per_scope == 3
            async with await CellblockClient.connect(service.address) as client:
                busy, other = Scope("admission-busy", "admission"), Scope("admission-other", "admission")
                for scope in (busy, other):
                    await client.put_catalog(scope, [Tool(source="host", name="noop")])
                slow = "await new Promise(r => setTimeout(r, 12000)); return 'ran';"
                running = [asyncio.ensure_future(client.exec(busy, tool_call_id=f"b{i}", code=slow, handlers={}, limits=LimitOverrides(timeout_ms=30000))) for i in range(3)]
                for _ in range(200):
                    if service.state.admission.running == 3:
                        break
                    await asyncio.sleep(0.05)
                with pytest.raises(ResourceExhaustedError, match="this scope already has 3 legs running, its most on this instance \\(of 4 legs in all\\); retry when one ends"):
                    await client.exec(busy, tool_call_id="b3", code="return 1", handlers={})
                # The quarter kept for other scopes: this one's leg runs beside the busy scope's three.
                beside = await client.exec(other, tool_call_id="o", code="return 'other ran';", handlers={}, limits=LimitOverrides(timeout_ms=10000))
                assert beside.status == "completed" and beside.value == "other ran"
                assert not any(task.done() for task in running), "the busy scope's legs still run"
                assert [r.value for r in await asyncio.gather(*running)] == ["ran"] * 3
                assert service.state.admission.running == 0
                again = await client.exec(busy, tool_call_id="again", code="return 1", handlers={})
                assert again.status == "completed"
        finally:
            await service.stop()
        assert service.executor.list_cell_containers() == []  # type: ignore[attr-defined]
